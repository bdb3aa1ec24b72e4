"""The client SDK against a real cluster: ZooKeeper, producer_id_svc and two
partition_svc processes started by LocalCluster (as `txlog cluster up` does).
Fault runs print their seed; rerun with it to replay the same drops."""

import random
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer, FaultInjection, Producer
from txlog.protocol.hashing import partition_for_key
from txlog.serde import RecordDeserializationError
from txlog.structs import TopicPartition


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("client") / "cluster")
    cluster.up(partition_svcs=2)
    yield cluster
    cluster.down(grace_s=5)


@pytest.fixture(scope="module")
def bootstrap(local_cluster):
    return local_cluster.state.bootstrap


def _create(bootstrap, name, partitions):
    with Admin(bootstrap) as admin:
        assert admin.create_topics([(name, partitions)]) == {name: partitions}


def _consume_all(bootstrap, topic, partitions, expected, **kwargs):
    records = []
    with Consumer(bootstrap, fetch_max_wait_ms=100, **kwargs) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 60
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(timeout_s=1)
        records += consumer.poll(timeout_s=0.2)  # nothing more should come
    return records


def test_produce_consume_round_trip(bootstrap):
    _create(bootstrap, "roundtrip", 3)
    with Producer(bootstrap) as producer:
        futures = [producer.send("roundtrip", f"value-{i}", key=f"key-{i}", headers=[("n", str(i))],
                                 timestamp_ms=1_700_000_000_000 + i) for i in range(300)]
        producer.flush(timeout_s=30)
        sent = [f.result(timeout=0) for f in futures]
    records = _consume_all(bootstrap, "roundtrip", 3, 300)
    assert len(records) == 300
    by_value = {r.value: r for r in records}
    for i, metadata in enumerate(sent):
        record = by_value[f"value-{i}".encode()]
        assert (record.partition, record.offset) == (metadata.partition, metadata.offset)
        assert record.key == f"key-{i}".encode() and record.headers == [("n", str(i).encode())]
        assert record.timestamp_ms == metadata.timestamp_ms == 1_700_000_000_000 + i


def test_keyed_records_land_by_key_on_six_partitions_over_two_instances(bootstrap):
    _create(bootstrap, "keyed", 6)
    with Admin(bootstrap) as admin:
        (topic,) = admin.describe_topics(["keyed"])
    assert len({p.leader_address for p in topic.partitions}) == 2
    keys = [f"customer-{i}".encode() for i in range(60)]
    with Producer(bootstrap) as producer:
        futures = [(key, producer.send("keyed", b"v", key=key)) for key in keys for _ in range(3)]
        producer.flush(timeout_s=30)
        for key, future in futures:
            assert future.result(timeout=0).partition == partition_for_key(key, 6)
    records = _consume_all(bootstrap, "keyed", 6, len(futures))
    assert len(records) == len(futures)
    assert {r.partition for r in records} == set(range(6))
    for record in records:
        assert record.partition == partition_for_key(record.key, 6)


@pytest.mark.parametrize("seed", [7, 2024])
def test_every_record_is_appended_exactly_once_in_order_under_dropped_answers(bootstrap, seed):
    print(f"seed={seed}")
    topic = f"exactly-once-{seed}"
    _create(bootstrap, topic, 4)
    faults = FaultInjection(drop_response_probability=0.25, drop_request_probability=0.05, rng=random.Random(seed))
    sent_by_partition = defaultdict(list)
    with Producer(bootstrap, fault_injection=faults, linger_ms=2, batch_size_bytes=2000,
                  retry_backoff_ms=5, retry_backoff_max_ms=50) as producer:
        futures = [(f"{i}".encode(), producer.send(topic, f"{i}", key=f"k{i % 17}")) for i in range(4000)]
        producer.flush(timeout_s=120)
        for value, future in futures:
            metadata = future.result(timeout=0)
            sent_by_partition[metadata.partition].append((value, metadata.offset))
        assert producer.stats.batches_resent > 0
    assert faults.responses_dropped > 0, "the test injected no fault"
    records = _consume_all(bootstrap, topic, 4, 4000)
    assert len(records) == 4000, "a record is missing or duplicated"
    read_by_partition = defaultdict(list)
    for record in records:
        read_by_partition[record.partition].append((record.value, record.offset))
    for partition, sent in sent_by_partition.items():
        read = read_by_partition[partition]
        assert [value for value, _ in read] == [value for value, _ in sent], f"partition {partition} out of order"
        assert [offset for _, offset in read] == list(range(len(read)))
        for (_, sent_offset), (_, read_offset) in zip(sent, read, strict=True):
            assert sent_offset in (read_offset, -1)


