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
COMPLETED = {"partitions": frozenset(), "txn_start_ms": -1, "prepared_ms": -1, "prepared_timeout_ms": 0}  # a Complete* record's resets
GROUP_HANDLES_MAX = 10_000
# Fatal answers read from an id's state in memory (not from the request alone): given only by a confirmed owner.
ANSWERS_FROM_STATE = frozenset(ErrorCode.Value(c) for c in (
    "INVALID_PRODUCER_ID_MAPPING", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_TXN_STATE", "TRANSACTIONAL_ID_NOT_FOUND"))


def error(code: str, message: str) -> TxlogError:
    return TxlogError(ErrorCode.Value(code), message)


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

    def _existing(self, loaded: LoadedPartition, transactional_id: str, producer_id: int) -> TransactionMetadata:
        meta = loaded.transactions.get(transactional_id)
        if meta is None or meta.state is S.DEAD:
            raise error("INVALID_PRODUCER_ID_MAPPING", f"transactional id {transactional_id!r} is unknown: call InitProducerId first")
        if producer_id != meta.producer_id:
            raise error(
                "INVALID_PRODUCER_ID_MAPPING",
                f"producer id {producer_id} is not the one of transactional id {transactional_id!r} ({meta.producer_id})",
            )
        if meta.pending_state is not None:
            raise error("CONCURRENT_TRANSACTIONS", f"a {meta.pending_state.value} of {transactional_id!r} is in flight; retry")
        return meta

    @staticmethod
    def _check_epoch(meta: TransactionMetadata, producer_epoch: int) -> None:
        if producer_epoch < meta.producer_epoch:
            raise error(
                "PRODUCER_FENCED",
                f"producer epoch {producer_epoch} of {meta.transactional_id!r} was fenced by epoch {meta.producer_epoch}: "
                "a newer producer with this transactional id exists, or the transaction was aborted; close this producer",
            )
        if producer_epoch > meta.producer_epoch:
            raise error("INVALID_PRODUCER_EPOCH", f"producer epoch {producer_epoch} is newer than {meta.producer_epoch}, which the coordinator knows")

    async def _transition(self, loaded: LoadedPartition, meta: TransactionMetadata, to_state: TransactionState, **changes) -> None:
        """Write, then apply."""
        record = ts.prepare_transition(meta, to_state, last_update_ms=self.clock_ms(), **changes)
        try:
            await loaded.log.write(record)
        except BaseException:
            ts.abandon_transition(meta)
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
        meta = loaded.transactions.get(transactional_id)
        if meta is None or meta.state is S.DEAD:
            new_id = await self.producer_ids.next_id()
            meta = loaded.transactions.get(transactional_id)  # another init may have created it meanwhile
            if meta is None or meta.state is S.DEAD:
                return await self._register(loaded, transactional_id, new_id, timeout_ms)
        if meta.pending_state is not None:
            raise error("CONCURRENT_TRANSACTIONS", f"a {meta.pending_state.value} of {transactional_id!r} is in flight; retry")
        kip360 = producer_id >= 0  # a producer that knows its id and epoch asks for a bump (KIP-360)
        if kip360 and ts.is_retried_init(meta, producer_id, producer_epoch):
            return meta.producer_id, meta.producer_epoch  # its first attempt bumped the epoch; the answer was lost
        if kip360 and (producer_id != meta.producer_id or producer_epoch != meta.producer_epoch):
            raise error(
                "PRODUCER_FENCED",
                f"producer {producer_id} epoch {producer_epoch} is not the current one of {transactional_id!r}; close this producer",
            )
        if meta.state in ts.UNDECIDED_STATES:
            if kip360:  # the current producer's own transaction: aborted as its EndTxn(abort) would
                await self._begin_completion(loaded, meta, committed=False)
            else:  # a new incarnation: the previous one is a zombie, fenced
                await self._fence_and_abort(loaded, meta)
            raise error("CONCURRENT_TRANSACTIONS", f"aborting the open transaction of {transactional_id!r} first; retry")
        if meta.state.is_preparing:
            raise error("CONCURRENT_TRANSACTIONS", f"the last transaction of {transactional_id!r} is completing; retry")
        bumped = ts.bumped_epoch(meta.producer_id, meta.producer_epoch)
        if bumped is None:
            new_id, new_epoch, previous = await self.producer_ids.next_id(), 0, meta.producer_id
        else:
            (new_id, new_epoch), previous = bumped, meta.previous_producer_id
        # The last epoch recognises a retry of this init: only the requester's own epoch (a new
        # incarnation names none, and the epoch it replaces must not be taken for a retry).
        await self._transition(
            loaded, meta, S.EMPTY, producer_id=new_id, producer_epoch=new_epoch, previous_producer_id=previous,
            last_producer_epoch=producer_epoch if kip360 else ts.NO_EPOCH, txn_timeout_ms=timeout_ms,
            partitions=frozenset(), txn_start_ms=-1,
        )
        return new_id, new_epoch

    async def _register(self, loaded: LoadedPartition, transactional_id: str, producer_id: int, timeout_ms: int) -> tuple[int, int]:
        """A new transactional id: its first record, EMPTY at epoch 0. No await
        between the caller's check that the id is new and the pending state."""
        meta = TransactionMetadata(transactional_id, producer_id, 0, timeout_ms, pending_state=S.EMPTY)
        loaded.transactions[transactional_id] = meta
        record = ts.TransactionRecord(transactional_id, producer_id, ts.NO_PRODUCER_ID, 0, ts.NO_EPOCH, timeout_ms, S.EMPTY, frozenset(), -1, self.clock_ms())
        try:
            await loaded.log.write(record)
        except BaseException:
            loaded.transactions.pop(transactional_id, None)
            raise
        ts.complete_transition(meta, record)
        return meta.producer_id, meta.producer_epoch

    async def _fence_and_abort(self, loaded: LoadedPartition, meta: TransactionMetadata) -> None:
        """Aborts an Ongoing or Prepared transaction whose producer is replaced by
        a new incarnation: PREPARE_EPOCH_FENCE bumps the epoch and the abort bumps
        it again, so the zombie's epoch is neither the current nor the last one."""
        ts.prepare_transition(meta, S.PREPARE_EPOCH_FENCE)
        ts.abandon_transition(meta)  # the fence is pending-only: the PrepareAbort below is what is written
        fenced = ts.fenced_epoch(meta.producer_id, meta.producer_epoch)
        if fenced is not None:
            changes = {"producer_epoch": fenced[1], "last_producer_epoch": fenced[2]}
        else:  # exhausted: a new id; the markers carry the old one at the last epoch, which no zombie holds
            changes = {"producer_id": await self.producer_ids.next_id(), "producer_epoch": 0,
                       "previous_producer_id": meta.producer_id, "last_producer_epoch": ts.PRODUCER_EPOCH_MAX}
        await self._begin_completion(loaded, meta, committed=False, changes=changes)

    # --- AddPartitionsToTxn, AddOffsetsToTxn -------------------------------------------

    async def handle_add_partitions(self, transactional_id, producer_id, producer_epoch, partitions, verify_only) -> dict:
        """{(topic, partition): None (ok) or a TxlogError}."""
        self.check_transactional_id(transactional_id)
        loaded = self.loaded_partition(transactional_id)
        if verify_only:
            meta = loaded.transactions.get(transactional_id)
            if meta is not None and meta.producer_id == producer_id:
                self._check_epoch(meta, producer_epoch)  # a zombie is fenced, not merely refused
            ok = meta is not None and meta.producer_id == producer_id and meta.producer_epoch == producer_epoch and meta.state is S.ONGOING
            return {
                tp: None if ok and tp in meta.partitions else error("INVALID_TXN_STATE", f"{tp[0]}-{tp[1]} is not in an open transaction of producer {producer_id} epoch {producer_epoch}")
                for tp in partitions
            }
        done = loaded.completing.get(transactional_id)
        if done is not None and not done.is_set():  # the previous transaction is completing: wait rather than bounce the client
            with contextlib.suppress(TimeoutError):  # still completing: CONCURRENT_TRANSACTIONS below
                await asyncio.wait_for(done.wait(), timeout=5)
        unknown = await self._unknown_partitions(partitions)
        # No await from here to the transition: a concurrent AddPartitions/AddOffsets of the same id
        # must see this one pending (CONCURRENT_TRANSACTIONS), never slip in between check and write.
        meta = self._existing(loaded, transactional_id, producer_id)
        self._check_epoch(meta, producer_epoch)
        if meta.state.is_preparing:
            raise error("CONCURRENT_TRANSACTIONS", f"the last transaction of {transactional_id!r} is completing; retry")
        if meta.state is S.PREPARED:
            raise error("INVALID_TXN_STATE", f"the transaction of {transactional_id!r} is prepared: it takes nothing more; complete it first")
        wanted = frozenset(tp for tp in partitions if tp not in unknown)
        if wanted and not (meta.state is S.ONGOING and wanted <= meta.partitions):
            start = meta.txn_start_ms if meta.state is S.ONGOING else self.clock_ms()
            await self._transition(loaded, meta, S.ONGOING, partitions=meta.partitions | wanted, txn_start_ms=start)
        return {tp: unknown.get(tp) for tp in partitions}

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
        meta = loaded.transactions.get(transactional_id)
        retry = meta is not None and ts.settled(meta) and ts.is_retried_end(meta, producer_id, producer_epoch)
        if not retry:
            meta = self._existing(loaded, transactional_id, producer_id)
        outcome_commit = {S.PREPARE_COMMIT, S.COMPLETE_COMMIT}
        outcome_abort = {S.PREPARE_ABORT, S.COMPLETE_ABORT}
        if retry and meta.state in outcome_commit | outcome_abort:
            # A retried EndTxn whose first attempt was applied (Transactions V2 table).
            if (meta.state in outcome_commit) == committed:
                return meta.producer_id, meta.producer_epoch
            if committed:  # the coordinator aborted it (timeout): the commit never happened
                raise error("PRODUCER_FENCED", f"the transaction of {transactional_id!r} was aborted by the coordinator (timeout or fence); close this producer")
            raise error("INVALID_TXN_STATE", f"the transaction of {transactional_id!r} committed already; it cannot be aborted")
        if retry:  # the retry of an EndTxn whose transaction is long over: the id moved on
            meta = self._existing(loaded, transactional_id, producer_id)
        self._check_epoch(meta, producer_epoch)
        if meta.state.is_preparing:
            raise error("CONCURRENT_TRANSACTIONS", f"the last transaction of {transactional_id!r} is completing; retry")
        if meta.state not in ts.UNDECIDED_STATES and committed:
            raise error("INVALID_TXN_STATE", f"{transactional_id!r} has no open transaction to commit (nothing was added to it)")
        # Aborting a transaction with nothing in it bumps the epoch too (Transactions V2): a late
        # AddPartitions of the old epoch is then fenced instead of opening a phantom transaction.
        await self._begin_completion(loaded, meta, committed)
        return meta.producer_id, meta.producer_epoch

    @staticmethod
    def _bump(meta: TransactionMetadata, spare_ids: list[int]) -> dict:
        """The record changes of deciding ``meta``'s transaction: the epoch bumped;
        when it is exhausted, a new producer id from ``spare_ids`` at epoch 0 (the
        markers carry the old one, ts.marker_producer)."""
        bumped = ts.bumped_epoch(meta.producer_id, meta.producer_epoch)
        if bumped is not None:
            return {"producer_epoch": bumped[1], "last_producer_epoch": meta.producer_epoch}
        return {"producer_id": spare_ids.pop(), "producer_epoch": 0, "previous_producer_id": meta.producer_id, "last_producer_epoch": meta.producer_epoch}

    async def _spare_ids(self, metas) -> list[int]:
        """New producer ids for those of ``metas`` whose epoch is exhausted."""
        return [await self.producer_ids.next_id() for m in metas if ts.bumped_epoch(m.producer_id, m.producer_epoch) is None]

    async def _begin_completion(self, loaded: LoadedPartition, meta: TransactionMetadata, committed: bool, changes: dict | None = None) -> None:
        """Writes the decision (Prepare*, epoch bumped), then completes it in the background."""
        if changes is None:
            changes = self._bump(meta, await self._spare_ids([meta]))
        to_state = S.PREPARE_COMMIT if committed else S.PREPARE_ABORT
        if meta.pending_state is not None or meta.state not in ts.VALID_PREVIOUS_STATES[to_state]:
            # something moved the id while a producer id was fetched
            raise error("CONCURRENT_TRANSACTIONS", f"{meta.transactional_id!r} changed meanwhile ({meta.state.value}); retry")
        await self._transition(loaded, meta, to_state, **changes)
        loaded.completing[meta.transactional_id] = asyncio.Event()
        self._spawn(loaded, self._complete(loaded, meta))

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
        meta = loaded.transactions.get(transactional_id)
        if meta is not None and meta.pending_state is None and ts.is_prepared_as(meta, handle):
            await self._seal(loaded, meta)  # a retry whose first attempt was applied: it may not have sealed
            return handle
        meta = self._existing(loaded, transactional_id, producer_id)
        self._check_epoch(meta, producer_epoch)
        if meta.state.is_preparing:
            raise error("CONCURRENT_TRANSACTIONS", f"the last transaction of {transactional_id!r} is completing; retry")
        now = self.clock_ms()
        start = meta.txn_start_ms if meta.state is S.ONGOING else now
        await self._transition(loaded, meta, S.PREPARED, prepared_ms=now, prepared_timeout_ms=timeout_ms, txn_start_ms=start)
        await self._seal(loaded, meta)
        return handle

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

    def _check_handle(self, loaded: LoadedPartition, handle: Handle) -> TransactionMetadata:
        """The prepared transaction ``handle`` names; raises (as for a producer's
        request with that id and epoch) unless it is Prepared at that epoch."""
        meta = self._existing(loaded, handle.transactional_id, handle.producer_id)
        self._check_epoch(meta, handle.producer_epoch)
        if meta.state is not S.PREPARED:
            raise error("INVALID_TXN_STATE", f"the transaction of {handle.transactional_id!r} is {meta.state.value}, "
                                             "not Prepared: call PrepareTransaction first")
        return meta

    @staticmethod
    def _check_outcome(meta: TransactionMetadata, handle: Handle, committed: bool) -> bool:
        """True when the transaction ``handle`` names was decided as asked
        already (a repeat); raises when it was decided the other way."""
        decided = ts.decided_as(meta, handle)
        if decided is None:
            return False
        if decided == committed:
            return True
        if committed:
            raise error(
                "PRODUCER_FENCED",
                f"the transaction of {handle.transactional_id!r} was aborted (CompleteTransaction(abort), its prepared timeout, "
                "or a new producer with its id): it cannot commit",
            )
        raise error("INVALID_TXN_STATE", f"the transaction of {handle.transactional_id!r} was committed already: it cannot be aborted")

    async def handle_complete(self, handle: Handle, committed: bool) -> tuple[int, int]:
        self.check_transactional_id(handle.transactional_id)
        loaded = self.loaded_partition(handle.transactional_id)
        meta = loaded.transactions.get(handle.transactional_id)
        if meta is not None and ts.settled(meta) and self._check_outcome(meta, handle, committed):
            return meta.producer_id, meta.producer_epoch
        meta = self._check_handle(loaded, handle)
        await self._begin_completion(loaded, meta, committed)
        return meta.producer_id, meta.producer_epoch

    def _group_members(self, loaded: LoadedPartition, handles: list[Handle]) -> list[TransactionMetadata] | None:
        """The members to commit, all PREPARED as their handles say; None when the
        group was committed already (a repeat). Raises, changing nothing, otherwise."""
        metas = [loaded.transactions.get(h.transactional_id) for h in handles]
        done = [m is not None and ts.settled(m) and self._check_outcome(m, h, True) for m, h in zip(metas, handles, strict=True)]
        if all(done):
            return None
        if any(done):
            raise error(
                "INVALID_TXN_STATE",
                f"{sum(done)} of the {len(handles)} transactions were committed already (e.g. "
                f"{next(h.transactional_id for h, d in zip(handles, done, strict=True) if d)!r}) and the others not: a group commits once, whole",
            )
        return [self._check_handle(loaded, handle) for handle in handles]

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
        records = [ts.prepare_transition(m, S.PREPARE_COMMIT, last_update_ms=now, **self._bump(m, spare_ids)) for m in metas]
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
                changes = self._bump(meta, await self._spare_ids([meta]))
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
                timed_out = (meta.state is S.ONGOING and meta.txn_start_ms + meta.txn_timeout_ms < now) or (
                    meta.state is S.PREPARED and meta.prepared_ms + meta.prepared_timeout_ms < now
                )
                if timed_out:
                    log.info("aborting a timed-out transaction", extra=fields(transactional_id=meta.transactional_id, state=meta.state.value))
                    try:
                        await self._begin_completion(loaded, meta, committed=False)
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
