"""The partitioner: Kafka's murmur2 for keyed records, sticky for keyless ones."""

import random

import pytest

from txlog.partitioner import DefaultPartitioner
from txlog.protocol.hashing import murmur2, partition_for_key


@pytest.mark.parametrize(
    "data, expected",
    [
        # org.apache.kafka.common.utils.UtilsTest#testMurmur2
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka_known_vectors(data, expected):
    assert murmur2(data) == expected


def test_keyed_records_go_to_the_murmur2_partition_whatever_the_instance():
    first, second = DefaultPartitioner(random.Random(1)), DefaultPartitioner(random.Random(2))
    for i in range(200):
        key = f"user-{i}".encode()
        expected = (murmur2(key) & 0x7FFFFFFF) % 6
        assert first.partition("t", key, 6) == expected == second.partition("t", key, 6)
        assert expected == partition_for_key(key, 6)


def test_keyless_records_stick_to_one_partition_until_its_batch_is_sent():
    partitioner = DefaultPartitioner(random.Random(7))
    sticky = partitioner.partition("t", None, 6)
    assert all(partitioner.partition("t", None, 6) == sticky for _ in range(100))
    other = (sticky + 1) % 6
    partitioner.on_batch_sent("t", other, 6)  # another partition's batch: no switch
    assert partitioner.partition("t", None, 6) == sticky
    partitioner.on_batch_sent("t", sticky, 6)
    switched = partitioner.partition("t", None, 6)
    assert switched != sticky
    assert all(partitioner.partition("t", None, 6) == switched for _ in range(100))


def test_sticky_partition_is_kept_per_topic():
    partitioner = DefaultPartitioner(random.Random(3))
    a, b = partitioner.partition("a", None, 1000), partitioner.partition("b", None, 1000)
    partitioner.on_batch_sent("a", a, 1000)
    assert partitioner.partition("b", None, 1000) == b
    assert partitioner.partition("a", None, 1000) != a


def test_sticky_switching_visits_every_partition():
    partitioner = DefaultPartitioner(random.Random(11))
    seen = set()
    for _ in range(200):
        current = partitioner.partition("t", None, 4)
        seen.add(current)
        partitioner.on_batch_sent("t", current, 4)
    assert seen == {0, 1, 2, 3}


def test_single_partition_topic_stays_on_partition_zero():
    partitioner = DefaultPartitioner(random.Random(5))
    assert partitioner.partition("t", None, 1) == 0
    partitioner.on_batch_sent("t", 0, 1)
    assert partitioner.partition("t", None, 1) == 0


def test_sticky_choice_is_redrawn_when_the_partition_count_shrinks():
    partitioner = DefaultPartitioner(random.Random(2))
    while partitioner.partition("t", None, 10) < 5:
        partitioner.on_batch_sent("t", partitioner.partition("t", None, 10), 10)
    assert 0 <= partitioner.partition("t", None, 3) < 3


def test_partition_count_must_be_positive():
    with pytest.raises(ValueError, match="partition_count"):
        DefaultPartitioner().partition("t", b"k", 0)
