"""The consumer's fetch engine: positions of the assigned partitions, Fetch
requests to their leaders, and the records fetched but not yet returned.

Guarantees
----------
* ``poll`` returns each partition's records in offset order, never a record
  below the partition's position, and moves the position past what it returns;
  a ``seek`` drops whatever was fetched for the partition before it.
* Positions move past offsets the leader skips (transaction markers, aborted
  batches under read_committed) by following ``next_fetch_offset``.
* At most ``max_poll_records`` records per poll and ``fetch_max_bytes`` per
  Fetch request (and ``max_partition_fetch_bytes`` per partition); one request
  per leader, in parallel, each a long poll of at most ``fetch_max_wait_ms``.

Error Handling
--------------
Per partition, by ``errors.action_for``: OFFSET_OUT_OF_RANGE resets the
position by ``auto_offset_reset`` (``"none"``: NoOffsetForPartitionError);
REFRESH_METADATA marks metadata stale and the partition is fetched again on
the next round; RETRY backs off; FAIL raises. A request-level failure applies
to each of the request's partitions.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.client.config import ConsumerConfig
from services.client.errors import ClientError, NoOffsetForPartitionError, from_proto
from services.client.metadata import Metadata
from services.client.requests import PARTITIONS_PER_REQUEST_MAX, call_leaders, retry_policy, sort_error
from services.client.structs import ConsumerRecord, TopicPartition, consumer_record
from services.errors import ErrorCode
from services.stubs.txlog.v1 import common_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
OFFSET_OUT_OF_RANGE = ErrorCode.Value("OFFSET_OUT_OF_RANGE")


@dataclass
class PartitionState:
    """What the consumer knows of one assigned partition."""

    position: int | None = None  # the offset of the next record to return
    reset_to: str | None = None  # "earliest" / "latest" when a reset is pending
    buffer: deque[ConsumerRecord] = field(default_factory=deque)
    buffer_next_offset: int | None = None  # where fetching continues after the buffer
    high_watermark: int = -1
    last_stable_offset: int = -1
    fetch_error: ClientError | None = None


class Fetcher:
    def __init__(self, metadata: Metadata, transport, config: ConsumerConfig,
                 clock: Callable[[], float] = time.monotonic):
        self._metadata = metadata
        self._transport = transport
        self._config = config
        self._clock = clock
        self.states: dict[TopicPartition, PartitionState] = {}
        self._round_robin = 0
        self._isolation = (common_pb2.ISOLATION_LEVEL_READ_COMMITTED if config.isolation_level == "read_committed"
                           else common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED)

    # --- assignment and positions ----------------------------------------------------------

    def assign(self, tps: list[TopicPartition]) -> None:
        self.states = {tp: self.states.get(tp, PartitionState()) for tp in tps}
        self._metadata.track({tp.topic for tp in tps})

    def seek(self, tp: TopicPartition, offset: int) -> None:
        state = self._state(tp)
        state.position, state.reset_to = offset, None
        state.buffer.clear()
        state.buffer_next_offset = None

    def request_reset(self, tp: TopicPartition, strategy: str) -> None:
        state = self._state(tp)
        state.reset_to = strategy
        state.position = None
        state.buffer.clear()
        state.buffer_next_offset = None

    def _state(self, tp: TopicPartition) -> PartitionState:
        state = self.states.get(tp)
        if state is None:
            raise ClientError(ErrorCode.Value("INVALID_REQUEST"),
                              f"{tp.topic}-{tp.partition} is not assigned to this consumer; assign() it first")
        return state

    def missing_positions(self) -> list[TopicPartition]:
        """Assigned partitions with neither a position nor a pending reset."""
        return [tp for tp, s in self.states.items() if s.position is None and s.reset_to is None]

    async def reset_positions(self, timeout_ms: float) -> None:
        """Resolves the pending resets (earliest / latest) with ListOffsets."""
        pending = {tp: s.reset_to for tp, s in self.states.items() if s.reset_to is not None}
        if not pending:
            return
        latest = partition_pb2.OFFSET_SPEC_LAST_STABLE if self._isolation == common_pb2.ISOLATION_LEVEL_READ_COMMITTED \
            else partition_pb2.OFFSET_SPEC_LATEST
        specs = {tp: partition_pb2.OFFSET_SPEC_EARLIEST if strategy == "earliest" else latest
                 for tp, strategy in pending.items()}
        offsets = await list_offsets(self._metadata, self._transport, specs, {}, timeout_ms=timeout_ms,
                                     backoff_ms=self._config.retry_backoff_ms,
                                     request_timeout_ms=self._config.request_timeout_ms)
        for tp, (offset, _) in offsets.items():
            state = self.states.get(tp)
            if state is not None and state.reset_to == pending[tp]:
                state.position, state.reset_to = offset, None

    # --- fetching ----------------------------------------------------------------------------------

    def drain(self, max_records: int) -> list[ConsumerRecord]:
        """Up to ``max_records`` buffered records, moving positions past them."""
        out: list[ConsumerRecord] = []
        tps = list(self.states)
        if not tps:
            return out
        start = self._round_robin % len(tps)
        self._round_robin += 1
        for tp in tps[start:] + tps[:start]:
            state = self.states[tp]
            if state.fetch_error is not None:
                error, state.fetch_error = state.fetch_error, None
                if out:  # give back what we have; raise on the next poll
                    state.fetch_error = error
                    return out
                raise error
            while state.buffer and len(out) < max_records:
                record = state.buffer.popleft()
                out.append(record)
                state.position = record.offset + 1
            if not state.buffer and state.buffer_next_offset is not None:
                if state.position is None or state.buffer_next_offset > state.position:
                    state.position = state.buffer_next_offset
                state.buffer_next_offset = None
            if len(out) >= max_records:
                break
        return out

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, s in self.states.items() if s.position is not None and not s.buffer]

    async def fetch_once(self, max_wait_ms: float) -> None:
        """One round: a Fetch to each leader of the fetchable partitions."""
        by_leader: dict[str, list[TopicPartition]] = {}
        missing_leader = False
        for tp in self.fetchable():
            leader = self._metadata.leader(tp)
            if leader is None:
                missing_leader = True
                continue
            by_leader.setdefault(leader.leader_address, []).append(tp)
        if missing_leader:
            self._metadata.request_update()
            try:
                await self._metadata.refresh()
            except ClientError as exc:
                if not exc.retriable:
                    raise
        if not by_leader:
            await asyncio.sleep(min(self._config.retry_backoff_ms, max_wait_ms) / 1000)
            return
        await asyncio.gather(*(self._fetch_from(address, tps[i:i + PARTITIONS_PER_REQUEST_MAX], max_wait_ms)
                               for address, tps in by_leader.items()
                               for i in range(0, len(tps), PARTITIONS_PER_REQUEST_MAX)))

    async def _fetch_from(self, address: str, tps: list[TopicPartition], max_wait_ms: float) -> None:
        positions = {tp: self.states[tp].position for tp in tps}
        request = partition_pb2.FetchRequest(
            isolation_level=self._isolation,
            max_wait_ms=int(max_wait_ms),
            min_bytes=1,
            max_bytes=self._config.fetch_max_bytes,
            max_records=self._config.max_poll_records,
            partitions=[
                partition_pb2.FetchPartition(topic=tp.topic, partition=tp.partition, fetch_offset=positions[tp],
                                             partition_max_bytes=self._config.max_partition_fetch_bytes,
                                             leader_epoch=self._leader_epoch(tp))
                for tp in tps
            ],
        )
        try:
            response = await self._transport.call(address, "Fetch", request,
                                                  timeout_ms=self._config.request_timeout_ms + max_wait_ms)
        except ClientError as exc:
            if not sort_error(exc, self._metadata):
                raise
            await asyncio.sleep(self._config.retry_backoff_ms / 1000)
            return
        retry_later = False
        for result in response.results:
            tp = TopicPartition(result.topic, result.partition)
            state = self.states.get(tp)
            if state is None or tp not in positions or state.position != positions[tp] or state.buffer:
                continue  # unassigned or sought meanwhile: this answer is stale
            if result.error.code == NONE:
                self._take(tp, state, result, positions[tp])
            elif result.error.code == OFFSET_OUT_OF_RANGE:
                self._out_of_range(tp, state, positions[tp], result)
            else:
                exc = from_proto(result.error)
                if not sort_error(exc, self._metadata):
                    state.fetch_error = exc
                retry_later = True
        if retry_later:
            await asyncio.sleep(self._config.retry_backoff_ms / 1000)

    def _leader_epoch(self, tp: TopicPartition) -> int:
        leader = self._metadata.leader(tp)
        return leader.leader_epoch if leader is not None else -1

    def _take(self, tp: TopicPartition, state: PartitionState, result, fetch_offset: int) -> None:
        state.high_watermark = result.high_watermark
        state.last_stable_offset = result.last_stable_offset
        next_offset = fetch_offset
        for batch in result.batches:
            for record in batch.records:
                if record.offset >= fetch_offset:
                    state.buffer.append(consumer_record(tp.topic, tp.partition, record))
                    next_offset = record.offset + 1
        if result.next_fetch_offset > next_offset:
            next_offset = result.next_fetch_offset
        if state.buffer:
            state.buffer_next_offset = next_offset
        elif next_offset > fetch_offset:
            state.position = next_offset

    def _out_of_range(self, tp: TopicPartition, state: PartitionState, fetch_offset: int, result) -> None:
        strategy = self._config.auto_offset_reset
        if strategy == "none":
            state.fetch_error = NoOffsetForPartitionError(
                f"offset {fetch_offset} of {tp.topic}-{tp.partition} is out of range "
                f"[{result.log_start_offset}, {result.high_watermark}] and auto_offset_reset is 'none'")
            return
        self.request_reset(tp, strategy)


async def list_offsets(
    metadata: Metadata,
    transport,
    specs: dict[TopicPartition, int],
    timestamps_ms: dict[TopicPartition, int],
    *,
    timeout_ms: float,
    backoff_ms: float,
    request_timeout_ms: float,
) -> dict[TopicPartition, tuple[int, int]]:
    """ListOffsets per partition: ``specs`` maps each partition to an
    OffsetSpec (``timestamps_ms`` gives the timestamp of OFFSET_SPEC_TIMESTAMP
    ones); answers ``(offset, timestamp_ms)`` per partition."""

    def build(tps: list[TopicPartition]):
        return partition_pb2.ListOffsetsRequest(partitions=[
            partition_pb2.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, spec=specs[tp],
                                               timestamp_ms=timestamps_ms.get(tp, 0))
            for tp in tps
        ])

    def results_of(response):
        for item in response.results:
            yield TopicPartition(item.topic, item.partition), item.error, (item.offset, item.timestamp_ms)

    return await call_leaders(metadata, transport, specs, "ListOffsets", build, results_of,
                              policy=retry_policy(deadline_ms=timeout_ms, backoff_ms=backoff_ms),
                              timeout_ms=request_timeout_ms)
