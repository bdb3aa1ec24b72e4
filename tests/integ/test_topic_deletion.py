"""DeleteTopics through the real services (issue 17): three partition_svc
processes, replicated topics with records and committed group offsets.

What is checked is what a Kafka user counts on: a deleted topic is unknown
at once to every instance; no instance's RocksDB keeps a key of it (read
from the instance's own database, opened read-only beside it); the groups'
offsets for it are gone and the others' stay; a topic of the same name
starts afresh at offset 0; an instance down during the deletion holds it up
(REQUEST_TIMED_OUT, the deletion going on, across a controller failover too)
and drops its copies when it comes back, never resurrecting them; an
internal topic and bad requests are refused with nothing changed. Every wait
is for a condition, with a deadline.
"""

from __future__ import annotations

import json

import grpc
import pytest
from kazoo.client import KazooClient
from rocksdict import AccessType, Options, Rdict

from services.tooling.cluster import LocalCluster
from tests.integ import test_replication
from tests.integ.raw import Raw
from tests.integ.test_metrics import scrape
from txlog import Admin, TopicPartition
from txlog.errors import ClientError
from txlog.protocol.errors import ErrorCode
from txlog.two_phase import wait_until
from txlog.v1 import common_pb2, partition_pb2

WAIT_S = 60
NODES = (0, 1, 2)
UNKNOWN = ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION")
GROUP = "deleting-group"

# test_replication's: three partition_svc with short failure detection, raw gRPC, a ZooKeeper client
cluster, raw, zk = test_replication.cluster, test_replication.raw, test_replication.zk
name_of = test_replication.name_of


def stored_keys(cluster: LocalCluster, node: int, topic: str) -> list[bytes]:
    """Every key of ``topic`` in the instance's RocksDB: its partitions' log,
    epochs, metadata, producer states, aborted index and pending offsets, and
    groups' committed offsets of it (read-only: the instance may be running)."""
    db = Rdict(str(cluster.dir / name_of(node) / f"node-{node}"), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        pkey = topic.encode() + b"\x00"
        found = []
        for key in db.keys():
            if key[:1] in (b"L", b"E", b"M", b"P", b"A", b"X") and key[1:].startswith(pkey):
                found.append(key)
            elif key[:1] == b"G" and key.split(b"\x00")[1:2] == [topic.encode()]:
                found.append(key)
        return found
    finally:
        db.close()


def gauge_series(cluster: LocalCluster, topic: str) -> list[tuple[str, dict]]:
    """The per-partition and per-group gauges labelled with ``topic`` on every instance (a deleted one's must stop)."""
    gauges = ("txlog_partition_high_watermark", "txlog_partition_last_stable_offset", "txlog_partition_lso_lag",
              "txlog_partition_in_sync_replicas", "txlog_group_committed_offset")
    return [(name, labels) for node in NODES for name, series in scrape(cluster.state.services[name_of(node)].metrics_address).items()
            if name in gauges for labels, _ in series if labels.get("topic") == topic]


def fully_replicated(raw: Raw, topic: str, partitions: int) -> bool:
    reply = raw.metadata(partition_pb2.MetadataRequest(topics=[topic]))
    return reply.topics[0].error.code == 0 and all(len(p.isr) == 3 and p.error.code == 0 for p in reply.topics[0].partitions) \
        and len(reply.topics[0].partitions) == partitions


def produce(raw: Raw, topic: str, partition: int, values: list[str]) -> common_pb2.PartitionResult | None:
    batch = common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                   records=[common_pb2.Record(value=v.encode()) for v in values])
    result = raw.produce(topic, partition, batch)
    return result if result.error.code == 0 else None


def commit(raw: Raw, offsets: dict[tuple[str, int], int]) -> None:
    def committed() -> bool:
        found = raw.metadata(partition_pb2.MetadataRequest(group_ids=[GROUP])).group_coordinators[0]
        if found.error.code != 0:
            return False
        reply = raw.stub(found.address).OffsetCommit(partition_pb2.OffsetCommitRequest(group_id=GROUP, offsets=[
            partition_pb2.PartitionOffset(topic=t, partition=p, offset=o) for (t, p), o in offsets.items()]), timeout=10)
        return all(r.error.code == 0 for r in reply.results)

    wait_until(committed, WAIT_S, "the group's offsets committed")