def test_consumer_group_commit_and_committed(bootstrap):
    _create(bootstrap, "grouped", 2)
    with Producer(bootstrap) as producer:
        for i in range(20):
            producer.send("grouped", f"{i}", partition=i % 2)
        producer.flush(timeout_s=30)
    tp0, tp1 = TopicPartition("grouped", 0), TopicPartition("grouped", 1)
    with Consumer(bootstrap, group_id="readers") as consumer:
        consumer.assign([tp0, tp1])
        assert consumer.committed(tp0) is None
        consumer.commit({tp0: 4})
        assert consumer.committed(tp0) == 4 and consumer.committed(tp1) is None
    with Consumer(bootstrap, group_id="readers", max_poll_records=100, fetch_max_wait_ms=100) as consumer:
        consumer.assign([tp0, tp1])
        assert consumer.position(tp0) == 4  # the committed offset
        assert consumer.position(tp1) == 0  # none committed: auto_offset_reset earliest
        records = []
        while len(records) < 16:
            records += consumer.poll(timeout_s=1)
        assert sorted(r.offset for r in records if r.partition == 0) == list(range(4, 10))
        consumer.commit()
        assert consumer.committed(tp0) == 10 and consumer.committed(tp1) == 10
    with Consumer(bootstrap, group_id="readers", auto_offset_reset="none") as consumer:
        consumer.assign([tp0])
        assert consumer.position(tp0) == 10


def test_admin_lists_offsets_and_describes_producers(bootstrap):
    _create(bootstrap, "admin-view", 1)
    tp = TopicPartition("admin-view", 0)
    with Producer(bootstrap) as producer:
        for i in range(5):
            producer.send("admin-view", f"{i}", timestamp_ms=1_000 * (i + 1))
        producer.flush(timeout_s=30)
        producer_id = producer.producer_id
    with Admin(bootstrap) as admin:
        offsets = admin.list_offsets({tp: "earliest", ("admin-view", 0): "latest"})
        assert offsets[tp].offset == 5
        assert admin.list_offsets({tp: "earliest"})[tp].offset == 0
        assert admin.list_offsets({tp: 3_000})[tp] == (2, 3_000)
        (state,) = admin.describe_producers([tp])[tp]
        assert (state.producer_id, state.producer_epoch, state.last_sequence) == (producer_id, 0, 4)
        assert "admin-view" in admin.list_topics()
        with pytest.raises(Exception) as caught:
            admin.describe_topics(["no-such-topic"])
        assert caught.value.name == "UNKNOWN_TOPIC_OR_PARTITION"
        with pytest.raises(Exception) as caught:
            admin.create_topics([("admin-view", 2)])
        assert caught.value.name == "TOPIC_ALREADY_EXISTS"


def test_producer_survives_a_partition_leader_restart_exactly_once(local_cluster, bootstrap):
    _create(bootstrap, "restart", 2)
    name = next(n for n, p in local_cluster.state.services.items() if p.kind == "partition_svc")
    with Producer(bootstrap, linger_ms=2, retry_backoff_ms=20, request_timeout_ms=5_000) as producer:
        futures = [producer.send("restart", f"{i}", partition=i % 2) for i in range(200)]
        producer.flush(timeout_s=30)
        local_cluster.kill(name)
        futures += [producer.send("restart", f"{i}", partition=i % 2) for i in range(200, 400)]
        time.sleep(0.5)
        local_cluster.start(name)
        producer.flush(timeout_s=60)
        for future in futures:
            future.result(timeout=0)
    records = _consume_all(bootstrap, "restart", 2, 400)
    assert len(records) == 400
    for partition in (0, 1):
        values = [int(r.value) for r in records if r.partition == partition]
        assert values == list(range(partition, 400, 2))


