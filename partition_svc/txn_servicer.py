"""PartitionService's transactional writes and consumer-group offsets:
WriteTxnMarkers (the coordinator's markers and seals), OffsetCommit,
TxnOffsetCommit and OffsetFetch. The rules are the partition's
(partition_core.py); a marker counts as written once it is replicated."""

from __future__ import annotations

import asyncio

from partition_svc import appends, log_format, validation
from partition_svc.cluster_view import ClusterView
from partition_svc.group_coordinator import GroupCoordinator
from partition_svc.partition import now_ms
from partition_svc.producer_state import Reject
from partition_svc.rpc_errors import error_of, not_replicated, optional, request_error
from partition_svc.txn_verification import TransactionVerifier
from services.coordination.producer_ids import check_producer, named_producer
from services.runtime import server
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.v1 import common_pb2, partition_pb2


class TransactionServicer:
    RPCS = ("WriteTxnMarkers", "OffsetCommit", "TxnOffsetCommit", "OffsetFetch")

    def __init__(self, view: ClusterView, verifier: TransactionVerifier, groups: GroupCoordinator):
        self.view = view
        self.config = view.config
        self.verifier = verifier
        self.groups = groups

    @server.rpc_handler
    async def WriteTxnMarkers(self, request, context):
        if not request.markers:
            raise request_error("the request holds no marker")
        self.view.check_partition_count(sum(len(m.partitions) for m in request.markers))
        for marker in request.markers:
            check_producer(marker.producer_id, marker.producer_epoch, "WriteTxnMarkers")
            if marker.coordinator_epoch < 0:
                raise request_error(f"coordinator_epoch must not be negative, got {marker.coordinator_epoch}")
        reply = partition_pb2.WriteTxnMarkersResponse()
        targets = []
        for marker in request.markers:
            marker_result = reply.markers.add(producer_id=marker.producer_id)
            for tp in marker.partitions:
                result = marker_result.results.add(partition=tp)
                try:
                    targets.append((marker, result, await self.view.hosted(tp.topic, tp.partition)))
                except TxlogError as exc:
                    result.error.CopyFrom(error_of(exc))
        written, now = [], now_ms()
        for marker, result, partition in targets:
            if marker.seal_prepared:
                outcome = partition.seal_prepared(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, now)
            else:
                outcome = partition.write_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                                 marker.committed, now)
            if isinstance(outcome, Reject):
                result.error.CopyFrom(error_proto(outcome.code, outcome.message))
            elif outcome is not None:
                written.append((result, partition, outcome))
        # A marker counts as written only once it is replicated (below the high watermark).
        replicated = await asyncio.gather(*(future for _, _, future in written))
        for (result, partition, _), done in zip(written, replicated, strict=True):
            appends.check_replicated(result, partition, done)
        return reply

    async def offset_records(self, group_id: str, offsets, results) -> list[tuple[bytes, bytes]]:
        """The (key, value) records of the valid offsets to commit; each invalid
        one gets its error in ``results`` (a repeated PartitionResult)."""
        records = []
        now = now_ms()
        for wanted in offsets:
            result = results.add(partition=common_pb2.TopicPartition(topic=wanted.topic, partition=wanted.partition))
            try:
                validation.check_topic_name(wanted.topic)
                info = await self.view.topics.get(wanted.topic)
                if info is None or not 0 <= wanted.partition < info.partition_count:
                    raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"{wanted.topic} partition {wanted.partition} does not exist")
                if not wanted.HasField("offset"):
                    raise TxlogError(ErrorCode.Value("INVALID_OFFSET"), "offset is required (left out it is not 0, which would "
                                     "rewind the group to the start)")
                if wanted.offset < 0:
                    raise TxlogError(ErrorCode.Value("INVALID_OFFSET"), f"offset must not be negative, got {wanted.offset}")
                if len(wanted.metadata.encode()) > validation.OFFSET_METADATA_BYTES_MAX:
                    raise request_error(f"offset metadata is larger than {validation.OFFSET_METADATA_BYTES_MAX} bytes")
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
                continue
            key = log_format.group_offset_key(group_id, wanted.topic, wanted.partition)
            records.append((key, log_format.group_offset_value(wanted.offset, wanted.metadata, now)))
        return records

    @server.rpc_handler
    async def OffsetCommit(self, request, context):
        validation.check_group_id(request.group_id)
        self.view.check_partition_count(len(request.offsets))
        offsets_partition = await self.view.group_partition(request.group_id)
        await self.groups.check_commit(request.group_id, request.member_id, optional(request, "member_epoch"))
        reply = partition_pb2.OffsetCommitResponse()
        records = await self.offset_records(request.group_id, request.offsets, reply.results)
        if records:
            outcome = offsets_partition.commit_offsets(records, now_ms(), self.view.limits)
            if isinstance(outcome, Reject) or not await outcome:
                raise not_replicated(offsets_partition)
        return reply

    @server.rpc_handler
    async def TxnOffsetCommit(self, request, context):
        validation.check_group_id(request.group_id)
        self.view.check_partition_count(len(request.offsets))
        named_producer(request, "TxnOffsetCommit")
        offsets_partition = await self.view.group_partition(request.group_id)
        batch = common_pb2.RecordBatch(producer_id=request.producer_id, producer_epoch=request.producer_epoch)
        await self.verifier.verify_transactional(request.transactional_id, batch, offsets_partition)
        await self.groups.check_commit(request.group_id, request.member_id, optional(request, "member_epoch"))
        reply = partition_pb2.TxnOffsetCommitResponse()
        records = await self.offset_records(request.group_id, request.offsets, reply.results)
        if records:
            outcome = offsets_partition.commit_txn_offsets(request.producer_id, request.producer_epoch, records, now_ms())
            if isinstance(outcome, Reject) and outcome.code == ErrorCode.Value("NOT_LEADER"):
                raise not_replicated(offsets_partition)
            if isinstance(outcome, Reject):
                raise TxlogError(outcome.code, outcome.message)
            if outcome is not None and not await outcome:  # None when every offset was older than one pending already
                raise not_replicated(offsets_partition)
        return reply

    @server.rpc_handler
    async def OffsetFetch(self, request, context):
        validation.check_group_id(request.group_id)
        if len(request.partitions) > self.config.partitions_per_request_max:
            self.view.check_partition_count(len(request.partitions))
        negative = [f"{p.topic[:300]}-{p.partition}" for p in request.partitions if p.partition < 0]
        if negative:
            raise validation.invalid(f"partitions are numbered from 0: {negative[:10]}")
        offsets_partition = await self.view.group_partition(request.group_id)
        prefix = log_format.group_prefix(request.group_id)
        wanted_keys = [log_format.group_offset_key(request.group_id, p.topic, p.partition) for p in request.partitions]
        if request.require_stable and offsets_partition.has_pending_offsets(prefix, wanted_keys or None):
            raise TxlogError(
                ErrorCode.Value("UNSTABLE_OFFSET_COMMIT"),
                f"group {request.group_id!r} has offsets pending in an open transaction; retry once it ends",
            )
        found = self.view.store.group_offsets(request.group_id, [(p.topic, p.partition) for p in request.partitions])
        return partition_pb2.OffsetFetchResponse(offsets=[
            partition_pb2.FetchedOffset(topic=topic, partition=index, offset=offset, metadata=metadata)
            for topic, index, offset, metadata in found])
