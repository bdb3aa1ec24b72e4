"""An in-memory stand-in for the partition servers, for unit tests of the SDK.

:class:`FakeCluster` implements the :class:`~txlog.transport.Transport`
interface (``call`` / ``close``) and answers Metadata, InitProducerId (empty
transactional id), Produce, Fetch and ListOffsets the way partition_svc does,
including the leader's idempotence rules of docs/design.md ("Idempotent produce"):

the real ones, ``partition_svc.producer_state.check_batch`` and
``after_append`` on the real ``ProducerStateEntry`` (duplicates of the last 5
batches answered their original offsets, fenced and out-of-order batches
refused, transactional rules 5 and 6), so the fake cannot drift from them.

Faults tests can script: answers dropped after the append or requests dropped
before it (``fault_injection``), random delays that reorder concurrent requests
(``delay_ms_max``), answers of chosen Produce calls lost
(``lost_produce_answers``), leadership moves (:meth:`FakeCluster.move_leader`), and
per-partition errors for chosen Produce calls (:meth:`FakeCluster.fail_produce`).
The SDK's code under test is the real one; only the network is fake.

Transactions
------------
The fake also plays one transaction coordinator (at ``coordinator_address``)
and the group coordinator (the first partition server). Its decisions are the
coordinator's own rules (``coordinator_svc.transaction_core`` on the real
``TransactionMetadata`` and state table), carried out at once: the log write,
and for a decided transaction the markers and Complete*, happen within the
call (so InitProducerId fencing an open transaction answers
CONCURRENT_TRANSACTIONS with the abort already complete). It answers
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
(pending offsets applied by the COMMIT marker), OffsetCommit/OffsetFetch,
ListTransactions, DescribeTransactions, AbortTransaction and DescribeProducers. Leaders verify transactional batches
with the coordinator (an older epoch: PRODUCER_FENCED; a partition not in the
transaction: INVALID_TXN_STATE) and fence batches whose epoch is below the one
a marker set. Fetch honours ``read_committed`` (nothing at or above the LSO,
aborted records dropped). Scripting: :meth:`FakeCluster.fail_next` (request-level
errors of the next calls of an rpc, before or after handling it),
:meth:`FakeCluster.fail_add_partitions`, :meth:`FakeCluster.move_coordinator`,
:meth:`FakeCluster.start_other_producer` (a zombie maker),
:meth:`FakeCluster.inject_open_transaction` (a hanging transaction).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from coordinator_svc import transaction_core as core
from coordinator_svc import transaction_state as ts
from coordinator_svc.transaction_state import TransactionMetadata
from partition_svc import producer_state
from partition_svc.producer_state import ProducerStateEntry
from tests.support.fake_transport import UnaryFetch
from txlog.errors import ClientError, error_for
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, batch_format
from txlog.protocol import TransactionState as S
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.structs import TopicPartition
from txlog.transport import FaultInjection
from txlog.v1 import common_pb2, coordinator_pb2, errors_pb2, partition_pb2

E = ErrorCode.Value


OFFSETS_TP = TopicPartition(CONSUMER_OFFSETS_TOPIC, 0)  # the fake's one offsets partition, for every group


@dataclass
class FakePartition:
    records: list[common_pb2.Record] = field(default_factory=list)
    producers: dict[int, ProducerStateEntry] = field(default_factory=dict)  # the leaders' own producer state
    open_txns: dict[int, list[int]] = field(default_factory=dict)  # producer id -> offsets of its open transaction
    aborted: set[int] = field(default_factory=set)  # offsets of aborted records
    markers: list[tuple[int, int, bool]] = field(default_factory=list)  # (producer id, epoch, committed)

    @property
    def high_watermark(self) -> int:
        return len(self.records)

    @property
    def last_stable_offset(self) -> int:
        firsts = [offsets[0] for offsets in self.open_txns.values() if offsets]
        return min(firsts) if firsts else self.high_watermark

    def visible(self, offset: int) -> bool:
        """Whether ``read_committed`` may return the record at ``offset``."""
        return offset < self.last_stable_offset and offset not in self.aborted


class FakeCluster(UnaryFetch):
    """Partitions of ``topics`` ({name: partition count}) spread round-robin over ``addresses``."""

    def __init__(
        self,
        topics: dict[str, int],
        *,
        addresses: tuple[str, ...] = ("fake-a:1", "fake-b:2"),
        delay_ms_max: float = 0.0,
        fault_injection: FaultInjection | None = None,
        rng: random.Random | None = None,
        topic_configs: dict[str, dict[str, str]] | None = None,
        coordinator_address: str = "fake-coordinator:9",
        duplicate_cache_size: int = producer_state.DUPLICATE_CACHE_BATCHES,
    ):
        self.topic_configs = topic_configs or {}
        self.duplicate_cache_size = duplicate_cache_size
        self.addresses = addresses
        self.partitions: dict[TopicPartition, FakePartition] = {}
        self.leaders: dict[TopicPartition, str] = {}
        self.leader_epochs: dict[TopicPartition, int] = {}
        self.topics: dict[str, int] = {}
        for topic, count in topics.items():
            self.create_topic(topic, count)
        self.delay_ms_max = delay_ms_max
        self.fault_injection = fault_injection
        self.rng = rng or random.Random(0)
        self.next_producer_id = 1000
        self.calls: list[tuple[str, str]] = []  # (address, rpc) in call order
        self.produce_results: list[tuple[TopicPartition, int, str]] = []  # (tp, base_sequence, error name)
        self._scripted: dict[int, Callable[[TopicPartition], int | None]] = {}
        self._produce_calls = 0
        self.unreachable: set[str] = set()
        # Produce call number -> ms after the append at which the caller sees its answer lost
        self.lost_produce_answers: dict[int, float] = {}
        # --- the transaction coordinator and the group coordinator
        self.coordinator_address = coordinator_address
        self.coordinator_addresses = {coordinator_address}  # every fake coordinator (all answer FindCoordinator)
        self.coordinator_available = True  # False: Metadata answers COORDINATOR_NOT_AVAILABLE for ids
        self.coordinator_epoch = 0
        self.transactions: dict[str, TransactionMetadata] = {}  # the coordinator's, driven by its own rules
        self.group_offsets: dict[str, dict[TopicPartition, int]] = {}
        self.pending_offsets: dict[int, dict[str, dict[TopicPartition, int]]] = {}  # pid -> group -> offsets
        self.end_txns: list[tuple[str, bool, int, int]] = []  # (id, committed, epoch asked, epoch answered)
        self.now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        self._next_calls: dict[str, deque[tuple[int, bool]]] = {}
        self._add_partitions_scripts: deque[Callable[[TopicPartition], int | None]] = deque()

    # --- scripting --------------------------------------------------------------------------

    def create_topic(self, topic: str, partition_count: int) -> None:
        self.topics[topic] = partition_count
        for p in range(partition_count):
            tp = TopicPartition(topic, p)
            self.partitions[tp] = FakePartition()
            self.leaders[tp] = self.addresses[p % len(self.addresses)]
            self.leader_epochs[tp] = 0

    def move_leader(self, tp: TopicPartition, address: str) -> None:
        self.leaders[tp] = address
        self.leader_epochs[tp] += 1

    def fail_produce(self, call_index: int, code_for: Callable[[TopicPartition], int | None]) -> None:
        """Produce call number ``call_index`` (0-based) answers ``code_for(tp)``
        (an ErrorCode, or None for normal handling) for each of its partitions."""
        self._scripted[call_index] = code_for

    def values(self, tp: TopicPartition) -> list[bytes]:
        return [r.value for r in self.partitions[tp].records]

    def count(self, rpc: str) -> int:
        return sum(1 for _, name in self.calls if name == rpc)

    def committed_values(self, tp: TopicPartition) -> list[bytes]:
        """What a read_committed reader sees of the partition."""
        partition = self.partitions[tp]
        return [r.value for offset, r in enumerate(partition.records) if partition.visible(offset)]

    def fail_next(self, rpc: str, *codes: int, after_handling: bool = False) -> None:
        """The next calls of ``rpc`` fail with ``codes`` (one call each), as
        request-level errors: before the fake handles the call, or -- with
        ``after_handling`` -- after it did (the answer is lost)."""
        queue = self._next_calls.setdefault(rpc, deque())
        queue.extend((code, after_handling) for code in codes)

    def fail_add_partitions(self, code_for: Callable[[TopicPartition], int | None]) -> None:
        """The next AddPartitionsToTxn answers ``code_for(tp)`` per partition (None: normal)."""
        self._add_partitions_scripts.append(code_for)

    def move_coordinator(self, address: str) -> None:
        """Another coordinator takes over: the old address answers NOT_COORDINATOR."""
        self.coordinator_address = address
        self.coordinator_addresses.add(address)
        self.coordinator_epoch += 1

    def start_other_producer(self, transactional_id: str) -> tuple[int, int]:
        """What a second producer's init_transactions() does to the first: its
        open transaction is aborted and its epoch fenced. Returns the new (id, epoch)."""
        meta = self.transactions[transactional_id]
        for _ in range(2):  # as the real producer does: CONCURRENT_TRANSACTIONS while the open one is aborted, then again
            try:
                return self._carry_out(transactional_id, lambda m, ids: core.decide_init(m, transactional_id, meta.txn_timeout_ms,
                                                                                      -1, -1, ids))
            except ClientError as exc:
                if ErrorCode.Name(exc.code) != "CONCURRENT_TRANSACTIONS":
                    raise
        raise AssertionError("fake: the second init of a new incarnation is never concurrent")

    def inject_open_transaction(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
                                last_timestamp_ms: int) -> int:
        """Appends a transactional record of a producer no coordinator knows about
        (a hanging transaction); returns its offset."""
        partition = self.partitions[tp]
        offset = partition.high_watermark
        partition.records.append(common_pb2.Record(offset=offset, value=b"hanging"))
        partition.open_txns.setdefault(producer_id, []).append(offset)
        partition.producers[producer_id] = ProducerStateEntry(producer_id, producer_epoch, last_timestamp_ms=last_timestamp_ms,
                                                              current_txn_first_offset=offset)
        return offset

    # --- the Transport interface --------------------------------------------------------------

    async def close(self) -> None:
        pass

    async def call(self, address: str, rpc: str, request, *, timeout_ms: float | None = None):
        self.calls.append((address, rpc))
        if address in self.unreachable:
            raise error_for(E("LEADER_NOT_AVAILABLE"), f"gRPC UNAVAILABLE: {address} is unreachable")
        if self.fault_injection is not None:
            self.fault_injection.before_call(rpc, address)
        if self.delay_ms_max > 0:
            await asyncio.sleep(self.rng.random() * self.delay_ms_max / 1000)
        else:
            await asyncio.sleep(0)
        handler = getattr(self, f"_handle_{rpc}", None)
        if handler is None:
            raise error_for(E("INVALID_REQUEST"), f"gRPC UNIMPLEMENTED: the fake does not serve {rpc}")
        scripted = self._next_calls.get(rpc)
        code, after_handling = scripted.popleft() if scripted else (None, False)
        if code is not None and not after_handling:
            raise error_for(code, f"fake: {rpc} answers {ErrorCode.Name(code)} (scripted)")
        produce_call = self._produce_calls
        response = handler(address, request)
        if code is not None:
            raise error_for(code, f"fake: {rpc} was handled, then answered {ErrorCode.Name(code)} (scripted)")
        if rpc == "Produce" and produce_call in self.lost_produce_answers:
            await asyncio.sleep(self.lost_produce_answers[produce_call] / 1000)
            raise error_for(E("REQUEST_TIMED_OUT"), f"fake: the answer to Produce call {produce_call} was lost")
        if self.fault_injection is not None:
            self.fault_injection.after_call(rpc, address)
        return response

    # --- handlers ---------------------------------------------------------------------------------

    def _handle_Metadata(self, address, request):  # noqa: N802
        response = partition_pb2.MetadataResponse()
        for node_id, broker in enumerate(self.addresses):
            response.brokers.add(node_id=node_id, address=broker)
        names = sorted(self.topics) if request.all_topics else list(request.topics)
        for name in names:
            topic = response.topics.add(name=name)
            topic.configs.update(self.topic_configs.get(name, {}))
            if name not in self.topics:
                topic.error.code = E("UNKNOWN_TOPIC_OR_PARTITION")
                topic.error.message = f"no topic {name!r}"
                continue
            for p in range(self.topics[name]):
                tp = TopicPartition(name, p)
                leader = self.leaders[tp]
                topic.partitions.add(partition=p, leader_id=self.addresses.index(leader), leader_address=leader,
                                     leader_epoch=self.leader_epochs[tp])
        for group in request.group_ids:
            response.group_coordinators.add(key=group, node_id=0, address=self.addresses[0])
        for transactional_id in request.transactional_ids:
            entry = response.transaction_coordinators.add(key=transactional_id)
            if self.coordinator_available:
                entry.node_id, entry.address = 0, self.coordinator_address
            else:
                entry.error.code = E("COORDINATOR_NOT_AVAILABLE")
                entry.error.message = "fake: no coordinator owns the id's partition yet"
        return response

    def _handle_InitProducerId(self, address, request):  # noqa: N802
        if request.transactional_id:
            return self._init_transactional(address, request)
        self.next_producer_id += 1  # always a new id, as partition_svc answers (issue 12)
        return coordinator_pb2.InitProducerIdResponse(producer_id=self.next_producer_id, producer_epoch=0)

    def _handle_Produce(self, address, request):  # noqa: N802
        call_index = self._produce_calls
        self._produce_calls += 1
        scripted = self._scripted.pop(call_index, None)
        response = partition_pb2.ProduceResponse()
        for entry in request.batches:
            tp = TopicPartition(entry.topic, entry.partition)
            result = response.results.add(topic=entry.topic, partition=entry.partition, base_offset=-1)
            batch = _message_of(entry)
            code = scripted(tp) if scripted is not None else None
            if code is None:
                code, base_offset = self._append(address, tp, batch, request.transactional_id, request.add_to_transaction)
                result.base_offset = base_offset
            result.error.CopyFrom(errors_pb2.Error(code=code, message="" if code == E("NONE") else "fake"))
            self.produce_results.append((tp, batch.base_sequence, ErrorCode.Name(code)))
        return response

    def _append(self, address: str, tp: TopicPartition, batch: common_pb2.RecordBatch,
                transactional_id: str = "", add_to_transaction: bool = False) -> tuple[int, int]:
        if tp not in self.partitions:
            return E("UNKNOWN_TOPIC_OR_PARTITION"), -1
        if self.leaders[tp] != address:
            return E("NOT_LEADER"), -1
        if batch.is_transactional:
            code = self._verify(transactional_id, batch.producer_id, batch.producer_epoch, tp)
            if code != E("NONE") and add_to_transaction:  # the leader adds it (KIP-890 part 2), as AddPartitionsToTxn would
                refused = self._add_partitions(transactional_id, batch.producer_id, batch.producer_epoch, [tp])[tp]
                code = E("NONE") if refused is None else refused.code
            if code != E("NONE"):
                return code, -1
        partition = self.partitions[tp]
        count = len(batch.records)
        if batch.producer_id >= 0:  # the leaders' rules themselves (partition_svc/producer_state.py)
            entry = partition.producers.get(batch.producer_id)
            outcome = producer_state.check_batch(entry, batch.producer_id, batch.producer_epoch, batch.base_sequence, count,
                                                 batch.is_transactional)
            if isinstance(outcome, producer_state.Reject):
                return outcome.code, -1
            if isinstance(outcome, producer_state.Duplicate):
                return E("NONE"), outcome.base_offset
            partition.producers[batch.producer_id] = producer_state.after_append(
                entry, batch.producer_id, batch.producer_epoch, batch.base_sequence, count, partition.high_watermark,
                self.now_ms(), batch.is_transactional, self.duplicate_cache_size)
        base_offset = partition.high_watermark
        for record in batch.records:
            stored = common_pb2.Record()
            stored.CopyFrom(record)
            stored.offset = partition.high_watermark
            if batch.is_transactional:
                partition.open_txns.setdefault(batch.producer_id, []).append(stored.offset)
            partition.records.append(stored)
        return E("NONE"), base_offset

    def _handle_ListOffsets(self, address, request):  # noqa: N802
        response = partition_pb2.ListOffsetsResponse()
        for item in request.partitions:
            tp = TopicPartition(item.topic, item.partition)
            result = response.results.add(topic=item.topic, partition=item.partition, timestamp_ms=-1)
            if self.leaders.get(tp) != address:
                result.error.code = E("NOT_LEADER")
                continue
            partition = self.partitions[tp]
            result.offset = {partition_pb2.OFFSET_SPEC_EARLIEST: 0,
                             partition_pb2.OFFSET_SPEC_LAST_STABLE: partition.last_stable_offset}.get(
                item.spec, partition.high_watermark)
        return response

    def _handle_Fetch(self, address, request):  # noqa: N802
        response = partition_pb2.FetchResponse()
        for item in request.partitions:
            tp = TopicPartition(item.topic, item.partition)
            result = response.results.add(topic=item.topic, partition=item.partition)
            if self.leaders.get(tp) != address:
                result.error.code = E("NOT_LEADER")
                continue
            partition = self.partitions[tp]
            hw = partition.high_watermark
            result.high_watermark = hw
            result.last_stable_offset = partition.last_stable_offset
            if not 0 <= item.fetch_offset <= hw:
                result.error.code = E("OFFSET_OUT_OF_RANGE")
                continue
            committed = request.isolation_level == common_pb2.ISOLATION_LEVEL_READ_COMMITTED
            limit = partition.last_stable_offset if committed else hw
            end = max(item.fetch_offset, limit if request.max_records <= 0
                      else min(limit, item.fetch_offset + request.max_records))
            records = [r for r in partition.records[item.fetch_offset:end]
                       if not committed or r.offset not in partition.aborted]
            if request.batch_format == partition_pb2.BATCH_FORMAT_ENCODED:  # a batch a record: offsets may have gaps
                result.encoded_batches.extend(
                    batch_format.encode(common_pb2.RecordBatch(records=[r]).SerializeToString(), 1, base_offset=r.offset)
                    for r in records)
            elif records:
                result.batches.add(base_offset=records[0].offset, records=records)
            result.next_fetch_offset = end
        return response

    # --- the transaction coordinator ----------------------------------------------------------------

    def _at_coordinator(self, address: str) -> None:
        if address != self.coordinator_address:
            raise error_for(E("NOT_COORDINATOR"), f"fake: {address} is not the transaction coordinator")

    def _carry_out(self, transactional_id: str, decide):
        """The coordinator's own rules (coordinator_svc/transaction_core.py), its
        outcome carried out at once: the log write, and for a decided
        transaction the markers and Complete*, happen within the call."""
        spare = [self.next_producer_id + 1]
        meta = self.transactions.get(transactional_id)
        outcome = decide(meta, spare)
        assert not isinstance(outcome, core.NeedProducerIds), outcome  # one spare id always suffices here
        if isinstance(outcome, core.Refuse):
            raise error_for(outcome.error.code, f"fake: {outcome.error.message}")
        if isinstance(outcome, core.Reply):
            return self._answer(outcome.value, meta)
        if meta is None:
            meta = self.transactions[transactional_id] = TransactionMetadata(transactional_id, ts.NO_PRODUCER_ID, ts.NO_EPOCH, 0)
        if outcome.changes.get("producer_id") == spare[0]:
            self.next_producer_id = spare[0]
        if outcome.fence:
            ts.check_transition(meta, S.PREPARE_EPOCH_FENCE)
        self._transition(meta, outcome.to_state, **outcome.changes)
        if outcome.then is core.Then.COMPLETE:
            committed = meta.state is S.PREPARE_COMMIT
            producer_id, producer_epoch = ts.marker_producer(meta)
            for tp in sorted(meta.partitions):
                self._write_marker(tp, producer_id, producer_epoch, committed)
            self._transition(meta, S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT, **core.COMPLETED)
        if isinstance(outcome.reply, TxlogError):
            raise error_for(outcome.reply.code, f"fake: {outcome.reply.message}")
        return self._answer(outcome.reply, meta)

    def _transition(self, meta: TransactionMetadata, to_state: S, **changes) -> None:
        ts.complete_transition(meta, ts.prepare_transition(meta, to_state, last_update_ms=self.now_ms(), **changes))

    @staticmethod
    def _answer(value, meta):
        return (meta.producer_id, meta.producer_epoch) if value is core.Answer.PRODUCER else value

    def _init_transactional(self, address, request):
        self._at_coordinator(address)
        producer_id = request.producer_id if request.HasField("producer_id") else -1
        producer_epoch = request.producer_epoch if request.HasField("producer_epoch") else -1
        producer_id, producer_epoch = self._carry_out(request.transactional_id, lambda meta, ids: core.decide_init(
            meta, request.transactional_id, request.transaction_timeout_ms, producer_id, producer_epoch, ids))
        return coordinator_pb2.InitProducerIdResponse(producer_id=producer_id, producer_epoch=producer_epoch)

    def _add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int, wanted: list[TopicPartition]) -> dict:
        """The coordinator's AddPartitionsToTxn, from a client or (implicit adds) a leader: {tp: None or TxlogError}."""
        script = self._add_partitions_scripts.popleft() if self._add_partitions_scripts else (lambda _: None)
        unknown = {}
        for tp in wanted:
            code = script(tp)
            if code is None and tp not in self.partitions:
                code = E("UNKNOWN_TOPIC_OR_PARTITION")
            if code is not None:
                unknown[tp] = TxlogError(code, "fake")
        return self._carry_out(transactional_id, lambda meta, _: core.decide_add_partitions(
            meta, transactional_id, producer_id, producer_epoch, wanted, unknown, self.now_ms()))

    def _handle_AddPartitionsToTxn(self, address, request):  # noqa: N802
        self._at_coordinator(address)
        wanted = [TopicPartition(item.topic, item.partition) for item in request.partitions]
        answers = self._add_partitions(request.transactional_id, request.producer_id, request.producer_epoch, wanted)
        response = coordinator_pb2.AddPartitionsToTxnResponse()
        for item, tp in zip(request.partitions, wanted, strict=True):
            result = response.results.add(partition=item)
            if answers[tp] is not None:
                result.error.CopyFrom(errors_pb2.Error(code=answers[tp].code, message=answers[tp].message))
        return response

    def _handle_AddOffsetsToTxn(self, address, request):  # noqa: N802
        self._at_coordinator(address)
        answers = self._carry_out(request.transactional_id, lambda meta, _: core.decide_add_partitions(
            meta, request.transactional_id, request.producer_id, request.producer_epoch, [OFFSETS_TP], {}, self.now_ms()))
        if answers[OFFSETS_TP] is not None:
            raise error_for(answers[OFFSETS_TP].code, "fake")
        return coordinator_pb2.AddOffsetsToTxnResponse()

    def _handle_EndTxn(self, address, request):  # noqa: N802
        self._at_coordinator(address)
        producer_id, producer_epoch = self._carry_out(request.transactional_id, lambda meta, ids: core.decide_end_txn(
            meta, request.transactional_id, request.producer_id, request.producer_epoch, request.committed, ids))
        self.end_txns.append((request.transactional_id, request.committed, request.producer_epoch, producer_epoch))
        return coordinator_pb2.EndTxnResponse(producer_id=producer_id, producer_epoch=producer_epoch)

    def _write_marker(self, tp: TopicPartition, producer_id: int, producer_epoch: int, committed: bool) -> int:
        if tp == OFFSETS_TP:
            for group, offsets in self.pending_offsets.pop(producer_id, {}).items():
                if committed:
                    self.group_offsets.setdefault(group, {}).update(offsets)
            return E("NONE")
        partition = self.partitions[tp]
        entry = partition.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.producer_epoch:
            return E("INVALID_PRODUCER_EPOCH")
        offsets = partition.open_txns.pop(producer_id, [])
        if not committed:
            partition.aborted.update(offsets)
        partition.markers.append((producer_id, producer_epoch, committed))
        # as a leader applies a marker: the transaction closed, sequences restart at the marker's epoch
        partition.producers[producer_id] = replace(
            entry or ProducerStateEntry(producer_id, producer_epoch), producer_epoch=producer_epoch, batches=(),
            coordinator_epoch=self.coordinator_epoch, current_txn_first_offset=producer_state.NO_OFFSET, txn_prepared=False)
        return E("NONE")

    def _verify(self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int:
        """The leader's check, with the coordinator, that ``tp`` is in the producer's open transaction (KIP-890)."""
        meta = self.transactions.get(transactional_id)
        if not transactional_id or meta is None or meta.producer_id != producer_id:
            return E("INVALID_PRODUCER_ID_MAPPING")
        verified = core.verify_partitions(meta, producer_id, producer_epoch, [tp])
        if isinstance(verified, core.Refuse):
            return verified.error.code
        return E("NONE") if verified[tp] is None else verified[tp].code

    def _handle_FindCoordinator(self, address, request):  # noqa: N802
        if address not in self.coordinator_addresses:
            raise error_for(E("INVALID_REQUEST"), f"fake: {address} is no coordinator")
        return coordinator_pb2.FindCoordinatorResponse(coordinator_id=0, address=self.coordinator_address,
                                                       coordinator_epoch=self.coordinator_epoch)

    def _handle_ListTransactions(self, address, request):  # noqa: N802
        if address not in self.coordinator_addresses:
            raise error_for(E("INVALID_REQUEST"), f"fake: {address} is no coordinator")
        response = coordinator_pb2.ListTransactionsResponse()
        now = self.now_ms()
        for txn in sorted(self.transactions.values(), key=lambda t: t.transactional_id):
            state = txn.state.to_proto()
            if request.state_filters and state not in request.state_filters:
                continue
            if request.producer_id_filters and txn.producer_id not in request.producer_id_filters:
                continue
            if request.duration_filter_ms and not (txn.state is S.ONGOING
                                                   and now - txn.txn_start_ms > request.duration_filter_ms):
                continue
            response.transactions.add(transactional_id=txn.transactional_id, producer_id=txn.producer_id, state=state)
        return response

    def _handle_DescribeTransactions(self, address, request):  # noqa: N802
        response = coordinator_pb2.DescribeTransactionsResponse()
        for transactional_id in request.transactional_ids:
            txn = self.transactions.get(transactional_id)
            if address != self.coordinator_address:
                response.transactions.add(transactional_id=transactional_id,
                                          error=errors_pb2.Error(code=E("NOT_COORDINATOR"), message="fake"))
            elif txn is None:
                response.transactions.add(transactional_id=transactional_id,
                                          error=errors_pb2.Error(code=E("TRANSACTIONAL_ID_NOT_FOUND"), message="fake"))
            else:
                response.transactions.add(
                    transactional_id=transactional_id, state=txn.state.to_proto(), producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch, transaction_timeout_ms=txn.txn_timeout_ms,
                    transaction_start_time_ms=txn.txn_start_ms,
                    partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(txn.partitions)])
        return response

    def _handle_AbortTransaction(self, address, request):  # noqa: N802
        if address not in self.coordinator_addresses:
            raise error_for(E("INVALID_REQUEST"), f"fake: {address} is no coordinator")
        if request.producer_id < 0 or request.coordinator_epoch < 0:
            raise error_for(E("INVALID_REQUEST"), "fake: producer_id and coordinator_epoch must not be negative")
        tp = TopicPartition(request.partition.topic, request.partition.partition)
        if tp not in self.partitions:
            raise error_for(E("UNKNOWN_TOPIC_OR_PARTITION"), f"fake: no partition {tp}")
        code = self._write_marker(tp, request.producer_id, request.producer_epoch, committed=False)
        if code != E("NONE"):
            raise error_for(code, "fake: the leader refused the marker")
        return coordinator_pb2.AbortTransactionResponse()

    # --- the group coordinator and producer states -------------------------------------------------------

    def _at_group_coordinator(self, address: str) -> None:
        if address != self.addresses[0]:
            raise error_for(E("NOT_COORDINATOR"), f"fake: {address} is not the group coordinator")

    def _handle_TxnOffsetCommit(self, address, request):  # noqa: N802
        self._at_group_coordinator(address)
        code = self._verify(request.transactional_id, request.producer_id, request.producer_epoch, OFFSETS_TP)
        if code != E("NONE"):
            raise error_for(code, "fake: the offsets partition is not in the transaction")
        response = partition_pb2.TxnOffsetCommitResponse()
        pending = self.pending_offsets.setdefault(request.producer_id, {}).setdefault(request.group_id, {})
        for item in request.offsets:
            pending[TopicPartition(item.topic, item.partition)] = item.offset
            response.results.add(partition=common_pb2.TopicPartition(topic=item.topic, partition=item.partition))
        return response

    def _handle_OffsetCommit(self, address, request):  # noqa: N802
        self._at_group_coordinator(address)
        response = partition_pb2.OffsetCommitResponse()
        for item in request.offsets:
            self.group_offsets.setdefault(request.group_id, {})[TopicPartition(item.topic, item.partition)] = item.offset
            response.results.add(partition=common_pb2.TopicPartition(topic=item.topic, partition=item.partition))
        return response

    def _handle_OffsetFetch(self, address, request):  # noqa: N802
        self._at_group_coordinator(address)
        if request.require_stable and any(request.group_id in groups for groups in self.pending_offsets.values()):
            raise error_for(E("UNSTABLE_OFFSET_COMMIT"), "fake: offsets of the group are pending in a transaction")
        committed = self.group_offsets.get(request.group_id, {})
        response = partition_pb2.OffsetFetchResponse()
        wanted = [TopicPartition(p.topic, p.partition) for p in request.partitions] or sorted(committed)
        for tp in wanted:
            response.offsets.add(topic=tp.topic, partition=tp.partition, offset=committed.get(tp, -1))
        return response

    def _handle_DescribeProducers(self, address, request):  # noqa: N802
        response = partition_pb2.DescribeProducersResponse()
        for item in request.partitions:
            tp = TopicPartition(item.topic, item.partition)
            result = response.results.add(topic=item.topic, partition=item.partition)
            if self.leaders.get(tp) != address:
                result.error.code = E("NOT_LEADER")
                continue
            partition = self.partitions[tp]
            for producer_id, entry in sorted(partition.producers.items()):
                offsets = partition.open_txns.get(producer_id)
                result.producers.add(
                    producer_id=producer_id, producer_epoch=entry.producer_epoch, last_sequence=entry.last_sequence,
                    last_timestamp_ms=entry.last_timestamp_ms, coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=offsets[0] if offsets else -1)
        return response


def _message_of(entry: partition_pb2.PartitionBatch) -> common_pb2.RecordBatch:
    """A produced batch as a RecordBatch, whichever form it came in (the records
    of an encoded one with offsets from 0, as the real leader would take them)."""
    if not entry.encoded_batch:
        return entry.batch
    header = batch_format.verified_header(entry.encoded_batch)
    return batch_format.to_message(entry.encoded_batch, header)
