"""The consumer's fetch engine: positions of the assigned partitions, Fetch
requests to their leaders, and the records fetched but not yet returned.

Guarantees
----------
* ``poll`` returns each partition's records in offset order, never a record
  below the partition's position, and moves the position past what it returns;
  a ``seek`` drops whatever was fetched for the partition before it.
* Positions move past offsets the leader skips (transaction markers, aborted
  batches under read_committed) by following ``next_fetch_offset``.
* With ``include_transaction_outcomes`` (read_uncommitted only), each record
  carries its producer id and its transaction's outcome as the leader answered
  it with the records (txlog/protocol/txn_outcomes.py); without, Fetch asks nothing more.
* At most ``max_poll_records`` records per poll and ``fetch_max_bytes`` per
  Fetch request (and ``max_partition_fetch_bytes`` per partition); one request
  per leader, in parallel, each a long poll of at most ``fetch_max_wait_ms``.
* A truncated log is noticed, not read past (KIP-320): each partition keeps
  the leader epochs of what it read below its position (where each began, as
  a replica does); once metadata names a new leader epoch, the partition is
  fetched again only after EpochEndOffsets rounds with the new leader find
  where its log and what was read agree (txlog.protocol.leader_epochs, the
  followers' own rule). Agreement below the position means records this
  consumer returned are gone (an unclean election): the position goes back
  there, or, with ``auto_offset_reset`` ``"none"``, poll raises
  LogTruncationError until the application seeks.

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
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from txlog.config import ConsumerConfig
from txlog.errors import ClientError, LogTruncationError, NoOffsetForPartitionError, from_proto
from txlog.metadata import Metadata
from txlog.protocol import batch_format, compression
from txlog.protocol.batch_format import BatchFormatError
from txlog.protocol.errors import ErrorCode, error_proto
from txlog.protocol.leader_epochs import AskAgain, LeaderEpochCache, truncation_step
from txlog.protocol.txn_outcomes import Outcomes
from txlog.requests import PARTITIONS_PER_REQUEST_MAX, call_leaders, retry_policy, sort_error
from txlog.structs import ConsumerRecord, TopicPartition, consumer_record
from txlog.v1 import common_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
# Every codec txlog.protocol.compression decodes: batches stored so come as stored (smaller on the wire), decoded here.
ACCEPTED_COMPRESSIONS = sorted(compression.CODECS)
OFFSET_OUT_OF_RANGE = ErrorCode.Value("OFFSET_OUT_OF_RANGE")
CORRUPT_MESSAGE = ErrorCode.Value("CORRUPT_MESSAGE")
log = logging.getLogger(__name__)


@dataclass
class PartitionState:
    """What the consumer knows of one assigned partition."""

    position: int | None = None  # the offset of the next record to return
    read_epochs: LeaderEpochCache = field(default_factory=LeaderEpochCache)  # of what was read below the position
    fetched_under_epoch: int | None = None  # the leader epoch of the leader last fetched from
    asking_epoch: int | None = None  # a validation round's next epoch to ask about (KIP-279's rounds)
    reset_to: str | None = None  # "earliest" / "latest" when a reset is pending
    buffer: deque[ConsumerRecord] = field(default_factory=deque)
    buffer_next_offset: int | None = None  # where fetching continues after the buffer
    buffer_next_epoch: int | None = None  # the leader epoch of the offsets skipped up to buffer_next_offset
    high_watermark: int = -1
    last_stable_offset: int = -1
    fetch_error: ClientError | None = None
    paused: bool = False  # neither fetched nor drained (its buffer is kept) until resumed


@dataclass
class FetcherStats:
    """What the fetcher did, for Consumer.metrics()."""

    fetch_requests: int = 0
    fetch_errors: int = 0  # requests that failed whole
    fetch_latency_ms_total: float = 0.0
    fetch_latency_ms_max: float = 0.0
    records_consumed: int = 0  # returned by poll
    bytes_consumed: int = 0  # keys and values returned by poll


class Fetcher:
    def __init__(self, metadata: Metadata, transport, config: ConsumerConfig,
                 clock: Callable[[], float] = time.monotonic):
        self._metadata = metadata
        self._transport = transport
        self._config = config
        self._clock = clock
        self.states: dict[TopicPartition, PartitionState] = {}
        self.stats = FetcherStats()
        self._round_robin = 0
        self._isolation = (common_pb2.ISOLATION_LEVEL_READ_COMMITTED if config.isolation_level == "read_committed"
                           else common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED)

    # --- assignment and positions ----------------------------------------------------------

    def assign(self, tps: list[TopicPartition]) -> None:
        self.states = {tp: self.states.get(tp, PartitionState()) for tp in tps}
        self._metadata.track({tp.topic for tp in tps})

    def seek(self, tp: TopicPartition, offset: int) -> None:
        state = self._state(tp)
        if state.position is not None and offset <= state.position:
            # Back over what was read (after a LogTruncationError, say): the epochs of what lies below
            # still say what the log held there, so a leader change is still checked against them
            # (Kafka's seek with the divergent offset's epoch); forward, nothing read describes the gap.
            state.read_epochs.truncate_from_end(offset)
        else:
            state.read_epochs = LeaderEpochCache()
        state.position, state.reset_to = offset, None
        state.asking_epoch = None
        state.buffer.clear()
        state.buffer_next_offset = None

    def set_paused(self, tps: list[TopicPartition], paused: bool) -> None:
        states = [self._state(tp) for tp in tps]  # every one assigned, or none changes
        for state in states:
            state.paused = paused

    def request_reset(self, tp: TopicPartition, strategy: str) -> None:
        state = self._state(tp)
        state.reset_to = strategy
        state.position = None
        state.read_epochs, state.asking_epoch = LeaderEpochCache(), None
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
            if state.paused:
                continue
            if state.fetch_error is not None:
                error, state.fetch_error = state.fetch_error, None
                if out:  # give back what we have; raise on the next poll
                    state.fetch_error = error
                    return out
                raise error
            while state.buffer and len(out) < max_records:
                record = state.buffer.popleft()
                out.append(record)
                self.stats.records_consumed += 1
                self.stats.bytes_consumed += len(record.key or b"") + len(record.value or b"")
                _read_in(state, record.leader_epoch, record.offset)
                state.position = record.offset + 1
            if not state.buffer and state.buffer_next_offset is not None:
                if state.position is None or state.buffer_next_offset > state.position:
                    _read_in(state, state.buffer_next_epoch, state.position)
                    state.position = state.buffer_next_offset
                state.buffer_next_offset = None
            if len(out) >= max_records:
                break
        return out

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, s in self.states.items() if s.position is not None and not s.buffer and not s.paused]

    async def fetch_once(self, max_wait_ms: float) -> None:
        """One round: the positions of partitions whose leader changed
        validated, then a Fetch to each leader of the fetchable partitions.
        Metadata marked stale (a leader that stopped answering or leading) is
        read again first: a consumer follows its partitions' leaders."""
        if self._metadata.needs_refresh():
            await self._refresh_metadata()
        unvalidated = await self._validate_positions()
        by_leader: dict[str, list[TopicPartition]] = {}
        missing_leader = False
        for tp in self.fetchable():
            if tp in unvalidated:
                continue
            leader = self._metadata.leader(tp)
            if leader is None:
                missing_leader = True
                continue
            by_leader.setdefault(leader.leader_address, []).append(tp)
        if missing_leader:
            self._metadata.request_update()
            await self._refresh_metadata()
        if not by_leader:
            await asyncio.sleep(min(self._config.retry_backoff_ms, max_wait_ms) / 1000)
            return
        await asyncio.gather(*(self._fetch_from(address, tps[i:i + PARTITIONS_PER_REQUEST_MAX], max_wait_ms)
                               for address, tps in by_leader.items()
                               for i in range(0, len(tps), PARTITIONS_PER_REQUEST_MAX)))

    async def _refresh_metadata(self) -> None:
        try:
            await self._metadata.refresh()
        except ClientError as exc:
            if not exc.retriable:
                raise

    async def _fetch_from(self, address: str, tps: list[TopicPartition], max_wait_ms: float) -> None:
        # The round awaited since choosing these: a group may have taken a partition away (or reset it) meanwhile,
        # and metadata may have moved on since the positions were validated (a refresh within this round): a
        # partition whose leader epoch changed again waits for the next round's validation.
        tps = [tp for tp in tps if (state := self.states.get(tp)) is not None and state.position is not None
               and not self._needs_validation(state, self._leader_epoch(tp))]
        if not tps:
            return
        positions = {tp: self.states[tp].position for tp in tps}
        epochs = {tp: self._leader_epoch(tp) for tp in tps}
        request = partition_pb2.FetchRequest(
            isolation_level=self._isolation,
            include_transaction_outcomes=self._config.include_transaction_outcomes,
            accepted_compressions=ACCEPTED_COMPRESSIONS,
            batch_format=partition_pb2.BATCH_FORMAT_ENCODED,
            max_wait_ms=int(max_wait_ms),
            min_bytes=1,
            max_bytes=self._config.fetch_max_bytes,
            max_records=self._config.max_poll_records,
            partitions=[
                partition_pb2.FetchPartition(topic=tp.topic, partition=tp.partition, fetch_offset=positions[tp],
                                             partition_max_bytes=self._config.max_partition_fetch_bytes,
                                             leader_epoch=epochs[tp])
                for tp in tps
            ],
        )
        self.stats.fetch_requests += 1
        started_s = time.monotonic()
        retry_later = False
        try:
            # a stream of chunks (FetchStream): each is taken as it comes, decoded while the leader reads the next
            async for response in self._transport.fetch(address, request, timeout_ms=self._config.request_timeout_ms + max_wait_ms):
                retry_later = self._take_all(response, positions, epochs) or retry_later
        except ClientError as exc:
            self.stats.fetch_errors += 1
            if not sort_error(exc, self._metadata):
                raise
            await asyncio.sleep(self._config.retry_backoff_ms / 1000)
            return
        latency_ms = (time.monotonic() - started_s) * 1000
        self.stats.fetch_latency_ms_total += latency_ms
        self.stats.fetch_latency_ms_max = max(self.stats.fetch_latency_ms_max, latency_ms)
        if retry_later:
            await asyncio.sleep(self._config.retry_backoff_ms / 1000)

    def _take_all(self, response, positions: dict[TopicPartition, int], epochs: dict[TopicPartition, int]) -> bool:
        """Takes one response (or chunk of a stream) of a Fetch sent with ``positions``;
        those continue where it left each partition. True when a partition is to be
        fetched again after a backoff."""
        retry_later = False
        for result in response.results:
            tp = TopicPartition(result.topic, result.partition)
            state = self.states.get(tp)
            if state is None or tp not in positions or _fetching_at(state) != positions[tp]:
                continue  # unassigned or sought meanwhile: this answer is stale
            if result.error.code == NONE:
                self._take(tp, state, result, positions[tp], epochs[tp])
                positions[tp] = _fetching_at(state)
            elif result.error.code == OFFSET_OUT_OF_RANGE:
                self._out_of_range(tp, state, positions[tp], result)
            else:
                exc = from_proto(result.error)
                if not sort_error(exc, self._metadata):
                    state.fetch_error = exc
                retry_later = True
            if state.fetch_error is not None or state.reset_to is not None:
                del positions[tp]  # whatever a later chunk says of it is not taken
        return retry_later

    # --- KIP-320: positions checked against a new leader's log ------------------------------------

    def _needs_validation(self, state: PartitionState, leader_epoch: int) -> bool:
        return (state.position is not None and state.read_epochs.latest_epoch >= 0 and not state.buffer
                and state.fetched_under_epoch is not None and leader_epoch != state.fetched_under_epoch)

    async def _validate_positions(self) -> set[TopicPartition]:
        """An EpochEndOffsets round for every position fetched under another
        leader epoch than metadata names now; the partitions still unvalidated."""
        by_leader: dict[str, dict[TopicPartition, tuple[int, int, int]]] = {}
        for tp, state in self.states.items():
            leader = self._metadata.leader(tp)
            if leader is not None and self._needs_validation(state, leader.leader_epoch):
                asked = state.asking_epoch if state.asking_epoch is not None else state.read_epochs.latest_epoch
                by_leader.setdefault(leader.leader_address, {})[tp] = (state.position, asked, leader.leader_epoch)
        if not by_leader:
            return set()
        unvalidated: set[TopicPartition] = set()
        await asyncio.gather(*(self._validate_at(address, asked, unvalidated) for address, asked in by_leader.items()))
        return unvalidated

    async def _validate_at(self, address: str, asked: dict[TopicPartition, tuple[int, int, int]],
                           unvalidated: set[TopicPartition]) -> None:
        request = partition_pb2.EpochEndOffsetsRequest(partitions=[
            partition_pb2.EpochEndOffsetsPartition(topic=tp.topic, partition=tp.partition, leader_epoch=epoch,
                                                   current_leader_epoch=leader_epoch)
            for tp, (_, epoch, leader_epoch) in asked.items()])
        try:
            response = await self._transport.call(address, "EpochEndOffsets", request, timeout_ms=self._config.request_timeout_ms)
        except ClientError as exc:
            if not sort_error(exc, self._metadata):
                raise
            unvalidated.update(asked)
            return
        for result in response.results:
            tp = TopicPartition(result.topic, result.partition)
            state = self.states.get(tp)
            if tp not in asked or state is None or state.position != asked[tp][0] or state.buffer:
                continue  # unassigned or sought meanwhile
            if result.error.code != NONE:
                exc = from_proto(result.error)
                if not sort_error(exc, self._metadata):
                    state.fetch_error = exc
                unvalidated.add(tp)
                continue
            if not self._validated(tp, state, asked[tp][2], result):
                unvalidated.add(tp)

    def _validated(self, tp: TopicPartition, state: PartitionState, leader_epoch: int, result) -> bool:
        """Acts on one answer; False when another round (or the application) must follow."""
        step = truncation_step(state.read_epochs, state.position, result.leader_epoch, result.end_offset)
        if isinstance(step, AskAgain):
            state.asking_epoch = step.epoch
            return False
        state.asking_epoch = None
        if step >= state.position:
            state.fetched_under_epoch = leader_epoch
            return True
        if self._config.auto_offset_reset == "none":
            state.fetch_error = LogTruncationError(tp.topic, tp.partition, state.position, step)
            return False  # validated again (and raised again) until the application seeks
        log.warning("log truncation detected: %s-%d was read to %d; the leader's log diverges from it at %d",
                    tp.topic, tp.partition, state.position, step)
        state.read_epochs.truncate_from_end(step)
        state.position = step
        state.fetched_under_epoch = leader_epoch
        return True

    def _leader_epoch(self, tp: TopicPartition) -> int:
        leader = self._metadata.leader(tp)
        return leader.leader_epoch if leader is not None else -1

    def _take(self, tp: TopicPartition, state: PartitionState, result, fetch_offset: int, leader_epoch: int) -> None:
        state.high_watermark = result.high_watermark
        state.last_stable_offset = result.last_stable_offset
        state.fetched_under_epoch = leader_epoch if leader_epoch >= 0 else None
        next_offset, skipped_epoch = fetch_offset, None
        outcomes = Outcomes.of_result(result) if self._config.include_transaction_outcomes else None
        for batch in result.batches:  # a server older than the encoded format answers messages
            epoch = batch.partition_leader_epoch if batch.HasField("partition_leader_epoch") else None
            outcome = None if outcomes is None else outcomes.of(batch.is_transactional, batch.producer_id, batch.base_offset)
            if batch.compression:  # whole, as stored: its records get their offsets here, those below ours are skipped
                compression.expand(batch, compression.READ_BYTES_MAX, fetch_offset)
            for record in batch.records:
                if record.offset >= fetch_offset:
                    state.buffer.append(consumer_record(tp.topic, tp.partition, record, epoch, batch.producer_id, outcome))
                    next_offset = record.offset + 1
        for data in result.encoded_batches:  # whole, as stored: records get their offsets here, those below ours are skipped
            try:
                header = batch_format.verified_header(data)
                records = batch_format.open_records(data, header, compression.READ_BYTES_MAX).records
            except BatchFormatError as exc:
                state.fetch_error = from_proto(error_proto(CORRUPT_MESSAGE, f"{tp.topic}-{tp.partition}: a batch fetched "
                                                           f"at offset {fetch_offset} or after is damaged: {exc}"))
                break  # the records before it stay buffered; the position stays at the damaged batch
            epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else None
            outcome = None if outcomes is None else outcomes.of(header.is_transactional, header.producer_id, header.base_offset)
            base_offset, append_time_ms, producer_id = header.base_offset, header.log_append_time_ms, header.producer_id
            for offset in range(max(fetch_offset, base_offset), base_offset + len(records)):
                state.buffer.append(consumer_record(tp.topic, tp.partition, records[offset - base_offset], epoch, producer_id,
                                                    outcome, offset=offset, append_time_ms=append_time_ms))
                next_offset = offset + 1
        if state.fetch_error is not None:
            result.next_fetch_offset = next_offset  # not past the damaged batch
        if result.next_fetch_offset > next_offset:
            next_offset = result.next_fetch_offset
            skipped_epoch = result.next_fetch_epoch if result.HasField("next_fetch_epoch") else None
        if state.buffer:
            state.buffer_next_offset, state.buffer_next_epoch = next_offset, skipped_epoch
        elif next_offset > fetch_offset:
            _read_in(state, skipped_epoch, fetch_offset)
            state.position = next_offset

    def _out_of_range(self, tp: TopicPartition, state: PartitionState, fetch_offset: int, result) -> None:
        strategy = self._config.auto_offset_reset
        if strategy == "none":
            state.fetch_error = NoOffsetForPartitionError(
                f"offset {fetch_offset} of {tp.topic}-{tp.partition} is out of range "
                f"[{result.log_start_offset}, {result.high_watermark}] and auto_offset_reset is 'none'")
            return
        self.request_reset(tp, strategy)


def _fetching_at(state: PartitionState) -> int | None:
    """Where a fetch of the partition continues: after its buffer, else at its position."""
    return state.buffer_next_offset if state.buffer else state.position


def _read_in(state: PartitionState, epoch: int | None, offset: int) -> None:
    """What was read from ``offset`` on was written in ``epoch`` (None: the
    server did not say). Offsets skipped unseen (markers, aborted batches) are
    entered from the first of them: an epoch placed too early only makes a
    truncation go back over offsets that return nothing."""
    if epoch is None or epoch == state.read_epochs.latest_epoch:
        return
    try:
        state.read_epochs.assign(epoch, offset)
    except ValueError:  # an older epoch after a newer one: what was read cannot be placed, so start over from here
        state.read_epochs = LeaderEpochCache([(epoch, offset)])


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
