"""An in-memory stand-in for the partition servers, for unit tests of the SDK.

:class:`FakeCluster` implements the :class:`~services.client.transport.Transport`
interface (``call`` / ``close``) and answers Metadata, InitProducerId (empty
transactional id), Produce, Fetch and ListOffsets the way partition_svc does,
including the leader's idempotence rules of DESIGN.md ("Idempotent produce"):

1. a batch whose sequence range equals one of the producer's last
   ``duplicate_cache_size`` batches (same epoch) is a duplicate: success with
   its original base offset, nothing appended;
2. an epoch below the known one: INVALID_PRODUCER_EPOCH;
3. a new epoch must start at sequence 0 (else OUT_OF_ORDER_SEQUENCE); an unknown
   producer id with a sequence other than 0: UNKNOWN_PRODUCER_ID;
4. same epoch: the sequence must be last+1 (int32 wrap); one at or below the last
   that is not cached: DUPLICATE_SEQUENCE; else OUT_OF_ORDER_SEQUENCE.

Faults tests can script: answers dropped after the append or requests dropped
before it (``fault_injection``), random delays that reorder concurrent requests
(``delay_ms_max``), answers of chosen Produce calls lost
(``lost_produce_answers``), leadership moves (:meth:`FakeCluster.move_leader`), and
per-partition errors for chosen Produce calls (:meth:`FakeCluster.fail_produce`).
The SDK's code under test is the real one; only the network is fake.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.client.errors import error_for
from services.client.sequences import SEQUENCE_MODULUS
from services.client.structs import TopicPartition
from services.client.transport import FaultInjection
from services.errors import ErrorCode
from services.stubs.txlog.v1 import common_pb2, coordinator_pb2, errors_pb2, partition_pb2

E = ErrorCode.Value


@dataclass
class _ProducerEntry:
    producer_epoch: int
    last_sequence: int
    cache: deque = field(default_factory=deque)  # (first_sequence, last_sequence, base_offset)


@dataclass
class FakePartition:
    records: list[common_pb2.Record] = field(default_factory=list)
    producers: dict[int, _ProducerEntry] = field(default_factory=dict)

    @property
    def high_watermark(self) -> int:
        return len(self.records)


class FakeCluster:
    """Partitions of ``topics`` ({name: partition count}) spread round-robin over ``addresses``."""

    def __init__(
        self,
        topics: dict[str, int],
        *,
        addresses: tuple[str, ...] = ("fake-a:1", "fake-b:2"),
        duplicate_cache_size: int = 5,
        delay_ms_max: float = 0.0,
        fault_injection: FaultInjection | None = None,
        rng: random.Random | None = None,
        topic_configs: dict[str, dict[str, str]] | None = None,
    ):
        self.topic_configs = topic_configs or {}
        self.addresses = addresses
        self.partitions: dict[TopicPartition, FakePartition] = {}
        self.leaders: dict[TopicPartition, str] = {}
        self.leader_epochs: dict[TopicPartition, int] = {}
        self.topics: dict[str, int] = {}
        for topic, count in topics.items():
            self.create_topic(topic, count)
        self.duplicate_cache_size = duplicate_cache_size
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
        produce_call = self._produce_calls
        response = handler(address, request)
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
        return response

    def _handle_InitProducerId(self, address, request):  # noqa: N802
        if request.producer_id >= 0 and 0 <= request.producer_epoch < 32767:  # KIP-360 bump
            return coordinator_pb2.InitProducerIdResponse(producer_id=request.producer_id,
                                                          producer_epoch=request.producer_epoch + 1)
        self.next_producer_id += 1
        return coordinator_pb2.InitProducerIdResponse(producer_id=self.next_producer_id, producer_epoch=0)

    def _handle_Produce(self, address, request):  # noqa: N802
        call_index = self._produce_calls
        self._produce_calls += 1
        scripted = self._scripted.pop(call_index, None)
        response = partition_pb2.ProduceResponse()
        for entry in request.batches:
            tp = TopicPartition(entry.topic, entry.partition)
            result = response.results.add(topic=entry.topic, partition=entry.partition, base_offset=-1)
            code = scripted(tp) if scripted is not None else None
            if code is None:
                code, base_offset = self._append(address, tp, entry.batch)
                result.base_offset = base_offset
            result.error.CopyFrom(errors_pb2.Error(code=code, message="" if code == E("NONE") else "fake"))
            self.produce_results.append((tp, entry.batch.base_sequence, ErrorCode.Name(code)))
        return response

    def _append(self, address: str, tp: TopicPartition, batch: common_pb2.RecordBatch) -> tuple[int, int]:
        if tp not in self.partitions:
            return E("UNKNOWN_TOPIC_OR_PARTITION"), -1
        if self.leaders[tp] != address:
            return E("NOT_LEADER"), -1
        partition = self.partitions[tp]
        count = len(batch.records)
        if batch.producer_id >= 0:
            first, last = batch.base_sequence, (batch.base_sequence + count - 1) % SEQUENCE_MODULUS
            entry = partition.producers.get(batch.producer_id)
            if entry is not None and entry.producer_epoch == batch.producer_epoch:
                for cached_first, cached_last, base_offset in entry.cache:
                    if (cached_first, cached_last) == (first, last):
                        return E("NONE"), base_offset  # rule 1
            if entry is not None and batch.producer_epoch < entry.producer_epoch:
                return E("INVALID_PRODUCER_EPOCH"), -1  # rule 2
            if entry is None or batch.producer_epoch > entry.producer_epoch:
                if first != 0:  # rule 3
                    return (E("UNKNOWN_PRODUCER_ID") if entry is None else E("OUT_OF_ORDER_SEQUENCE")), -1
                entry = _ProducerEntry(batch.producer_epoch, -1)
                partition.producers[batch.producer_id] = entry
            else:
                gap = (first - (entry.last_sequence + 1)) % SEQUENCE_MODULUS
                if gap != 0:  # rule 4
                    return (E("DUPLICATE_SEQUENCE") if gap >= SEQUENCE_MODULUS // 2 else E("OUT_OF_ORDER_SEQUENCE")), -1
            base_offset = partition.high_watermark
            entry.last_sequence = last
            entry.cache.append((first, last, base_offset))
            while len(entry.cache) > self.duplicate_cache_size:
                entry.cache.popleft()
        base_offset = partition.high_watermark
        for record in batch.records:
            stored = common_pb2.Record()
            stored.CopyFrom(record)
            stored.offset = partition.high_watermark
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
            hw = self.partitions[tp].high_watermark
            result.offset = 0 if item.spec == partition_pb2.OFFSET_SPEC_EARLIEST else hw
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
            result.high_watermark = result.last_stable_offset = hw
            if not 0 <= item.fetch_offset <= hw:
                result.error.code = E("OFFSET_OUT_OF_RANGE")
                continue
            end = hw if request.max_records <= 0 else min(hw, item.fetch_offset + request.max_records)
            if end > item.fetch_offset:
                result.batches.add(base_offset=item.fetch_offset, records=partition.records[item.fetch_offset:end])
            result.next_fetch_offset = end
        return response
