"""Which partition states an instance follows, through the real services:
an instance that holds none of a topic's partitions reads none of their
states from ZooKeeper (it is told of changes by the controller's
LeaderAndIsr), while the replicas still learn a leader change, and the
bystander still answers Metadata with the new leaders and ISRs.

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

from services.client.two_phase import wait_until
from services.cluster import LocalCluster, registration_session, zookeeper_session_requests
from services.stubs.txlog.v1 import partition_pb2, partition_pb2_grpc

SESSION_S = 4
REFRESH_MS = 1000
FAST = ["--zookeeper-session-timeout-s", str(SESSION_S), "--replica-lag-time-max-ms", "2000",
        "--controller-pass-interval-ms", "1000", "--partition-state-refresh-ms", str(REFRESH_MS)]
PARTITIONS = 200
TOPIC = "held"
DEADLINE_S = 60


def metadata(address: str) -> list[partition_pb2.PartitionMetadata]:
    with grpc.insecure_channel(address) as channel:
        reply = partition_pb2_grpc.PartitionServiceStub(channel).Metadata(partition_pb2.MetadataRequest(topics=[TOPIC]), timeout=30)
    return list(reply.topics[0].partitions)


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
    with grpc.insecure_channel(first) as channel:
        reply = partition_pb2_grpc.PartitionServiceStub(channel).CreateTopics(partition_pb2.CreateTopicsRequest(topics=[
            partition_pb2.CreatableTopic(name=TOPIC, partition_count=PARTITIONS, replication_factor=2)]), timeout=60)
    assert reply.results[0].error.code == 0, reply
    wait_until(lambda: all_partitions(first, lambda p: p.leader_id >= 0 and len(p.isr) == 2), DEADLINE_S,
               "every partition led, both replicas in sync")
    bystander = cluster.add_service("partition_svc", 2, FAST)  # after placement: it holds none of them
    session = registration_session(cluster.state.zookeeper, "partition_svc", 2)
    zk = KazooClient(hosts=cluster.state.zookeeper)
    zk.start(timeout=30)
    try:
        controller = json.loads(zk.get("/txlog/controller")[0])["node_id"]
    finally:
        zk.stop()
        zk.close()
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
