"""What every servicer of this partition_svc instance asks of the cluster:
which instances are live, which partitions this instance leads, who
coordinates a transactional id or a group, and topic creation (the offsets
topic is created on first use). Shared by the servicers, so none of them
takes another whole."""

from __future__ import annotations

import asyncio
import time

from partition_svc import placement, validation
from partition_svc.controller import Controller
from partition_svc.log_store import LogStore
from partition_svc.partition import Partition
from partition_svc.replica_manager import ReplicaManager
from partition_svc.rpc_errors import request_error
from partition_svc.topics import TopicInfo, TopicRegistry
from services.coordination import coordinators
from services.runtime import server
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.hashing import partition_for_id
from txlog.protocol.names import is_topic_name
from txlog.v1 import coordinator_pb2

KIND = "partition_svc"
SERVICE_KINDS = (KIND, "coordinator_svc", "producer_id_svc")


class LiveNodes:
    """The live instances of a kind, as ZooKeeper's registry lists them, read again after ``cache_ms``."""

    def __init__(self, registry, cache_ms: int):
        self.registry = registry
        self.cache_ms = cache_ms
        self._cached: dict[str, tuple[float, dict[int, str]]] = {}

    async def get(self, kind: str = KIND) -> dict[int, str]:
        fetched_at, nodes = self._cached.get(kind, (0.0, {}))
        if time.monotonic() - fetched_at > self.cache_ms / 1000:
            nodes = await asyncio.to_thread(self.registry.live, kind)
            self._cached[kind] = (time.monotonic(), nodes)
        return nodes


INTERNAL_REPLICATION_FACTOR_AUTO_MAX = 3


def internal_replication_factor(configured: int, live: int, topic: str) -> int:
    """The replication factor an internal topic is created with. ``configured``
    N: N, or COORDINATOR_NOT_AVAILABLE (retriable) while fewer than N instances
    are live, as Kafka's offsets.topic.replication.factor: instances that come
    up one at a time must not leave the transaction log or the groups' offsets
    on one replica for the cluster's life, where losing that one pod stops
    every transaction. 0: as many as are live, at most 3."""
    if configured == 0:
        return min(INTERNAL_REPLICATION_FACTOR_AUTO_MAX, live)
    if live < configured:
        raise TxlogError(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"),
                         f"{topic} is created with {configured} replicas (--internal-topic-replication-factor) once "
                         f"{configured} partition_svc instances are live; {live} are: retry")
    return configured


class ClusterView:
    def __init__(self, runtime: server.ServiceRuntime, store: LogStore, topics: TopicRegistry, replicas: ReplicaManager,
                 live: LiveNodes, controller: Controller, limits: validation.BatchLimits):
        self.runtime = runtime
        self.config = runtime.config
        self.node_id = runtime.config.node_id
        self.store = store
        self.topics = topics
        self.replicas = replicas
        self.live = live
        self.controller = controller
        self.limits = limits
        self._owners = coordinators.WatchedOwners(runtime.zookeeper, runtime.config.zookeeper_root)

    @property
    def partitions(self) -> dict[tuple[str, int], Partition]:
        """Every replica this instance holds, leader or follower."""
        return self.replicas.partitions

    async def live_nodes(self, kind: str = KIND) -> dict[int, str]:
        return await self.live.get(kind)

    async def instances(self) -> list[tuple[str, int, dict]]:
        """(kind, node id, registration) of every live instance of every service, by kind and node id."""
        found = []
        for kind in SERVICE_KINDS:
            details = await asyncio.to_thread(self.runtime.registry.live_details, kind)
            found.extend((kind, node_id, details[node_id]) for node_id in sorted(details))
        return found

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
        replication factor: the cluster's default, capped at the live instances;
        an internal topic's, internal_replication_factor."""
        nodes = await asyncio.to_thread(self.runtime.registry.live_details, KIND)
        if not nodes:
            raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"), "no partition_svc instance is live to host partitions")
        if replication_factor is None and internal:
            replication_factor = internal_replication_factor(self.config.internal_topic_replication_factor, len(nodes), name)
        elif replication_factor is None:
            replication_factor = min(self.config.default_replication_factor, len(nodes))
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
