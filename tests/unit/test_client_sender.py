"""The producer's sender against an in-memory fake of the partition servers
(``tests/unit/fake_cluster.py: FakeCluster``, which applies the leader's sequence
rules): every record exactly once and in order through lost answers, lost
requests, reordered requests and leader moves; failures sorted as the error
table says. Faulty runs print their seed; rerun with it to replay."""

import random
import time

import pytest
from fake_cluster import FakeCluster

from txlog import DeliveryTimeoutError, FaultInjection, Producer
from txlog.errors import ClientClosedError, ClientTimeoutError, RecordTooLargeError
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition

E = ErrorCode.Value
FAST = {"retry_backoff_ms": 1, "retry_backoff_max_ms": 5, "linger_ms": 1}


def _producer(fake, **kwargs):
    options = {**FAST, **kwargs}
    return Producer(fake.addresses[0], transport=fake, **options)


def _assert_exactly_once_in_order(fake, futures, values_by_partition):
    for tp, sent in values_by_partition.items():
        assert fake.values(tp) == sent, f"{tp}: log differs from send() order"
    for future, (tp, value) in futures:
        metadata = future.result(timeout=0)
        assert (metadata.topic, metadata.partition) == tp
        if metadata.offset >= 0:
            assert fake.partitions[tp].records[metadata.offset].value == value


def _send_all(producer, topic, count, key_mod=None):
    futures, by_partition = [], {}
    for i in range(count):
        value = f"v{i}".encode()
        key = None if key_mod is None else f"k{i % key_mod}".encode()
        future = producer.send(topic, value, key=key)
        futures.append((future, value))
    producer.flush(timeout_s=60)
    resolved = []
    for future, value in futures:
        metadata = future.result(timeout=0)
        tp = TopicPartition(metadata.topic, metadata.partition)
        by_partition.setdefault(tp, []).append(value)
        resolved.append((future, (tp, value)))
    return resolved, by_partition


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_every_record_is_appended_once_in_order_when_answers_and_requests_are_lost(seed):
    print(f"seed={seed}")
    faults = FaultInjection(drop_request_probability=0.1, drop_response_probability=0.3, rng=random.Random(seed))
    fake = FakeCluster({"t": 3}, fault_injection=faults, delay_ms_max=2, rng=random.Random(seed))
    with _producer(fake, batch_size_bytes=300) as producer:
        futures, by_partition = _send_all(producer, "t", 1500, key_mod=11)
        assert producer.stats.batches_resent > 0
    assert faults.responses_dropped > 0 and faults.requests_dropped > 0
    _assert_exactly_once_in_order(fake, futures, by_partition)
    assert sum(len(v) for v in by_partition.values()) == 1500
    assert any(error == "OUT_OF_ORDER_SEQUENCE" for _, _, error in fake.produce_results)


def test_a_retry_older_than_the_duplicate_cache_completes_with_offset_minus_one():
    # Call 0 carries sequence 0 and is appended, but its answer is lost (seen 100 ms
    # later); meanwhile the next batch lands. With a one-batch cache the re-send of
    # sequence 0 is answered DUPLICATE_SEQUENCE: in the log, offsets unknown.
    fake = FakeCluster({"t": 1}, duplicate_cache_size=1)
    fake.lost_produce_answers[0] = 100
    with _producer(fake, batch_records_max=1, linger_ms=30, retry_backoff_ms=50, retry_backoff_max_ms=50) as producer:
        first = producer.send("t", b"first")
        later = [producer.send("t", f"later{i}".encode()) for i in range(3)]
        producer.flush(timeout_s=10)
    assert first.result(timeout=0).offset == -1
    assert [f.result(timeout=0).offset for f in later] == [1, 2, 3]
    assert fake.values(TopicPartition("t", 0)) == [b"first", b"later0", b"later1", b"later2"]
    assert any(error == "DUPLICATE_SEQUENCE" for _, _, error in fake.produce_results)


