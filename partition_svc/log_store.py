"""The RocksDB store of one partition_svc instance (one database, rocksdict),
with the key layout of log_format.py.

Guarantees: writes go through :class:`GroupCommitWriter`, one WriteBatch at a
time in submission order, each synced to disk (its WAL fsynced, unless sync is
off) before its submitters are told; so the batch, the partition metadata and the producer
states of an append are durable together or not at all, in log order, and a
restart (even after kill -9) finds them consistent: there is no log tail to
replay to rebuild producer state.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator

from rocksdict import Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from partition_svc.log_format import (
    STORAGE_KEY,
    DamagedBatch,
    decode_header,
    group_offset_key,
    group_prefix,
    log_key,
    membership_prefix,
    meta_key,
    offset_and_metadata,
    offset_of_key,
    prove_encoded,
)
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError

log = logging.getLogger(__name__)

BLOB_BYTES_MIN = 4096
BLOB_GC_ON_RATIO = 0.25  # deleted share of the live blob bytes that turns blob GC on (and forces its compactions)
BLOB_GC_OFF_RATIO = 0.1  # and below which it goes off again
BLOB_GC_AGE_CUTOFF = 0.25  # while on: the oldest share of blob files whose live batches compaction moves


def blob_gc_wanted(garbage_ratio: float, on: bool) -> bool:
    """Whether blob GC should run: on from BLOB_GC_ON_RATIO, off below BLOB_GC_OFF_RATIO, as it was in between."""
    return garbage_ratio >= BLOB_GC_ON_RATIO or (on and garbage_ratio >= BLOB_GC_OFF_RATIO)


class LogStore:
    def __init__(self, path: str, *, sync: bool = True):
        os.makedirs(path, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Record batches go to blob files, out of the LSM tree: compaction, which
        # the small metadata and producer-state keys written with every append
        # would otherwise trigger across the whole log, never rewrites them
        # (bench/produce_fetch.py measured 1.4 GB of compaction per GB appended
        # without this).
        options.set_enable_blob_files(True)
        options.set_min_blob_size(BLOB_BYTES_MIN)
        # Blob GC copies the live batches of the oldest blob files into new ones
        # at every compaction, whether those files hold garbage or not: left on,
        # it rewrote 1.7 GB of live batches over 2 GB appended with nothing
        # deleted. A file whose batches are all deleted goes without it; GC is
        # turned on only while deleted batches are a real share of the live blob
        # bytes (tune_blob_gc), and then forces the compactions that reclaim them.
        options.set_enable_blob_gc(False)
        options.set_blob_gc_age_cutoff(BLOB_GC_AGE_CUTOFF)
        options.set_blob_gc_force_threshold(BLOB_GC_ON_RATIO)
        self.db = Rdict(path, options)
        self.blob_gc = False
        # The store is closed at shutdown while a thread may still read its
        # properties or tune it (a cancelled task's to_thread runs on): both
        # hold this lock, and do nothing once the store is closed.
        self._side_lock = threading.Lock()
        self._closed = False
        self.sync = sync
        self._write_options = WriteOptions()
        self._write_options.sync = False

    # RocksDB's own figures an operator watches: how much is stored, how much
    # compaction is behind, and whether writes are being slowed or stopped.
    PROPERTIES = {"sst_bytes": "rocksdb.total-sst-files-size", "blob_bytes": "rocksdb.total-blob-file-size",
                  "blob_garbage_bytes": "rocksdb.live-blob-file-garbage-size",
                  "memtable_bytes": "rocksdb.cur-size-all-mem-tables",
                  "block_cache_bytes": "rocksdb.block-cache-usage", "block_cache_capacity_bytes": "rocksdb.block-cache-capacity",
                  "table_readers_bytes": "rocksdb.estimate-table-readers-mem",
                  "pending_compaction_bytes": "rocksdb.estimate-pending-compaction-bytes",
                  "delayed_write_rate": "rocksdb.actual-delayed-write-rate", "write_stopped": "rocksdb.is-write-stopped"}

    def properties(self) -> dict[str, int]:
        with self._side_lock:
            if self._closed:
                return dict.fromkeys(self.PROPERTIES, 0)
            return {name: self.db.property_int_value(key) or 0 for name, key in self.PROPERTIES.items()}

    def blob_garbage_ratio(self) -> float:
        """The share of the live blob files' bytes that belongs to deleted batches."""
        live = self.db.property_int_value("rocksdb.live-blob-file-size") or 0
        garbage = self.db.property_int_value("rocksdb.live-blob-file-garbage-size") or 0
        return garbage / live if live else 0.0

    def tune_blob_gc(self) -> bool:
        """Turns blob GC on once deleted batches reach BLOB_GC_ON_RATIO of the
        live blob bytes, off again below BLOB_GC_OFF_RATIO (the gap keeps it
        from flapping); whether it is on. Blocking: call it off the event loop."""
        with self._side_lock:
            if self._closed:
                return self.blob_gc
            ratio = self.blob_garbage_ratio()
            wanted = blob_gc_wanted(ratio, self.blob_gc)
            if wanted != self.blob_gc:
                self.db.set_options({"enable_blob_garbage_collection": "true" if wanted else "false"})
                self.blob_gc = wanted
                log.info("blob garbage collection " + ("on" if wanted else "off"), extra=fields(garbage_ratio=round(ratio, 3)))
            return self.blob_gc

    def close(self) -> None:
        with self._side_lock:
            self._closed = True
            self.db.close()

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def items(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self.db.items(from_key=start or prefix):
            if not key.startswith(prefix):
                return
            yield key, value

    def batch_at_or_before(self, pkey: bytes, offset: int) -> tuple[int, bytes] | None:
        """The batch whose base offset is the greatest at or below ``offset``."""
        prefix = b"L" + pkey
        for key, value in self.db.items(from_key=log_key(pkey, offset), backwards=True):
            if key.startswith(prefix):
                return offset_of_key(key), value
            return None
        return None

    def batches(self, pkey: bytes, from_offset: int) -> Iterator[tuple[int, bytes]]:
        prefix = b"L" + pkey
        for key, value in self.items(prefix, log_key(pkey, from_offset)):
            yield offset_of_key(key), value

    def batches_holding(self, pkey: bytes, offset: int, end_offset: int = 2**63 - 1) -> Iterator[tuple[int, bytes]]:
        """The batches from the one holding ``offset`` (else from the first
        above it) up to, not including, the one based at ``end_offset``: what
        batch_at_or_before then batches() find, in one iterator that reads
        each value once. (A batch's value is read whenever the iterator stops
        on it, its header included: the two scans read the first batch twice,
        and the one past the end once, which for a follower's fetch of one or
        two batches doubled the reads.)

        The iterator skips RocksDB's checksums: the rocksdict wheel computes
        them in software, which took half of a streamed fetch's time. Each
        value is proven instead (:meth:`_proven`): a batch in the encoded
        format by its own CRC32C, computed in hardware; any other one (written
        as a message, or a marker) read again with RocksDB's checksums. What is
        damaged raises CORRUPT_MESSAGE, as a failed RocksDB checksum would."""
        prefix = b"L" + pkey
        bounds = ReadOptions()
        bounds.set_iterate_upper_bound(log_key(pkey, end_offset))
        bounds.set_verify_checksums(False)
        found = self.db.iter(bounds)
        target = log_key(pkey, offset)
        # A reader continuing where it left off asks for a batch's base offset: one forward seek finds it. Only
        # an offset inside a batch needs the batch before it (a backward seek, then the iterator turned forward).
        found.seek(target)
        if not (found.valid() and found.key() == target):
            found.seek_for_prev(target)
            key = found.key() if found.valid() else b""
            if key.startswith(prefix):
                value = self._proven(key, found.value())
                if decode_header(offset_of_key(key), value).last_offset >= offset:
                    yield offset_of_key(key), value
                found.next()
            else:
                found.seek(target)
        while found.valid():
            key = found.key()
            if not key.startswith(prefix):
                return
            yield offset_of_key(key), self._proven(key, found.value())
            found.next()

    def _proven(self, key: bytes, value: bytes) -> bytes:
        """``value`` of log key ``key``, read without RocksDB's checksums, once
        it holds together; else read again with them (RocksDB's corruption
        error, or a value that still does not hold, is CORRUPT_MESSAGE)."""
        base_offset = offset_of_key(key)
        damage = None
        stored = decode_header(base_offset, value)
        if stored.is_encoded:
            try:
                prove_encoded(stored, value)
                return value
            except DamagedBatch as exc:
                damage = exc
        try:
            checked = self.db.get(key)
        except Exception as exc:  # rocksdict raises a bare Exception("Corruption: ...")
            raise TxlogError(ErrorCode.Value("CORRUPT_MESSAGE"), f"the batch stored at offset {base_offset} is damaged: {exc}") from None
        if checked is None:  # deleted meanwhile (retention): what the iterator saw stands, unless it is damaged
            if damage is not None:
                raise TxlogError(ErrorCode.Value("CORRUPT_MESSAGE"), str(damage))
            return value
        stored = decode_header(base_offset, checked)
        if stored.is_encoded:
            try:
                prove_encoded(stored, checked)
            except DamagedBatch as exc:
                raise TxlogError(ErrorCode.Value("CORRUPT_MESSAGE"), str(exc)) from None
        return checked

    def partitions(self) -> Iterator[tuple[bytes, dict]]:
        """Every partition with metadata, as (pkey, metadata)."""
        for key, value in self.items(b"M"):
            yield key[1:], json.loads(value)

    def producers(self, pkey: bytes) -> Iterator[bytes]:
        for _, value in self.items(b"P" + pkey):
            yield value

    def leader_epochs(self, pkey: bytes) -> list[tuple[int, int]]:
        """The leader-epoch cache: (epoch, start offset) in epoch order."""
        prefix = b"E" + pkey
        return [(int.from_bytes(key[len(prefix):], "big"), int.from_bytes(value, "big")) for key, value in self.items(prefix)]

    def derived_keys(self, pkey: bytes, owns_group: Callable[[str], bool] | None = None) -> list[bytes]:
        """Every key derived from the partition's log: producer states, the
        aborted index, pending offsets and, for a __consumer_offsets partition
        (``owns_group`` says which groups it holds), the groups' committed offsets
        and membership records."""
        keys = [key for kind in (b"P", b"A", b"X") for key, _ in self.items(kind + pkey)]
        if owns_group is not None:
            keys += [key for kind in (b"G", b"C") for key, _ in self.items(kind)
                     if owns_group(key[1:key.index(b"\x00")].decode())]
        return keys

    def wipe_changes(self, pkey: bytes, owns_group: Callable[[str], bool] | None = None) -> list[tuple[bytes, None]]:
        """Deletes of every key of a partition: log, epochs, metadata and what
        derives from the log (also of one not loaded: a deleted topic's, found on disk)."""
        return [(key, None) for kind in (b"L", b"E", b"M") for key, _ in self.items(kind + pkey)] + \
            [(key, None) for key in self.derived_keys(pkey, owns_group)]

    def batch(self, pkey: bytes, base_offset: int) -> bytes | None:
        return self.get(log_key(pkey, base_offset))

    def storage_zxid(self) -> int | None:
        raw = self.get(STORAGE_KEY)
        return None if raw is None else json.loads(raw)["zxid"]

    def is_empty(self) -> bool:
        return next(iter(self.db.keys()), None) is None

    def mark_storage(self, zxid: int) -> None:
        self.write([(STORAGE_KEY, json.dumps({"zxid": zxid}).encode())])
        if not self.sync:
            self.db.flush_wal(True)

    def group_ids(self) -> set[str]:
        """The groups with committed offsets or membership records here (as leader or follower)."""
        found: set[str] = set()
        for kind in (b"G", b"C"):
            key = next(iter(self.db.keys(from_key=kind)), None)
            while key is not None and key.startswith(kind):
                group = key[1:key.index(b"\x00")]
                found.add(group.decode())
                key = next(iter(self.db.keys(from_key=kind + group + b"\x01")), None)  # past every key of this group
        return found

    def group_membership(self, group_id: str) -> dict[str, bytes]:
        """A group's membership records, by member id ("": the group's own)."""
        prefix = membership_prefix(group_id)
        return {key[len(prefix):].decode(): value for key, value in self.items(prefix)}

    def metadata(self, pkey: bytes) -> dict | None:
        raw = self.get(meta_key(pkey))
        return None if raw is None else json.loads(raw)

    def aborted_spans(self, pkey: bytes) -> dict[int, list[tuple[int, int]]]:
        """{producer id: [(first, last offset)]} of the partition's aborted
        transactions, each producer's in offset order."""
        spans: dict[int, list[tuple[int, int]]] = {}
        prefix = b"A" + pkey
        for key, value in self.items(prefix):
            span = json.loads(value)
            spans.setdefault(int.from_bytes(key[len(prefix):len(prefix) + 8], "big"), []).append((span["first"], span["last"]))
        return spans

    def pending_offsets(self, pkey: bytes) -> dict[int, dict[bytes, bytes]]:
        """{producer id: {G key: offset value}} committed in open transactions."""
        pending: dict[int, dict[bytes, bytes]] = {}
        prefix = b"X" + pkey
        for key, value in self.items(prefix):
            producer_id = int.from_bytes(key[len(prefix):len(prefix) + 8], "big")
            pending.setdefault(producer_id, {})[key[len(prefix) + 8:]] = value
        return pending

    def group_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None = None) -> list[tuple[str, int, int, str]]:
        """(topic, partition, offset, metadata) committed by the group: of the
        partitions named (-1 and "" where none is), or of every partition."""
        if partitions:
            found = []
            for topic, partition in partitions:
                raw = self.get(group_offset_key(group_id, topic, partition))
                committed = json.loads(raw) if raw else {"offset": -1, "metadata": ""}
                found.append((topic, partition, committed["offset"], committed["metadata"]))
            return found
        prefix = group_prefix(group_id)
        return [(key[len(prefix):-5].decode(), int.from_bytes(key[-4:], "big"), *offset_and_metadata(raw))
                for key, raw in self.items(prefix)]

    def write(self, changes: list[tuple[bytes, bytes | None]], on_readable: Callable[[], None] | None = None) -> None:
        """Applies changes in order, atomically; a value of None deletes the key.
        ``on_readable`` is called once they can be read, before they are synced."""
        batch = WriteBatch(raw_mode=True)
        for key, value in changes:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self.db.write(batch, self._write_options)
        if on_readable is not None:
            on_readable()
        if self.sync:
            # Durable before the caller hears back. Write-then-SyncWAL rather than
            # a synced write: rocksdict keeps the GIL through a synced write's
            # fsync, stalling the event loop, but releases it in flush_wal. The
            # difference (the data is readable before it is durable) is harmless
            # here: readers stop at the high watermark, which moves only after this.
            self.db.flush_wal(True)


