"""The transaction coordinator: one ``handle_*`` per request, completion of
decided transactions (markers, group decisions, seals), and the timers. Each
handler is core -> write -> complete -> answer: the rules are
transaction_core's (pure), the partitions this node serves and their
ownership are state_manager's, the transaction log is txn_log's.

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
  (CommitTransactionGroup), by its own prepared timeout, by a new producer
  with its id, or by its group's checker when its owner went silent
  (check_back.py: the answer is applied as CompleteTransaction would be). A group decision record naming every member is durable before
  any member moves on; a coordinator loading the partition finishes it.
- Epochs (Transactions V2): EndTxn and every coordinator-initiated abort bump
  the producer epoch; nothing sent with an older epoch can join, commit or abort
  a later transaction.
- Ownership (state_manager.py): each __transaction_state partition is served
  by the coordinator that ZooKeeper names its owner, with a coordinator epoch
  that grows at every change of owner. The new owner first writes a fence
  record with its epoch, so a deposed owner can neither write the log nor
  (partition leaders compare coordinator epochs) write markers.

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
import logging
import time
import uuid
from collections.abc import Callable

from opentelemetry.metrics import Meter, NoOpMeter

from coordinator_svc import check_rules
from coordinator_svc import transaction_core as core
from coordinator_svc import transaction_state as ts
from coordinator_svc.check_back import CheckBack
from coordinator_svc.coordinator_config import CoordinatorConfig
from coordinator_svc.markers import MarkerSender, MarkerSet
from coordinator_svc.state_manager import LoadedPartition, TransactionStateManager
from coordinator_svc.transaction_metrics import TransactionMetrics
from coordinator_svc.transaction_state import GroupDecision, Handle, TransactionMetadata, TransactionState
from services.coordination.producer_ids import ProducerIdSource
from services.coordination.rpc import PeerClient
from services.runtime.logs import fields
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, names
from txlog.protocol.errors import TxlogError
from txlog.protocol.hashing import partition_for_id
from txlog.v1 import partition_pb2

log = logging.getLogger(__name__)
S = TransactionState
COMPLETED = core.COMPLETED
ADD_WAIT_S_MAX = 5.0  # an add waits this long at most for the id's completion or other adds in flight


error = core.error


def _retrieved(future: asyncio.Future) -> None:
    """Marks an add's outcome seen even when its caller left (no "exception never retrieved")."""
    if not future.cancelled():
        future.exception()


