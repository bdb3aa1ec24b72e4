"""Benchmark: what RocksDB's background work costs per GB appended to a
partition's log store (partition_svc/log_store.py), with nothing deleted and
with retention deleting the oldest batches (issue 18).

One LogStore in a temporary folder, written as partition_svc writes it: each
write a 1 MB batch (random bytes: incompressible) under its log key beside the
small producer-state and metadata keys an append updates. Two phases:

* ``append``: ``--mb`` batches, nothing deleted;
* ``retention``: ``--mb`` more, each write also deleting the oldest batch (a
  retention pass's deletion), then ``tune_blob_gc`` as the retention pass calls
  it, until the deleted share is reclaimed or ``--settle-s`` is up.

Each policy on its own store, one after the other: ``tuned`` (what
partition_svc does: blob GC on only while deleted batches are a real share,
LogStore.tune_blob_gc) and ``always`` (blob GC on from the start, as before
that; the baseline). For each phase, from RocksDB's own event log (the store's LOG file): how many
compactions ran, the blob bytes they wrote (live batches copied into new blob
files: blob GC) and their CPU seconds, per GB appended; the store's garbage
ratio and blob bytes on disk at the end. The baseline is the same writes'
time and CPU in this process (the writes themselves), so the figures read as
"background work per unit of foreground work"; the target is no blob bytes
copied while nothing is deleted, and garbage reclaimed once deletions make it
worth it. Run it as ``python -m bench.log_store_compaction [--mb N]``;
prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from partition_svc.log_store import BLOB_GC_OFF_RATIO, BLOB_GC_ON_RATIO, LogStore

BATCH_BYTES = 1 << 20
BLOB_FILE_MB = 268.4  # RocksDB's default blob_file_size (256 MiB), which LogStore keeps
PKEY = b"t\x00\x00\x00\x00"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=2000, help="1 MB batches written per phase (default 2000)")
    parser.add_argument("--settle-s", type=float, default=30.0, help="how long the retention phase waits for reclaiming")
    args = parser.parse_args(argv)
    if args.mb < 10 or args.settle_s <= 0:
        parser.error("--mb must be at least 10 and --settle-s positive")
    return args


def compaction_events(path: str) -> list[dict]:
    with open(os.path.join(path, "LOG")) as log:
        return [json.loads(line.split("EVENT_LOG_v1 ", 1)[1]) for line in log
                if "EVENT_LOG_v1" in line and '"compaction_finished"' in line]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write(store: LogStore, offset: int, value: bytes, delete_offset: int | None = None) -> None:
    changes: list[tuple[bytes, bytes | None]] = [
        (b"L" + PKEY + offset.to_bytes(8, "big"), value),
        (b"P" + PKEY + (offset % 64).to_bytes(8, "big"), b"s" * 40),  # producer state
        (b"M" + PKEY, offset.to_bytes(8, "big")),  # partition metadata
    ]
    if delete_offset is not None:
        changes.append((b"L" + PKEY + delete_offset.to_bytes(8, "big"), None))
    store.write(changes)


def phase(store: LogStore, path: str, name: str, offsets: range, deleting: bool, settle_s: float, tuned: bool) -> dict:
    events_before = len(compaction_events(path))
    value = os.urandom(BATCH_BYTES)
    started, cpu_started = time.perf_counter(), cpu_s()
    for offset in offsets:
        write(store, offset, value, offset - len(offsets) if deleting else None)
    writes_s, writes_cpu_s = time.perf_counter() - started, cpu_s() - cpu_started
    store.db.flush()
    gc_turned_on = False
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        if store.db.property_int_value("rocksdb.compaction-pending") == 0 and \
                store.db.property_int_value("rocksdb.num-running-compactions") == 0:
            on = store.tune_blob_gc() if tuned else True
            gc_turned_on |= on
            if not (tuned and on) and (not deleting or store.blob_garbage_ratio() < BLOB_GC_OFF_RATIO):
                break
        time.sleep(0.1)
    events = compaction_events(path)[events_before:]
    gb = len(offsets) * BATCH_BYTES / 1e9
    return {
        "phase": name,
        "mb_appended": len(offsets),
        "writes_seconds": round(writes_s, 2),
        "process_cpu_seconds_per_gb_while_writing": round(writes_cpu_s / gb, 3),  # the writes and what ran beside them
        "compactions": len(events),
        "compaction_blob_bytes_written_per_gb": round(sum(e.get("total_blob_output_size", 0) for e in events) / gb),
        "compaction_cpu_seconds_per_gb": round(sum(e.get("compaction_time_cpu_micros", 0) for e in events) / 1e6 / gb, 3),
        "compaction_cpu_vs_process_cpu_while_writing": round(sum(e.get("compaction_time_cpu_micros", 0) for e in events) / 1e6 / writes_cpu_s, 3),
        "blob_gc_turned_on": gc_turned_on,
        "garbage_ratio_at_end": round(store.blob_garbage_ratio(), 3),
        "blob_bytes_on_disk_mb": round(store.properties()["blob_bytes"] / 1e6),
    }


def run(policy: str, args: argparse.Namespace) -> dict:
    tuned = policy == "tuned"
    with tempfile.TemporaryDirectory(prefix="txlog-bench-store-") as path:
        store = LogStore(path, sync=False)
        if not tuned:  # as the store was opened before the policy: GC on, no forced GC compactions (RocksDB's default)
            store.db.set_options({"enable_blob_garbage_collection": "true", "blob_garbage_collection_force_threshold": "1.0"})
        try:
            return {"append": phase(store, path, "append", range(0, args.mb), False, args.settle_s, tuned),
                    "retention": phase(store, path, "retention", range(args.mb, 2 * args.mb), True, args.settle_s, tuned)}
        finally:
            store.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    always = run("always", args)
    tuned = run("tuned", args)
    append, retention = tuned["append"], tuned["retention"]
    print(json.dumps({
        "benchmark": "log store compaction per GB appended: nothing deleted, then retention deleting the oldest batches",
        "parameters": {"batch_bytes": BATCH_BYTES, "mb_per_phase": args.mb, "sync": False},
        "machine": {"cpus": os.cpu_count()},
        "tuned": tuned,
        "always_baseline": always,
        "ratios": {
            f"{name}_compaction_cpu_tuned_vs_always": round(
                tuned[name]["compaction_cpu_seconds_per_gb"] / always[name]["compaction_cpu_seconds_per_gb"], 3)
            if always[name]["compaction_cpu_seconds_per_gb"] else None
            for name in ("append", "retention")
        },
        "targets": {
            "no_blob_bytes_copied_while_nothing_is_deleted": {"actual": append["compaction_blob_bytes_written_per_gb"],
                                                              "met": append["compaction_blob_bytes_written_per_gb"] == 0},
            # the live batches after retention are the last --mb written: what is on disk beyond them is garbage, counted
            # or not yet (the ratio only counts deletions compaction has met); a blob file goes only once all of it is
            # deleted, so one file's worth may stay besides the garbage GC tolerates
            "blob_mb_on_disk_after_retention": {
                "actual": retention["blob_bytes_on_disk_mb"], "live_mb": round(args.mb * BATCH_BYTES / 1e6),
                "bound": round(args.mb * BATCH_BYTES / 1e6 / (1 - BLOB_GC_ON_RATIO) + BLOB_FILE_MB),
                "met": retention["blob_bytes_on_disk_mb"] <= args.mb * BATCH_BYTES / 1e6 / (1 - BLOB_GC_ON_RATIO) + BLOB_FILE_MB},
        },
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
