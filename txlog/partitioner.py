"""Which partition a record goes to.

* A record with an explicit partition goes there.
* A keyed record goes to ``murmur2(key) & 0x7fffffff % partition_count``
  (:func:`txlog.protocol.hashing.partition_for_key`, Kafka's default partitioner), so
  the same key always lands in the same partition, in txlog as in Kafka.
* Keyless records stick to one partition per topic (Kafka's sticky
  partitioner, KIP-480) and the partitioner switches to another one, chosen at
  random, when the sender sends a batch of the sticky partition. Records then
  fill whole batches instead of spreading thin batches over every partition.

The partitioner is called from user threads (``send``) and from the sender's
loop thread (``on_batch_sent``): it holds a lock.
"""

from __future__ import annotations

import random
import threading
from typing import Protocol

from txlog.protocol.hashing import partition_for_key


class Partitioner(Protocol):
    def partition(self, topic: str, key: bytes | None, partition_count: int) -> int:
        """The partition of a record without an explicit one, in [0, partition_count)."""

    def on_batch_sent(self, topic: str, partition: int, partition_count: int) -> None:
        """A batch of ``topic``/``partition`` was sent (the sticky partition moves on)."""


class DefaultPartitioner:
    """murmur2 for keyed records, sticky for keyless ones (see module docstring)."""

    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}
        self._lock = threading.Lock()

    def partition(self, topic: str, key: bytes | None, partition_count: int) -> int:
        if partition_count <= 1:  # one partition: no hash, no draw (either would answer 0)
            if partition_count == 1:
                return 0
            raise ValueError(f"partition_count must be positive, not {partition_count}")
        if key is not None:
            return partition_for_key(key, partition_count)
        with self._lock:
            current = self._sticky.get(topic)
            if current is None or current >= partition_count:
                current = self._rng.randrange(partition_count)
                self._sticky[topic] = current
            return current

    def on_batch_sent(self, topic: str, partition: int, partition_count: int) -> None:
        with self._lock:
            if self._sticky.get(topic) != partition:
                return
            if partition_count <= 1:
                return
            choice = self._rng.randrange(partition_count - 1)  # any partition but the current one
            self._sticky[topic] = choice if choice < partition else choice + 1