def unknown_everywhere(cluster: LocalCluster, raw: Raw, topic: str, nodes=NODES) -> bool:
    """Every instance's Metadata, Produce and Fetch answer UNKNOWN_TOPIC_OR_PARTITION for the topic."""
    for node in nodes:
        stub = raw.stub(cluster.address(name_of(node)))
        if stub.Metadata(partition_pb2.MetadataRequest(topics=[topic]), timeout=10).topics[0].error.code != UNKNOWN:
            return False
        if topic in [t.name for t in stub.Metadata(partition_pb2.MetadataRequest(all_topics=True), timeout=10).topics]:
            return False
        batch = common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, records=[common_pb2.Record(value=b"late")])
        if raw.produce(topic, 0, batch, stub=stub).error.code != UNKNOWN or raw.fetch(topic, 0, 0, stub=stub).error.code != UNKNOWN:
            return False
    return True


def deletion_marked(zk: KazooClient, topic: str) -> bool:
    return zk.exists(f"/txlog/admin/delete_topics/{topic}") is not None


def test_a_deleted_topic_leaves_no_key_on_any_replica_nor_group_offsets_and_comes_back_empty(cluster, raw, zk):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("doomed", 2, 3), ("kept", 1, 3)], {"min.insync.replicas": "2"})
    wait_until(lambda: fully_replicated(raw, "doomed", 2) and fully_replicated(raw, "kept", 1), WAIT_S, "every replica in sync")
    for partition in (0, 1):
        wait_until(lambda p=partition: produce(raw, "doomed", p, [f"old-{p}-{i}" for i in range(5)]), WAIT_S, "records stored")
    wait_until(lambda: produce(raw, "kept", 0, ["kept-0", "kept-1"]), WAIT_S, "records stored")
    commit(raw, {("doomed", 0): 3, ("doomed", 1): 4, ("kept", 0): 1})
    # the check below means something: every instance held the topic's keys and the group's offsets of it
    wait_until(lambda: all(len(stored_keys(cluster, n, "doomed")) >= 2 * 3 + 2 for n in NODES), WAIT_S,
               "every replica holding the topic's log, metadata, epochs and the group's offsets of it")
    assert {name for name, _ in gauge_series(cluster, "doomed")} >= {"txlog_partition_high_watermark", "txlog_group_committed_offset"}

    with Admin(bootstrap) as admin:
        admin.delete_topics(["doomed"], timeout_s=WAIT_S)
        assert "doomed" not in admin.list_topics()
        assert admin.list_group_offsets(GROUP) == {TopicPartition("kept", 0): 1}

    assert unknown_everywhere(cluster, raw, "doomed")
    assert zk.exists("/txlog/topics/doomed") is None and not deletion_marked(zk, "doomed")
    # the followers of __consumer_offsets apply the tombstones as they fetch them
    wait_until(lambda: all(stored_keys(cluster, n, "doomed") == [] for n in NODES), WAIT_S, "no key of the topic on any instance")
    assert all(stored_keys(cluster, n, "kept") for n in NODES), "another topic's keys went too"
    assert gauge_series(cluster, "doomed") == [] and gauge_series(cluster, "kept")

    with Admin(bootstrap) as admin:
        admin.create_topics([("doomed", 1, 3)])
    wait_until(lambda: fully_replicated(raw, "doomed", 1), WAIT_S, "the new topic's replicas in sync")
    fresh = []
    wait_until(lambda: fresh.append(produce(raw, "doomed", 0, ["new"])) or fresh[-1], WAIT_S, "a record in the new topic")
    assert fresh[-1].base_offset == 0
    assert [r.value for r in raw.read_all("doomed", 0)] == [b"new"]
    assert [r.value for r in raw.read_all("kept", 0)] == [b"kept-0", b"kept-1"]


