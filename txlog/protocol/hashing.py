"""Stable hashes: the same on every machine, process and Python version (never
Python's ``hash()``, which is salted per process).

``murmur2`` is Kafka's key hash (``org.apache.kafka.common.utils.Utils.murmur2``),
so a keyed record lands in the partition a Kafka client would choose:
``partition_for_key(key, n) = (murmur2(key) & 0x7fffffff) % n``. Transactional ids
and consumer groups are mapped to their internal-topic partition the same way.
"""

from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2, as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partition_count: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partition_count


def partition_for_id(identifier: str, partition_count: int) -> int:
    """The internal-topic partition of a transactional id or consumer group."""
    return partition_for_key(identifier.encode(), partition_count)