class GroupCommitWriter:
    """Writes submitted changes in submission order, many submissions per
    WriteBatch and per sync, off the event loop. A submission may also ask to
    hear when its changes are readable (in RocksDB, not synced yet): a leader
    lets its followers fetch them while its own sync runs.

    A failed write leaves the in-memory state ahead of the disk, which no
    request may ever observe: the process stops at once (kill -9 semantics), and
    a restart recovers from what is durable.
    """

    def __init__(self, store: LogStore, *, changes_per_write_max: int = 10_000):
        self.store = store
        self.changes_per_write_max = changes_per_write_max
        self._pending: list[tuple[list, asyncio.Future, asyncio.Future | None]] = []  # (changes, durable, readable)
        self._flusher: asyncio.Task | None = None
        self.writes = 0

    def submit(self, changes: list[tuple[bytes, bytes | None]]) -> asyncio.Future:
        """Queues changes (value None: delete); the future completes when they are durable."""
        return self._queue(changes, None)

    def submit_readable(self, changes: list[tuple[bytes, bytes | None]]) -> tuple[asyncio.Future, asyncio.Future]:
        """As submit; also a future that completes once the changes are readable,
        always before the durable one."""
        readable = asyncio.get_running_loop().create_future()
        return readable, self._queue(changes, readable)

    def _queue(self, changes: list[tuple[bytes, bytes | None]], readable: asyncio.Future | None) -> asyncio.Future:
        durable = asyncio.get_running_loop().create_future()
        self._pending.append((changes, durable, readable))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return durable

    async def drain(self) -> None:
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            group, changes = [], []
            while self._pending and len(changes) < self.changes_per_write_max:
                item = self._pending.pop(0)
                group.append(item)
                changes.extend(item[0])
            readables = [readable for _, _, readable in group if readable is not None]
            # From the writing thread: queued on the loop ahead of to_thread's own return, so every readable
            # future completes before its durable one.
            on_readable = functools.partial(loop.call_soon_threadsafe, _complete, readables) if readables else None
            try:
                await asyncio.to_thread(self.store.write, changes, on_readable)
            except BaseException:
                log.critical("a RocksDB write failed; stopping the process so it restarts from what is durable", exc_info=True)
                logging.shutdown()
                os._exit(70)
            self.writes += 1
            _complete(readables)
            _complete([durable for _, durable, _ in group])


def _complete(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