def test_an_instance_down_during_the_deletion_holds_it_up_and_drops_the_partitions_when_back(cluster, raw, zk):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("orphan", 1, 3)], {"min.insync.replicas": "1"})
    wait_until(lambda: fully_replicated(raw, "orphan", 1), WAIT_S, "every replica in sync")
    wait_until(lambda: produce(raw, "orphan", 0, ["a", "b", "c"]), WAIT_S, "records stored")
    wait_until(lambda: all(stored_keys(cluster, n, "orphan") for n in NODES), WAIT_S, "every replica holding the records")
    controller = json.loads(zk.get("/txlog/controller")[0])["node_id"]
    down = next(n for n in NODES if n != controller)
    cluster.stop(name_of(down))

    with Admin(bootstrap) as admin:
        with pytest.raises(ClientError, match="REQUEST_TIMED_OUT") as timed_out:
            admin.delete_topics(["orphan"], timeout_s=3)
        assert timed_out.value.retriable
        with pytest.raises(ClientError, match="REQUEST_TIMED_OUT"):  # asked again, it waits for the same deletion again
            admin.delete_topics(["orphan"], timeout_s=2)
        with pytest.raises(ClientError, match="TOPIC_ALREADY_EXISTS.*being deleted"):
            admin.create_topics([("orphan", 1, 2)])
    live = [n for n in NODES if n != down]
    assert unknown_everywhere(cluster, raw, "orphan", live)
    assert deletion_marked(zk, "orphan") and zk.exists("/txlog/topics/orphan") is not None
    assert stored_keys(cluster, down, "orphan"), "the instance down still holds its copy"

    cluster.kill(name_of(controller))  # the mark survives the controller: the next one carries the deletion on
    cluster.start(name_of(controller))
    cluster.start(name_of(down))
    wait_until(lambda: not deletion_marked(zk, "orphan"), WAIT_S, "the deletion complete once the instance is back")
    assert zk.exists("/txlog/topics/orphan") is None
    assert unknown_everywhere(cluster, raw, "orphan")
    assert all(stored_keys(cluster, n, "orphan") == [] for n in NODES)
    with Admin(bootstrap) as admin:
        with pytest.raises(ClientError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            admin.delete_topics(["orphan"], timeout_s=10)
        admin.create_topics([("orphan", 1, 3)])
    wait_until(lambda: fully_replicated(raw, "orphan", 1), WAIT_S, "the new topic's replicas in sync")
    assert raw.read_all("orphan", 0) == [], "a record of the deleted topic came back"


def test_internal_unknown_and_malformed_deletions_are_refused_and_change_nothing(cluster, raw, zk):
    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([("stays", 1, 3)])
    wait_until(lambda: fully_replicated(raw, "stays", 1), WAIT_S, "every replica in sync")
    commit(raw, {("stays", 0): 0})  # creates __consumer_offsets
    stub = raw.stub(raw.bootstrap[0])
    topics_before = sorted(t.name for t in stub.Metadata(partition_pb2.MetadataRequest(all_topics=True), timeout=10).topics)
    assert "__consumer_offsets" in topics_before

    reply = stub.DeleteTopics(partition_pb2.DeleteTopicsRequest(topics=["__consumer_offsets", "never-made", "bad/name"]), timeout=30)
    codes = {r.topic: ErrorCode.Name(r.error.code) for r in reply.results}
    assert codes == {"__consumer_offsets": "INVALID_REQUEST", "never-made": "UNKNOWN_TOPIC_OR_PARTITION",
                     "bad/name": "UNKNOWN_TOPIC_OR_PARTITION"}
    assert "internal" in reply.results[0].error.message
    for request, says in ((partition_pb2.DeleteTopicsRequest(), "names no topic"),
                          (partition_pb2.DeleteTopicsRequest(topics=["stays", "stays"]), "names a topic twice"),
                          (partition_pb2.DeleteTopicsRequest(topics=["stays"], timeout_ms=-1), "timeout_ms must not be negative")):
        with pytest.raises(grpc.RpcError) as refused:
            stub.DeleteTopics(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in refused.value.details()
    with Admin(cluster.state.bootstrap) as admin:
        with pytest.raises(ClientError, match="INVALID_REQUEST.*internal"):
            admin.delete_topics(["__transaction_state"])

    assert sorted(t.name for t in stub.Metadata(partition_pb2.MetadataRequest(all_topics=True), timeout=10).topics) == topics_before
    assert zk.get_children("/txlog/admin/delete_topics") == []
    assert all(stored_keys(cluster, n, "stays") for n in NODES)
    with Admin(cluster.state.bootstrap) as admin:
        assert admin.list_group_offsets(GROUP) == {TopicPartition("stays", 0): 0}