class TransactionCoordinator:
    def __init__(
        self,
        config: CoordinatorConfig,
        zookeeper,
        registry,
        client: PeerClient,
        producer_ids: ProducerIdSource,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        monotonic: Callable[[], float] = time.monotonic,
        markers: MarkerSender | None = None,
        meter: Meter | None = None,
    ):
        self.config = config
        self.client = client
        self.markers = markers or MarkerSender(client)
        self.producer_ids = producer_ids
        self.clock_ms = clock_ms
        self.state = TransactionStateManager(config, zookeeper, registry, client, producer_ids, self._resume, clock_ms, monotonic)
        self.metrics = TransactionMetrics(meter or NoOpMeter("txlog"), lambda: list(self.state.partitions.values()), clock_ms)
        self.check_back = CheckBack(self, config.checks_in_flight_max, monotonic)

    async def _resume(self, loaded: LoadedPartition, decisions: list[GroupDecision]) -> None:
        """A partition's records are in memory: group decisions first, before any
        request is served (their members still PREPARED move to PREPARE_COMMIT,
        pending until written, so no one can abort them); then every decided
        transaction is finished and every prepared one sealed again."""
        resumed = [await self._resume_decision(loaded, decision) for decision in decisions]
        loaded.loaded = True
        log.info("loaded transaction log partition", extra=fields(partition=loaded.index, transactional_ids=len(loaded.transactions), group_decisions=len(resumed)))
        in_groups = set()
        for decision, members, records_to_write in resumed:
            in_groups.update(m.transactional_id for m in members)
            self.state.spawn(loaded, self._finish_decision(loaded, decision, members, records_to_write))
        for meta in loaded.transactions.values():
            if meta.state.is_preparing and meta.transactional_id not in in_groups:  # decided before the previous owner stopped: finish it
                self.state.spawn(loaded, self._complete(loaded, meta))
            elif meta.state is S.PREPARED:  # the previous owner may have stopped before sealing it
                self.state.spawn(loaded, self._seal_quietly(loaded, meta))

    async def carry_out(self, loaded: LoadedPartition, transactional_id: str, decide: Callable[[TransactionMetadata | None, list[int]], core.Outcome]):
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
        new = meta is None or meta.state is S.DEAD
        if new:  # not in the log until its first record is: forgotten again if that write fails
            meta = loaded.transactions[transactional_id] = TransactionMetadata(transactional_id, ts.NO_PRODUCER_ID, ts.NO_EPOCH, 0)
        if outcome.fence:
            ts.check_transition(meta, S.PREPARE_EPOCH_FENCE)
        try:
            await self._transition(loaded, meta, outcome.to_state, **outcome.changes)
        except BaseException:
            if new and loaded.transactions.get(transactional_id) is meta:
                loaded.transactions.pop(transactional_id)
            raise
        if outcome.fence:
            self.metrics.fenced.add(1)
        if outcome.then is core.Then.COMPLETE:
            loaded.completing[meta.transactional_id] = asyncio.Event()
            self.state.spawn(loaded, self._complete(loaded, meta))
        elif outcome.then is core.Then.SEAL:
            await self._seal(loaded, meta)
        if isinstance(outcome.reply, TxlogError):
            raise outcome.reply
        return self._answer(outcome.reply, meta)

    @staticmethod
    def _answer(value, meta: TransactionMetadata | None):
        return (meta.producer_id, meta.producer_epoch) if value is core.Answer.PRODUCER else value

    async def _transition(self, loaded: LoadedPartition, meta: TransactionMetadata, to_state: TransactionState, **changes) -> None:
        """Write, then apply."""
        record = ts.prepare_transition(meta, to_state, last_update_ms=self.clock_ms(), **changes)
        # an add being written: the id's other adds wait for it (_until_ready_to_add); no other write is waited on
        written = asyncio.Event() if to_state is S.ONGOING else None
        if written is not None:
            loaded.writing[meta.transactional_id] = written
        try:
            await loaded.log.write(record)
        except BaseException:
            ts.abandon_transition(meta)
            raise
        finally:
            if written is not None:
                written.set()
                if loaded.writing.get(meta.transactional_id) is written:
                    del loaded.writing[meta.transactional_id]
        before = meta.state
        loaded.complete_transition(meta, record)
        self.metrics.transitioned(before, meta.state)

    # --- InitProducerId --------------------------------------------------------------------

    async def handle_init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        if not transactional_id:
            return await self.producer_ids.next_id(), 0
        names.check_transactional_id(transactional_id)
        if not 1 <= timeout_ms <= self.config.transaction_timeout_ms_max:
            raise error("INVALID_TRANSACTION_TIMEOUT", f"transaction_timeout_ms must be 1..{self.config.transaction_timeout_ms_max}, got {timeout_ms}")
        loaded = self.state.loaded_partition(transactional_id)
        return await self.carry_out(loaded, transactional_id, lambda meta, spare_ids: core.decide_init(
            meta, transactional_id, timeout_ms, producer_id, producer_epoch, spare_ids))

    # --- AddPartitionsToTxn, AddOffsetsToTxn -------------------------------------------

    async def handle_add_partitions(self, transactional_id, producer_id, producer_epoch, partitions, verify_only) -> dict:
        """{(topic, partition): None (ok) or a TxlogError}."""
        names.check_transactional_id(transactional_id)
        loaded = self.state.loaded_partition(transactional_id)
        if verify_only:
            verified = core.verify_partitions(loaded.transactions.get(transactional_id), producer_id, producer_epoch, partitions)
            if isinstance(verified, core.Refuse):
                raise verified.error
            return verified
        unknown = await self._unknown_partitions(partitions)
        if transactional_id in loaded.next_adds:
            return await self._add_with_completion(loaded, transactional_id, core.NextAdd(producer_id, producer_epoch, tuple(partitions), unknown))
        await self._until_ready_to_add(loaded, transactional_id)
        return await self.carry_out(loaded, transactional_id, lambda meta, _: core.decide_add_partitions(
            meta, transactional_id, producer_id, producer_epoch, partitions, unknown, self.clock_ms()))

    @staticmethod
    async def _until_ready_to_add(loaded: LoadedPartition, transactional_id: str) -> None:
        """Waits (ADD_WAIT_S_MAX at most; then CONCURRENT_TRANSACTIONS, which the
        caller retries) while the id's previous transaction is completing or
        another add of it is being written, rather than bounce the caller: with
        implicit adds (KIP-890 part 2) every leader of a transaction's first
        batches adds its partitions at once, and the first batches of the next
        transaction arrive while the markers of the last are written."""
        deadline = asyncio.get_running_loop().time() + ADD_WAIT_S_MAX
        while True:
            meta = loaded.transactions.get(transactional_id)
            completing, writing = loaded.completing.get(transactional_id), loaded.writing.get(transactional_id)
            if completing is not None and not completing.is_set():
                wait = completing
            elif writing is not None and meta is not None and meta.pending_state is S.ONGOING:
                wait = writing
            else:
                return
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wait.wait(), left)

    @staticmethod
    async def _add_with_completion(loaded: LoadedPartition, transactional_id: str, add: core.NextAdd) -> dict:
        """An add of the id's next transaction while the markers of its last one
        are written: decided with that completion, whose record it then shares
        (one transaction-log write instead of Complete* and then Ongoing). Waits
        ADD_WAIT_S_MAX at most for the markers, then CONCURRENT_TRANSACTIONS."""
        waiting = loaded.next_adds[transactional_id]
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        waiting.append((add, future))
        try:
            return await asyncio.wait_for(asyncio.shield(future), ADD_WAIT_S_MAX)
        except TimeoutError:
            if loaded.next_adds.get(transactional_id) is waiting:  # not taken yet: leave
                waiting.remove((add, future))
                raise error("CONCURRENT_TRANSACTIONS", f"the last transaction of {transactional_id!r} is still completing; retry") from None
            return await future  # taken with the completion: its record is being written

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
        names.check_transactional_id(transactional_id)
        loaded = self.state.loaded_partition(transactional_id)
        return await self.carry_out(loaded, transactional_id, lambda meta, spare_ids: core.decide_end_txn(
            meta, transactional_id, producer_id, producer_epoch, committed, spare_ids))

    async def _complete(self, loaded: LoadedPartition, meta: TransactionMetadata) -> None:
        committed = meta.state is S.PREPARE_COMMIT
        producer_id, producer_epoch = ts.marker_producer(meta)
        next_adds = loaded.next_adds[meta.transactional_id] = []
        try:
            await self._complete_inner(loaded, meta, committed, producer_id, producer_epoch)
        finally:
            if loaded.next_adds.get(meta.transactional_id) is next_adds:
                del loaded.next_adds[meta.transactional_id]
            for _, future in next_adds:  # not answered: the completion failed or stopped here (the partition is reloaded or left)
                if not future.done():
                    future.set_exception(error("NOT_COORDINATOR", f"the last transaction of {meta.transactional_id!r} did not complete here; retry"))
            done = loaded.completing.pop(meta.transactional_id, None)
            if done is not None:
                done.set()

    async def _complete_inner(self, loaded, meta, committed, producer_id, producer_epoch) -> None:
        try:
            await self.markers.write(
                meta.transactional_id, producer_id, producer_epoch, committed, loaded.owner.coordinator_epoch, meta.partitions
            )
            next_adds = loaded.next_adds.pop(meta.transactional_id, [])  # from here on an add waits for the record below
            await self._complete_into_next(loaded, meta, list(next_adds))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a decided transaction must be finished: reload the partition, which finishes it
            loaded.log.broken = f"completing {meta.transactional_id!r} failed: {exc}"
            log.warning("could not complete a transaction; reloading its partition", extra=fields(transactional_id=meta.transactional_id, error=str(exc)))

    async def _complete_into_next(self, loaded: LoadedPartition, meta: TransactionMetadata, next_adds: list) -> None:
        """Every marker is written: one record completes the transaction and, if
        an add of the next one opened it, opens that one too
        (core.decide_completion_into_next; with no add, Complete* alone); each
        add is answered once it is durable."""
        changes, outcomes = core.decide_completion_into_next(meta, [add for add, _ in next_adds], self.clock_ms())
        try:
            if changes is None:
                await self._transition(loaded, meta, S.COMPLETE_COMMIT if meta.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT, **COMPLETED)
            else:
                await self._transition(loaded, meta, S.ONGOING, **changes)
        except BaseException as exc:
            failed = exc if isinstance(exc, TxlogError) else error("NOT_COORDINATOR", f"the transaction log write failed: {exc}; retry")
            for _, future in next_adds:
                if not future.done():
                    future.set_exception(failed)
            raise
        for (_, future), outcome in zip(next_adds, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, core.Refuse):
                future.set_exception(outcome.error)
            else:
                future.set_result(outcome.value if isinstance(outcome, core.Reply) else outcome.reply)

    # --- two-phase: PrepareTransaction, CompleteTransaction, CommitTransactionGroup ------------

    async def handle_prepare(self, transactional_id: str, producer_id: int, producer_epoch: int, prepared_timeout_ms: int,
                             metadata: bytes = b"") -> Handle:
        names.check_transactional_id(transactional_id)
        limit = self.config.prepared_transaction_timeout_ms
        timeout_ms = prepared_timeout_ms or limit
        if not 1 <= timeout_ms <= limit:
            raise error("INVALID_TRANSACTION_TIMEOUT", f"prepared_timeout_ms must be 0 (the default, {limit}) or 1..{limit}, got {prepared_timeout_ms}")
        if len(metadata) > check_rules.PREPARE_METADATA_BYTES_MAX:
            raise error("INVALID_REQUEST", f"prepare_metadata holds {len(metadata):,} bytes; at most {check_rules.PREPARE_METADATA_BYTES_MAX:,}")
        loaded = self.state.loaded_partition(transactional_id)
        handle = Handle(transactional_id, producer_id, producer_epoch)
        return await self.carry_out(loaded, transactional_id, lambda meta, _: core.decide_prepare(meta, handle, timeout_ms, self.clock_ms(), metadata))

    async def _seal(self, loaded: LoadedPartition, meta: TransactionMetadata) -> None:
        """Tells every partition of a PREPARED transaction that it takes nothing
        more of its epoch, before PrepareTransaction answers: the leaders had
        verified the transaction's partitions once, so without the seal a zombie
        of the preparing process could still add records or offsets that the
        handle's holder would then commit."""
        with self.check_back.held_while_sealing(meta.transactional_id):
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
        names.check_transactional_id(handle.transactional_id)
        loaded = self.state.loaded_partition(handle.transactional_id)
        return await self.carry_out(loaded, handle.transactional_id, lambda meta, spare_ids: core.decide_complete(
            meta, handle, committed, spare_ids))

    async def handle_commit_group(self, group_id: str, handles: list[Handle]) -> None:
        names.check_transaction_group(group_id)
        for handle in handles:
            names.check_transactional_id(handle.transactional_id)
        refused = core.check_group_request(group_id, handles)
        if refused is not None:
            raise refused.error
        loaded = self.state.loaded_partition(group_id)  # every member's partition is the group's
        spare_ids: list[int] = []
        for _ in range(3):  # producer ids for exhausted epochs are fetched first: no await between decision and transitions
            outcome = core.decide_group_commit([loaded.transactions.get(h.transactional_id) for h in handles], handles, spare_ids)
            if not isinstance(outcome, core.NeedProducerIds):
                break
            spare_ids += [await self.producer_ids.next_id() for _ in range(outcome.count)]
        else:
            raise error("CONCURRENT_TRANSACTIONS", f"the members of group {group_id!r} kept changing; retry")
        if isinstance(outcome, core.Refuse):
            raise outcome.error
        if isinstance(outcome, core.Reply):
            return
        now = self.clock_ms()
        decision = GroupDecision(uuid.uuid4().hex, group_id, tuple(handles), now)
        metas = list(outcome.members)
        records = [ts.prepare_transition(m, S.PREPARE_COMMIT, last_update_ms=now, **changes)
                   for m, changes in zip(metas, outcome.changes, strict=True)]
        try:
            await loaded.log.write_decision_then(decision, records)
        except BaseException:
            for meta in metas:
                if meta.pending_state is S.PREPARE_COMMIT:
                    ts.abandon_transition(meta)
            raise
        for meta, record in zip(metas, records, strict=True):
            loaded.complete_transition(meta, record)
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
                loaded.complete_transition(meta, by_id[meta.transactional_id])
        self._start_group_completion(loaded, decision, members)

    def _start_group_completion(self, loaded: LoadedPartition, decision: GroupDecision, members) -> None:
        loaded.decisions[decision.decision_id] = decision
        for meta in members:
            loaded.completing[meta.transactional_id] = asyncio.Event()
        self.state.spawn(loaded, self._complete_group(loaded, decision, members))

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
        """One pass of the timers: aborts the transactions past their timeout (or
        prepared timeout) and expires the ids idle past their expiration. Only
        the ids whose due time came are taken from the partitions' indexes
        (state_manager.DeadlineIndex), each looked at again with the rules;
        one that is not due after all (moved on since) is put back at its
        current time, one whose transition is in flight (or whose abort failed)
        at the next pass. The loop is yielded every PASS_IDS_PER_YIELD ids (TransactionStateManager.take_due)."""
        now = self.clock_ms()
        expiration_ms = self.config.transactional_id_expiration_ms
        for loaded in list(self.state.partitions.values()):
            if not loaded.loaded or loaded.log.broken:
                continue
            next_pass: list[TransactionMetadata] = []
            async for meta in self.state.take_due(loaded, loaded.timeouts, now):
                try:
                    if meta.pending_state is not None:
                        next_pass.append(meta)  # looked at again once its transition is written or abandoned
                    elif core.timed_out(meta, now):
                        next_pass.append(meta)  # aborted: its due times moved already; refused: tried again next pass
                        await self._abort_timed_out(loaded, meta, now)
                    else:
                        loaded.schedule(meta)  # moved on since: due later, or never
                except Exception:  # not a refusal (those are logged where they happen): the id stays due
                    log.exception("aborting a timed-out transaction failed", extra=fields(transactional_id=meta.transactional_id))
                    next_pass.append(meta)
            async for meta in self.state.take_due(loaded, loaded.idle, now - expiration_ms - 1):
                try:
                    if meta.pending_state is not None:
                        next_pass.append(meta)
                    elif core.expired(meta, now, expiration_ms):
                        if not await self._expire(loaded, meta, now):
                            next_pass.append(meta)
                    else:
                        loaded.schedule(meta)
                except Exception:
                    log.exception("expiring a transactional id failed", extra=fields(transactional_id=meta.transactional_id))
                    next_pass.append(meta)
            for meta in next_pass:
                self.state.reschedule(loaded, meta)

    async def _abort_timed_out(self, loaded: LoadedPartition, meta: TransactionMetadata, now: int) -> None:
        log.info("aborting a timed-out transaction", extra=fields(transactional_id=meta.transactional_id, state=meta.state.value))
        decided: list[core.Outcome | None] = []

        def decide(m, spare_ids):
            decided.append(core.decide_timeout(m, now, spare_ids))
            return decided[-1] or core.Reply()
        try:
            await self.carry_out(loaded, meta.transactional_id, decide)
            if isinstance(decided[-1], core.Transit):
                self.metrics.timed_out.add(1)
        except TxlogError as exc:
            log.warning("timeout abort failed", extra=fields(transactional_id=meta.transactional_id, error=str(exc)))

    async def _expire(self, loaded: LoadedPartition, meta: TransactionMetadata, now: int) -> bool:
        """The id leaves the log (a tombstone) and memory; False when the tombstone could not be written."""
        record = ts.prepare_transition(meta, S.DEAD, last_update_ms=now)
        try:
            await loaded.log.append(meta.transactional_id.encode(), None)  # a tombstone: the id leaves the log
        except BaseException as exc:  # whatever it was, the id is not left pending for ever
            ts.abandon_transition(meta)
            if isinstance(exc, TxlogError):
                return False
            raise
        loaded.complete_transition(meta, record)
        loaded.transactions.pop(meta.transactional_id, None)
        log.info("transactional id expired", extra=fields(transactional_id=meta.transactional_id))
        return True

    # --- admin -------------------------------------------------------------------------------

    async def alter_group_config(self, group_id: str, to_set: dict[str, str], to_delete: list[str]) -> dict[str, str]:
        """Changes a transaction group's check-back settings: written to the
        group's transaction-log partition, then applied (one change at a time)."""
        names.check_transaction_group(group_id)
        loaded = self.state.loaded_partition(group_id)
        async with loaded.config_changes:
            config = check_rules.altered(self.state.group_config(loaded, group_id), to_set, to_delete)
            await loaded.log.write_group_config(group_id, dict(config.overrides))
            if config.overrides:
                loaded.group_configs[group_id] = config
            else:
                loaded.group_configs.pop(group_id, None)
            loaded.reschedule_group(group_id)  # its prepared transactions' check times follow the new settings
        log.info("transaction group settings changed", extra=fields(group_id=group_id, overrides=dict(config.overrides)))
        return config.configs()

    def group_config(self, group_id: str) -> check_rules.GroupCheckConfig:
        names.check_transaction_group(group_id)
        return self.state.group_config(self.state.loaded_partition(group_id), group_id)
