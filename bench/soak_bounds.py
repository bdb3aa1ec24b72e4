"""What fills to a limit by design in a soak, and that limit.

The limits hold for the services (a worker, the SDK's side, runs its own
threads). A soak's slope cannot tell a cache filling towards its capacity from a leak:
both rise for the whole of an hour's run. These series have a limit the code
or its configuration sets, and the soak checks every fitted sample against
it (``bounded`` when every one is within it; ``over_bound`` when one is not,
which a leak would soon be):

- ``threads``: the services start their threads at start-up, but for the
  event loop's default executor (``asyncio.to_thread``: RocksDB writes and
  reads, ZooKeeper reads), whose threads start on demand up to
  ``min(32, cpus + 4)`` and then stay. Limit: the incarnation's first sample
  plus that pool.
- ``rocksdb_block_cache_mb``: RocksDB's block cache, up to its capacity (the
  ``block_cache_capacity_bytes`` property each partition_svc exposes).
- ``metrics_series``: a series is born for each new label set (an error
  code, a method or a status seen for the first time after a fault) and
  lives as long as the process. They are bounded when every label is one of
  the enumerations the code names (method, status, error code, state...) or
  names one of the workload's topics and groups: then no value comes from an
  unbounded domain (a producer id, a client address).
- ZooKeeper's ``disk_mb``: its transaction log grows until ``snapCount``
  transactions (100,000 by default) roll it over with a snapshot, and its
  purge keeps ``autopurge.snapRetainCount`` of those; a log is preallocated
  64 MiB at a time. Limit: (retained + 1) logs of 64 MiB and snapshots.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from bench.measure import MB
from partition_svc.log_store import LogStore

# Label keys whose values come from enumerations in the code (otel's resource
# and scope labels carry one value per process).
ENUMERATED_LABELS = frozenset({
    "service_instance_id", "service_name", "telemetry_sdk_language", "telemetry_sdk_name", "telemetry_sdk_version",
    "otel_scope_name", "otel_scope_schema_url", "otel_scope_version",
    "le", "rpc_system", "rpc_service", "rpc_method", "rpc_grpc_status_code", "error_code",
    "state", "outcome", "property", "partition",
})
# Label keys that name the workload's objects: bounded by what the run creates.
WORKLOAD_LABELS = {"topic": "topics", "group": "groups"}
ZOOKEEPER_LOG_PREALLOCATED_MB = 64 * 1024 * 1024 / MB
ZOOKEEPER_RETAINED_DEFAULT = 3  # autopurge.snapRetainCount's default


def block_cache_capacity_mb() -> float:
    """The block cache capacity a LogStore opens with (for samples taken before
    partition_svc exposed it: the same code, so the same capacity)."""
    with tempfile.TemporaryDirectory(prefix="txlog-soak-bounds-") as folder:
        store = LogStore(folder)
        try:
            return round(store.properties()["block_cache_capacity_bytes"] / MB, 2)
        finally:
            store.close()


def zookeeper_retained(config: Path) -> int:
    try:
        lines = config.read_text().splitlines()
    except OSError:
        return ZOOKEEPER_RETAINED_DEFAULT
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    return int(values.get("autopurge.snapRetainCount", ZOOKEEPER_RETAINED_DEFAULT))


def design_bounds(cluster_dir: Path) -> dict:
    """The limits that do not change within a run, from the code and the cluster's configuration
    (executor_threads: concurrent.futures.ThreadPoolExecutor's default size, asyncio's default executor's)."""
    return {"executor_threads": min(32, (os.cpu_count() or 1) + 4),
            "block_cache_capacity_mb": block_cache_capacity_mb(),
            "zookeeper_retained": zookeeper_retained(cluster_dir / "zookeeper" / "conf" / "zoo.cfg")}


def labels_within_domains(row: dict, workload: dict[str, list[str]]) -> bool | None:
    """Whether a sample's /metrics labels all come from bounded domains; None when the sample has no labels."""
    keys = row.get("metrics_label_keys")
    if keys is None:
        return None
    if not set(keys) <= ENUMERATED_LABELS | set(WORKLOAD_LABELS):
        return False
    return all(set(row.get(f"metrics_{plural}", ())) <= set(workload.get(plural, ())) for plural in WORKLOAD_LABELS.values())


def process_caps(key: str, rows: list[dict], pids: list, bounds: dict, workload: dict) -> list[float | None] | None:
    """Each sample's limit for a process series ``key`` (None: that sample's not known); None: no limit by design."""
    if key == "threads":
        first: dict = {}
        for pid, row in zip(pids, rows, strict=True):
            if pid and row.get("threads") is not None:
                first.setdefault(pid, row["threads"])
        return [first[pid] + bounds["executor_threads"] if pid in first else None for pid in pids]
    if key == "rocksdb_block_cache_mb":
        return [row.get("rocksdb_block_cache_capacity_mb", bounds["block_cache_capacity_mb"]) for row in rows]
    if key == "metrics_series":
        within = [labels_within_domains(row, workload) for row in rows]
        return [None if w is None else math.inf if w else -math.inf for w in within]
    return None


def zookeeper_disk_caps(data_kb: list[float | None], bounds: dict) -> list[float | None]:
    retained = bounds["zookeeper_retained"] + 1
    return [None if kb is None else round(retained * (ZOOKEEPER_LOG_PREALLOCATED_MB + kb * 1000 / MB), 2) for kb in data_kb]


def bound_verdict(values: list[float], caps: list[float | None]) -> dict | None:
    """Whether fitted values stayed within their limits: None when a limit is unknown."""
    if not values or any(cap is None for cap in caps):
        return None
    over = sum(1 for value, cap in zip(values, caps, strict=True) if value > cap)
    finite = [cap for cap in caps if math.isfinite(cap)]
    return {"bound": max(finite) if finite else "label domains", "max_value": max(values), "over_bound": over}
