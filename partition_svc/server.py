"""The gRPC face of partition_svc: one handler per RPC, thin: decode, check,
call the partition, persist through the writer, answer.

Error Handling
--------------
A problem with the request as a whole (bad acks, no partitions, a partition
named twice, a group this instance does not coordinate) is the call's status
and nothing is applied. A problem with one partition (unknown, led elsewhere, a
bad batch, a sequence error) is that partition's ``error``; the others proceed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable

from partition_svc import log_format, placement, validation, wire
from partition_svc.controller import Controller, PartitionStates, storage_zxid
from partition_svc.group_coordinator import GroupCoordinator
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition, now_ms
from partition_svc.partition_metrics import PartitionMetrics
from partition_svc.producer_state import Reject
from partition_svc.replica_manager import ReplicaManager
from partition_svc.replication import ReplicationServicer
from partition_svc.topic_deletion import TopicDeletion
from partition_svc.topics import INTERNAL_PREFIX, TopicInfo, TopicRegistry
from partition_svc.txn_verification import TransactionVerifier
from services import coordinators, malloc, server, zk
from services.config import Setting, boolean, non_negative_int, positive_int
from services.logs import fields
from services.producer_ids import IdempotentProducerInitServicer, ProducerIdSource, check_producer, named_producer
from services.rpc import PeerClient, answer_of
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, acls
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.protocol.hashing import partition_for_id
from txlog.protocol.names import check_transactional_id, is_group_id, is_topic_name
from txlog.v1 import (
    common_pb2,
    coordinator_pb2,
    errors_pb2,
    partition_pb2,
    partition_pb2_grpc,
    replication_pb2,
)

KIND = "partition_svc"
log = logging.getLogger(__name__)

CONFIG_WRITE_ATTEMPTS = 5  # conditional writes of a topic (configs, partitions) raced by others (a reassignment, another change)

SETTINGS = (
    Setting("listen", "0.0.0.0:7300", "host:port the gRPC server binds"),
    Setting("data_dir", "./data/partition_svc", "folder of this instance's RocksDB"),
    Setting("fsync", True, "sync every write to disk before acknowledging it", boolean),
    Setting("partitions_per_topic_max", 1000, "largest partition count of a topic", positive_int),
    Setting("offsets_topic_partitions", 8, "partition count of __consumer_offsets, set when it is first created", positive_int),
    Setting("group_heartbeat_interval_ms", 3000, "how often consumer-group members heartbeat (the coordinator tells them; "
            "a rebalance takes a few of these)", positive_int),
    Setting("records_per_batch_max", 100_000, "most records in one produced batch", positive_int),
    Setting("batch_bytes_max", 16 * 1024 * 1024, "largest produced batch, bytes", positive_int),
    Setting("record_bytes_max", 8 * 1024 * 1024, "largest max.record.bytes a topic may set, bytes", positive_int),
    Setting("partitions_per_request_max", 10_000, "most partitions named in one request", positive_int),
    Setting("fetch_wait_ms_max", 30_000, "longest long-poll a Fetch may ask for, ms (longer asks are cut)", positive_int),
    Setting("retention_check_interval_ms", 30_000, "how often retention and compaction run, ms", positive_int),
    Setting("producer_id_expiration_ms", 86_400_000, "a producer that appended nothing to a partition for this long, "
            "and has no transaction open there, is forgotten by it (Kafka's producer.id.expiration.ms): its next batch "
            "must start at sequence 0, as a new producer's; internal topics keep theirs, ms", positive_int),
    Setting("producer_id_expiration_check_interval_ms", 600_000, "how often producers are checked for expiry, ms",
            positive_int),
    Setting("live_nodes_cache_ms", 1_000, "how long the list of live instances is reused, ms", positive_int),
    Setting("rack", "", "this instance's rack (or zone): replicas of a partition go to different racks when every instance has one"),
    Setting("default_replication_factor", 3, "replication factor of a topic created without one (capped at the live instances)",
            positive_int),
    Setting("min_insync_replicas", 1, "min.insync.replicas of a topic created without one (capped at its replication "
            "factor - 1, so one instance may be down)", positive_int),
    Setting("internal_topic_replication_factor", 3, "replication factor of __transaction_state and __consumer_offsets "
            "(capped at the live instances when they are created)", positive_int),
    Setting("internal_topic_min_insync_replicas", 2, "min.insync.replicas of the internal topics (capped at their "
            "replication factor - 1, so one instance may be down)", positive_int),
    Setting("replica_lag_time_max_ms", 10_000, "a follower not caught up for this long leaves the ISR, ms", positive_int),
    Setting("replica_fetch_wait_ms", 500, "how long a follower's fetch waits for new data at the leader, ms", positive_int),
    Setting("replica_fetch_bytes_max", 16 * 1024 * 1024, "most bytes one follower fetch returns", positive_int),
    Setting("controller_pass_interval_ms", 5_000, "how often the controller checks every partition besides when "
            "instances come and go, ms", positive_int),
    Setting("malloc_mmap_threshold_bytes", 32 * 1024 * 1024, "allocations up to this size come from the C "
            "allocator's reused heap instead of a fresh mmap each (glibc; 0 keeps its default): batches and fetch "
            "responses were faulted in page by page; up to twice this of freed heap stays resident", non_negative_int),
    Setting("partition_state_refresh_ms", 5_000, "how often an instance reads its topics and a share "
            "of its own partitions' states again (all within 6 reads; missed controller messages), ms", positive_int),
)

NONE = ErrorCode.Value("NONE")
ACKS_ALL = -1
LEADER_AND_ISR_TIMEOUT_S = 5.0
METADATA_STATE_READS_CONCURRENT_MAX = 500  # ZooKeeper reads one Metadata call has outstanding at once
DELETE_RECORDS_TIMEOUT_MS_DEFAULT = 30_000  # DeleteRecords' wait for the in-sync replicas when its timeout_ms is 0
# Internal topics, created by the services that own them (names starting "__" are refused otherwise).
INTERNAL_TOPICS = (CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)


def error(code: str, message: str) -> errors_pb2.Error:
    return error_proto(ErrorCode.Value(code), message)


def error_of(exc: TxlogError) -> errors_pb2.Error:
    return error_proto(exc.code, exc.message)


def request_error(message: str) -> TxlogError:
    return TxlogError(ErrorCode.Value("INVALID_REQUEST"), message)


def optional(request, name: str):
    """A proto3 optional field's value, None when left out."""
    return getattr(request, name) if request.HasField(name) else None


def checked_acl(convert, message, what: str):
    try:
        return convert(message)
    except acls.AclError as exc:
        raise request_error(f"{what}: {exc}") from None