def test_a_duplicate_within_the_cache_completes_with_its_original_offset():
    fake = FakeCluster({"t": 1})
    fake.lost_produce_answers[0] = 0
    with _producer(fake, linger_ms=0) as producer:
        future = producer.send("t", b"once")
        producer.flush(timeout_s=10)
        assert producer.stats.batches_resent == 1
    assert future.result(timeout=0).offset == 0
    assert fake.values(TopicPartition("t", 0)) == [b"once"]


def test_records_follow_a_leader_move_after_a_metadata_refresh():
    fake = FakeCluster({"t": 2})
    tp = TopicPartition("t", 0)
    with _producer(fake) as producer:
        producer.send("t", b"before", partition=0).result(timeout=10)
        metadata_calls = fake.count("Metadata")
        fake.move_leader(tp, fake.addresses[1])
        moved = producer.send("t", b"after", partition=0).result(timeout=10)
        assert fake.count("Metadata") > metadata_calls
    assert moved.offset == 1
    assert fake.values(tp) == [b"before", b"after"]
    assert any(e == "NOT_LEADER" for _, _, e in fake.produce_results)
    produce_addresses = [address for address, rpc in fake.calls if rpc == "Produce"]
    assert produce_addresses[0] == fake.addresses[0] and produce_addresses[-1] == fake.addresses[1]


def test_a_rejected_batch_fails_alone_and_the_partition_recovers_with_a_new_producer_id():
    fake = FakeCluster({"t": 1})
    tp = TopicPartition("t", 0)
    with _producer(fake, linger_ms=0, batch_size_bytes=60) as producer:
        producer.send("t", b"a").result(timeout=10)
        fake.fail_produce(1, lambda _: E("RECORD_TOO_LARGE"))  # the next Produce call
        bad = producer.send("t", b"b")
        with pytest.raises(Exception) as caught:
            bad.result(timeout=10)
        assert caught.value.name == "RECORD_TOO_LARGE" and not caught.value.retriable
        after = [producer.send("t", f"c{i}".encode()) for i in range(5)]
        producer.flush(timeout_s=10)
        assert producer.stats.producer_id_resets == 1
    assert [f.result(timeout=0).offset for f in after] == [1, 2, 3, 4, 5]
    assert fake.values(tp) == [b"a", b"c0", b"c1", b"c2", b"c3", b"c4"]
    # the reset (KIP-360) takes a new producer id, as partition_svc answers every InitProducerId without a transactional id
    entry = fake.partitions[tp].producers
    assert len(entry) == 2 and [e.producer_epoch for e in entry.values()] == [0, 0]


def test_held_batches_are_resent_in_order_after_the_epoch_bump():
    # Batch 0 is rejected outright; batches 1 and 2, in flight with it, are
    # rejected OUT_OF_ORDER behind the gap: they are held, then re-sequenced.
    fake = FakeCluster({"t": 1}, delay_ms_max=0)
    tp = TopicPartition("t", 0)
    fake.fail_produce(0, lambda _: E("INVALID_RECORD"))
    with _producer(fake, linger_ms=30, batch_records_max=1, max_in_flight=5) as producer:
        futures = [producer.send("t", f"r{i}".encode()) for i in range(3)]
        producer.flush(timeout_s=10)
    assert futures[0].exception(timeout=0).name == "INVALID_RECORD"
    assert [f.result(timeout=0).offset for f in futures[1:]] == [0, 1]
    assert fake.values(tp) == [b"r1", b"r2"]


def test_non_idempotent_producer_sends_no_producer_id():
    fake = FakeCluster({"t": 1})
    with _producer(fake, enable_idempotence=False, acks=1) as producer:
        producer.send("t", b"x").result(timeout=10)
    assert fake.count("InitProducerId") == 0
    assert fake.partitions[TopicPartition("t", 0)].producers == {}


