"""partition_svc's wiring: its settings, the parts of one instance (the
store and its writer, the replica manager, the controller, the group
coordinator, the cluster view the servicers share) and the servicers that
serve PartitionService by concern:

- data_servicer.py: Produce, Fetch, ListOffsets, EpochEndOffsets, DeleteRecords, DescribeProducers
- txn_servicer.py: WriteTxnMarkers, OffsetCommit, TxnOffsetCommit, OffsetFetch
- group_servicer.py: consumer-group heartbeats, listing, describing, deleting
- admin_servicer.py: Metadata, topics, configs, partitions, reassignments, ACLs
- replication.py: ReplicationService (followers' fetches, LeaderAndIsr)
- bootstrap_servicer.py: the CoordinatorService RPCs any instance answers
"""

from __future__ import annotations

import asyncio
import os
import sys

from partition_svc import validation
from partition_svc.admin_servicer import AdminServicer
from partition_svc.announcer import Announcer
from partition_svc.bootstrap_servicer import BootstrapCoordinatorServicer
from partition_svc.cluster_view import KIND, ClusterView, LiveNodes
from partition_svc.controller import Controller, storage_zxid
from partition_svc.data_servicer import DataServicer
from partition_svc.group_coordinator import GroupCoordinator
from partition_svc.group_servicer import GroupServicer
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.maintenance import Maintenance
from partition_svc.partition_metrics import PartitionMetrics
from partition_svc.quota_servicer import QuotaServicer, Throttling
from partition_svc.quota_store import QuotaStore
from partition_svc.replica_manager import ReplicaManager
from partition_svc.replication import ReplicationServicer
from partition_svc.topic_deletion import TopicDeletion
from partition_svc.topics import TopicRegistry
from partition_svc.txn_servicer import TransactionServicer
from partition_svc.txn_verification import TransactionVerifier
from services.coordination.peer_routes import PEER_ROUTES_SETTING, PeerRoutes
from services.coordination.producer_ids import ProducerIdSource
from services.coordination.rpc import PeerClient
from services.runtime import malloc, server
from services.runtime.config import Setting, boolean, non_negative_int, positive_int
from txlog.v1 import coordinator_pb2, partition_pb2, replication_pb2

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
    Setting("log_cleaner_delete_retention_ms", validation.DELETE_RETENTION_MS_DEFAULT, "how long a compacted topic "
            "keeps a transaction's markers once none of its batches is left (and every replica has copied them), unless "
            "the topic sets delete.retention.ms (Kafka's log.cleaner.delete.retention.ms), ms", non_negative_int),
    Setting("producer_id_expiration_check_interval_ms", 600_000, "how often producers are checked for expiry, ms",
            positive_int),
    Setting("live_nodes_cache_ms", 1_000, "how long the list of live instances is reused, ms", positive_int),
    Setting("rack", "", "this instance's rack (or zone): replicas of a partition go to different racks when every instance has one"),
    Setting("default_replication_factor", 3, "replication factor of a topic created without one (capped at the live instances)",
            positive_int),
    Setting("min_insync_replicas", 1, "min.insync.replicas of a topic created without one (capped at its replication "
            "factor - 1, so one instance may be down)", positive_int),
    Setting("internal_topic_replication_factor", 0, "replication factor of __transaction_state and __consumer_offsets: "
            "N, and they are created only once N instances are live (COORDINATOR_NOT_AVAILABLE, which callers retry, "
            "until then); 0, as many as are live when they are created, at most 3 (for clusters whose size is not "
            "known: a local one, the tests)", non_negative_int),
    Setting("internal_topic_min_insync_replicas", 2, "min.insync.replicas of the internal topics (capped at their "
            "replication factor - 1, so one instance may be down)", positive_int),
    Setting("replica_lag_time_max_ms", 10_000, "a follower not caught up for this long leaves the ISR, ms", positive_int),
    Setting("replica_fetch_wait_ms", 500, "how long a follower's fetch waits for new data at the leader, ms", positive_int),
    Setting("replica_fetch_bytes_max", 16 * 1024 * 1024, "most bytes one follower fetch returns", positive_int),
    Setting("controller_pass_interval_ms", 5_000, "how often the controller checks every partition besides when "
            "instances come and go, ms", positive_int),
    Setting("malloc_mmap_threshold_bytes", 32 * 1024 * 1024, "allocations up to this size come from the C "
            "allocator's reused heap instead of a fresh mmap each (glibc; 0 keeps its default): batches and fetch "
            "responses were faulted in page by page; freed heap at the top of an arena is kept up to twice this before "
            "it is trimmed (freed blocks below live ones stay too: an hour's soak saw up to 81 MB free)", non_negative_int),
    Setting("partition_state_refresh_ms", 5_000, "how often an instance reads its topics and a share "
            "of its own partitions' states again (all within 6 reads; missed controller messages), ms", positive_int),
    PEER_ROUTES_SETTING,
)


class Routes:
    """PartitionService as gRPC serves it: each RPC is the handler of the servicer of its concern (RPCS)."""

    def __init__(self, *servicers):
        for servicer in servicers:
            for name in servicer.RPCS:
                if hasattr(self, name):
                    raise ValueError(f"{name} is served twice")
                setattr(self, name, getattr(servicer, name))