class PartitionServicer(partition_pb2_grpc.PartitionServiceServicer):
    def __init__(self, runtime: server.ServiceRuntime, store: LogStore):
        self.runtime = runtime
        self.config = runtime.config
        self.node_id = runtime.config.node_id
        self.store = store
        self.writer = GroupCommitWriter(store)
        self.topics = TopicRegistry(runtime.zookeeper, runtime.config.zookeeper_root)
        self.limits = validation.BatchLimits(runtime.config.records_per_batch_max, runtime.config.batch_bytes_max)
        self._live_nodes: dict[str, tuple[float, dict[int, str]]] = {}
        self._owners = coordinators.WatchedOwners(runtime.zookeeper, runtime.config.zookeeper_root)
        self.peers = PeerClient(runtime.registry, tls_files=runtime.tls_files)  # coordinators (verification), producer_id_svc, other replicas
        self.verifier = TransactionVerifier(self.transaction_coordinator, self.peers)
        cfg = runtime.config
        self.replicas = ReplicaManager(self.node_id, store, self.writer, self.topics, self.peers, self.live_nodes,
                                       runtime.registry.path(KIND, self.node_id), lag_max_ms=cfg.replica_lag_time_max_ms, fetch_wait_ms=cfg.replica_fetch_wait_ms,
                                       fetch_bytes_max=cfg.replica_fetch_bytes_max)
        self.groups = GroupCoordinator(self, heartbeat_interval_ms=cfg.group_heartbeat_interval_ms)
        self.controller = Controller(runtime.zookeeper, cfg.zookeeper_root, self.node_id, KIND, self.topics, self.announce,
                                     pass_interval_ms=cfg.controller_pass_interval_ms)
        self.metrics = PartitionMetrics(runtime.metrics.meter, lambda: list(self.replicas.partitions.values()),
                                        lambda: self.controller.offline_partitions if self.controller.active else None,
                                        store.properties, self.coordinated_group_offsets)
        self.deletion = TopicDeletion(self.node_id, self.topics, self.replicas, store, self.limits, self.metrics.forget_topic,
                                      refresh_ms=cfg.partition_state_refresh_ms)

    @property
    def partitions(self) -> dict[tuple[str, int], Partition]:
        """Every replica this instance holds, leader or follower."""
        return self.replicas.partitions

    # --- where partitions live ------------------------------------------------------

    async def live_nodes(self, kind: str = KIND) -> dict[int, str]:
        fetched_at, nodes = self._live_nodes.get(kind, (0.0, {}))
        if time.monotonic() - fetched_at > self.config.live_nodes_cache_ms / 1000:
            nodes = await asyncio.to_thread(self.runtime.registry.live, kind)
            self._live_nodes[kind] = (time.monotonic(), nodes)
        return nodes

    async def transaction_coordinator(self, transactional_id: str) -> str:
        """The address of the coordinator of a transactional id."""
        return (await self.find_transaction_coordinator(transactional_id)).address

    async def find_transaction_coordinator(self, transactional_id: str) -> coordinator_pb2.FindCoordinatorResponse:
        """Who coordinates a transactional id: the owner of its __transaction_state partition."""
        info = await self.topics.get(TRANSACTION_STATE_TOPIC)
        if info is None:
            raise TxlogError(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), "no transaction coordinator has started yet")
        index = coordinators.transaction_log_partition(transactional_id, info.partition_count)
        owner = await self.transaction_log_owner(index)
        if owner is None:
            raise TxlogError(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), f"{TRANSACTION_STATE_TOPIC} partition {index} has no owner yet")
        address = (await self.live_nodes(coordinators.COORDINATOR_KIND)).get(owner[0].node_id)
        if address is None:
            raise TxlogError(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), f"coordinator {owner[0].node_id} is not live")
        return coordinator_pb2.FindCoordinatorResponse(
            coordinator_id=owner[0].node_id, address=address, partition=index, coordinator_epoch=owner[0].coordinator_epoch)

    async def find_group_coordinator(self, group_id: str, info: TopicInfo | None = None) -> coordinator_pb2.FindCoordinatorResponse:
        """Who coordinates a consumer group: the leader of its __consumer_offsets partition."""
        validation.check_group_id(group_id)
        info = info or await self.offsets_topic()
        index = partition_for_id(group_id, info.partition_count)
        state = await self.replicas.state(CONSUMER_OFFSETS_TOPIC, index)
        leader = state.leader if state is not None else -1
        found = coordinator_pb2.FindCoordinatorResponse(coordinator_id=leader, partition=index)
        address = (await self.live_nodes()).get(leader)
        if address is None:
            raise TxlogError(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), f"node {leader}, the group's coordinator, is not live")
        found.address = address
        return found

    async def transaction_log_owner(self, index: int, *, fresh: bool = False):
        """The owner of a __transaction_state partition and its node version (or
        None): kept in memory and read again when a ZooKeeper watch says it
        changed, or at once when ``fresh``."""
        return await self._owners.get(index, fresh=fresh)

    async def check_internal_writer(self, topic: str, index: int, batch) -> None:
        """Internal topics take no client's records: __consumer_offsets is written
        only by OffsetCommit/TxnOffsetCommit here, __transaction_state only by the
        coordinator owning the partition (its log producer id, in the owner node).
        A stray record there would stop every later load of the partition. The
        owner's id is taken from memory, which a watch keeps current (it was a
        ZooKeeper read per log write); a refusal is only ever decided on a fresh read."""
        if topic == TRANSACTION_STATE_TOPIC:
            for fresh in (False, True):
                owner = await self.transaction_log_owner(index, fresh=fresh)
                if owner is not None and batch.producer_id == owner[0].log_producer_id:
                    return
        raise TxlogError(ErrorCode.Value("INVALID_TOPIC"),
                         f"{topic} is an internal topic: only its owner writes to it (offsets go through OffsetCommit)")

    async def hosted(self, topic: str, index: int) -> Partition:
        """The partition, if this instance leads it; else a TxlogError saying where to go."""
        if not is_topic_name(topic):
            raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"{topic[:300]!r} partition {index} does not exist")
        return await self.replicas.leader(topic, index)

    async def create_topic(self, name: str, partition_count: int, configs: dict[str, str], replication_factor: int | None,
                           internal: bool = False) -> TopicInfo:
        """Creates the topic with its replicas placed over the live instances
        (placement.py, rack-aware), or returns it if it exists. Without a
        replication factor: the cluster's default, capped at the live instances."""
        nodes = await asyncio.to_thread(self.runtime.registry.live_details, KIND)
        if not nodes:
            raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"), "no partition_svc instance is live to host partitions")
        if replication_factor is None:
            wanted = self.config.internal_topic_replication_factor if internal else self.config.default_replication_factor
            replication_factor = min(wanted, len(nodes))
        if not 1 <= replication_factor <= len(nodes):
            raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                             f"replication factor must be 1..{len(nodes)} (the live partition_svc instances), got {replication_factor}")
        if "min.insync.replicas" not in configs:
            # Capped below the replication factor: with fewer than 3 instances, one may still be down.
            wanted = self.config.internal_topic_min_insync_replicas if internal else self.config.min_insync_replicas
            configs = dict(configs, **{"min.insync.replicas": str(max(1, min(wanted, replication_factor - 1)))})
        configs = validation.topic_configs(configs, self.config.record_bytes_max, replication_factor)
        racks = {node: (details.get("rack") or None) for node, details in nodes.items()}
        start = partition_for_id(name, len(nodes))
        replicas = placement.assign_replicas(partition_count, replication_factor, racks, start=start, shift=start)
        info = TopicInfo(name, partition_count, configs, tuple(tuple(r) for r in replicas), internal)
        created = await self.topics.create(info, self.replicas.controller_epoch)
        self.controller.wake()
        return created

    async def offsets_topic(self) -> TopicInfo:
        info = await self.topics.get(CONSUMER_OFFSETS_TOPIC)
        if info is None:
            info = await self.create_topic(CONSUMER_OFFSETS_TOPIC, self.config.offsets_topic_partitions, {"cleanup.policy": "compact"},
                                           None, internal=True)
        return info

    def known_topic(self, name: str) -> str:
        """A topic name as a metric label: one this instance knows, or "(unknown)"
        (a client naming random topics must not make a series each)."""
        return name if self.topics.cached(name) is not None else "(unknown)"

    def coordinated_group_offsets(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, partition, committed offset) of every group whose
        __consumer_offsets partition this instance leads (read off the loop:
        for metrics)."""
        info = self.topics.cached(CONSUMER_OFFSETS_TOPIC)
        if info is None:
            return []
        partitions = self.replicas.partitions
        found = []
        for group in sorted(self.store.group_ids()):
            offsets_partition = partitions.get((CONSUMER_OFFSETS_TOPIC, partition_for_id(group, info.partition_count)))
            if offsets_partition is not None and offsets_partition.is_leader:
                found += [(group, topic, index, offset) for topic, index, offset, _ in self.store.group_offsets(group) if offset >= 0]
        return found

    async def group_partition(self, group_id: str) -> Partition:
        """The __consumer_offsets partition of a group, if this instance is its coordinator."""
        info = await self.offsets_topic()
        index = partition_for_id(group_id, info.partition_count)
        try:
            return await self.hosted(CONSUMER_OFFSETS_TOPIC, index)
        except TxlogError as exc:
            raise TxlogError(
                ErrorCode.Value("NOT_COORDINATOR"),
                f"group {group_id!r} is coordinated by the leader of {CONSUMER_OFFSETS_TOPIC} partition {index}: {exc.message}",
            ) from None

    def check_partition_count(self, count: int) -> None:
        if count == 0:
            raise request_error("the request names no partition")
        if count > self.config.partitions_per_request_max:
            raise request_error(f"the request names {count} partitions, more than {self.config.partitions_per_request_max}")

    # --- Metadata, CreateTopics ------------------------------------------------------

    async def _read_unknown_states(self, topic: str, partition_count: int) -> None:
        """Reads the states of the topic's partitions not known here, many at once
        (an instance forgets those of partitions held elsewhere every minute: one
        at a time, a Metadata of every topic then waited for thousands of reads in a row)."""
        unknown = [index for index in range(partition_count) if (topic, index) not in self.replicas.states]
        await zk.gather_in_chunks(lambda index: self.replicas.state(topic, index), unknown, METADATA_STATE_READS_CONCURRENT_MAX)

    @server.rpc_handler
    async def Metadata(self, request, context):
        live = await self.live_nodes()
        reply = partition_pb2.MetadataResponse(
            brokers=[partition_pb2.NodeInfo(node_id=n, address=a) for n, a in sorted(live.items())]
        )
        names = await self.topics.names() if request.all_topics else list(dict.fromkeys(request.topics))
        for name in names:
            topic = reply.topics.add(name=name)
            info = await self.topics.get(name) if is_topic_name(name) else None
            if info is None:
                topic.error.CopyFrom(error("UNKNOWN_TOPIC_OR_PARTITION", f"topic {name[:300]!r} does not exist"))
                continue
            topic.is_internal = info.internal
            topic.configs.update(info.configs)
            await self._read_unknown_states(name, info.partition_count)
            for index in range(info.partition_count):
                state = await self.replicas.state(name, index)
                leader = state.leader if state is not None else -1
                entry = topic.partitions.add(partition=index, leader_id=leader, leader_epoch=state.leader_epoch if state else 0,
                                             replicas=info.replicas[index], isr=state.isr if state else ())
                if leader in live:
                    entry.leader_address = live[leader]
                else:
                    entry.error.CopyFrom(error("LEADER_NOT_AVAILABLE", f"partition {index} has no live leader (leader {leader}, "
                                                                       f"in-sync replicas {list(entry.isr)})"))
        for transactional_id in request.transactional_ids:
            entry = reply.transaction_coordinators.add(key=transactional_id)
            try:
                entry.address = await self.transaction_coordinator(transactional_id)
            except TxlogError as exc:
                entry.error.CopyFrom(error_of(exc))
        if request.group_ids:
            info = await self.offsets_topic()
            for group_id in request.group_ids:
                entry = reply.group_coordinators.add(key=group_id)
                try:
                    found = await self.find_group_coordinator(group_id, info)
                    entry.node_id, entry.address = found.coordinator_id, found.address
                except TxlogError as exc:
                    if is_group_id(group_id):
                        state = await self.replicas.state(CONSUMER_OFFSETS_TOPIC, partition_for_id(group_id, info.partition_count))
                        entry.node_id = state.leader if state is not None else -1
                    entry.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def CreateTopics(self, request, context):
        if not request.topics:
            raise request_error("the request names no topic")
        reply = partition_pb2.CreateTopicsResponse()
        for wanted in request.topics:
            result = reply.results.add(name=wanted.name, partition_count=wanted.partition_count)
            try:
                validation.check_topic_name(wanted.name)
                internal = wanted.name.startswith(INTERNAL_PREFIX)
                if internal and wanted.name not in INTERNAL_TOPICS:
                    raise TxlogError(ErrorCode.Value("INVALID_TOPIC"), f"names starting with {INTERNAL_PREFIX!r} are internal")
                validation.check_partition_count(wanted.partition_count, self.config.partitions_per_topic_max)
                configs = dict(wanted.configs, **({"cleanup.policy": "compact"} if internal else {}))
                replication_factor = wanted.replication_factor if wanted.HasField("replication_factor") else None
                if replication_factor is not None and replication_factor < 1:
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"replication factor must be at least 1, got {replication_factor}")
                validation.topic_configs(configs, self.config.record_bytes_max, replication_factor or 2**31)
                if request.validate_only:
                    continue
                info = await self.create_topic(wanted.name, wanted.partition_count, configs, replication_factor, internal=internal)
                result.replication_factor = info.replication_factor
                if info.partition_count != wanted.partition_count:
                    raise TxlogError(
                        ErrorCode.Value("TOPIC_ALREADY_EXISTS"),
                        f"topic {wanted.name!r} exists with {info.partition_count} partitions, not {wanted.partition_count}",
                    )
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    # --- Produce ------------------------------------------------------------------------

    @server.rpc_handler
    async def Produce(self, request, context):
        acks = request.acks if request.HasField("acks") else ACKS_ALL  # absent: the safe meaning
        if acks not in (ACKS_ALL, 0, 1):
            raise request_error(f"acks must be left out or -1 (all), 1 or 0, got {acks}")
        if request.timeout_ms < 0:
            raise request_error(f"timeout_ms must be 0 (no limit) or positive, got {request.timeout_ms}")
        self.check_partition_count(len(request.batches))
        named = {(b.topic, b.partition) for b in request.batches}
        if len(named) != len(request.batches):
            raise request_error("the request names a partition twice; put its records in one batch")
        reply = partition_pb2.ProduceResponse()
        resolved: list[tuple[object, Partition | None]] = []
        to_verify: dict[tuple[int, int], list[int]] = {}
        for item in request.batches:
            result = reply.results.add(topic=item.topic, partition=item.partition)
            try:
                partition = await self.hosted(item.topic, item.partition)
                await self.check_leader_epoch(item, partition)
                validation.check_batch(item.batch, self.limits, item.topic)  # first: it gives an absent producer id its -1
                if item.topic in INTERNAL_TOPICS:
                    await self.check_internal_writer(item.topic, item.partition, item.batch)
                if item.batch.is_transactional and self.needs_verification(request.transactional_id, item.batch, partition):
                    to_verify.setdefault((item.batch.producer_id, item.batch.producer_epoch), []).append(len(resolved))
                resolved.append((result, partition))
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
                resolved.append((result, None))
        for (producer_id, producer_epoch), indexes in to_verify.items():  # one coordinator call per producer, not per batch
            tps = [(resolved[i][1].topic, resolved[i][1].index) for i in indexes]
            refused = await self.verifier.verify(request.transactional_id, producer_id, producer_epoch, tps, add=request.add_to_transaction)
            for i, tp in zip(indexes, tps, strict=True):
                if tp in refused:
                    result, partition = resolved[i]
                    result.error.CopyFrom(self.not_in_transaction(tp, refused[tp], added=request.add_to_transaction))
                    resolved[i] = (result, None)
        taken: list[tuple[object, Partition, asyncio.Future]] = []
        now = now_ms()
        for item, (result, partition) in zip(request.batches, resolved, strict=True):
            if partition is None:
                continue
            refused = partition.check_enough_replicas() if acks == ACKS_ALL else None
            outcome = refused or partition.produce(item.batch, now, self.limits)
            if isinstance(outcome, Reject):
                result.error.CopyFrom(error_proto(outcome.code, outcome.message))
                continue
            result.base_offset = outcome.base_offset
            written = outcome.replicated if acks == ACKS_ALL else outcome.durable
            if not outcome.duplicate:
                self.count_produced(item.topic, outcome.last_offset + 1 - outcome.base_offset, item.batch.ByteSize(), written)
            result.log_start_offset = partition.log_start_offset
            result.log_append_time_ms = now
            taken.append((result, partition, written))
        if acks == 0:  # answered before anything is durable: no offsets to rely on
            for result in reply.results:
                result.base_offset = -1
        elif taken:
            done = asyncio.gather(*(future for _, _, future in taken))
            if request.timeout_ms:  # the write goes on; a retry of the same batch is answered as a duplicate
                try:
                    await asyncio.wait_for(asyncio.shield(done), request.timeout_ms / 1000)
                except TimeoutError:
                    raise TxlogError(ErrorCode.Value("REQUEST_TIMED_OUT"),
                                     f"the batches were not {'replicated' if acks == ACKS_ALL else 'durable'} within timeout_ms "
                                     f"{request.timeout_ms}; retry them (an idempotent retry is answered as a duplicate once "
                                     "they are)") from None
            else:
                await done
            if acks == ACKS_ALL:
                for result, partition, future in taken:
                    self.check_replicated(result, partition, future.result())
        for result in reply.results:
            if result.error.code:
                self.metrics.refused("Produce", self.known_topic(result.topic), result.error.code)
        return reply

    def count_produced(self, topic: str, records: int, size_bytes: int, written: asyncio.Future) -> None:
        """Counts an appended batch once it is written as its acks asked (for
        acks=all: replicated), whether or not the request still waits for it: a
        batch a leader change truncated is not counted, and its retry, appended
        again at the new leader, is counted there once."""
        def counted(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is None and future.result() is not False:
                self.metrics.produced(topic, records, size_bytes)

        written.add_done_callback(counted)

    @staticmethod
    def check_replicated(result, partition: Partition, replicated: bool) -> None:
        """What an acks=all append turned into once it was replicated, or
        once leadership went first: the error its result must carry, if any."""
        if not replicated:
            result.error.CopyFrom(error("NOT_LEADER", f"{partition.topic}-{partition.index} stopped being led here before "
                                        "the batch was replicated; refresh metadata and retry (an idempotent retry is "
                                        "answered as a duplicate if it survived)"))
        elif partition.check_enough_replicas() is not None:
            result.error.CopyFrom(error("NOT_ENOUGH_REPLICAS_AFTER_APPEND",
                                        f"{partition.topic}-{partition.index} was appended, but its in-sync replicas fell "
                                        f"below min.insync.replicas {partition.min_insync_replicas} before it was acknowledged"))

    async def check_leader_epoch(self, wanted, partition: Partition) -> None:
        """A PartitionBatch or FetchPartition that names the leader epoch it saw
        is refused when this leader's differs (absent or -1: no check)."""
        if wanted.HasField("leader_epoch") and wanted.leader_epoch != -1:
            partition.check_leader_epoch(wanted.leader_epoch)

    def needs_verification(self, transactional_id: str, batch, partition: Partition) -> bool:
        """Whether the coordinator must confirm that the partition is in the
        producer's transaction before the leader takes the batch."""
        if not transactional_id:
            raise request_error("transactional batches need the request's transactional_id")
        entry = partition.producers.get(batch.producer_id)
        if entry is not None and batch.producer_epoch < entry.producer_epoch:
            return False  # a zombie: the producer-state check fences it (PRODUCER_FENCED), no need to ask
        # its transaction open here already: verified with its first batch
        return not (entry is not None and entry.producer_epoch == batch.producer_epoch and entry.current_txn_first_offset >= 0)

    @staticmethod
    def not_in_transaction(tp: tuple[str, int], reason: errors_pb2.Error, added: bool = False) -> errors_pb2.Error:
        said = f"did not add {tp[0]}-{tp[1]} to" if added else f"does not have {tp[0]}-{tp[1]} in"  # added: the leader asked it to
        return error_proto(reason.code, f"the coordinator {said} this transaction: {reason.message}")

    async def verify_transactional(self, transactional_id: str, batch, partition: Partition) -> None:
        """Raises unless the partition is in the producer's open transaction."""
        if self.needs_verification(transactional_id, batch, partition):
            tp = (partition.topic, partition.index)
            refused = await self.verifier.verify(transactional_id, batch.producer_id, batch.producer_epoch, [tp])
            if refused:
                reason = self.not_in_transaction(tp, refused[tp])
                raise TxlogError(reason.code, reason.message)

    # --- Fetch, ListOffsets --------------------------------------------------------------

    @server.rpc_handler
    async def Fetch(self, request, context):
        if request.isolation_level not in (common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED, common_pb2.ISOLATION_LEVEL_READ_COMMITTED):
            raise request_error(f"unknown isolation_level {request.isolation_level}")
        if request.max_wait_ms < 0 or request.max_bytes < 0 or request.max_records < 0 or request.min_bytes < 0:
            raise request_error("max_wait_ms, min_bytes, max_bytes and max_records must not be negative")
        self.check_partition_count(len(request.partitions))
        wait_s = min(request.max_wait_ms, self.config.fetch_wait_ms_max) / 1000
        deadline = time.monotonic() + wait_s
        while True:
            reply, waits, returned_bytes, tally = await self._fetch_once(request)
            remaining = deadline - time.monotonic()
            if returned_bytes > max(request.min_bytes - 1, 0) or not waits or remaining <= 0:
                tally()  # only the pass answered counts: a long poll's earlier passes were thrown away
                return reply
            waiters = [asyncio.ensure_future(w.wait()) for w in waits]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:  # an idle partition's event may never fire: a waiter left behind would live for good
                for waiter in waiters:
                    waiter.cancel()

    async def _fetch_once(self, request) -> tuple[bytes, list[asyncio.Event], int, Callable[[], None]]:
        """One pass over the partitions: the encoded response, the events to
        wait on for partitions that had nothing, the bytes returned, and what
        records the pass in the metrics once it is the answer."""
        encoded_results = []
        fetched: list[tuple[str, int, int]] = []
        refused: list[tuple[str, int]] = []
        bytes_left = request.max_bytes or self.config.batch_bytes_max * 4
        records_left = request.max_records or 2**31
        accepted = frozenset(request.accepted_compressions)
        waits, returned_bytes = [], 0
        for wanted in request.partitions:
            result = partition_pb2.FetchPartitionResult(topic=wanted.topic, partition=wanted.partition, next_fetch_offset=wanted.fetch_offset)
            batches: list[wire.Encoded] = []
            records = 0
            try:
                partition = await self.hosted(wanted.topic, wanted.partition)
                await self.check_leader_epoch(wanted, partition)
                batches, records = self._read(
                    partition, wanted, request.isolation_level, result, bytes_left, records_left, returned_bytes == 0,
                    outcomes=request.include_transaction_outcomes, accepted=accepted,
                )
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
                refused.append((self.known_topic(wanted.topic), exc.code))
            taken = sum(batch.size for batch in batches)
            if records:
                fetched.append((wanted.topic, records, taken))
            returned_bytes += taken
            bytes_left = max(bytes_left - taken, 0)
            records_left = max(records_left - records, 0)
            if not batches and not result.HasField("error"):
                waits.append(partition.data_arrived())
            encoded_results.append(wire.partition_result(result, batches))

        def tally() -> None:
            for topic, code in refused:
                self.metrics.refused("Fetch", topic, code)
            for topic, records, taken in fetched:
                self.metrics.fetched(topic, records, taken)

        return wire.fetch_response(encoded_results), waits, returned_bytes, tally

    def _read(self, partition, wanted, isolation_level, result, bytes_left, records_left, take_first, *,
              outcomes: bool = False, accepted: frozenset[int] = frozenset()) -> tuple[list[wire.Encoded], int]:
        check_settled(partition)
        hw, lso = partition.high_watermark, partition.last_stable_offset
        result.high_watermark, result.last_stable_offset, result.log_start_offset = hw, lso, partition.log_start_offset
        if not partition.log_start_offset <= wanted.fetch_offset <= hw:
            raise TxlogError(
                ErrorCode.Value("OFFSET_OUT_OF_RANGE"),
                f"offset {wanted.fetch_offset} is outside [{partition.log_start_offset}, {hw}] of {wanted.topic}-{wanted.partition}",
            )
        upper = lso if isolation_level == common_pb2.ISOLATION_LEVEL_READ_COMMITTED else hw
        partition_bytes = min(wanted.partition_max_bytes or bytes_left, bytes_left)
        batches, result.next_fetch_offset, records = partition.read_encoded(
            wanted.fetch_offset, upper, partition_bytes, records_left, take_first=take_first,
            committed=isolation_level == common_pb2.ISOLATION_LEVEL_READ_COMMITTED, accepted=accepted,
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
        self.check_partition_count(len(request.partitions))
        reply = partition_pb2.EpochEndOffsetsResponse()
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition, leader_epoch=-1, end_offset=-1)
            try:
                if wanted.leader_epoch < 0:
                    raise request_error(f"leader_epoch must not be negative, got {wanted.leader_epoch}")
                partition = await self.hosted(wanted.topic, wanted.partition)
                if wanted.HasField("current_leader_epoch") and wanted.current_leader_epoch != -1:
                    partition.check_leader_epoch(wanted.current_leader_epoch)
                result.leader_epoch, result.end_offset = partition.epochs.end_offset_for(wanted.leader_epoch, partition.written_end)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def ListOffsets(self, request, context):
        self.check_partition_count(len(request.partitions))
        reply = partition_pb2.ListOffsetsResponse()
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition, offset=-1, timestamp_ms=-1)
            try:
                partition = await self.hosted(wanted.topic, wanted.partition)
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

    # --- DeleteRecords -------------------------------------------------------------------

    @server.rpc_handler
    async def DeleteRecords(self, request, context):
        if request.timeout_ms < 0:
            raise request_error(f"timeout_ms must be 0 (the default, {DELETE_RECORDS_TIMEOUT_MS_DEFAULT}) or positive, "
                                f"got {request.timeout_ms}")
        self.check_partition_count(len(request.partitions))
        if len({(p.topic, p.partition) for p in request.partitions}) != len(request.partitions):
            raise request_error("the request names a partition twice")
        reply = partition_pb2.DeleteRecordsResponse()
        waits: dict[asyncio.Future, tuple[object, Partition]] = {}
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition, low_watermark=-1)
            try:
                if wanted.topic.startswith(INTERNAL_PREFIX):  # as Kafka: only their owners' compaction deletes there
                    raise TxlogError(ErrorCode.Value("INVALID_TOPIC"), f"{wanted.topic[:300]} is internal: its records are not deleted on request")
                partition = await self.hosted(wanted.topic, wanted.partition)
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

    # --- consumer-group offsets ------------------------------------------------------

    async def offset_records(self, group_id: str, offsets, results) -> list[tuple[bytes, bytes]]:
        """The (key, value) records of the valid offsets to commit; each invalid
        one gets its error in ``results`` (a repeated PartitionResult)."""
        records = []
        now = now_ms()
        for wanted in offsets:
            result = results.add(partition=common_pb2.TopicPartition(topic=wanted.topic, partition=wanted.partition))
            try:
                validation.check_topic_name(wanted.topic)
                info = await self.topics.get(wanted.topic)
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
        self.check_partition_count(len(request.offsets))
        offsets_partition = await self.group_partition(request.group_id)
        await self.groups.check_commit(request.group_id, request.member_id, optional(request, "member_epoch"))
        reply = partition_pb2.OffsetCommitResponse()
        records = await self.offset_records(request.group_id, request.offsets, reply.results)
        if records:
            outcome = offsets_partition.commit_offsets(records, now_ms(), self.limits)
            if isinstance(outcome, Reject) or not await outcome:
                raise not_replicated(offsets_partition)
        return reply

    @server.rpc_handler
    async def TxnOffsetCommit(self, request, context):
        validation.check_group_id(request.group_id)
        self.check_partition_count(len(request.offsets))
        named_producer(request, "TxnOffsetCommit")
        offsets_partition = await self.group_partition(request.group_id)
        batch = common_pb2.RecordBatch(producer_id=request.producer_id, producer_epoch=request.producer_epoch)
        await self.verify_transactional(request.transactional_id, batch, offsets_partition)
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
            self.check_partition_count(len(request.partitions))
        negative = [f"{p.topic[:300]}-{p.partition}" for p in request.partitions if p.partition < 0]
        if negative:
            raise validation.invalid(f"partitions are numbered from 0: {negative[:10]}")
        offsets_partition = await self.group_partition(request.group_id)
        prefix = log_format.group_prefix(request.group_id)
        wanted_keys = [log_format.group_offset_key(request.group_id, p.topic, p.partition) for p in request.partitions]
        if request.require_stable and offsets_partition.has_pending_offsets(prefix, wanted_keys or None):
            raise TxlogError(
                ErrorCode.Value("UNSTABLE_OFFSET_COMMIT"),
                f"group {request.group_id!r} has offsets pending in an open transaction; retry once it ends",
            )
        found = self.store.group_offsets(request.group_id, [(p.topic, p.partition) for p in request.partitions])
        return partition_pb2.OffsetFetchResponse(offsets=[
            partition_pb2.FetchedOffset(topic=topic, partition=index, offset=offset, metadata=metadata)
            for topic, index, offset, metadata in found])

    # --- WriteTxnMarkers ---------------------------------------------------------------

    @server.rpc_handler
    async def WriteTxnMarkers(self, request, context):
        if not request.markers:
            raise request_error("the request holds no marker")
        self.check_partition_count(sum(len(m.partitions) for m in request.markers))
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
                    targets.append((marker, result, await self.hosted(tp.topic, tp.partition)))
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
            self.check_replicated(result, partition, done)
        return reply

    # --- DescribeProducers -----------------------------------------------------------

    @server.rpc_handler
    async def DescribeProducers(self, request, context):
        self.check_partition_count(len(request.partitions))
        reply = partition_pb2.DescribeProducersResponse()
        for wanted in request.partitions:
            result = reply.results.add(topic=wanted.topic, partition=wanted.partition)
            try:
                partition = await self.hosted(wanted.topic, wanted.partition)
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

    # --- reassignment ------------------------------------------------------------------

    @server.rpc_handler
    async def AlterPartitionReassignments(self, request, context):
        if not request.reassignments:
            raise request_error("the request names no reassignment")
        self.check_partition_count(len(request.reassignments))
        named = [(r.topic, r.partition) for r in request.reassignments]
        if len(set(named)) != len(named):
            raise request_error("the request names a partition twice")
        live = await asyncio.to_thread(self.runtime.registry.live, KIND)
        reply = partition_pb2.AlterPartitionReassignmentsResponse()
        for wanted in request.reassignments:
            result = reply.results.add(partition=common_pb2.TopicPartition(topic=wanted.topic, partition=wanted.partition))
            try:
                info = await self.topics.get(wanted.topic) if is_topic_name(wanted.topic) else None
                if info is None or not 0 <= wanted.partition < info.partition_count:
                    raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"),
                                     f"{wanted.topic[:300]!r} partition {wanted.partition} does not exist")
                target = tuple(wanted.replicas)
                if not target or len(set(target)) != len(target):
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"the target replicas must be distinct node ids, at least one, got {list(target)[:20]}")
                gone = sorted(set(target) - set(live))
                if gone:
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"nodes {gone[:20]} are not live partition_svc instances (live: {sorted(live)})")
                if int(info.configs.get("min.insync.replicas", "1")) > len(target):
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"{len(target)} replicas are fewer than the topic's min.insync.replicas {info.configs['min.insync.replicas']}")
                await self.topics.request_reassignment(wanted.topic, wanted.partition, target)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        self.controller.wake()
        return reply

    @server.rpc_handler
    async def ListPartitionReassignments(self, request, context):
        reply = partition_pb2.ListPartitionReassignmentsResponse()
        for (topic, index), target in sorted((await self.topics.reassignments()).items()):
            info = await self.topics.get(topic, fresh=True)
            current = info.replicas[index] if info is not None and index < info.partition_count else ()
            reply.reassignments.add(topic=topic, partition=index, replicas=current, target_replicas=target)
        return reply

    @server.rpc_handler
    async def AlterTopicConfigs(self, request, context):
        self.check_topic_items(request.topics)
        reply = partition_pb2.AlterTopicConfigsResponse()
        for change in request.topics:
            result = reply.results.add(topic=change.topic)
            try:
                result.configs.update(await self.alter_topic_configs(change, request.validate_only))
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    def check_topic_items(self, items) -> None:
        """A per-topic request's items: at least one, at most the limit, each topic once."""
        self.check_topic_names([item.topic for item in items], "; put its changes together")

    def check_topic_names(self, names, hint: str = "") -> None:
        """A request's topics: at least one, at most the limit, each once."""
        if not names:
            raise request_error("the request names no topic")
        if len(names) > self.config.partitions_per_request_max:
            raise request_error(f"the request names {len(names)} topics, more than {self.config.partitions_per_request_max}")
        if len(set(names)) < len(names):
            raise request_error(f"the request names a topic twice{hint}")

    async def alter_topic_configs(self, change, validate_only: bool) -> dict[str, str]:
        """The topic's configs after ``change`` (written unless ``validate_only``),
        checked as a new topic's are; a write that raced another is done again."""
        validation.check_topic_name(change.topic)
        if change.topic.startswith(INTERNAL_PREFIX):
            raise validation.invalid(f"{change.topic} is internal: its configs are the cluster's settings", "INVALID_CONFIG")
        both = sorted(set(change.set) & set(change.delete))
        if both:
            raise validation.invalid(f"config {both[0][:100]!r} is both set and deleted", "INVALID_CONFIG")
        unknown = sorted(set(change.delete) - set(validation.TOPIC_CONFIG_DEFAULTS))
        if unknown:
            raise validation.invalid(f"unknown topic config {unknown[0][:100]!r} to delete; known: "
                                     f"{sorted(validation.TOPIC_CONFIG_DEFAULTS)}", "INVALID_CONFIG")

        async def attempt(info: TopicInfo, version: int) -> dict[str, str] | None:
            kept = {key: value for key, value in info.configs.items() if key not in change.delete}
            configs = validation.topic_configs({**kept, **change.set}, self.config.record_bytes_max, info.replication_factor)
            if validate_only or configs == info.configs:
                return configs
            written = await self.topics.write_configs(info, configs, version)
            if written is None:
                return None
            self.replicas.apply_configs(written)
            log.info("topic configs altered", extra=fields(topic=change.topic, set=dict(change.set), deleted=list(change.delete)))
            return configs

        return await self.change_topic(change.topic, attempt, "its configs were written")

    async def change_topic(self, topic: str, attempt, doing: str):
        """Runs ``attempt(info, version)`` on the topic as ZooKeeper holds it
        until it answers something other than None (None: its conditional write
        lost to another change of the topic, so read again and redo)."""
        for _ in range(CONFIG_WRITE_ATTEMPTS):
            versioned = await self.topics.versioned(topic)
            if versioned is None:
                raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"topic {topic!r} does not exist")
            done = await attempt(*versioned)
            if done is not None:
                return done
        raise TxlogError(ErrorCode.Value("REQUEST_TIMED_OUT"), f"topic {topic!r} kept changing while {doing}; retry")

    @server.rpc_handler
    async def CreatePartitions(self, request, context):
        self.check_topic_items(request.topics)
        reply = partition_pb2.CreatePartitionsResponse()
        for wanted in request.topics:
            result = reply.results.add(topic=wanted.topic)
            try:
                result.partition_count = await self.add_partitions(wanted.topic, wanted.total_count, request.validate_only)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    async def add_partitions(self, topic: str, total: int, validate_only: bool) -> int:
        """Grows ``topic`` to ``total`` partitions, placed over the live instances
        (rack-aware) as a new topic's are; the partition count afterwards."""
        validation.check_topic_name(topic)
        if topic.startswith(INTERNAL_PREFIX):
            raise TxlogError(ErrorCode.Value("INVALID_PARTITIONS"), f"{topic} is internal: its partition count places "
                             "transactional ids and groups, and stays as it was created")
        validation.check_partition_count(total, self.config.partitions_per_topic_max)

        async def attempt(info: TopicInfo, version: int) -> int | None:
            if total <= info.partition_count:
                raise TxlogError(ErrorCode.Value("INVALID_PARTITIONS"), f"topic {topic!r} has {info.partition_count} partitions: "
                                 f"a new count must be more (partitions are never removed), got {total}")
            nodes = await asyncio.to_thread(self.runtime.registry.live_details, KIND)
            if len(nodes) < info.replication_factor:
                raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"), f"topic {topic!r} has {info.replication_factor} "
                                 f"replicas per partition, more than the {len(nodes)} live partition_svc instances")
            if validate_only:
                return total
            racks = {node: (details.get("rack") or None) for node, details in nodes.items()}
            start = partition_for_id(topic, len(nodes))
            placed = placement.assign_replicas(total, info.replication_factor, racks, start=start, shift=start)[info.partition_count:]
            grown = await self.topics.add_partitions(info, [tuple(r) for r in placed], version, self.replicas.controller_epoch)
            if grown is None:
                return None
            self.controller.wake()
            log.info("partitions added", extra=fields(topic=topic, partitions=grown.partition_count))
            return grown.partition_count

        return await self.change_topic(topic, attempt, "partitions were added")

    @server.rpc_handler
    async def DeleteTopics(self, request, context):
        self.check_topic_names(request.topics)
        return await self.deletion.delete_topics(list(request.topics), request.timeout_ms)

    # --- consumer groups ---------------------------------------------------------------

    @server.rpc_handler
    async def ConsumerGroupHeartbeat(self, request, context):
        validation.check_group_id(request.group_id)
        return await self.groups.heartbeat(request)

    @server.rpc_handler
    async def ListGroups(self, request, context):
        return await self.groups.list_groups()

    @server.rpc_handler
    async def DeleteGroups(self, request, context):
        reply = partition_pb2.DeleteGroupsResponse()
        for group_id in self.checked_group_ids(request.group_ids):
            item = reply.groups.add(group_id=group_id)
            try:
                offsets_partition = await self.group_partition(group_id)
                async with self.groups.lock(group_id):  # no member joins while the group goes
                    await self.groups.check_empty(group_id)
                    keys = [log_format.group_offset_key(group_id, topic, index) for topic, index, _, _ in self.store.group_offsets(group_id)]
                    membership = [log_format.membership_key(group_id, member_id) for member_id in self.store.group_membership(group_id)]
                    if keys or membership:
                        outcome = offsets_partition.commit_offsets([(key, None) for key in keys + membership], now_ms(), self.limits)
                        if isinstance(outcome, Reject) or not await outcome:
                            raise not_replicated(offsets_partition)
                    self.groups.forget(group_id)
                item.offsets_deleted = len(keys)
                log.info("group deleted", extra=fields(group=group_id, offsets=len(keys)))
            except TxlogError as exc:
                item.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def DeleteGroupOffsets(self, request, context):
        validation.check_group_id(request.group_id)
        self.check_partition_count(len(request.partitions))
        wanted = [(p.topic, p.partition) for p in request.partitions]
        for topic, index in wanted:
            validation.check_topic_name(topic)
            if index < 0:
                raise validation.invalid(f"partitions are numbered from 0: {topic}-{index}")
        if len(set(wanted)) < len(wanted):
            raise request_error("the request names a partition twice")
        offsets_partition = await self.group_partition(request.group_id)
        reply = partition_pb2.DeleteGroupOffsetsResponse()
        async with self.groups.lock(request.group_id):  # no member subscribes between the check and the write
            subscribed = await self.groups.subscribed_topics(request.group_id)
            committed = {(topic, index) for topic, index, _, _ in self.store.group_offsets(request.group_id)}
            keys = []
            for topic, index in wanted:
                item = reply.partitions.add(partition=common_pb2.TopicPartition(topic=topic, partition=index))
                if topic in subscribed:
                    item.error.CopyFrom(error_of(TxlogError(
                        ErrorCode.Value("GROUP_SUBSCRIBED_TO_TOPIC"),
                        f"a live member of group {request.group_id!r} subscribes to {topic}: its offsets stay "
                        "(stop or unsubscribe the members first)")))
                elif (topic, index) in committed:
                    keys.append(log_format.group_offset_key(request.group_id, topic, index))
            if keys:
                outcome = offsets_partition.commit_offsets([(key, None) for key in keys], now_ms(), self.limits)
                if isinstance(outcome, Reject) or not await outcome:
                    raise not_replicated(offsets_partition)
        log.info("group offsets deleted", extra=fields(group=request.group_id, offsets=len(keys)))
        return reply

    @server.rpc_handler
    async def DescribeGroups(self, request, context):
        return await self.groups.describe(self.checked_group_ids(request.group_ids))

    def checked_group_ids(self, group_ids) -> list[str]:
        """The request's group ids, each once; INVALID_REQUEST or INVALID_GROUP_ID naming what is wrong."""
        if not group_ids:
            raise request_error("the request names no group")
        if len(group_ids) > self.config.partitions_per_request_max:
            raise request_error(f"the request names {len(group_ids)} groups, more than {self.config.partitions_per_request_max}")
        for group_id in group_ids:
            validation.check_group_id(group_id)
        return list(dict.fromkeys(group_ids))

    # --- ACLs (the authorizer checks Alter or Describe on the Cluster first) -------------

    @server.rpc_handler
    async def CreateAcls(self, request, context):
        store = self.runtime.authorizer.check_admin_available()
        if not request.bindings:
            raise request_error("the request holds no binding")
        if len(request.bindings) > self.config.partitions_per_request_max:
            raise request_error(f"the request holds {len(request.bindings)} bindings, more than {self.config.partitions_per_request_max}")
        bindings = [checked_acl(acls.binding_from_proto, b, f"binding {i}") for i, b in enumerate(request.bindings)]
        await store.add(bindings)
        log.info("acls created", extra=fields(bindings=[acls.describe(b) for b in bindings]))
        return partition_pb2.CreateAclsResponse()

    @server.rpc_handler
    async def DescribeAcls(self, request, context):
        store = self.runtime.authorizer.check_admin_available()
        filters = [checked_acl(acls.filter_from_proto, f, f"filter {i}") for i, f in enumerate(request.filters)] or [acls.AclFilter()]
        found = [b for b in await asyncio.to_thread(store.load) if any(f.matches(b) for f in filters)]
        return partition_pb2.DescribeAclsResponse(bindings=[acls.binding_to_proto(b) for b in sorted(found, key=acls.describe)])

    @server.rpc_handler
    async def DeleteAcls(self, request, context):
        store = self.runtime.authorizer.check_admin_available()
        if not request.filters:
            raise request_error("the request holds no filter; AclBindingFilter() with nothing set matches every binding")
        filters = [checked_acl(acls.filter_from_proto, f, f"filter {i}") for i, f in enumerate(request.filters)]
        removed = await store.remove(filters)
        log.info("acls deleted", extra=fields(bindings=[acls.describe(b) for b in removed]))
        return partition_pb2.DeleteAclsResponse(bindings=[acls.binding_to_proto(b) for b in sorted(removed, key=acls.describe)])

    # --- replication -------------------------------------------------------------------

    async def announce(self, controller_epoch: int, addresses: dict[int, str], changed: PartitionStates, newcomers: set[int],
                       everything: PartitionStates) -> set[int]:
        """The controller's LeaderAndIsr: the changed states to every live
        instance, every state to those that are new or restarted. Returns the
        instances it failed to tell: the controller's next pass takes them as
        new (every state again)."""
        def request(states: PartitionStates) -> replication_pb2.LeaderAndIsrRequest:
            return replication_pb2.LeaderAndIsrRequest(controller_id=self.node_id, controller_epoch=controller_epoch, partitions=[
                replication_pb2.PartitionState(topic=info.name, partition=index, leader=state.leader,
                                               leader_epoch=state.leader_epoch, isr=state.isr, replicas=info.replicas[index],
                                               zk_version=state.zk_version, controller_epoch=state.controller_epoch,
                                               zk_mzxid=state.zk_mzxid)
                for info, index, state in states])

        async def tell(node: int, address: str) -> bool:
            states = everything if node in newcomers else changed
            if not states:
                return True
            try:
                # wait_for_ready: a channel still backing off from the instance's last life reconnects first
                reply = await answer_of(lambda: self.peers.replication_stub(address).LeaderAndIsr(
                    request(states), wait_for_ready=True, timeout=LEADER_AND_ISR_TIMEOUT_S))
            except TxlogError as exc:  # the controller's next pass sends it every state (its resync is only the safety net)
                log.warning("LeaderAndIsr not delivered", extra=fields(node=node, error=exc.message))
                return False
            refused = [r for r in reply.results if r.error.code != NONE]
            if refused:
                log.warning("LeaderAndIsr refused in part", extra=fields(node=node, first=refused[0].error.message))
            return True

        nodes = list(addresses)
        told = await asyncio.gather(*(tell(node, addresses[node]) for node in nodes))
        return {node for node, ok in zip(nodes, told, strict=True) if not ok}

    # --- background work -------------------------------------------------------------

    @staticmethod
    async def every(interval_ms: int, one_pass, what: str) -> None:
        """Runs ``one_pass()`` every ``interval_ms``, for good; a pass that fails is logged, the next one runs."""
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await one_pass()
            except Exception:
                log.exception(f"{what} pass failed")

    async def expire_producers(self) -> None:
        now = now_ms()
        for partition in list(self.partitions.values()):
            before = len(partition.producers)
            written = partition.expire_producers(now, self.config.producer_id_expiration_ms)
            if written is not None:
                await written
                log.info("producers expired", extra=fields(topic=partition.topic, partition=partition.index,
                                                           expired=before - len(partition.producers)))

    async def enforce_retention(self) -> None:
        now = now_ms()
        for partition in list(self.partitions.values()):
            written = partition.enforce_retention(now)
            if written is not None:
                await written
                log.info("retention", extra=fields(topic=partition.topic, partition=partition.index, log_start_offset=partition.log_start_offset))
        # after retention, and after whatever else deleted batches since the last pass (deleted topics, DeleteRecords)
        await asyncio.to_thread(self.store.tune_blob_gc)


