"""Producer-id expiry (producer.id.expiration.ms) through the real services: an
idle producer is forgotten, one that comes back is served as a new one (the
SDK takes a new epoch, KIP-360) with nothing lost or doubled, and a producer
with a transaction open, or a coordinator's log writer, is never forgotten."""

from __future__ import annotations

import pytest

from services.tooling.cluster import LocalCluster
from tests.integ.raw import Raw, batch
from txlog import Producer
from txlog.protocol import TRANSACTION_STATE_TOPIC
from txlog.protocol.errors import ErrorCode
from txlog.two_phase import wait_until
from txlog.v1 import common_pb2, partition_pb2

EXPIRATION_MS = 1500
SETTLE_S = 60


@pytest.fixture
def cluster(tmp_path):
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=1, service_args={"partition_svc": [
        "--producer-id-expiration-ms", str(EXPIRATION_MS), "--producer-id-expiration-check-interval-ms", "200"]})
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)


@pytest.fixture
def raw(cluster):
    client = Raw(cluster)
    yield client
    client.close()


def known(raw: Raw, topic: str, producer_id: int) -> bool:
    return any(p.producer_id == producer_id for p in raw.producers(topic, 0).producers)


def test_an_idle_producer_is_forgotten_and_comes_back_as_a_new_one(raw):
    raw.create_topic("idle", 1)
    pid = raw.producer_id()
    assert raw.produce("idle", 0, batch(pid, 0, ["a", "b"])).error.code == 0
    assert known(raw, "idle", pid)

    wait_until(lambda: not known(raw, "idle", pid), SETTLE_S, "the idle producer expiring")

    gap = raw.produce("idle", 0, batch(pid, 2, ["c"]))
    assert ErrorCode.Name(gap.error.code) == "UNKNOWN_PRODUCER_ID", gap.error
    assert raw.produce("idle", 0, batch(pid, 0, ["c"])).error.code == 0  # a new producer's first batch
    assert [r.value for r in raw.read_all("idle", 0)] == [b"a", b"b", b"c"]


def test_the_sdk_producer_outlives_its_expiry_without_loss_or_duplicates(raw):
    raw.create_topic("sdk-idle", 1)
    bootstrap = ",".join(raw.bootstrap)
    with Producer(bootstrap) as producer:
        for i in range(3):
            producer.send("sdk-idle", f"before-{i}", partition=0)
        producer.flush(timeout_s=30)
        pid = producer.producer_id
        wait_until(lambda: not known(raw, "sdk-idle", pid), SETTLE_S, "the SDK producer's state expiring")
        for i in range(3):
            producer.send("sdk-idle", f"after-{i}", partition=0)
        producer.flush(timeout_s=30)
    assert [r.value.decode() for r in raw.read_all("sdk-idle", 0)] == [f"before-{i}" for i in range(3)] + [f"after-{i}" for i in range(3)]


def test_an_open_transaction_and_the_coordinators_log_writer_are_never_forgotten(raw):
    raw.create_topic("held", 1)
    raw.create_topic("witness", 1)
    bootstrap = ",".join(raw.bootstrap)
    with Producer(bootstrap, transactional_id="held-txn") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("held", "inside", partition=0)
        producer.flush(timeout_s=30)
        pid = producer.producer_id
        # A producer idle since after the transaction began: once it is gone, an expiry
        # pass ran with the transaction's producer idle past the window as well.
        witness = raw.producer_id()
        assert raw.produce("witness", 0, batch(witness, 0, ["w"])).error.code == 0
        wait_until(lambda: not known(raw, "witness", witness), SETTLE_S, "the witness producer expiring")

        assert known(raw, "held", pid), "a producer with a transaction open was forgotten"
        assert _log_writers(raw), "the coordinator's transaction-log writer was forgotten"
        producer.commit_transaction()
    wait_until(lambda: [r.value for r in _read_committed(raw, "held")] == [b"inside"], SETTLE_S, "the commit visible")


def _log_writers(raw: Raw) -> list:
    """Producers that wrote to some __transaction_state partition."""
    reply = raw.metadata(partition_pb2.MetadataRequest(topics=[TRANSACTION_STATE_TOPIC]))
    return [p for partition in reply.topics[0].partitions
            for p in raw.producers(TRANSACTION_STATE_TOPIC, partition.partition).producers if p.last_sequence >= 0]


def _read_committed(raw: Raw, topic: str):
    result = raw.fetch(topic, 0, 0, isolation=common_pb2.ISOLATION_LEVEL_READ_COMMITTED)
    return [r for b in result.batches for r in b.records]
