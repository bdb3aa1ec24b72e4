"""The transaction coordinator: one ``handle_*`` per request, the ownership of
``__transaction_state`` partitions, completion of decided transactions, and
the timers.

Guarantees
----------
- Write, then apply: every transition is first written to the transaction log
  (durable on its partition leader) and only then applied in memory; while it
  is in flight the id answers CONCURRENT_TRANSACTIONS.
- Once PrepareCommit/PrepareAbort is durable the outcome is decided: this
  coordinator, or the next owner of the partition after a crash, sends the
  markers until every partition acknowledged, then writes Complete*.
- Two-phase participation: a PREPARED transaction is decided only by whoever
  holds its handle (CompleteTransaction), by a group decision
  (CommitTransactionGroup), by its own prepared timeout, or by a new producer
  with its id. A group decision record naming every member is durable before
  any member moves on; a coordinator loading the partition finishes it.
- Epochs (Transactions V2): EndTxn and every coordinator-initiated abort bump
  the producer epoch; nothing sent with an older epoch can join, commit or abort
  a later transaction.
- Ownership: each __transaction_state partition is served by the coordinator
  that ZooKeeper names its owner, with a coordinator epoch that grows at every
  change of owner. The new owner first writes a fence record with its epoch, so
  a deposed owner can neither write the log nor (partition leaders compare
  coordinator epochs) write markers.

Error Handling
--------------
Client mistakes are TxlogErrors with the code Kafka would answer (PRODUCER_FENCED,
INVALID_PRODUCER_ID_MAPPING, INVALID_TXN_STATE, ...). A transaction-log write that
fails leaves memory as it was and marks the partition for reloading
(NOT_COORDINATOR to the client, which retries at the new owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kazoo.exceptions import BadVersionError, NodeExistsError

from coordinator_svc import transaction_core as core
from coordinator_svc import transaction_state as ts
from coordinator_svc.markers import MarkerSender, MarkerSet
from coordinator_svc.transaction_state import GroupDecision, Handle, TransactionMetadata, TransactionState
from coordinator_svc.txn_log import FENCE_KEY, TransactionLogPartition
from services import coordinators, names, zk
from services.errors import ErrorCode, TxlogError
from services.hashing import partition_for_id
from services.logs import fields
from services.producer_ids import ProducerIdSource
from services.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from services.rpc import PeerClient
from services.stubs.txlog.v1 import partition_pb2

log = logging.getLogger(__name__)
S = TransactionState
COMPLETED = core.COMPLETED
GROUP_HANDLES_MAX = 10_000
# Fatal answers read from an id's state in memory (not from the request alone): given only by a confirmed owner.
ANSWERS_FROM_STATE = frozenset(ErrorCode.Value(c) for c in (
    "INVALID_PRODUCER_ID_MAPPING", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_TXN_STATE", "TRANSACTIONAL_ID_NOT_FOUND"))


error = core.error


@dataclass
class LoadedPartition:
    index: int
    owner: coordinators.PartitionOwner
    log: TransactionLogPartition
    transactions: dict[str, TransactionMetadata] = field(default_factory=dict)
    loaded: bool = False
    tasks: set = field(default_factory=set)
    completing: dict = field(default_factory=dict)  # transactional id -> asyncio.Event set when its completion ends
    decisions: dict[str, GroupDecision] = field(default_factory=dict)  # group decisions not finished yet
    confirmed_s: float = 0.0  # monotonic time ZooKeeper last confirmed this owner and epoch


@dataclass(frozen=True)
class CoordinatorConfig:
    node_id: int
    zookeeper_root: str
    transaction_state_partitions: int
    transaction_timeout_ms_max: int
    transactional_id_expiration_ms: int
    ownership_lease_ms: int = 3_000
    prepared_transaction_timeout_ms: int = 24 * 3600 * 1000


class TransactionCoordinator:
    def __init__(
        self,
        config: CoordinatorConfig,
        zookeeper,
        registry,
        client: PeerClient,
        producer_ids: ProducerIdSource,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ):
        self.config = config
        self.zookeeper = zookeeper
        self.registry = registry
        self.client = client
        self.markers = MarkerSender(client)
        self.producer_ids = producer_ids
        self.clock_ms = clock_ms
        self.partitions: dict[int, LoadedPartition] = {}
        self.partition_count: int | None = None
        # A partition is served only while ZooKeeper confirmed its ownership this
        # recently: a coordinator that was paused (or cut off from ZooKeeper) stops
        # answering from state another owner may have changed since. Shorter than
        # the ZooKeeper session timeout, after which another owner can take over.
        self.lease_s = config.ownership_lease_ms / 1000

    # --- ownership of __transaction_state partitions ------------------------------------

    async def ensure_log_topic(self) -> int:
        if self.partition_count is None:
            count = await self.client.partition_count(TRANSACTION_STATE_TOPIC)
            if count is None:
                reply = await self.client.call_any_partition_svc(
                    "CreateTopics",
                    partition_pb2.CreateTopicsRequest(
                        topics=[partition_pb2.CreatableTopic(name=TRANSACTION_STATE_TOPIC, partition_count=self.config.transaction_state_partitions)]
                    ),
                )
                if reply.results[0].error.code not in (0, ErrorCode.Value("TOPIC_ALREADY_EXISTS")):
                    raise TxlogError(reply.results[0].error.code, reply.results[0].error.message)
                await self.client.refresh([TRANSACTION_STATE_TOPIC])
                count = await self.client.partition_count(TRANSACTION_STATE_TOPIC)
            self.partition_count = count
        return self.partition_count

    async def balance(self) -> None:
        """Confirms the partitions this node serves (renewing their leases), lets
        go of the ones it lost, then takes over the ones it should own."""
        count = await self.ensure_log_topic()
        live = sorted(await asyncio.to_thread(self.registry.live, coordinators.COORDINATOR_KIND))
        if self.config.node_id not in live:
            return
        owners = [await coordinators.read_owner(self.zookeeper, self.config.zookeeper_root, index) for index in range(count)]
        confirmed_s = time.monotonic()
        to_take = []
        for index, current in enumerate(owners):
            loaded = self.partitions.get(index)
            if loaded is not None and (current is None or current[0].coordinator_epoch != loaded.owner.coordinator_epoch):
                self.unload(index, "now owned by another coordinator" if current is None else f"now owned by node {current[0].node_id} at epoch {current[0].coordinator_epoch}")
                loaded = None
            if loaded is not None and loaded.log.broken:
                self.unload(index, loaded.log.broken)
                loaded = None
            if loaded is not None:
                loaded.confirmed_s = confirmed_s
                continue
            if live[index % len(live)] == self.config.node_id:  # partition p goes to the p-th live coordinator
                to_take.append((index, current))
        for index, current in to_take:
            await self.take_over(index, current)

    async def take_over(self, index: int, current) -> None:
        if current is None:
            owner = coordinators.PartitionOwner(self.config.node_id, 0, await self.producer_ids.next_id())
            try:
                await zk.call(self.zookeeper, "create", coordinators.owner_path(self.config.zookeeper_root, index), owner.encode(), makepath=True)
            except NodeExistsError:
                return  # someone else was faster; the next round looks again
        else:
            previous, version = current
            owner = previous.successor(self.config.node_id)
            if owner.log_producer_id < 0:
                owner = dataclasses.replace(owner, log_producer_id=await self.producer_ids.next_id())
            try:
                await zk.call(self.zookeeper, "set", coordinators.owner_path(self.config.zookeeper_root, index), owner.encode(), version=version)
            except BadVersionError:
                return
        log.info("taking over transaction log partition", extra=fields(partition=index, coordinator_epoch=owner.coordinator_epoch))
        loaded = LoadedPartition(index, owner, TransactionLogPartition(self.client, index, owner.log_producer_id, owner.log_producer_epoch), confirmed_s=time.monotonic())
        self.partitions[index] = loaded
        try:
            await loaded.log.append(FENCE_KEY, str(owner.coordinator_epoch).encode())  # fences the previous owner's writes
            records, decisions = await loaded.log.read_all()
        except TxlogError as exc:
            self.unload(index, f"loading failed: {exc}")
            return
        for tid, record in records.items():
            if record is not None:
                loaded.transactions[tid] = TransactionMetadata.from_record(record)
        # Group decisions first, before any request is served: their members still
        # PREPARED move to PREPARE_COMMIT (pending until written), so no one can abort them.
        resumed = []
        for decision in decisions.values():
            if decision is not None:
                resumed.append(await self._resume_decision(loaded, decision))
        loaded.loaded = True
        log.info("loaded transaction log partition", extra=fields(partition=index, transactional_ids=len(loaded.transactions), group_decisions=len(resumed)))
        in_groups = set()
        for decision, members, records_to_write in resumed:
            in_groups.update(m.transactional_id for m in members)
            self._spawn(loaded, self._finish_decision(loaded, decision, members, records_to_write))
        for meta in loaded.transactions.values():
            if meta.state.is_preparing and meta.transactional_id not in in_groups:  # decided before the previous owner stopped: finish it
                self._spawn(loaded, self._complete(loaded, meta))
            elif meta.state is S.PREPARED:  # the previous owner may have stopped before sealing it
                self._spawn(loaded, self._seal_quietly(loaded, meta))

    def unload(self, index: int, reason: str) -> None:
        loaded = self.partitions.pop(index, None)
        if loaded is not None:
            log.warning("no longer serving transaction log partition", extra=fields(partition=index, reason=reason))
            for task in loaded.tasks:
                task.cancel()

    def _spawn(self, loaded: LoadedPartition, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        loaded.tasks.add(task)
        task.add_done_callback(loaded.tasks.discard)

    # --- finding the state of an id ----------------------------------------------------

    def partition_of(self, transactional_id: str) -> int:
        if self.partition_count is None:
            raise error("COORDINATOR_NOT_AVAILABLE", "the transaction log is not set up yet; retry")
        return coordinators.transaction_log_partition(transactional_id, self.partition_count)

    def loaded_partition(self, transactional_id: str) -> LoadedPartition:
        index = self.partition_of(transactional_id)
        loaded = self.partitions.get(index)
        if loaded is None:
            raise error("NOT_COORDINATOR", f"this coordinator (node {self.config.node_id}) does not own transaction log partition {index}")
        if not loaded.loaded:
            raise error("COORDINATOR_LOAD_IN_PROGRESS", f"transaction log partition {index} is still loading; retry")
        if loaded.log.broken:
            raise error("NOT_COORDINATOR", f"transaction log partition {index} is being reloaded")
        if time.monotonic() - loaded.confirmed_s > self.lease_s:
            raise error("NOT_COORDINATOR", f"ownership of transaction log partition {index} is not confirmed by ZooKeeper; retry")
        return loaded

    async def confirm_ownership(self, key: str) -> None:
        """Reads the owner of ``key``'s log partition from ZooKeeper and raises
        NOT_COORDINATOR (unloading the partition) unless it is still this node at
        the epoch it loaded. Memory is only as good as the ownership behind it: a
        coordinator whose partition moved keeps its old view until its next
        balance round, and must not give a fatal answer from that view
        (INVALID_PRODUCER_ID_MAPPING for an id the new owner just created)."""
        index = self.partition_of(key)
        loaded = self.partitions.get(index)
        current = await coordinators.read_owner(self.zookeeper, self.config.zookeeper_root, index)
        if loaded is not None and current is not None and current[0].node_id == self.config.node_id \
                and current[0].coordinator_epoch == loaded.owner.coordinator_epoch:
            loaded.confirmed_s = time.monotonic()
            return
        reason = "no owner" if current is None else f"owned by node {current[0].node_id} at epoch {current[0].coordinator_epoch}"
        if self.partitions.get(index) is loaded:
            self.unload(index, reason)
        raise error("NOT_COORDINATOR", f"transaction log partition {index} is {reason}, not served here any more; find the coordinator again")

    async def answer_as_owner(self, key: str, answer):
        """Awaits ``answer`` (a handler's coroutine); a fatal error it raises is
        given only once ZooKeeper confirms this node still owns ``key``'s
        partition, else NOT_COORDINATOR, which the client retries elsewhere."""
        try:
            return await answer
        except TxlogError as exc:
            if exc.code in ANSWERS_FROM_STATE:
                await self.confirm_ownership(key)
            raise

    @staticmethod
    def check_transactional_id(transactional_id: str) -> None:
        names.check_transactional_id(transactional_id)

    async def _carry_out(self, loaded: LoadedPartition, transactional_id: str, decide: Callable[[TransactionMetadata | None, list[int]], core.Outcome]):
        """Decides (transaction_core) and carries the outcome out: producer ids
        the decision needs are fetched first, then it is decided again with them,
        so there is no await between a decision and the transition it names."""
        spare_ids: list[int] = []
        for _ in range(3):
            meta = loaded.transactions.get(transactional_id)
            outcome = decide(meta, spare_ids)
            if isinstance(outcome, core.NeedProducerIds):
                spare_ids += [await self.producer_ids.next_id() for _ in range(outcome.count)]
                continue
            return await self._apply(loaded, transactional_id, meta, outcome)
        raise error("CONCURRENT_TRANSACTIONS", f"{transactional_id!r} kept changing while producer ids were fetched; retry")

    async def _apply(self, loaded: LoadedPartition, transactional_id: str, meta: TransactionMetadata | None, outcome: core.Outcome):
        if isinstance(outcome, core.Refuse):
            raise outcome.error
        if isinstance(outcome, core.Reply):
            if outcome.then is core.Then.SEAL:
                await self._seal(loaded, meta)
            return self._answer(outcome.value, meta)
        if meta is None or meta.state is S.DEAD:  # a new id: not in the log until its first record is
            meta = loaded.transactions[transactional_id] = TransactionMetadata(transactional_id, ts.NO_PRODUCER_ID, ts.NO_EPOCH, 0)
        if outcome.fence:
            ts.check_transition(meta, S.PREPARE_EPOCH_FENCE)
        await self._transition(loaded, meta, outcome.to_state, **outcome.changes)
        if outcome.then is core.Then.COMPLETE:
            loaded.completing[meta.transactional_id] = asyncio.Event()
            self._spawn(loaded, self._complete(loaded, meta))
        elif outcome.then is core.Then.SEAL:
            await self._seal(loaded, meta)
        if isinstance(outcome.reply, TxlogError):
            raise outcome.reply
        return self._answer(outcome.reply, meta)

    @staticmethod
    def _answer(value, meta: TransactionMetadata | None):
        return (meta.producer_id, meta.producer_epoch) if value is core.Answer.PRODUCER else value

    async def _transition(self, loaded: LoadedPartition, meta: TransactionMetadata, to_state: TransactionState, **changes) -> None:
        """Write, then apply. A new id whose first record fails to be written is forgotten."""
        record = ts.prepare_transition(meta, to_state, last_update_ms=self.clock_ms(), **changes)
        try:
            await loaded.log.write(record)
        except BaseException:
            ts.abandon_transition(meta)
            if meta.state is S.EMPTY and meta.producer_id == ts.NO_PRODUCER_ID and loaded.transactions.get(meta.transactional_id) is meta:
                loaded.transactions.pop(meta.transactional_id)
            raise
        ts.complete_transition(meta, record)

    # --- InitProducerId --------------------------------------------------------------------

    async def handle_init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        if not transactional_id:
            return await self.producer_ids.next_id(), 0
        self.check_transactional_id(transactional_id)
        if not 1 <= timeout_ms <= self.config.transaction_timeout_ms_max:
            raise error("INVALID_TRANSACTION_TIMEOUT", f"transaction_timeout_ms must be 1..{self.config.transaction_timeout_ms_max}, got {timeout_ms}")
        loaded = self.loaded_partition(transactional_id)
        return await self._carry_out(loaded, transactional_id, lambda meta, spare_ids: core.decide_init(
            meta, transactional_id, timeout_ms, producer_id, producer_epoch, spare_ids))

    # --- AddPartitionsToTxn, AddOffsetsToTxn -------------------------------------------

    async def handle_add_partitions(self, transactional_id, producer_id, producer_epoch, partitions, verify_only) -> dict:
        """{(topic, partition): None (ok) or a TxlogError}."""
        self.check_transactional_id(transactional_id)
        loaded = self.loaded_partition(transactional_id)
        if verify_only:
            verified = core.verify_partitions(loaded.transactions.get(transactional_id), producer_id, producer_epoch, partitions)
            if isinstance(verified, core.Refuse):
                raise verified.error
            return verified
        done = loaded.completing.get(transactional_id)
        if done is not None and not done.is_set():  # the previous transaction is completing: wait rather than bounce the client
            with contextlib.suppress(TimeoutError):  # still completing: CONCURRENT_TRANSACTIONS below
                await asyncio.wait_for(done.wait(), timeout=5)
        unknown = await self._unknown_partitions(partitions)
        return await self._carry_out(loaded, transactional_id, lambda meta, _: core.decide_add_partitions(
            meta, transactional_id, producer_id, producer_epoch, partitions, unknown, self.clock_ms()))

    async def _unknown_partitions(self, partitions) -> dict:
        """The partitions that do not exist; metadata is asked again only on a miss."""
        def missing(counts):
            return {(t, i) for t, i in partitions if counts.get(t) is None or not 0 <= i < counts[t]}

        counts = {t: await self.client.partition_count(t) for t in {t for t, _ in partitions}}
        if missing(counts):
            await self.client.refresh(sorted(counts))
            counts = {t: await self.client.partition_count(t) for t in counts}
        return {tp: error("UNKNOWN_TOPIC_OR_PARTITION", f"{tp[0]}-{tp[1]} does not exist") for tp in missing(counts)}

    async def handle_add_offsets(self, transactional_id, producer_id, producer_epoch, group_id) -> None:
        names.check_group_id(group_id)
        count = await self.client.partition_count(CONSUMER_OFFSETS_TOPIC)
        if count is None:  # asking for a group's coordinator creates the topic
            await self.client.call_any_partition_svc("Metadata", partition_pb2.MetadataRequest(group_ids=[group_id]))
            await self.client.refresh([CONSUMER_OFFSETS_TOPIC])
            count = await self.client.partition_count(CONSUMER_OFFSETS_TOPIC)
        if not count:
            raise error("COORDINATOR_NOT_AVAILABLE", f"{CONSUMER_OFFSETS_TOPIC} is not available yet; retry")
        partition = (CONSUMER_OFFSETS_TOPIC, partition_for_id(group_id, count))
        results = await self.handle_add_partitions(transactional_id, producer_id, producer_epoch, [partition], False)
        if results[partition] is not None:
            raise results[partition]

    # --- EndTxn ------------------------------------------------------------------------------

    async def handle_end_txn(self, transactional_id, producer_id, producer_epoch, committed) -> tuple[int, int]:
        self.check_transactional_id(transactional_id)
        loaded = self.loaded_partition(transactional_id)
        return await self._carry_out(loaded, transactional_id, lambda meta, spare_ids: core.decide_end_txn(
            meta, transactional_id, producer_id, producer_epoch, committed, spare_ids))

    async def _complete(self, loaded: LoadedPartition, meta: TransactionMetadata) -> None:
        committed = meta.state is S.PREPARE_COMMIT
        producer_id, producer_epoch = ts.marker_producer(meta)
        try:
            await self._complete_inner(loaded, meta, committed, producer_id, producer_epoch)
        finally:
            done = loaded.completing.pop(meta.transactional_id, None)
            if done is not None:
                done.set()

    async def _complete_inner(self, loaded, meta, committed, producer_id, producer_epoch) -> None:
        try:
            await self.markers.write(
                meta.transactional_id, producer_id, producer_epoch, committed, loaded.owner.coordinator_epoch, meta.partitions
            )
            await self._transition(loaded, meta, S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT, **COMPLETED)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a decided transaction must be finished: reload the partition, which finishes it
            loaded.log.broken = f"completing {meta.transactional_id!r} failed: {exc}"
            log.warning("could not complete a transaction; reloading its partition", extra=fields(transactional_id=meta.transactional_id, error=str(exc)))

    # --- two-phase: PrepareTransaction, CompleteTransaction, CommitTransactionGroup ------------

    async def handle_prepare(self, transactional_id: str, producer_id: int, producer_epoch: int, prepared_timeout_ms: int) -> Handle:
        self.check_transactional_id(transactional_id)
        limit = self.config.prepared_transaction_timeout_ms
        timeout_ms = prepared_timeout_ms or limit
        if not 1 <= timeout_ms <= limit:
            raise error("INVALID_TRANSACTION_TIMEOUT", f"prepared_timeout_ms must be 0 (the default, {limit}) or 1..{limit}, got {prepared_timeout_ms}")
        loaded = self.loaded_partition(transactional_id)
        handle = Handle(transactional_id, producer_id, producer_epoch)
        return await self._carry_out(loaded, transactional_id, lambda meta, _: core.decide_prepare(meta, handle, timeout_ms, self.clock_ms()))

    async def _seal(self, loaded: LoadedPartition, meta: TransactionMetadata) -> None:
        """Tells every partition of a PREPARED transaction that it takes nothing
        more of its epoch, before PrepareTransaction answers: the leaders had
        verified the transaction's partitions once, so without the seal a zombie
        of the preparing process could still add records or offsets that the
        handle's holder would then commit."""
        await self.markers.write_all(
            [MarkerSet(meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.partitions)],
            False, loaded.owner.coordinator_epoch, seal_prepared=True,
        )

    async def _seal_quietly(self, loaded: LoadedPartition, meta: TransactionMetadata) -> None:
        try:
            await self._seal(loaded, meta)
        except TxlogError as exc:
            loaded.log.broken = f"sealing {meta.transactional_id!r} failed: {exc}"

    async def handle_complete(self, handle: Handle, committed: bool) -> tuple[int, int]:
        self.check_transactional_id(handle.transactional_id)
        loaded = self.loaded_partition(handle.transactional_id)
        return await self._carry_out(loaded, handle.transactional_id, lambda meta, spare_ids: core.decide_complete(
            meta, handle, committed, spare_ids))

    def _group_members(self, loaded: LoadedPartition, handles: list[Handle]) -> list[TransactionMetadata] | None:
        """The members to commit, all PREPARED as their handles say; None when the
        group was committed already (a repeat). Raises, changing nothing, otherwise."""
        metas = [loaded.transactions.get(h.transactional_id) for h in handles]
        done = []
        for m, h in zip(metas, handles, strict=True):
            repeat = core.repeated_outcome(m, h, True)
            if isinstance(repeat, core.Refuse):
                raise repeat.error
            done.append(repeat)
        if all(done):
            return None
        if any(done):
            raise error(
                "INVALID_TXN_STATE",
                f"{sum(done)} of the {len(handles)} transactions were committed already (e.g. "
                f"{next(h.transactional_id for h, d in zip(handles, done, strict=True) if d)!r}) and the others not: a group commits once, whole",
            )
        for meta, handle in zip(metas, handles, strict=True):
            refused = core.check_handle(meta, handle)
            if refused is not None:
                raise refused.error
        return metas

    async def handle_commit_group(self, group_id: str, handles: list[Handle]) -> None:
        names.check_transaction_group(group_id)
        if not handles:
            raise error("INVALID_REQUEST", "the request names no transaction handle")
        if len(handles) > GROUP_HANDLES_MAX:
            raise error("INVALID_REQUEST", f"at most {GROUP_HANDLES_MAX} handles per group commit, got {len(handles)}")
        seen = set()
        for handle in handles:
            self.check_transactional_id(handle.transactional_id)
            member_group = names.transaction_group(handle.transactional_id)
            if member_group != group_id:
                raise error(
                    "INVALID_REQUEST",
                    f"transactional id {handle.transactional_id!r} belongs to group {names.quoted(member_group)}, not "
                    f"{names.quoted(group_id)}: a group commit takes only its own ids (<group>/<member>)",
                )
            if handle.transactional_id in seen:
                raise error("INVALID_REQUEST", f"transactional id {handle.transactional_id!r} is named twice")
            seen.add(handle.transactional_id)
        loaded = self.loaded_partition(group_id)  # every member's partition is the group's
        spare_ids: list[int] = []
        for _ in range(3):  # producer ids for exhausted epochs are fetched first: no await between check and decision
            metas = self._group_members(loaded, handles)
            if metas is None:
                return
            exhausted = sum(1 for m in metas if ts.bumped_epoch(m.producer_id, m.producer_epoch) is None)
            if exhausted <= len(spare_ids):
                break
            spare_ids.extend([await self.producer_ids.next_id() for _ in range(exhausted - len(spare_ids))])
        else:
            raise error("CONCURRENT_TRANSACTIONS", f"the members of group {group_id!r} kept changing; retry")
        now = self.clock_ms()
        decision = GroupDecision(uuid.uuid4().hex, group_id, tuple(handles), now)
        records = []
        for m in metas:
            changes = core.epoch_bump(m, spare_ids)
            if ts.bumped_epoch(m.producer_id, m.producer_epoch) is None:
                spare_ids = spare_ids[1:]  # that id is taken
            records.append(ts.prepare_transition(m, S.PREPARE_COMMIT, last_update_ms=now, **changes))
        try:
            await loaded.log.write_decision_then(decision, records)
        except BaseException:
            for meta in metas:
                if meta.pending_state is S.PREPARE_COMMIT:
                    ts.abandon_transition(meta)
            raise
        for meta, record in zip(metas, records, strict=True):
            ts.complete_transition(meta, record)
        log.info("group commit decided", extra=fields(group_id=group_id, decision_id=decision.decision_id, members=len(metas)))
        self._start_group_completion(loaded, decision, metas)

    async def _resume_decision(self, loaded: LoadedPartition, decision: GroupDecision):
        """(decision, members, records to write) for a decision found in the log:
        members still PREPARED as the decision names them are moved to
        PREPARE_COMMIT (pending: the records are written by _finish_decision)."""
        members, records = [], []
        for handle in decision.members:
            meta = loaded.transactions.get(handle.transactional_id)
            if meta is None:
                continue
            if ts.is_prepared_as(meta, handle):
                changes = core.epoch_bump(meta, [])
                if isinstance(changes, core.NeedProducerIds):
                    changes = core.epoch_bump(meta, [await self.producer_ids.next_id()])
                records.append(ts.prepare_transition(meta, S.PREPARE_COMMIT, last_update_ms=self.clock_ms(), **changes))
                members.append(meta)
            elif meta.state is S.PREPARE_COMMIT and ts.decided_as(meta, handle):
                members.append(meta)
        return decision, members, records

    async def _finish_decision(self, loaded: LoadedPartition, decision: GroupDecision, members, records) -> None:
        try:
            await asyncio.gather(*(loaded.log.write(r) for r in records))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            loaded.log.broken = f"resuming group decision {decision.decision_id} failed: {exc}"
            return
        by_id = {r.transactional_id: r for r in records}
        for meta in members:
            if meta.transactional_id in by_id:
                ts.complete_transition(meta, by_id[meta.transactional_id])
        self._start_group_completion(loaded, decision, members)

    def _start_group_completion(self, loaded: LoadedPartition, decision: GroupDecision, members) -> None:
        loaded.decisions[decision.decision_id] = decision
        for meta in members:
            loaded.completing[meta.transactional_id] = asyncio.Event()
        self._spawn(loaded, self._complete_group(loaded, decision, members))

    async def _complete_group(self, loaded: LoadedPartition, decision: GroupDecision, members) -> None:
        """Markers of every member (one request per leader), each member's
        CompleteCommit, then the decision is removed: nothing needs it any more."""
        try:
            sets = [MarkerSet(m.transactional_id, *ts.marker_producer(m), m.partitions) for m in members]
            await self.markers.write_all(sets, True, loaded.owner.coordinator_epoch)
            await asyncio.gather(*(self._transition(loaded, m, S.COMPLETE_COMMIT, **COMPLETED) for m in members))
            await loaded.log.remove_decision(decision.decision_id)
            loaded.decisions.pop(decision.decision_id, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # decided: reload the partition, which finishes it
            loaded.log.broken = f"completing group decision {decision.decision_id} failed: {exc}"
            log.warning("could not complete a group commit; reloading its partition", extra=fields(decision_id=decision.decision_id, error=str(exc)))
        finally:
            for meta in members:
                done = loaded.completing.pop(meta.transactional_id, None)
                if done is not None:
                    done.set()

    # --- timers ----------------------------------------------------------------------------

    async def abort_timed_out(self) -> None:
        now = self.clock_ms()
        for loaded in list(self.partitions.values()):
            if not loaded.loaded or loaded.log.broken:
                continue
            for meta in list(loaded.transactions.values()):
                if meta.pending_state is not None:
                    continue
                if core.timed_out(meta, now):
                    log.info("aborting a timed-out transaction", extra=fields(transactional_id=meta.transactional_id, state=meta.state.value))
                    try:
                        await self._carry_out(loaded, meta.transactional_id, lambda m, spare_ids: core.decide_timeout(m, now, spare_ids)
                                              or core.Reply())
                    except TxlogError as exc:
                        log.warning("timeout abort failed", extra=fields(transactional_id=meta.transactional_id, error=str(exc)))
                elif meta.state.is_complete and meta.last_update_ms + self.config.transactional_id_expiration_ms < now:
                    try:
                        ts.prepare_transition(meta, S.DEAD)
                        await loaded.log.append(meta.transactional_id.encode(), None)
                        loaded.transactions.pop(meta.transactional_id, None)
                        log.info("transactional id expired", extra=fields(transactional_id=meta.transactional_id))
                    except TxlogError:
                        ts.abandon_transition(meta)

    # --- admin -------------------------------------------------------------------------------

    def list_local(self, states: set, producer_ids: set, duration_ms: int, prefix: str = "") -> list[TransactionMetadata]:
        now = self.clock_ms()
        found = []
        loading = sorted(i for i, p in self.partitions.items() if not p.loaded)
        if loading:
            raise error("COORDINATOR_LOAD_IN_PROGRESS", f"transaction log partitions {loading} are still loading; retry")
        for loaded in self.partitions.values():
            for meta in loaded.transactions.values():
                if states and meta.state not in states:
                    continue
                if producer_ids and meta.producer_id not in producer_ids:
                    continue
                if duration_ms and not (meta.state in ts.UNDECIDED_STATES and now - meta.txn_start_ms > duration_ms):
                    continue
                if not meta.transactional_id.startswith(prefix):
                    continue
                found.append(meta)
        return sorted(found, key=lambda m: m.transactional_id)

    def describe(self, transactional_id: str) -> TransactionMetadata:
        self.check_transactional_id(transactional_id)
        meta = self.loaded_partition(transactional_id).transactions.get(transactional_id)
        if meta is None:
            raise error("TRANSACTIONAL_ID_NOT_FOUND", f"transactional id {transactional_id!r} is unknown")
        return meta

    async def owner_address(self, transactional_id: str) -> tuple[int, str, int, int]:
        """(node id, address, partition, coordinator epoch) of the id's coordinator."""
        index = self.partition_of(transactional_id)
        current = await coordinators.read_owner(self.zookeeper, self.config.zookeeper_root, index)
        if current is None:
            raise error("COORDINATOR_NOT_AVAILABLE", f"transaction log partition {index} has no owner yet; retry")
        live = await asyncio.to_thread(self.registry.live, coordinators.COORDINATOR_KIND)
        address = live.get(current[0].node_id)
        if address is None:
            raise error("COORDINATOR_NOT_AVAILABLE", f"coordinator {current[0].node_id} is not live; retry")
        return current[0].node_id, address, index, current[0].coordinator_epoch