def check_settled(partition: Partition) -> None:
    """A new leader answers reads only once its high watermark has reached
    the start of its epoch: below that, it could show a high watermark or LSO
    behind what the previous leader showed (KIP-207's OFFSET_NOT_AVAILABLE)."""
    if partition.high_watermark < partition.epoch_start_offset:
        raise TxlogError(ErrorCode.Value("OFFSET_NOT_AVAILABLE"),
                         f"{partition.topic}-{partition.index} has a new leader still catching its high watermark up to "
                         f"{partition.epoch_start_offset}; retry shortly")


def not_replicated(partition: Partition) -> TxlogError:
    return TxlogError(ErrorCode.Value("NOT_COORDINATOR"),
                      f"{partition.topic}-{partition.index} stopped being led here before the offsets were replicated; "
                      "find the group coordinator again and retry")


class BootstrapCoordinatorServicer(IdempotentProducerInitServicer):
    """The CoordinatorService rpcs any partition_svc answers, so that a client
    knowing only the bootstrap addresses needs nothing else: FindCoordinator
    (transactional ids and groups) and InitProducerId without a transactional
    id. The transactional rpcs answer NOT_COORDINATOR: they go to the
    coordinator FindCoordinator names."""

    def __init__(self, source: ProducerIdSource, partitions: PartitionServicer):
        super().__init__(source)
        self.partitions = partitions

    @server.rpc_handler
    async def FindCoordinator(self, request, context):
        if request.key_type == coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION:
            check_transactional_id(request.key)
            return await self.partitions.find_transaction_coordinator(request.key)
        if request.key_type == coordinator_pb2.COORDINATOR_KEY_TYPE_GROUP:
            return await self.partitions.find_group_coordinator(request.key)
        raise request_error(f"unknown key_type {request.key_type}")


