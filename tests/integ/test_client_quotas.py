"""Client quotas through the real services (issue 36): set, described and
refused whole on bad input through the Admin client and the `txlog quotas`
command; a producer over its producer_byte_rate gets every record
acknowledged, its answers held (throttle_time_ms), while another client id
is not held; a fetch over consumer_byte_rate is answered, held, too; a client
whose calls' handlers take more than its request_percentage of the instance's
handler thread is held, another not.

How closely a quota holds a client to its rate is measured by a benchmark
(bench/quotas.py), not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import grpc
import pytest

from tests.conftest import STORAGE_ONLY, fresh_chroot, running
from tests.integ.raw import Raw
from tests.support.errors import failure_name
from txlog import Admin, Producer
from txlog.protocol import errors
from txlog.two_phase import wait_until
from txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc

RATE = 100_000  # bytes per second
VALUE = b"q" * 10_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, shared_zookeeper):
    yield from running(tmp_path_factory.mktemp("quotas"), fresh_chroot(shared_zookeeper), {**STORAGE_ONLY, "partition_svcs": 1})


def txlog(cluster, *args) -> str:
    result = subprocess.run([sys.executable, "-m", "txlog.cli", *args, "--bootstrap", cluster.state.bootstrap],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_quotas_are_set_described_and_a_bad_change_changes_nothing(cluster):
    with Admin(cluster.state.bootstrap) as admin:
        admin.alter_client_quotas({"client-id": "described"}, {"producer_byte_rate": 1048576})
        admin.alter_client_quotas({"user": None}, {"consumer_byte_rate": 5_000_000})
        quotas = admin.describe_client_quotas()
        assert {"entity": {"client-id": "described"}, "quotas": {"producer_byte_rate": 1048576.0}} in quotas
        assert {"entity": {"user": None}, "quotas": {"consumer_byte_rate": 5_000_000.0}} in quotas
        for entity, values, code in (({"client-id": "described"}, {"produce_rate": 5}, "INVALID_CONFIG"),
                                     ({"client-id": "described"}, {"producer_byte_rate": -1}, "INVALID_CONFIG"),
                                     ({"client-id": "described"}, {"producer_byte_rate": 0.5}, "INVALID_CONFIG"),
                                     ({"host": "x"}, {"producer_byte_rate": 5}, "INVALID_REQUEST"),
                                     ({}, {"producer_byte_rate": 5}, "INVALID_REQUEST")):
            assert failure_name(lambda e=entity, v=values: admin.alter_client_quotas(e, v)) == code
        assert admin.describe_client_quotas() == quotas, "a refused change changed nothing"
        admin.alter_client_quotas({"client-id": "described"}, {"producer_byte_rate": 7}, validate_only=True)
        assert admin.describe_client_quotas() == quotas, "validate_only changes nothing"
        admin.alter_client_quotas({"user": None}, {"consumer_byte_rate": None})
        assert {"entity": {"user": None}, "quotas": {"consumer_byte_rate": 5_000_000.0}} not in admin.describe_client_quotas()


def test_the_quotas_command_sets_and_describes_as_json(cluster):
    changed = json.loads(txlog(cluster, "quotas", "alter", "--client-id", "flood-cli", "--add", "producer_byte_rate=1048576"))
    assert changed == {"entity": {"client-id": "flood-cli"}, "quotas": {"producer_byte_rate": 1048576.0}, "dry_run": False}
    described = json.loads(txlog(cluster, "quotas", "describe"))
    assert {"entity": {"client-id": "flood-cli"}, "quotas": {"producer_byte_rate": 1048576.0}} in described
    json.loads(txlog(cluster, "quotas", "alter", "--client-id", "flood-cli", "--delete", "producer_byte_rate"))
    assert all(e["entity"] != {"client-id": "flood-cli"} for e in json.loads(txlog(cluster, "quotas", "describe")))


def produce_all(cluster, topic: str, client_id: str, count: int) -> dict:
    with Producer(cluster.state.bootstrap, client_id=client_id, linger_ms=0, batch_size_bytes=len(VALUE) * 3) as producer:
        for future in [producer.send(topic, value=VALUE, partition=0) for _ in range(count)]:
            future.result(timeout=120)
        return producer.metrics()


def test_a_producer_over_its_quota_is_held_back_not_failed_and_another_client_is_not(cluster):
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    raw = Raw(cluster)
    raw.create_topic(topic, 1)
    with Admin(cluster.state.bootstrap) as admin:
        admin.alter_client_quotas({"client-id": "flood"}, {"producer_byte_rate": RATE})
    figures: dict = {}

    def flood_held() -> bool:  # the instance applies the quota within moments of its change (a watch)
        figures.update(produce_all(cluster, topic, "flood", 20))
        return figures["throttled_requests"] > 0

    wait_until(flood_held, 60, "the flood producer held back")
    assert figures["record_errors"] == 0 and figures["produce_throttle_time_max_ms"] > 0
    calm = produce_all(cluster, topic, "calm", 20)
    assert calm["throttled_requests"] == 0 and calm["record_errors"] == 0
    assert sum(1 for r in raw.read_all(topic, 0) if r.value == VALUE) >= 40
    raw.close()


def test_a_fetch_over_the_consumer_quota_is_answered_and_held(cluster):
    topic = f"quota-fetch-{uuid.uuid4().hex[:8]}"
    raw = Raw(cluster)
    raw.create_topic(topic, 1)
    produce_all(cluster, topic, "writer", 30)
    with Admin(cluster.state.bootstrap) as admin:
        admin.alter_client_quotas({"client-id": "reader"}, {"consumer_byte_rate": RATE})
    address = raw.leaders(topic)[0]
    stub = partition_pb2_grpc.PartitionServiceStub(grpc.insecure_channel(address))
    request = partition_pb2.FetchRequest(max_bytes=1 << 20, partitions=[partition_pb2.FetchPartition(topic=topic, partition=0)])
    held = []

    def reader_held() -> bool:
        reply = stub.Fetch(request, timeout=60, metadata=(("txlog-client-id", "reader"),))
        assert reply.results[0].batches, "answered with the records"
        held.append(reply.throttle_time_ms)
        return reply.throttle_time_ms > 0

    wait_until(reader_held, 60, "the reader's fetches held back")
    unheld = stub.Fetch(request, timeout=60, metadata=(("txlog-client-id", "other-reader"),))
    assert unheld.throttle_time_ms == 0 and unheld.results[0].batches
    raw.close()


def test_a_client_over_its_request_percentage_is_held_by_its_handlers_time_and_another_is_not(cluster):
    """0.001 % of the handler thread is 10 µs a second: any Produce's handler takes longer, whatever its bytes."""
    topic = f"quota-time-{uuid.uuid4().hex[:8]}"
    raw = Raw(cluster)
    raw.create_topic(topic, 1)
    with Admin(cluster.state.bootstrap) as admin:
        admin.alter_client_quotas({"client-id": "busy"}, {"request_percentage": 0.001})
        assert {"entity": {"client-id": "busy"}, "quotas": {"request_percentage": 0.001}} in admin.describe_client_quotas()
    stub = raw.stub(raw.leaders(topic)[0])
    request = partition_pb2.ProduceRequest(acks=-1, batches=[partition_pb2.PartitionBatch(
        topic=topic, partition=0, batch=common_pb2.RecordBatch(records=[common_pb2.Record(value=b"t")]))])
    held = []

    def busy_held() -> bool:  # applied within moments of the change (a watch); a refused call is sent again
        try:
            reply = stub.Produce(request, timeout=60, metadata=(("txlog-client-id", "busy"),))
        except grpc.RpcError as exc:
            assert errors.from_rpc_error(exc).name == "LIMIT_EXCEEDED", exc
            return False
        assert reply.results[0].error.code == 0, reply
        held.append(reply.throttle_time_ms)
        return reply.throttle_time_ms > 0

    wait_until(busy_held, 60, "the busy client's answers held")
    other = stub.Produce(request, timeout=60, metadata=(("txlog-client-id", "idle"),))
    assert other.results[0].error.code == 0 and other.throttle_time_ms == 0
    with Admin(cluster.state.bootstrap) as admin:
        admin.alter_client_quotas({"client-id": "busy"}, {"request_percentage": None})
    raw.close()
