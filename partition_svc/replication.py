"""The gRPC face of replication (replication.proto): LeaderAndIsr from the
controller, ReplicaFetch and OffsetForLeaderEpoch from followers. Internal:
only the cluster's own instances call these.
"""

from __future__ import annotations

import asyncio

from partition_svc import wire
from partition_svc.election import LeaderAndIsr
from partition_svc.partition import Partition
from partition_svc.replica_manager import ReplicaManager
from services.coordination import zk
from services.runtime import server
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.protocol.names import is_topic_name
from txlog.v1 import common_pb2, replication_pb2, replication_pb2_grpc

STATE_READS_CONCURRENT_MAX = 500  # ZooKeeper reads one request has outstanding at once (as Metadata's)


def _error(exc: TxlogError):
    return error_proto(exc.code, exc.message)


class ReplicationServicer(replication_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, replicas: ReplicaManager, fetch_wait_ms_max: int):
        self.replicas = replicas
        self.fetch_wait_ms_max = fetch_wait_ms_max

    async def _read_states(self, partitions) -> dict[tuple[str, int], Partition | TxlogError]:
        """Reads the states of the named partitions not known here, many at
        once, and answers those that do not exist, each once: the start of the
        request's lookups (:meth:`_leading`). One at a time, a request naming
        thousands this instance never heard of held its caller past a client
        deadline (the hostile fuzz found one, 380 KB, under load), and so did
        one naming a partition that does not exist thousands of times (each of
        its lookups read ZooKeeper again). No limit on how many a request
        names: a follower names every partition it follows from this leader."""
        unknown = list(dict.fromkeys((p.topic, p.partition) for p in partitions
                                     if (p.topic, p.partition) not in self.replicas.states))
        states = await zk.gather_in_chunks(lambda key: self.replicas.state(*key), unknown, STATE_READS_CONCURRENT_MAX)
        return {(topic, index): TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"{topic[:300]!r} partition {index} does not exist")
                for (topic, index), state in zip(unknown, states, strict=True) if state is None}

    @server.rpc_handler
    async def LeaderAndIsr(self, request, context):
        if request.controller_epoch < self.replicas.controller_epoch:
            raise TxlogError(ErrorCode.Value("STALE_CONTROLLER_EPOCH"),
                             f"controller epoch {request.controller_epoch} is older than {self.replicas.controller_epoch} "
                             "seen here: a deposed controller")
        self.replicas.controller_epoch = request.controller_epoch
        reply = replication_pb2.LeaderAndIsrResponse()
        for wanted in request.partitions:
            result = reply.results.add(partition=common_pb2.TopicPartition(topic=wanted.topic, partition=wanted.partition))
            try:
                info = await self.replicas.topic_of(wanted.topic, wanted.partition) if is_topic_name(wanted.topic) else None
                if info is None or not 0 <= wanted.partition < info.partition_count:
                    raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"{wanted.topic}-{wanted.partition} does not exist")
                state = LeaderAndIsr(wanted.leader, wanted.leader_epoch, tuple(wanted.isr), wanted.controller_epoch,
                                     wanted.zk_version, wanted.zk_mzxid, tuple(sorted(wanted.isr_storage_zxids.items())))
                await self.replicas.take(info, wanted.partition, state, tuple(wanted.replicas))
            except TxlogError as exc:
                result.error.CopyFrom(_error(exc))
        return reply

    async def _leading(self, topic: str, index: int, leader_epoch: int, looked_up: dict) -> Partition:
        """The partition this instance leads at ``leader_epoch``, else a TxlogError;
        ``looked_up``: the request's answers so far (a partition named again is not looked up again)."""
        found = looked_up.get((topic, index))
        if found is None:
            try:
                found = await self.replicas.leader(topic, index)
            except TxlogError as exc:
                found = exc
            looked_up[(topic, index)] = found
        if isinstance(found, TxlogError):
            raise found.with_traceback(None)  # the one answer, raised again for each naming (no traceback piled up)
        found.check_leader_epoch(leader_epoch)
        return found

    @server.rpc_handler
    async def OffsetForLeaderEpoch(self, request, context):
        looked_up = await self._read_states(request.partitions)
        reply = replication_pb2.OffsetForLeaderEpochResponse()
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition, leader_epoch=-1, end_offset=-1)
            try:
                partition = await self._leading(wanted.topic, wanted.partition, wanted.current_leader_epoch, looked_up)
                result.leader_epoch, result.end_offset = partition.epochs.end_offset_for(wanted.leader_epoch, partition.written_end)
            except TxlogError as exc:
                result.error.CopyFrom(_error(exc))
        return reply

    @server.rpc_handler
    async def ReplicaFetch(self, request, context):
        looked_up = await self._read_states(request.partitions)
        leading = []  # (wanted, the partition or None, what keeps the follower from fetching or None)
        for wanted in request.partitions:
            try:
                partition = await self._leading(wanted.topic, wanted.partition, wanted.leader_epoch, looked_up)
                storage = request.storage_zxid if request.HasField("storage_zxid") else None
                leading.append((wanted, partition, self._progress(request.replica_id, wanted, partition, storage)))
            except TxlogError as exc:
                leading.append((wanted, None, exc))
        reply, answered = self._collect(leading, request.max_bytes)
        wait_ms = min(request.max_wait_ms, self.fetch_wait_ms_max)
        if wait_ms > 0 and not answered:
            # new batches, or a log start DeleteRecords moved, end the wait
            events = [event for _, p, outcome in leading if p is not None and outcome is None
                      for event in (p.written_end_moved(), p.log_start_moved())]
            if events:
                waiters = [asyncio.ensure_future(e.wait()) for e in events]
                try:
                    await asyncio.wait(waiters, timeout=wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
                reply, _ = self._collect(leading, request.max_bytes)
        return reply

    def _progress(self, follower: int, wanted, partition: Partition, storage_zxid: int | None):
        """Records the follower's progress; what keeps it from fetching
        (not a follower, diverging logs, an offset out of range), or None."""
        if follower == partition.node_id or follower not in partition.replicas:
            return TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                              f"node {follower} is not a follower of {partition.topic}-{partition.index} (replicas {list(partition.replicas)})")
        if wanted.fetch_offset < 0:
            return TxlogError(ErrorCode.Value("INVALID_REQUEST"), f"fetch_offset must not be negative, got {wanted.fetch_offset}")
        if wanted.last_fetched_epoch >= 0:
            epoch, end = partition.epochs.end_offset_for(wanted.last_fetched_epoch, partition.written_end)
            if epoch != wanted.last_fetched_epoch or end < wanted.fetch_offset:
                return replication_pb2.EpochEndOffset(epoch=epoch, end_offset=end)
        if wanted.fetch_offset < partition.log_start_offset:
            return TxlogError(ErrorCode.Value("OFFSET_OUT_OF_RANGE"),
                              f"offset {wanted.fetch_offset} is below the log start {partition.log_start_offset}")
        if wanted.fetch_offset <= partition.written_end:  # it may hold what is not synced here yet: see partition.py
            self.replicas.follower_fetched(partition, follower, wanted.fetch_offset,
                                           wanted.log_start_offset if wanted.HasField("log_start_offset") else 0, storage_zxid)
        return None

    def _collect(self, leading, bytes_max: int) -> tuple[bytes, bool]:
        """The encoded ReplicaFetchResponse (the stored values spliced in as
        they are: wire.py), and whether any partition has something to say
        (batches, an error or a diverging epoch) rather than nothing yet."""
        results: list[wire.Encoded] = []
        answered = False
        left = bytes_max or 2**62
        for wanted, partition, outcome in leading:
            result = replication_pb2.ReplicaFetchPartitionResult(topic=wanted.topic, partition=wanted.partition)
            batches: list[wire.Encoded] = []
            if isinstance(outcome, TxlogError):
                result.error.CopyFrom(_error(outcome))
                if partition is not None:
                    result.log_start_offset = partition.log_start_offset
            else:
                result.high_watermark, result.log_start_offset = partition.high_watermark, partition.log_start_offset
                result.replicated_end_offset = partition.marker_end
                if outcome is not None:
                    result.diverging_epoch.CopyFrom(outcome)
                elif wanted.fetch_offset < partition.written_end:  # caught up: no batch to read (a read would load the last one)
                    # from the batch holding fetch_offset: a follower restarted at a log start inside a batch gets it whole
                    # up to what is written here, synced or not: the high watermark still waits for this replica's sync
                    try:
                        for base_offset, value in partition.store.batches_holding(partition.pkey, wanted.fetch_offset, partition.written_end):
                            batches.append(wire.stored_batch(base_offset, partition.epochs.epoch_at(base_offset), value))
                            left -= len(value)
                            if left <= 0:
                                break  # at least one batch, then no more than bytes_max
                    except TxlogError as exc:  # a damaged batch (CORRUPT_MESSAGE): this partition's answer, not the whole fetch's
                        batches = []
                        result.error.CopyFrom(_error(exc))
            answered = answered or bool(batches) or outcome is not None
            results.append(wire.replica_fetch_result(result, batches))
        return wire.replica_fetch_response(results), answered
