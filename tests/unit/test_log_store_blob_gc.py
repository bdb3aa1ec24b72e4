"""Blob GC runs only while deleted batches are a real share of the blob files
(log_store.LogStore.tune_blob_gc): left on, it copied live batches at every
compaction with nothing deleted. Real RocksDB files in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import BottommostLevelCompaction, CompactOptions

from partition_svc.log_store import BLOB_BYTES_MIN, BLOB_GC_OFF_RATIO, BLOB_GC_ON_RATIO, LogStore, blob_gc_wanted
from txlog.two_phase import wait_until

VALUE = b"x" * (BLOB_BYTES_MIN * 4)  # big enough to live in a blob file


def key(i: int) -> bytes:
    return b"L" + i.to_bytes(8, "big")


def filled(path: Path, files: int = 4, per_file: int = 50) -> LogStore:
    store = LogStore(str(path), sync=False)
    for f in range(files):
        store.write([(key(i), VALUE) for i in range(f * per_file, (f + 1) * per_file)])
        store.db.flush()
    return store


def blob_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("*.blob")}


def compact_everything(store: LogStore) -> None:
    options = CompactOptions()
    options.set_bottommost_level_compaction(BottommostLevelCompaction.force())
    store.db.compact_range(None, None, options)


def test_with_nothing_deleted_compaction_copies_no_live_batch(tmp_path):
    store = filled(tmp_path)
    before = blob_files(tmp_path)
    assert len(before) == 4
    compact_everything(store)
    assert blob_files(tmp_path) == before and not store.tune_blob_gc()
    store.close()


def test_deleted_batches_turn_gc_on_until_they_are_reclaimed_and_the_rest_reads_back(tmp_path):
    store = filled(tmp_path)
    store.write([(key(i), None) for i in range(0, 200, 2)])  # half of every file
    store.db.flush()
    store.db.compact_range(None, None)  # the deletions meet their batches: the garbage is counted
    assert store.blob_garbage_ratio() >= BLOB_GC_ON_RATIO
    assert store.tune_blob_gc()  # on: RocksDB forces the compactions of the files holding garbage
    wait_until(lambda: store.blob_garbage_ratio() < BLOB_GC_OFF_RATIO, 30, "RocksDB's forced compactions reclaiming the garbage")
    assert not store.tune_blob_gc()
    assert [store.get(key(i)) for i in range(200)] == [None if i % 2 == 0 else VALUE for i in range(200)]
    store.close()


@pytest.mark.parametrize(("ratio", "on", "wanted"), [
    (0.0, False, False), (BLOB_GC_ON_RATIO - 0.01, False, False), (BLOB_GC_ON_RATIO, False, True), (0.9, False, True),
    (BLOB_GC_ON_RATIO - 0.01, True, True), (BLOB_GC_OFF_RATIO, True, True), (BLOB_GC_OFF_RATIO - 0.01, True, False),
    (0.0, True, False),
])
def test_gc_goes_on_at_the_high_mark_and_off_below_the_low_one(ratio, on, wanted):
    assert blob_gc_wanted(ratio, on) is wanted


def test_a_closed_store_answers_properties_and_tuning_without_touching_the_database(tmp_path):
    """At shutdown the store closes while a thread may still be tuning it (a cancelled retention pass's to_thread)."""
    store = filled(tmp_path, files=1)
    store.close()
    assert store.properties() == dict.fromkeys(LogStore.PROPERTIES, 0)
    assert store.tune_blob_gc() is False
