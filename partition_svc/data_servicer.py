"""PartitionService's data plane: Produce, Fetch, ListOffsets,
EpochEndOffsets, DeleteRecords and DescribeProducers. Each handler checks the
request, finds the partitions this instance leads (ClusterView) and asks
them; appends.py holds the acks and the waiting.

A problem with the request as a whole (bad acks, no partitions, a partition
named twice) is the call's status and nothing is applied. A problem with one
partition (unknown, led elsewhere, a bad batch, a sequence error) is that
partition's ``error``; the others proceed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from partition_svc import appends, validation, wire
from partition_svc.appends import ACKS_ALL, Taken
from partition_svc.cluster_view import ClusterView
from partition_svc.partition import Partition, now_ms
from partition_svc.partition_metrics import PartitionMetrics
from partition_svc.producer_state import Reject
from partition_svc.rpc_errors import check_settled, error, error_of, request_error
from partition_svc.topics import INTERNAL_PREFIX
from partition_svc.txn_verification import TransactionVerifier
from services.runtime import server
from services.runtime.logs import fields
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)

STREAM_CHUNK_BYTES_DEFAULT = 1024 * 1024  # FetchStreamRequest.chunk_bytes left 0
DELETE_RECORDS_TIMEOUT_MS_DEFAULT = 30_000  # DeleteRecords' wait for the in-sync replicas when its timeout_ms is 0
INTERNAL_TOPICS = (CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)
# A produced batch's result, the partition it goes to and the batch (None, None: refused already)
Resolved = tuple[object, Partition | None, common_pb2.RecordBatch | validation.EncodedBatch | None]


def readable_end(isolation_level: int, high_watermark: int, last_stable_offset: int) -> int:
    """Where a fetch at ``isolation_level`` stops: read_committed at the last stable offset."""
    return last_stable_offset if isolation_level == common_pb2.ISOLATION_LEVEL_READ_COMMITTED else high_watermark


@dataclass
class FetchPass:
    """One pass over a Fetch's partitions: the encoded response, the events to
    wait on for partitions that had nothing, the bytes and records returned,
    {index in the request: (next_fetch_offset, bytes returned)} of the
    partitions not refused that have more to read, whether it has news for
    the reader, and what records the pass in the metrics once it is (part of)
    the answer."""

    reply: bytes
    waits: list[asyncio.Event]
    returned_bytes: int
    records: int
    more: dict[int, tuple[int, int]]
    news: bool  # some partition moved on or was refused
    tally: Callable[[], None]


class DataServicer:
    RPCS = ("Produce", "Fetch", "FetchStream", "EpochEndOffsets", "ListOffsets", "DeleteRecords", "DescribeProducers")

    def __init__(self, view: ClusterView, verifier: TransactionVerifier, metrics: PartitionMetrics):
        self.view = view
        self.config = view.config
        self.verifier = verifier
        self.metrics = metrics

    @server.rpc_handler
    async def Produce(self, request, context):
        acks = request.acks if request.HasField("acks") else ACKS_ALL  # absent: the safe meaning
        if acks not in (ACKS_ALL, 0, 1):
            raise request_error(f"acks must be left out or -1 (all), 1 or 0, got {acks}")
        if request.timeout_ms < 0:
            raise request_error(f"timeout_ms must be 0 (no limit) or positive, got {request.timeout_ms}")
        self.view.check_partition_count(len(request.batches))
        if len({(b.topic, b.partition) for b in request.batches}) != len(request.batches):
            raise request_error("the request names a partition twice; put its records in one batch")
        reply = partition_pb2.ProduceResponse()
        resolved = await self._verified(request, *await self._resolved(request, reply))
        taken: list[Taken] = []
        now = now_ms()
        for item, (result, partition, batch) in zip(request.batches, resolved, strict=True):
            if partition is None:
                continue
            outcome = appends.append(partition, batch, acks, now, self.view.limits)
            if isinstance(outcome, Reject):
                result.error.CopyFrom(error_proto(outcome.code, outcome.message))
                continue
            result.base_offset = outcome.base_offset
            if not outcome.duplicate:
                self.count_produced(item.topic, outcome.last_offset + 1 - outcome.base_offset,
                                    len(item.encoded_batch) or item.batch.ByteSize(),
                                    appends.written(outcome, acks))
            result.log_start_offset = partition.log_start_offset
            result.log_append_time_ms = now
            taken.append(Taken(result, partition, appends.written(outcome, acks)))
        if acks == 0:  # answered before anything is durable: no offsets to rely on
            for result in reply.results:
                result.base_offset = -1
        await appends.wait_for_acks(taken, acks, request.timeout_ms)
        for result in reply.results:
            if result.error.code:
                self.metrics.refused("Produce", self.view.known_topic(result.topic), result.error.code)
        return reply

    async def _resolved(self, request, reply) -> tuple[list[Resolved], dict[tuple[int, int], list[int]]]:
        """Each batch's result, the partition it goes to (None where it is refused already: the result says
        why) and the batch checked (validation.produced_batch, either form), and the transactional batches to
        verify, by producer (their indexes)."""
        resolved: list[Resolved] = []
        to_verify: dict[tuple[int, int], list[int]] = {}
        for item in request.batches:
            result = reply.results.add(topic=item.topic, partition=item.partition)
            try:
                partition = await self.view.hosted(item.topic, item.partition)
                await self.check_leader_epoch(item, partition)
                batch = validation.produced_batch(item, self.view.limits)  # first: it gives an absent producer id its -1
                if item.topic in INTERNAL_TOPICS:
                    await self.view.check_internal_writer(item.topic, item.partition, batch)
                if batch.is_transactional and self.verifier.needs_verification(request.transactional_id, batch, partition):
                    to_verify.setdefault((batch.producer_id, batch.producer_epoch), []).append(len(resolved))
                resolved.append((result, partition, batch))
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
                resolved.append((result, None, None))
        return resolved, to_verify

    async def _verified(self, request, resolved: list[Resolved], to_verify: dict[tuple[int, int], list[int]]) -> list[Resolved]:
        """``resolved`` without the transactional batches whose partitions the coordinator says are not in
        their transaction (KIP-890): one coordinator call per producer, not per batch."""
        for (producer_id, producer_epoch), indexes in to_verify.items():
            tps = [(resolved[i][1].topic, resolved[i][1].index) for i in indexes]
            refused = await self.verifier.verify(request.transactional_id, producer_id, producer_epoch, tps,
                                                 add=request.add_to_transaction)
            for i, tp in zip(indexes, tps, strict=True):
                if tp in refused:
                    result = resolved[i][0]
                    result.error.CopyFrom(self.verifier.not_in_transaction(tp, refused[tp], added=request.add_to_transaction))
                    resolved[i] = (result, None, None)
        return resolved

    def count_produced(self, topic: str, records: int, size_bytes: int, written: asyncio.Future) -> None:
        """Counts an appended batch once it is written as its acks asked (for
        acks=all: replicated), whether or not the request still waits for it: a
        batch a leader change truncated is not counted, and its retry, appended
        again at the new leader, is counted there once."""
        def counted(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is None and future.result() is not False:
                self.metrics.produced(topic, records, size_bytes)

        written.add_done_callback(counted)

    async def check_leader_epoch(self, wanted, partition: Partition) -> None:
        """A PartitionBatch or FetchPartition that names the leader epoch it saw
        is refused when this leader's differs (absent or -1: no check)."""
        if wanted.HasField("leader_epoch") and wanted.leader_epoch != -1:
            partition.check_leader_epoch(wanted.leader_epoch)

    @server.rpc_handler
    async def Fetch(self, request, context):
        self._check_fetch(request)
        return (await self._long_poll(request)).reply

    @server.rpc_handler
    async def FetchStream(self, streamed, context):
        """Fetch's answer in chunks. The first is a Fetch with the request's long
        poll and a budget of one chunk. Each next one continues every partition
        with more to read at its next_fetch_offset, without waiting, and holds
        batches until it has a chunk's bytes (its last batch may take it past:
        each batch is read once, none only to learn that it does not fit),
        within what is left of max_bytes, max_records and each partition's
        share; the stream ends when they are used up or no partition moves on.
        The request is checked and the first chunk read before the stream
        begins, so a refused request is a failed call, as with Fetch."""
        request = streamed.fetch
        self._check_fetch(request)
        if streamed.chunk_bytes < 0:
            raise request_error("chunk_bytes must not be negative")
        chunk = streamed.chunk_bytes or STREAM_CHUNK_BYTES_DEFAULT
        bytes_left = request.max_bytes or self.config.batch_bytes_max * 4
        records_left = request.max_records or 2**31 - 1  # int32
        wanted = partition_pb2.FetchRequest()
        wanted.CopyFrom(request)
        wanted.max_bytes, wanted.max_records = min(chunk, bytes_left), records_left
        wanted.min_bytes = min(request.min_bytes, wanted.max_bytes)
        first = await self._long_poll(wanted)

        async def chunks():
            nonlocal bytes_left, records_left
            done = first
            while True:
                yield done.reply
                bytes_left -= done.returned_bytes
                records_left -= done.records
                partitions = []
                for index, (offset, taken) in done.more.items():
                    item = partition_pb2.FetchPartition()
                    item.CopyFrom(wanted.partitions[index])
                    if item.partition_max_bytes > 0:  # its share: what is left of it (0: none of its own)
                        if item.partition_max_bytes <= taken:
                            continue
                        item.partition_max_bytes -= taken
                    item.fetch_offset = offset
                    partitions.append(item)
                if bytes_left <= 0 or records_left <= 0 or not partitions:
                    return
                del wanted.partitions[:]
                wanted.partitions.extend(partitions)
                wanted.max_bytes, wanted.max_records = bytes_left, records_left
                done = await self._fetch_once(wanted, take_first=False, enough=chunk)
                if not done.news:
                    return  # nothing fit in what is left: no empty chunk
                done.tally()

        return chunks()

    def _check_fetch(self, request) -> None:
        if request.isolation_level not in (common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED, common_pb2.ISOLATION_LEVEL_READ_COMMITTED):
            raise request_error(f"unknown isolation_level {request.isolation_level}")
        if request.batch_format not in (partition_pb2.BATCH_FORMAT_MESSAGE, partition_pb2.BATCH_FORMAT_ENCODED):
            raise request_error(f"unknown batch_format {request.batch_format}; known: BATCH_FORMAT_MESSAGE (0), "
                                "BATCH_FORMAT_ENCODED (2)")
        if request.max_wait_ms < 0 or request.max_bytes < 0 or request.max_records < 0 or request.min_bytes < 0:
            raise request_error("max_wait_ms, min_bytes, max_bytes and max_records must not be negative")
        self.view.check_partition_count(len(request.partitions))

    async def _long_poll(self, request) -> FetchPass:
        """Passes over the partitions until min_bytes are there or max_wait_ms has passed."""
        wait_s = min(request.max_wait_ms, self.config.fetch_wait_ms_max) / 1000
        deadline = time.monotonic() + wait_s
        while True:
            done = await self._fetch_once(request)
            remaining = deadline - time.monotonic()
            if done.returned_bytes > max(request.min_bytes - 1, 0) or not done.waits or remaining <= 0:
                done.tally()  # only the pass answered counts: a long poll's earlier passes were thrown away
                return done
            waiters = [asyncio.ensure_future(w.wait()) for w in done.waits]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:  # an idle partition's event may never fire: a waiter left behind would live for good
                for waiter in waiters:
                    waiter.cancel()

    async def _fetch_once(self, request, take_first: bool = True, enough: int | None = None) -> FetchPass:
        """One pass over the partitions; ``take_first``: the first batch is
        returned whatever its size; ``enough``: the pass stops once it holds
        that many bytes (its last batch may take it past, within max_bytes),
        and the partitions after that are left out of it (a FetchStream's
        chunk; the next one continues them)."""
        encoded_results = []
        fetched: list[tuple[str, int, int]] = []
        refused: list[tuple[str, int]] = []
        more: dict[int, tuple[int, int]] = {}
        bytes_left = request.max_bytes or self.config.batch_bytes_max * 4
        records_left = request.max_records or 2**31
        accepted = frozenset(request.accepted_compressions)
        encoded = request.batch_format == partition_pb2.BATCH_FORMAT_ENCODED
        waits, returned_bytes, returned_records, news = [], 0, 0, False
        for index, wanted in enumerate(request.partitions):
            if enough is not None and returned_bytes >= enough:
                more[index] = (wanted.fetch_offset, 0)
                continue
            result = partition_pb2.FetchPartitionResult(topic=wanted.topic, partition=wanted.partition, next_fetch_offset=wanted.fetch_offset)
            batches: list[wire.Encoded] = []
            records = 0
            try:
                partition = await self.view.hosted(wanted.topic, wanted.partition)
                await self.check_leader_epoch(wanted, partition)
                batches, records = self._read(
                    partition, wanted, request.isolation_level, result, bytes_left, records_left, take_first and returned_bytes == 0,
                    outcomes=request.include_transaction_outcomes, accepted=accepted, encoded=encoded,
                    bytes_enough=None if enough is None else enough - returned_bytes,
                )
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
                refused.append((self.view.known_topic(wanted.topic), exc.code))
            taken = sum(batch.size for batch in batches)
            if records:
                fetched.append((wanted.topic, records, taken))
            news = news or result.HasField("error") or result.next_fetch_offset > wanted.fetch_offset
            upper = readable_end(request.isolation_level, result.high_watermark, result.last_stable_offset)
            # more to read, and (unless a first batch is always taken) room for it: this pass moved on
            if not result.HasField("error") and result.next_fetch_offset < upper and (take_first or result.next_fetch_offset > wanted.fetch_offset):
                more[index] = (result.next_fetch_offset, taken)
            returned_bytes += taken
            returned_records += records
            bytes_left = max(bytes_left - taken, 0)
            records_left = max(records_left - records, 0)
            if not batches and not result.HasField("error"):
                waits.append(partition.data_arrived())
            encoded_results.append(wire.partition_result(result, batches, encoded))

        def tally() -> None:
            for topic, code in refused:
                self.metrics.refused("Fetch", topic, code)
            for topic, records, taken in fetched:
                self.metrics.fetched(topic, records, taken)

        return FetchPass(wire.fetch_response(encoded_results), waits, returned_bytes, returned_records, more, news, tally)

    def _read(self, partition, wanted, isolation_level, result, bytes_left, records_left, take_first, *,
              outcomes: bool = False, accepted: frozenset[int] = frozenset(), encoded: bool = False,
              bytes_enough: int | None = None) -> tuple[list[wire.Encoded], int]:
        check_settled(partition)
        hw, lso = partition.high_watermark, partition.last_stable_offset
        result.high_watermark, result.last_stable_offset, result.log_start_offset = hw, lso, partition.log_start_offset
        if not partition.log_start_offset <= wanted.fetch_offset <= hw:
            raise TxlogError(
                ErrorCode.Value("OFFSET_OUT_OF_RANGE"),
                f"offset {wanted.fetch_offset} is outside [{partition.log_start_offset}, {hw}] of {wanted.topic}-{wanted.partition}",
            )
        upper = readable_end(isolation_level, hw, lso)
        partition_bytes = min(wanted.partition_max_bytes or bytes_left, bytes_left)
        batches, result.next_fetch_offset, records = partition.read_encoded(
            wanted.fetch_offset, upper, partition_bytes, records_left, take_first=take_first,
            committed=isolation_level == common_pb2.ISOLATION_LEVEL_READ_COMMITTED, accepted=accepted, encoded=encoded,
            bytes_enough=bytes_enough,
        )
        if result.next_fetch_offset > wanted.fetch_offset:
            result.next_fetch_epoch = partition.epochs.epoch_at(result.next_fetch_offset - 1)
        if outcomes and batches and isolation_level == common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED:
            aborted, opened = partition.transaction_outcomes(wanted.fetch_offset, result.next_fetch_offset)
            result.aborted_transactions.extend(
                partition_pb2.AbortedTransaction(producer_id=p, first_offset=first, last_offset=last) for p, first, last in aborted)
            result.open_transactions.extend(partition_pb2.OpenTransaction(producer_id=p, first_offset=first) for p, first in opened)
        return batches, records

    @server.rpc_handler
    async def EpochEndOffsets(self, request, context):
        self.view.check_partition_count(len(request.partitions))
        reply = partition_pb2.EpochEndOffsetsResponse()
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition, leader_epoch=-1, end_offset=-1)
            try:
                if wanted.leader_epoch < 0:
                    raise request_error(f"leader_epoch must not be negative, got {wanted.leader_epoch}")
                partition = await self.view.hosted(wanted.topic, wanted.partition)
                if wanted.HasField("current_leader_epoch") and wanted.current_leader_epoch != -1:
                    partition.check_leader_epoch(wanted.current_leader_epoch)
                result.leader_epoch, result.end_offset = partition.epochs.end_offset_for(wanted.leader_epoch, partition.written_end)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def ListOffsets(self, request, context):
        self.view.check_partition_count(len(request.partitions))
        reply = partition_pb2.ListOffsetsResponse()
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition, offset=-1, timestamp_ms=-1)
            try:
                partition = await self.view.hosted(wanted.topic, wanted.partition)
                check_settled(partition)
                if wanted.spec == partition_pb2.OFFSET_SPEC_EARLIEST:
                    result.offset = partition.log_start_offset
                elif wanted.spec == partition_pb2.OFFSET_SPEC_LATEST:
                    result.offset = partition.high_watermark
                elif wanted.spec == partition_pb2.OFFSET_SPEC_LAST_STABLE:
                    result.offset = partition.last_stable_offset
                elif wanted.spec == partition_pb2.OFFSET_SPEC_TIMESTAMP:
                    if wanted.timestamp_ms < 0:
                        raise request_error(f"timestamp_ms must not be negative, got {wanted.timestamp_ms}")
                    result.offset, result.timestamp_ms = partition.offset_for_timestamp(wanted.timestamp_ms)
                else:
                    raise request_error(f"unknown offset spec {wanted.spec}")
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def DeleteRecords(self, request, context):
        if request.timeout_ms < 0:
            raise request_error(f"timeout_ms must be 0 (the default, {DELETE_RECORDS_TIMEOUT_MS_DEFAULT}) or positive, "
                                f"got {request.timeout_ms}")
        self.view.check_partition_count(len(request.partitions))
        if len({(p.topic, p.partition) for p in request.partitions}) != len(request.partitions):
            raise request_error("the request names a partition twice")
        reply = partition_pb2.DeleteRecordsResponse()
        waits: dict[asyncio.Future, tuple[object, Partition]] = {}
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition, low_watermark=-1)
            try:
                if wanted.topic.startswith(INTERNAL_PREFIX):  # as Kafka: only their owners' compaction deletes there
                    raise TxlogError(ErrorCode.Value("INVALID_TOPIC"), f"{wanted.topic[:300]} is internal: its records are not deleted on request")
                partition = await self.view.hosted(wanted.topic, wanted.partition)
                check_settled(partition)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
                continue
            outcome = partition.delete_records(wanted.offset)
            if isinstance(outcome, Reject):
                result.error.CopyFrom(error_proto(outcome.code, outcome.message))
                continue
            if outcome.written is not None:
                log.info("records deleted", extra=fields(topic=wanted.topic, partition=wanted.partition,
                                                         log_start_offset=outcome.log_start_offset))
            waits[asyncio.ensure_future(partition.wait_log_start_followed(outcome))] = (result, partition)
        if waits:
            try:
                done, _ = await asyncio.wait(waits, timeout=(request.timeout_ms or DELETE_RECORDS_TIMEOUT_MS_DEFAULT) / 1000)
            finally:  # also when the caller goes away: a wait for replicas that never follow must not stay behind
                for task in waits:
                    task.cancel()
            for task, (result, partition) in waits.items():
                result.low_watermark = partition.low_watermark
                if task not in done or not task.result():
                    result.error.CopyFrom(error("REQUEST_TIMED_OUT", (
                        f"the log start of {partition.topic}-{partition.index} moved on the leader, but not every in-sync replica "
                        f"had moved its own (the low watermark is {result.low_watermark}) "
                        + ("within timeout_ms" if task not in done else "before this replica stopped leading")
                        + "; they go on, and a retry answers once they have")))
        return reply

    @server.rpc_handler
    async def DescribeProducers(self, request, context):
        self.view.check_partition_count(len(request.partitions))
        reply = partition_pb2.DescribeProducersResponse()
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition)
            try:
                partition = await self.view.hosted(wanted.topic, wanted.partition)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
                continue
            for entry in sorted(partition.producers.values(), key=lambda e: e.producer_id):
                result.producers.add(
                    producer_id=entry.producer_id,
                    producer_epoch=entry.producer_epoch,
                    last_sequence=entry.last_sequence,
                    last_timestamp_ms=entry.last_timestamp_ms,
                    coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.current_txn_first_offset,
                )
        return reply
