"""Which partition states an instance follows, through the real services:
an instance that holds none of a topic's partitions reads none of their
states from ZooKeeper (it is told of changes by the controller's
LeaderAndIsr), while the replicas still learn a leader change, and the
bystander still answers Metadata with the new leaders and ISRs; and a
partition CreatePartitions places on an instance whose cached topic node is
older (it held none of the topic) is led there at once, not a minute later.

ZooKeeper's own per-connection counters (the ``cons`` command) count the
bystander's requests: nothing in the service is trusted to count itself.
Every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import json
import time

import grpc
import pytest
from kazoo.client import KazooClient

from services.tooling.cluster import LocalCluster, registration_session, zookeeper_session_requests
from txlog.two_phase import wait_until
from txlog.v1 import partition_pb2, partition_pb2_grpc

SESSION_S = 4
REFRESH_MS = 1000
FAST = ["--zookeeper-session-timeout-s", str(SESSION_S), "--replica-lag-time-max-ms", "2000",
        "--controller-pass-interval-ms", "1000", "--partition-state-refresh-ms", str(REFRESH_MS)]
PARTITIONS = 200
TOPIC = "held"
DEADLINE_S = 60


def metadata(address: str, topic: str = TOPIC) -> list[partition_pb2.PartitionMetadata]:
    with grpc.insecure_channel(address) as channel:
        reply = partition_pb2_grpc.PartitionServiceStub(channel).Metadata(partition_pb2.MetadataRequest(topics=[topic]), timeout=30)
    return list(reply.topics[0].partitions)


def create_topic(address: str, topic: str, partitions: int) -> None:
    with grpc.insecure_channel(address) as channel:
        reply = partition_pb2_grpc.PartitionServiceStub(channel).CreateTopics(partition_pb2.CreateTopicsRequest(topics=[
            partition_pb2.CreatableTopic(name=topic, partition_count=partitions, replication_factor=2)]), timeout=60)
    assert reply.results[0].error.code == 0, reply


def zookeeper_json(cluster: LocalCluster, path: str):
    """A ZooKeeper node's JSON, read in a session of its own."""
    zk = KazooClient(hosts=cluster.state.zookeeper)
    zk.start(timeout=30)
    try:
        return json.loads(zk.get(path)[0])
    finally:
        zk.stop()
        zk.close()


def all_partitions(address: str, check) -> bool:
    try:
        partitions = metadata(address)
    except grpc.RpcError:
        return False
    return len(partitions) == PARTITIONS and all(check(p) for p in partitions)


@pytest.fixture
def cluster(tmp_path):
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=2, coordinator_svcs=0, service_args={"partition_svc": FAST})
    yield local
    local.down(grace_s=5)


def test_a_bystander_reads_no_state_it_does_not_hold_while_replicas_and_it_learn_a_leader_change(cluster):
    first = cluster.state.services["partition_svc-0"].address
    create_topic(first, TOPIC, PARTITIONS)
    wait_until(lambda: all_partitions(first, lambda p: p.leader_id >= 0 and len(p.isr) == 2), DEADLINE_S,
               "every partition led, both replicas in sync")
    bystander = cluster.add_service("partition_svc", 2, FAST)  # after placement: it holds none of them
    session = registration_session(cluster.state.zookeeper, "partition_svc", 2)
    controller = zookeeper_json(cluster, "/txlog/controller")["node_id"]
    assert controller in (0, 1)
    victim, survivor = 1 - controller, controller  # the controller stays: the bystander must not become it (it reads every state)
    wait_until(lambda: all_partitions(bystander.address, lambda p: p.leader_id in (0, 1)), DEADLINE_S,
               "the bystander knowing every leader (the controller's LeaderAndIsr to a newcomer)")

    before, started = zookeeper_session_requests(cluster.state.zookeeper, session), time.monotonic()
    assert [p.partition for p in metadata(first) if p.leader_id == victim]
    cluster.kill(f"partition_svc-{victim}")
    follower = cluster.state.services[f"partition_svc-{survivor}"].address
    wait_until(lambda: all_partitions(follower, lambda p: p.leader_id == survivor), DEADLINE_S,
               "the follower leading every partition of the killed leader")
    requests, seconds = zookeeper_session_requests(cluster.state.zookeeper, session) - before, time.monotonic() - started

    assert seconds >= 3 * REFRESH_MS / 1000, "the window spans several resyncs"
    # Reading every state each resync would be PARTITIONS requests a second; what remains is its session's
    # pings, the topic list and the live instances, a few a second.
    assert requests < PARTITIONS // 2, f"{requests} ZooKeeper requests in {seconds:.1f} s from an instance holding none"
    wait_until(lambda: all_partitions(bystander.address, lambda p: p.leader_id == survivor and list(p.isr) == [survivor]),
               DEADLINE_S, "the bystander answering with the new leader and ISR")

    cluster.start(f"partition_svc-{victim}")  # back: it catches up, and the leaders (not the controller) let it in the ISR
    wait_until(lambda: all_partitions(bystander.address, lambda p: sorted(p.isr) == [0, 1]), DEADLINE_S,
               "the bystander answering with the ISRs the leaders grew")


GROWN = "grown"
GROWN_FROM, GROWN_TO = 3, 6
NEW_PARTITION_DEADLINE_S = 15  # well under the minute after which an instance re-reads every topic's node anyway


def list_latest(address: str, topic: str, partition: int) -> partition_pb2.ListOffsetsPartitionResult:
    with grpc.insecure_channel(address) as channel:
        reply = partition_pb2_grpc.PartitionServiceStub(channel).ListOffsets(partition_pb2.ListOffsetsRequest(partitions=[
            partition_pb2.ListOffsetsPartition(topic=topic, partition=partition, spec=partition_pb2.OFFSET_SPEC_LATEST)]), timeout=10)
    return reply.results[0]


def test_a_partition_added_on_an_instance_whose_cached_topic_is_older_is_led_at_once(cluster):
    first = cluster.state.services["partition_svc-0"].address
    create_topic(first, GROWN, GROWN_FROM)
    newcomer = cluster.add_service("partition_svc", 2, FAST)  # after placement: it holds none of the topic's partitions

    def topic_known() -> bool:
        try:
            partitions = metadata(newcomer.address, GROWN)
        except grpc.RpcError:
            return False
        return len(partitions) == GROWN_FROM and all(p.leader_id in (0, 1) for p in partitions)

    # the newcomer keeps the topic's node as it reads it now (3 partitions); its resyncs re-read only topics it has partitions of
    wait_until(topic_known, DEADLINE_S, "the newcomer knowing the topic's leaders")

    with grpc.insecure_channel(first) as channel:  # not to the newcomer: its cached node stays as it was
        grown = partition_pb2_grpc.PartitionServiceStub(channel).CreatePartitions(partition_pb2.CreatePartitionsRequest(topics=[
            partition_pb2.PartitionsIncrease(topic=GROWN, total_count=GROWN_TO)]), timeout=60)
    assert grown.results[0].error.code == 0, grown
    replicas = zookeeper_json(cluster, f"/txlog/topics/{GROWN}")["replicas"]
    led_by_newcomer = [index for index in range(GROWN_FROM, GROWN_TO) if replicas[index][0] == 2]
    assert led_by_newcomer, f"placement over three instances puts a new partition's preferred leader on each: {replicas}"

    wait_until(lambda: all(list_latest(newcomer.address, GROWN, index).error.code == 0 for index in led_by_newcomer),
               NEW_PARTITION_DEADLINE_S, "the newcomer leading the new partition placed on it")
