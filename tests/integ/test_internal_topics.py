"""The internal topics wait for as many instances as their replication factor
(--internal-topic-replication-factor N): asked for before, they answer
COORDINATOR_NOT_AVAILABLE, which clients and coordinators retry; they are never
created with fewer replicas because the first instances came up alone."""

from __future__ import annotations

import pytest

from services.tooling.cluster import LocalCluster
from tests.integ.raw import Raw
from txlog import Admin, Producer
from txlog.errors import RetriableError
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from txlog.protocol.errors import ErrorCode
from txlog.two_phase import wait_until
from txlog.v1 import partition_pb2

GROUP = "internal-topics-group"
SETTLE_S = 90


@pytest.fixture
def one_of_two(tmp_path, zookeeper_for):
    """One partition_svc of the two the internal topics are set to need, and a coordinator."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(partition_svcs=1, coordinator_svcs=1, zookeeper=zookeeper_for,
             service_args={"partition_svc": ["--internal-topic-replication-factor", "2"]})
    yield local
    local.down(grace_s=5)


def group_coordinator(raw: Raw) -> partition_pb2.CoordinatorMetadata:
    return raw.metadata(partition_pb2.MetadataRequest(group_ids=[GROUP])).group_coordinators[0]


def topic_names(raw: Raw) -> set[str]:
    return {t.name for t in raw.metadata(partition_pb2.MetadataRequest(all_topics=True)).topics if not t.error.code}


def test_the_internal_topics_are_created_only_once_as_many_instances_as_their_replicas_are_live(one_of_two):
    raw = Raw(one_of_two)
    waiting = group_coordinator(raw)
    assert waiting.error.code == ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), waiting
    assert "once 2 partition_svc instances are live; 1 are" in waiting.error.message
    early = Producer(one_of_two.state.bootstrap, transactional_id="internal-topics-txn")
    with pytest.raises(RetriableError):  # the coordinator cannot create its log yet: retried until the deadline
        early.init_transactions(timeout_s=3)
    early.close(timeout_s=5)
    assert not {CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC} & topic_names(raw)

    one_of_two.add_service("partition_svc", 1, ["--internal-topic-replication-factor", "2"])
    with Admin(one_of_two.state.bootstrap) as admin:
        admin.create_topics([("internal-topics-data", 1)])
    wait_until(lambda: not group_coordinator(raw).HasField("error") or not group_coordinator(raw).error.code, SETTLE_S,
               "the group's coordinator found")
    with Producer(one_of_two.state.bootstrap, transactional_id="internal-topics-txn") as producer:
        producer.init_transactions(timeout_s=SETTLE_S)
        producer.begin_transaction()
        producer.send("internal-topics-data", value=b"v", partition=0)
        producer.commit_transaction(timeout_s=SETTLE_S)
    with Admin(one_of_two.state.bootstrap) as admin:
        for described in admin.describe_topics([CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC]):
            assert described.is_internal
            assert {len(p.replicas) for p in described.partitions} == {2}, described