class Instance:
    """The parts of one partition_svc instance, wired."""

    def __init__(self, runtime: server.ServiceRuntime, store: LogStore):
        cfg = runtime.config
        self.store = store
        self.writer = GroupCommitWriter(store)
        topics = TopicRegistry(runtime.zookeeper, cfg.zookeeper_root)
        limits = validation.BatchLimits(cfg.records_per_batch_max, cfg.batch_bytes_max)
        live = LiveNodes(runtime.registry, cfg.live_nodes_cache_ms)
        # coordinators (verification), producer_id_svc, other replicas
        self.peers = PeerClient(runtime.registry, tls_files=runtime.tls_files, routes=PeerRoutes(cfg.peer_routes_file))
        self.replicas = ReplicaManager(cfg.node_id, store, self.writer, topics, self.peers, live.get,
                                       runtime.registry.path(KIND, cfg.node_id), lag_max_ms=cfg.replica_lag_time_max_ms,
                                       fetch_wait_ms=cfg.replica_fetch_wait_ms, fetch_bytes_max=cfg.replica_fetch_bytes_max)
        self.controller = Controller(runtime.zookeeper, cfg.zookeeper_root, cfg.node_id, KIND, topics,
                                     Announcer(cfg.node_id, self.peers).announce, pass_interval_ms=cfg.controller_pass_interval_ms)
        self.view = ClusterView(runtime, store, topics, self.replicas, live, self.controller, limits)
        self.groups = GroupCoordinator(self.view, heartbeat_interval_ms=cfg.group_heartbeat_interval_ms)
        self.metrics = PartitionMetrics(runtime.metrics.meter, lambda: list(self.replicas.partitions.values()),
                                        lambda: self.controller.offline_partitions if self.controller.active else None,
                                        store.properties, self.view.coordinated_group_offsets)
        self.deletion = TopicDeletion(cfg.node_id, topics, self.replicas, store, limits, self.metrics.forget_topic,
                                      refresh_ms=cfg.partition_state_refresh_ms)
        self.maintenance = Maintenance(self.replicas.partitions, store, cfg.producer_id_expiration_ms,
                                       cfg.log_cleaner_delete_retention_ms)
        verifier = TransactionVerifier(self.view.transaction_coordinator, self.peers)
        self.quotas = QuotaStore(runtime.zookeeper, cfg.zookeeper_root)
        data = DataServicer(self.view, verifier, self.metrics)
        Throttling(self.quotas, runtime.authorizer).throttle(data)
        self.routes = Routes(data, TransactionServicer(self.view, verifier, self.groups),
                             GroupServicer(self.view, self.groups), AdminServicer(self.view, self.deletion),
                             QuotaServicer(self.quotas))


async def build(runtime: server.ServiceRuntime) -> Instance:
    cfg = runtime.config
    malloc.keep_large_buffers(cfg.malloc_mmap_threshold_bytes)
    store = LogStore(os.path.join(cfg.data_dir, f"node-{cfg.node_id}"), sync=cfg.fsync)
    instance = Instance(runtime, store)
    if cfg.rack:
        runtime.registration_details["rack"] = cfg.rack
    instance.replicas.storage_zxid = await storage_zxid(runtime.zookeeper, cfg.zookeeper_root, KIND, cfg.node_id, store)
    runtime.registration_details["storage_zxid"] = str(instance.replicas.storage_zxid)
    await instance.quotas.start()
    await instance.deletion.start()  # before recovery: a topic marked for deletion is not loaded again
    await instance.replicas.recover()
    runtime.add_servicer(instance.routes, partition_pb2.DESCRIPTOR.services_by_name["PartitionService"])
    runtime.add_servicer(ReplicationServicer(instance.replicas, cfg.fetch_wait_ms_max),
                         replication_pb2.DESCRIPTOR.services_by_name["ReplicationService"])
    bootstrap = BootstrapCoordinatorServicer(ProducerIdSource(instance.peers, requester_id=cfg.node_id), instance.view)
    runtime.add_servicer(bootstrap, coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"])
    maintenance = instance.maintenance
    background = [asyncio.ensure_future(work) for work in (
        maintenance.every(cfg.retention_check_interval_ms, maintenance.enforce_retention, "retention"),
        maintenance.every(cfg.producer_id_expiration_check_interval_ms, maintenance.expire_producers, "producer expiry"),
        instance.controller.run_forever(),
        instance.replicas.maintain_forever(cfg.partition_state_refresh_ms),
        instance.groups.expire_forever(),
        instance.deletion.run_forever(),
    )]

    async def close() -> None:
        for task in background:
            task.cancel()
        await instance.replicas.close()
        await instance.writer.drain()
        await instance.peers.close()
        store.close()

    runtime.on_stop(close)
    return instance


def main(argv=None) -> int:
    return server.run(KIND, "txlog partition service", SETTINGS, build, argv)


if __name__ == "__main__":
    sys.exit(main())