def _not_a_coordinator(rpc: str):
    @server.rpc_handler
    async def handler(self, request, context):
        raise TxlogError(ErrorCode.Value("NOT_COORDINATOR"),
                         f"{rpc} is served by transaction coordinators (coordinator_svc), not by partition_svc: ask "
                         "FindCoordinator (any address) where the transactional id's coordinator is")

    handler.__name__ = rpc
    return handler


for _rpc in coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].methods_by_name:
    if _rpc not in ("FindCoordinator", "InitProducerId"):
        setattr(BootstrapCoordinatorServicer, _rpc, _not_a_coordinator(_rpc))


async def build(runtime: server.ServiceRuntime) -> PartitionServicer:
    cfg = runtime.config
    malloc.keep_large_buffers(cfg.malloc_mmap_threshold_bytes)
    store = LogStore(os.path.join(cfg.data_dir, f"node-{cfg.node_id}"), sync=cfg.fsync)
    servicer = PartitionServicer(runtime, store)
    if cfg.rack:
        runtime.registration_details["rack"] = cfg.rack
    runtime.registration_details["storage_zxid"] = str(
        await storage_zxid(runtime.zookeeper, cfg.zookeeper_root, KIND, cfg.node_id, store))
    await servicer.deletion.start()  # before recovery: a topic marked for deletion is not loaded again
    await servicer.replicas.recover()
    runtime.add_servicer(servicer, partition_pb2.DESCRIPTOR.services_by_name["PartitionService"])
    runtime.add_servicer(ReplicationServicer(servicer.replicas, cfg.fetch_wait_ms_max),
                         replication_pb2.DESCRIPTOR.services_by_name["ReplicationService"])
    bootstrap = BootstrapCoordinatorServicer(ProducerIdSource(servicer.peers, requester_id=cfg.node_id), servicer)
    runtime.add_servicer(bootstrap, coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"])
    background = [asyncio.ensure_future(work) for work in (
        servicer.every(cfg.retention_check_interval_ms, servicer.enforce_retention, "retention"),
        servicer.every(cfg.producer_id_expiration_check_interval_ms, servicer.expire_producers, "producer expiry"),
        servicer.controller.run_forever(),
        servicer.replicas.maintain_forever(cfg.partition_state_refresh_ms),
        servicer.groups.expire_forever(),
        servicer.deletion.run_forever(),
    )]

    async def close() -> None:
        for task in background:
            task.cancel()
        await servicer.replicas.close()
        await servicer.writer.drain()
        await servicer.peers.close()
        store.close()

    runtime.on_stop(close)
    return servicer


def main(argv=None) -> int:
    return server.run(KIND, "txlog partition service", SETTINGS, build, argv)


if __name__ == "__main__":
    sys.exit(main())
