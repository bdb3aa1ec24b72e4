"""partition_svc.log_store.LogStore's reads and writes over a sorted map in
memory, for the seeded simulation (test_partition_simulation.py), which
tests the partition's shell and cores, not RocksDB, and runs thousands of
times. What it holds survives a simulated crash, as written RocksDB data
does; every other method is LogStore's own, over these primitives. The
RocksDB store itself is tested with the partition by the hypothesis model
test (test_partition_model.py) and the integration tests."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from partition_svc.log_format import decode_header, log_key, offset_of_key
from partition_svc.log_store import LogStore


class MemoryStore(LogStore):
    def __init__(self) -> None:  # no database: LogStore's options and locks are RocksDB's
        self.data: dict[bytes, bytes] = {}
        self.keys: list[bytes] = []  # sorted
        self.sync = False

    def close(self) -> None:
        pass

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def items(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """A snapshot, as a RocksDB iterator reads one: writes during the iteration do not show."""
        first = bisect.bisect_left(self.keys, start or prefix)
        last = bisect.bisect_left(self.keys, prefix + b"\xff" * 16, first)
        return iter([(key, self.data[key]) for key in self.keys[first:last] if key.startswith(prefix)])

    def batch_at_or_before(self, pkey: bytes, offset: int) -> tuple[int, bytes] | None:
        index = bisect.bisect_right(self.keys, log_key(pkey, offset)) - 1
        if index >= 0 and self.keys[index].startswith(b"L" + pkey):
            return offset_of_key(self.keys[index]), self.data[self.keys[index]]
        return None

    def batches_holding(self, pkey: bytes, offset: int, end_offset: int = 2**63 - 1) -> Iterator[tuple[int, bytes]]:
        holding = self.batch_at_or_before(pkey, offset)
        found = []
        if holding is not None and decode_header(*holding).last_offset >= offset:
            found.append(holding)
        start = log_key(pkey, holding[0] + 1 if holding is not None else offset)
        for key, value in self.items(b"L" + pkey, max(start, log_key(pkey, offset))):
            if key >= log_key(pkey, end_offset):
                break
            found.append((offset_of_key(key), value))
        return iter(found)

    def write(self, changes: list[tuple[bytes, bytes | None]], on_readable: Callable[[], None] | None = None) -> None:
        for key, value in changes:
            if value is None:
                if self.data.pop(key, None) is not None:
                    del self.keys[bisect.bisect_left(self.keys, key)]
            else:
                if key not in self.data:
                    bisect.insort(self.keys, key)
                self.data[key] = value
        if on_readable is not None:
            on_readable()
