"""The consumer against the in-memory fake of the partition servers: positions,
seeks, resets, and the limits of a poll."""

import re

import pytest
from fake_cluster import FakeCluster

from txlog import Consumer, NoOffsetForPartitionError, Producer
from txlog.membership import topics_matching
from txlog.structs import TopicPartition

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _filled(counts):
    fake = FakeCluster({"t": len(counts)})
    with Producer(fake.addresses[0], transport=fake, linger_ms=0) as producer:
        for partition, count in enumerate(counts):
            for i in range(count):
                producer.send("t", f"p{partition}-{i}".encode(), key=f"k{i}".encode(), partition=partition,
                              headers=[("h", b"v"), ("n", None)])
        producer.flush(timeout_s=10)
    return fake


def _consumer(fake, **kwargs):
    return Consumer(fake.addresses[0], transport=fake, fetch_max_wait_ms=10, retry_backoff_ms=5, **kwargs)


def _poll_all(consumer, expected):
    records = []
    for _ in range(100):
        records += consumer.poll(timeout_s=0.05)
        if len(records) >= expected:
            break
    return records


def test_poll_returns_each_partitions_records_in_offset_order_with_keys_and_headers():
    fake = _filled([30, 20])
    with _consumer(fake) as consumer:
        consumer.assign([("t", 0), ("t", 1)])
        records = _poll_all(consumer, 50)
        assert consumer.position(TP0) == 30 and consumer.position(TP1) == 20
    assert len(records) == 50
    for tp, count in ((TP0, 30), (TP1, 20)):
        mine = [r for r in records if (r.topic, r.partition) == tp]
        assert [r.offset for r in mine] == list(range(count))
        assert [r.value for r in mine] == [f"p{tp.partition}-{i}".encode() for i in range(count)]
    assert records[0].headers == [("h", b"v"), ("n", None)] and records[0].key is not None


def test_a_poll_returns_at_most_max_poll_records():
    fake = _filled([50])
    with _consumer(fake, max_poll_records=7) as consumer:
        consumer.assign([TP0])
        sizes = [len(consumer.poll(timeout_s=1)) for _ in range(8)]
    assert max(sizes) <= 7 and sum(sizes) == 50


def test_seek_moves_the_next_record_and_drops_what_was_fetched_before():
    fake = _filled([10])
    with _consumer(fake, max_poll_records=3) as consumer:
        consumer.assign([TP0])
        assert [r.offset for r in consumer.poll(timeout_s=1)] == [0, 1, 2]
        consumer.seek(TP0, 8)
        assert [r.offset for r in _poll_all(consumer, 2)] == [8, 9]
        consumer.seek_to_beginning()
        assert consumer.poll(timeout_s=1)[0].offset == 0
        consumer.seek_to_end(TP0)
        assert consumer.position(TP0) == 10


def test_auto_offset_reset_latest_starts_at_the_end():
    fake = _filled([5])
    with _consumer(fake, auto_offset_reset="latest") as consumer:
        consumer.assign([TP0])
        assert consumer.position(TP0) == 5
        assert consumer.poll(timeout_s=0.05) == []


def test_an_out_of_range_position_is_reset_by_auto_offset_reset():
    fake = _filled([5])
    with _consumer(fake, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP0])
        consumer.seek(TP0, 99)
        assert [r.offset for r in _poll_all(consumer, 5)] == [0, 1, 2, 3, 4]


def test_an_out_of_range_position_without_a_reset_policy_raises():
    fake = _filled([5])
    with _consumer(fake, auto_offset_reset="none") as consumer:
        consumer.assign([TP0])
        with pytest.raises(NoOffsetForPartitionError):
            consumer.position(TP0)
        consumer.seek(TP0, 99)
        with pytest.raises(NoOffsetForPartitionError, match="out of range"):
            _poll_all(consumer, 1)


def test_poll_without_an_assignment_and_commit_without_a_group_are_refused():
    fake = _filled([1])
    with _consumer(fake) as consumer:
        with pytest.raises(Exception, match="assign"):
            consumer.poll(timeout_s=0)
        consumer.assign([TP0])
        with pytest.raises(Exception, match="group_id"):
            consumer.commit()


def test_consumer_settings_outside_their_limits_are_refused():
    with pytest.raises(ValueError, match="isolation_level"):
        Consumer("a:1", isolation_level="dirty")
    with pytest.raises(ValueError, match="enable_auto_commit"):
        Consumer("a:1", enable_auto_commit=True)
    with pytest.raises(ValueError, match="bootstrap"):
        Consumer("")


def test_poll_returns_empty_at_its_timeout_while_no_server_answers():
    fake = _filled([5])
    with _consumer(fake) as consumer:
        consumer.assign([TP0])
        fake.unreachable.update(fake.addresses)
        calls_before = len(fake.calls)
        assert consumer.poll(timeout_s=0.3) == []  # the failures stay inside: poll answers "nothing yet"
        assert fake.calls[calls_before:], "poll returned without asking a server"
        fake.unreachable.clear()
        assert len(_poll_all(consumer, 5)) == 5


def test_a_consumer_follows_its_partitions_leader_when_the_old_one_stops_answering():
    """Found with issue 14's truncation test: a Fetch that failed against a dead
    leader marked metadata stale, but nothing read it again, so the consumer
    kept asking the dead address for good."""
    fake = _filled([5])
    consumer = _consumer(fake, isolation_level="read_uncommitted")
    consumer.assign([TP0])
    assert [r.offset for r in _poll_all(consumer, 5)] == [0, 1, 2, 3, 4]
    old = fake.leaders[TP0]
    fake.move_leader(TP0, next(a for a in fake.addresses if a != old))
    fake.unreachable.add(old)
    with Producer(fake.leaders[TP0], transport=fake, linger_ms=0) as producer:
        producer.send("t", b"after", partition=0).result(timeout=10)
    records = _poll_all(consumer, 1)
    assert [(r.offset, r.value) for r in records] == [(5, b"after")]
    consumer.close()


def test_a_pattern_takes_whole_names_and_never_internal_topics():
    names = ["orders", "orders.eu", "orders-eu.old", "__consumer_offsets", "__transaction_state", "xorders"]
    assert topics_matching(re.compile(r"orders.*"), names) == {"orders", "orders.eu", "orders-eu.old"}
    assert topics_matching(re.compile(r"orders\.[a-z]+"), names) == {"orders.eu"}
    assert topics_matching(re.compile(r".*"), names) == {"orders", "orders.eu", "orders-eu.old", "xorders"}