LEFT_OPEN = """
import sys
from txlog import Admin, Consumer, Producer
producer, consumer, admin = Producer(sys.argv[1], linger_ms=50), Consumer(sys.argv[1], group_id="left-open"), Admin(sys.argv[1])
for i in range(100):
    producer.send("left-open", value=b"v%d" % i)
consumer.subscribe(["left-open"])
"""


def test_clients_left_open_are_closed_quietly_at_exit_and_what_was_sent_is_delivered(bootstrap):
    _create(bootstrap, "left-open", 2)
    script = subprocess.run([sys.executable, "-c", LEFT_OPEN, bootstrap], capture_output=True, text=True, timeout=120)
    assert script.returncode == 0, script.stderr
    assert script.stderr == "", "no 'Task was destroyed but it is pending!', no traceback"
    values = [r.value for r in _consume_all(bootstrap, "left-open", 2, 100)]
    assert sorted(values) == sorted(b"v%d" % i for i in range(100))


def test_serializers_round_trip_json_and_a_record_that_does_not_read_is_reported_and_skipped_only_on_request(bootstrap):
    _create(bootstrap, "serde", 1)
    with Producer(bootstrap, key_serializer="str", value_serializer="json") as producer:
        producer.send("serde", value={"n": 1}, key="a")
        producer.send("serde", value={"n": 2}, key="b")
        producer.flush()
    with Producer(bootstrap) as raw:
        raw.send("serde", value=b"not json {")
        raw.flush()
    with Producer(bootstrap, value_serializer="json") as producer:
        producer.send("serde", value={"n": 3})
        producer.flush()
    with Consumer(bootstrap, key_deserializer="str", value_deserializer="json", fetch_max_wait_ms=100) as consumer:
        consumer.assign([("serde", 0)])
        consumer.seek_to_beginning()
        read = []
        with pytest.raises(RecordDeserializationError) as failed:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                read += consumer.poll(timeout_s=1)
        assert [(r.key, r.value) for r in read] == [("a", {"n": 1}), ("b", {"n": 2})], "the records before it"
        assert (failed.value.partition, failed.value.offset) == (TopicPartition("serde", 0), 2)
        assert "seek(('serde', 0), 3) to go on past it" in str(failed.value), "advice a caller can follow as written"
        assert consumer.position(("serde", 0)) == 2, "nothing skipped until the application says so"
        consumer.seek(("serde", 0), failed.value.offset + 1)
        rest = []
        deadline = time.monotonic() + 60
        while not rest and time.monotonic() < deadline:
            rest += consumer.poll(timeout_s=1)
        assert [(r.offset, r.key, r.value) for r in rest] == [(3, None, {"n": 3})]


def test_clients_report_what_they_did_in_metrics(bootstrap):
    _create(bootstrap, "counted", 2)
    with Producer(bootstrap, linger_ms=20) as producer:
        for i in range(40):
            producer.send("counted", value=b"v" * 10, key=b"k%d" % i)
        producer.flush()
        sent = producer.metrics()
    assert sent["records_sent"] == 40 and sent["record_errors"] == 0
    assert sent["batches_sent"] >= 2 and sent["requests_sent"] >= 1 and sent["request_latency_max_ms"] > 0
    assert sent["bytes_sent"] > 40 * 10 and sent["buffer_available_bytes"] == sent["buffer_total_bytes"]
    with Consumer(bootstrap, fetch_max_wait_ms=100, max_poll_records=15) as consumer:
        consumer.assign([("counted", p) for p in range(2)])
        consumer.seek_to_beginning()
        first = consumer.poll(timeout_s=10)
        deadline = time.monotonic() + 60
        while not first and time.monotonic() < deadline:
            first = consumer.poll(timeout_s=1)
        partly = consumer.metrics()
        assert partly["records_consumed"] == len(first) and 0 < len(first) <= 15
        assert partly["bytes_consumed"] == sum(len(r.key) + len(r.value) for r in first)
        assert partly["records_lag_sum"] <= 40 - len(first) and partly["fetch_requests"] >= 1
        records = list(first)
        while len(records) < 40 and time.monotonic() < deadline:
            records += consumer.poll(timeout_s=1)
        consumer.poll(timeout_s=0.3)  # one more fetch: the ends as of now
        done = consumer.metrics()
    assert done["records_consumed"] == 40 and done["records_lag_max"] == 0 and done["assigned_partitions"] == 2