def test_acks_zero_reports_offset_minus_one():
    fake = FakeCluster({"t": 1})
    with _producer(fake, enable_idempotence=False, acks=0) as producer:
        assert producer.send("t", b"x").result(timeout=10).offset == -1
    assert fake.values(TopicPartition("t", 0)) == [b"x"]


def test_batches_for_the_same_leader_share_one_request():
    fake = FakeCluster({"t": 4}, addresses=("only:1",))
    with _producer(fake, linger_ms=50) as producer:
        futures = [producer.send("t", b"x", partition=p) for p in range(4)]
        producer.flush(timeout_s=10)
        assert producer.stats.requests_sent == 1 and producer.stats.batches_sent == 4
    assert all(f.result(timeout=0).offset == 0 for f in futures)


def test_records_without_a_reachable_leader_fail_with_a_delivery_timeout():
    fake = FakeCluster({"t": 1}, addresses=("a:1", "b:2"))
    with _producer(fake, request_timeout_ms=50, delivery_timeout_ms=200) as producer:
        producer.partitions_for("t")
        fake.unreachable.add("a:1")
        future = producer.send("t", b"x", partition=0)
        error = future.exception(timeout=10)
    assert isinstance(error, DeliveryTimeoutError) and error.name == "REQUEST_TIMED_OUT"
    assert error.maybe_appended  # requests went out; their answers never came
    assert fake.values(TopicPartition("t", 0)) == []


def test_a_topic_that_never_appears_fails_the_future_after_max_block_ms():
    fake = FakeCluster({"t": 1})
    with _producer(fake, max_block_ms=100) as producer:
        started = time.monotonic()
        error = producer.send("missing", b"x").exception(timeout=60)
    assert error.name == "UNKNOWN_TOPIC_OR_PARTITION" and "'missing' is not in the cluster metadata after 100 ms" in error.message
    assert fake.count("Metadata") >= 2  # it asked again while it waited
    assert time.monotonic() - started >= 0.09  # it did wait (a slower machine only waits longer)


def test_a_record_over_the_topics_max_record_bytes_fails_before_sending():
    fake = FakeCluster({"t": 1}, topic_configs={"t": {"max.record.bytes": "10"}})
    with _producer(fake) as producer:
        error = producer.send("t", b"x" * 11).exception(timeout=10)
        assert isinstance(error, RecordTooLargeError)
        assert producer.send("t", b"x" * 10).result(timeout=10).offset == 0
    assert fake.values(TopicPartition("t", 0)) == [b"x" * 10]


def test_flush_times_out_and_close_fails_what_is_left():
    fake = FakeCluster({"t": 1})
    producer = _producer(fake, request_timeout_ms=50, delivery_timeout_ms=60_000)
    producer.partitions_for("t")
    fake.unreachable.update(fake.addresses)
    future = producer.send("t", b"x")
    with pytest.raises(ClientTimeoutError):
        producer.flush(timeout_s=0.2)
    producer.close(timeout_s=0.2)
    assert isinstance(future.exception(timeout=0), ClientClosedError)
    with pytest.raises(ClientClosedError):
        producer.send("t", b"y")


def test_explicit_partition_out_of_range_fails_the_future():
    fake = FakeCluster({"t": 2})
    with _producer(fake) as producer:
        error = producer.send("t", b"x", partition=2).exception(timeout=10)
    assert error.name == "UNKNOWN_TOPIC_OR_PARTITION"


@pytest.mark.parametrize("kwargs, message", [
    ({"acks": 1}, "acks='all'"),
    ({"max_in_flight": 6}, "max_in_flight"),
    ({"linger_ms": -1}, "linger_ms"),
    ({"delivery_timeout_ms": 100, "request_timeout_ms": 200}, "delivery_timeout_ms"),
    ({"acks": "most"}, "acks"),
])
def test_settings_outside_their_limits_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Producer("a:1", transport=FakeCluster({}), **kwargs)
