"""Benchmark: long life. A cluster under steady transactional load with
occasional faults for ``--minutes``; does anything grow without bound?

The cluster and the load are the chaos run's (services/tooling/chaos/run.py):
a LocalCluster of ZooKeeper, one producer_id_svc, three partition_svc (every
partition on all three, min.insync.replicas 2) and two coordinator_svc, with
the chaos run's service flags; its topics, created with ``retention.ms`` of
``--retention-s`` so that the stored log is bounded by design (the internal
topics, __transaction_state and __consumer_offsets, are compacted); and its
worker processes (``Workers``: three transactional producers committing or
aborting transactions of one to six records, two members of a
consume-transform-produce group with their offsets in their transactions, a
read_committed and a read_uncommitted poller), with client connection cuts at
``--cut-probability``, and no silent owner (each of its transactions takes a
new transactional id: state that grows by design). The chaos run's
``Nemesis`` injects one fault every ``--fault-interval-s`` on average, from
``--faults`` (default: kill_leader, pause_coordinator, partition_zookeeper,
kill_coordinator: processes restarted or stalled for seconds, running the
rest of the time).

Every ``--sample-s`` (and once at the start), for each process of the
cluster (cluster.state.services, followed across restarts: a restarted
process has a new pid) and for each worker process (the SDK's side): VmRSS
and RssAnon, open file descriptors (/proc/PID/fd), threads (/proc/PID/task),
CPU share since the last sample, the process's age, and for a service the
series its /metrics endpoint exposes (labels that accumulate show there);
per partition_svc its data directory's size (RocksDB's files) and RocksDB's
own sst, blob and memtable bytes (/metrics); ZooKeeper's ``mntr`` counters
(znodes, approximate data size, ephemerals, watches), its RSS and its data
directory's allocated size; the transactions the workers committed,
aborted or left indefinite since the last sample (from their histories); and
the CPUs the machine kept busy, this run's processes and the others' (on a
shared machine a neighbour slows the load down: ``committed_per_run_cpu_s``,
transactions per CPU second of the run's processes, shows whether the run
itself got slower).

Each series is then fitted after a warm-up (the first ``--warmup-fraction``
of the samples, at least 2): the least-squares slope per hour, and the
relative growth per hour against the warm-up mean. A service process
restarted by a fault starts low again, so its series are fitted within each
incarnation (one pid: each incarnation's samples centred on their own means,
one common slope), leaving out the samples taken less than ``--fresh-s``
after the process started (``fresh``; a new partition_svc refills its
memtable for minutes). A partition_svc's memory is a sawtooth by design:
RocksDB fills a 64 MB memtable, flushes it and starts another, so beside
its RSS and anonymous memory comes ``anon_less_memtable_mb`` (anonymous
memory less RocksDB's own count of its memtables), the memory a leak would
show in, and ``anon_less_rocksdb_mb``, less RocksDB's block cache (bounded
by its capacity, 32 MiB as built here, and by the SST files, whose blocks alone
it holds: it fills as reads touch older blocks) and table readers too. What a
leak would be made of shows beside them: ``malloc_in_use_mb`` and
``malloc_free_mb`` (the C allocator's bytes, native code's), and
``python_blocks_k`` (thousands of Python objects' memory blocks),
``producer_ids`` (the producer ids a partition_svc's partitions remember: they
grow with every new producer until ``--producer-id-expiration-ms`` after its
last append, a day by default, and so does the memory that holds them),
``aborted_transactions`` (the aborted-index entries of the partitions it leads,
which retention and compaction trim; it moves with ``partitions_led``, as the
instance's CPU does, when faults move leadership: both are fitted on time and
``partitions_led`` together, so that their slope is the drift left once what
follows leadership is taken out, ``per_covariate_unit`` what one more partition
led adds, and ``uncontrolled`` the fit on time alone), and
``native_less_rocksdb_mb`` (the allocator's bytes in use less RocksDB's
memtables, block cache and table readers: without the freed memtables the
allocator keeps for the next one, which anonymous memory carries as a
sawtooth of up to a memtable's size). Criterion: a series is ``flat`` when its relative growth is within
+-10% an hour (growth of 10%/h doubles a process in ten hours: a leak that
would stop a service within days; smaller slopes are within what the
allocator and the workload's fluctuations produce in a short run), or, for a
count (fds, threads, /metrics series, znodes...), when the fitted change over
the run is at most one (a connection or a thread more, once, is a step, not
a trend). Otherwise it ``grows`` (or ``shrinks``) when the slope is at least
3 standard errors from 0, and is ``unclear`` when it is not (a sawtooth's or
the noise's chance slope). A series that grows over the fitted span ``grows``
only if it grows over the second half of the span too (by the same rule);
otherwise it ``settles`` (a warm-up longer than the one left out, or a level
that rose once and stays: bounded as far as the run shows). ``not_flat``
lists every series that is not flat with its verdict. A series that fills
to a limit the design sets (bench/soak_bounds.py: threads, the block cache,
/metrics series, ZooKeeper's disk) and is not flat is ``bounded`` when every
fitted sample is within that limit; ``over_bound`` counts those past it.
``targets``: no series over its limit, no series
of a txlog service grows, nor of ZooKeeper, nor of the workers (the SDK), and
the throughput stays flat. ZooKeeper is a JVM: its RSS rises until it has
touched the heap it committed (-Xmx512m), so its heap, committed, used and
old generation (``jstat -gc``), is sampled beside it.

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.soak --minutes N [--sample-s S] [--fault-interval-s S] [--dir D]``
(``--minutes 60 --sample-s 60`` for the record; ``--dir`` keeps the cluster's
data, logs, the workers' histories and the raw samples, ``soak-samples.json``,
there, else a temporary folder is removed). ``--from-samples D/soak-samples.json
[--warmup-fraction F] [--fresh-s S]`` reports a finished run again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.measure import CLOCK_TICKS, MB, cpu_seconds, machine_cpu_seconds, progress
from bench.produce_fetch import memory_status
from bench.soak_bounds import WORKLOAD_LABELS, bound_verdict, design_bounds, process_caps, zookeeper_disk_caps
from services.tooling.chaos import run as chaos
from services.tooling.chaos.faults import FAULT_KINDS, Nemesis
from services.tooling.chaos.history import HISTORY_DIR
from services.tooling.chaos.proxy import ZookeeperRoutes
from services.tooling.cluster import LocalCluster, pid_alive, zookeeper_counters
from txlog import Admin
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

DEFAULT_FAULTS = ("kill_leader", "pause_coordinator", "partition_zookeeper", "kill_coordinator")
GROWTH_PER_HOUR_MAX = 0.10  # flat: within +-10% of the warm-up mean an hour
SIGNIFICANT_T = 3.0  # grows: above the bound and the slope >= 3 standard errors
ZOOKEEPER_COUNTERS = {"znodes": "zk_znode_count", "data_kb": "zk_approximate_data_size",
                      "ephemerals": "zk_ephemerals_count", "watches": "zk_watch_count",
                      "connections": "zk_num_alive_connections", "outstanding": "zk_outstanding_requests"}
ROCKSDB_PROPERTIES = ("sst_bytes", "blob_bytes", "memtable_bytes", "block_cache_bytes", "block_cache_capacity_bytes",
                      "table_readers_bytes")
JVM_HEAP = {"heap_committed_mb": ("S0C", "S1C", "EC", "OC"), "heap_used_mb": ("S0U", "S1U", "EU", "OU"), "old_used_mb": ("OU",)}
COUNT_STEP = 1  # integer series (fds, threads, znodes...): a fitted change of one unit is a step, not a trend
OUTCOMES = ("committed", "aborted", "indefinite")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SAMPLES_FILE = "soak-samples.json"  # the raw samples, in --dir: --from-samples reports them again


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the load runs (default: %(default)s)")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (default: %(default)s)")
    parser.add_argument("--fault-interval-s", type=float, default=60.0,
                        help="mean seconds between faults, 0 for none (default: %(default)s)")
    parser.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                        help=f"fault kinds, comma-separated (default: %(default)s; known: {', '.join(FAULT_KINDS)})")
    parser.add_argument("--dir", help="where the cluster, its logs and the workers' histories go (kept); "
                                      "default: a temporary folder, removed")
    parser.add_argument("--warmup-fraction", type=float, default=0.2,
                        help="the share of the samples left out of the fits (at least 2 samples; default: %(default)s)")
    parser.add_argument("--fresh-s", type=float, default=300.0, help="a process's samples younger than this are "
                        "left out of its fits (default: %(default)s)")
    parser.add_argument("--retention-s", type=float, default=120.0, help="retention.ms of the workload's topics "
                        "(default: %(default)s)")
    parser.add_argument("--cut-probability", type=float, default=0.01, help="the workers' client connection cuts "
                        "per call (default: %(default)s)")
    parser.add_argument("--producer-id-expiration-ms", type=int, help="partition_svc's --producer-id-expiration-ms "
                        "(default: the service's, a day; shorter shows whether what grows with producers levels off once "
                        "they expire), checked every tenth of it")
    parser.add_argument("--delete-retention-ms", type=int, help="partition_svc's --log-cleaner-delete-retention-ms "
                        "(default: the service's, a day): how long a compacted topic (__consumer_offsets) keeps the "
                        "markers of transactions none of whose batches is left; shorter shows them level off")
    parser.add_argument("--seed", type=int, help="the nemesis's and the workers' seed (default: random)")
    parser.add_argument("--from-samples", metavar="FILE", help="no run: the report of a run's DIR/soak-samples.json "
                        "again, with this --warmup-fraction and --fresh-s")
    args = parser.parse_args(argv)
    args.faults = tuple(kind for kind in args.faults.split(",") if kind)
    unknown = sorted(set(args.faults) - set(FAULT_KINDS))
    if unknown or (args.fault_interval_s > 0 and not args.faults):
        parser.error(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    if args.minutes <= 0 or args.sample_s <= 0 or not 0 <= args.warmup_fraction < 1 or args.retention_s <= 0:
        parser.error("--minutes, --sample-s and --retention-s must be > 0, --warmup-fraction in [0, 1)")
    if args.producer_id_expiration_ms is not None and args.producer_id_expiration_ms < 1000:
        parser.error("--producer-id-expiration-ms must be at least 1000")
    if args.delete_retention_ms is not None and args.delete_retention_ms < 0:
        parser.error("--delete-retention-ms must be at least 0")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    return args


# --- one sample ----------------------------------------------------------------------------


def tree_bytes(folder: Path, allocated: bool = False) -> int:
    """The bytes of every file under ``folder``: their sizes, or (``allocated``)
    the blocks they take (ZooKeeper preallocates its logs as sparse files)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            stat = path.lstat()
        except OSError:  # deleted meanwhile (a RocksDB compaction)
            continue
        if path.is_file():
            total += stat.st_blocks * 512 if allocated else stat.st_size
    return total


def process_age_s(pid: int) -> float:
    """Seconds since the process started (/proc/PID/stat's starttime against /proc/uptime)."""
    with open(f"/proc/{pid}/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19]) / CLOCK_TICKS
    with open("/proc/uptime") as uptime:
        return float(uptime.read().split()[0]) - started


def process_figures(pid: int) -> dict | None:
    """What one process holds now; None when it is gone (killed by a fault, not started yet)."""
    if not pid or not pid_alive(pid):
        return None
    try:
        memory = memory_status(pid)
        figures = {"pid": pid, "age_s": round(process_age_s(pid), 1), "fds": len(os.listdir(f"/proc/{pid}/fd")),
                   "threads": len(os.listdir(f"/proc/{pid}/task")), "cpu_s": cpu_seconds(pid)}
    except OSError:
        return None
    if memory["VmRSS"] is None:
        return None
    return {**figures, "rss_mb": round(memory["VmRSS"] / MB, 2), "anon_mb": round((memory["RssAnon"] or 0) / MB, 2)}


def metrics_figures(address: str) -> dict:
    """The series a service's /metrics exposes, and RocksDB's figures (a partition_svc's)."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            lines = [line for line in response.read().decode().splitlines() if line and not line.startswith("#")]
    except OSError:
        return {}
    found: dict = {"metrics_series": len(lines)}
    label_values: dict[str, set[str]] = {}
    for line in lines:
        _, brace, rest = line.partition("{")
        for key, value in LABEL.findall(rest.rpartition("}")[0]) if brace else ():
            label_values.setdefault(key, set()).add(value)
        if line.startswith("txlog_rocksdb{"):
            labels, _, value = line.rpartition(" ")
            for name in ROCKSDB_PROPERTIES:
                if f'property="{name}"' in labels:
                    found[f"rocksdb_{name[:-6]}_mb"] = round(found.get(f"rocksdb_{name[:-6]}_mb", 0) + float(value) / MB, 2)
        elif line.startswith("txlog_process_malloc_bytes{"):
            labels, _, value = line.rpartition(" ")
            state = labels.partition('state="')[2].partition('"')[0]
            found[f"malloc_{state}_mb"] = round(float(value) / MB, 2)
        elif line.startswith("txlog_python_allocated_blocks"):
            found["python_blocks_k"] = round(float(line.rpartition(" ")[2]) / 1000, 1)
        elif line.startswith("txlog_producer_ids"):
            found["producer_ids"] = int(float(line.rpartition(" ")[2]))
        elif line.startswith("txlog_partitions_led"):  # what an instance's load and leader-side sums move with
            found["partitions_led"] = int(float(line.rpartition(" ")[2]))
        elif line.startswith("txlog_partition_aborted_transactions{"):
            found["aborted_transactions"] = found.get("aborted_transactions", 0) + int(float(line.rpartition(" ")[2]))
    # what makes the series (soak_bounds.labels_within_domains): every label key, and the workload's names among the values
    found["metrics_label_keys"] = sorted(label_values)
    found |= {f"metrics_{plural}": sorted(label_values.get(key, ())) for key, plural in WORKLOAD_LABELS.items()}
    return found


def jvm_heap(pid: int) -> dict:
    """A JVM's heap (``jstat -gc``, KB): committed, used, and used by the old
    generation (what survives collections: a leak shows there, while the RSS
    of a JVM rises until it has touched the heap it committed); {} without jstat."""
    jstat = shutil.which("jstat")
    if jstat is None:
        return {}
    try:
        lines = subprocess.run([jstat, "-gc", str(pid)], capture_output=True, text=True, timeout=30).stdout.split("\n")
        columns = dict(zip(lines[0].split(), (float(v) for v in lines[1].split()), strict=True))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}
    figures = {name: round(sum(columns.get(c, 0.0) for c in parts) * 1024 / MB, 2) for name, parts in JVM_HEAP.items()}
    return figures | {"young_gcs": int(columns.get("YGC", 0)), "full_gcs": int(columns.get("FGC", 0))}


class Outcomes:
    """The transactions the workers ended since the last call, by outcome, read
    from the new lines of their history files."""

    def __init__(self, directory: Path):
        self.folder = directory / HISTORY_DIR
        self.offsets: dict[Path, int] = {}

    def since_last(self) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for path in sorted(self.folder.glob("*.jsonl")):
            with open(path, "rb") as history:
                history.seek(self.offsets.get(path, 0))
                chunk = history.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]  # a line being written waits for the next sample
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                if line.startswith(b'{"type":"end"'):
                    outcome = json.loads(line).get("outcome")
                    counts[outcome] = counts.get(outcome, 0) + 1
        return counts


class Sampler:
    """Takes the samples: one dict each, at ``t_s`` seconds into the load."""

    def __init__(self, cluster: LocalCluster, workers: chaos.Workers, directory: Path):
        self.cluster, self.workers = cluster, workers
        self.outcomes = Outcomes(directory)
        self.samples: list[dict] = []
        self.started, self.started_wall = time.monotonic(), time.time()
        self.cpu_before = (machine_cpu_seconds(), cpu_seconds(os.getpid()))

    def processes(self) -> dict[str, dict]:
        """Each process's figures, the CPU share since its last sample (same pid only)."""
        previous = self.samples[-1] if self.samples else {"t_s": 0.0, "processes": {}}
        now = time.monotonic() - self.started
        named = {name: (info.pid, info.metrics_address) for name, info in self.cluster.state.services.items()}
        named |= {f"worker-{name}": (process.pid, "") for name, process in self.workers.processes.items()}
        found = {}
        for name, (pid, metrics_address) in named.items():
            figures = process_figures(pid)
            if figures is None:
                found[name] = {"pid": pid, "down": True}
                continue
            before = previous["processes"].get(name, {})
            figures["restarted"] = bool(before) and before.get("pid") != pid
            if before.get("pid") == pid and before.get("cpu_s") is not None and figures["cpu_s"] is not None:
                figures["cpu"] = round((figures["cpu_s"] - before["cpu_s"]) / max(now - previous["t_s"], 1e-3), 3)
            if metrics_address:
                figures |= metrics_figures(metrics_address)
                if "rocksdb_memtable_mb" in figures:  # the memory RocksDB fills to write_buffer_size and flushes, left out
                    figures["anon_less_memtable_mb"] = round(figures["anon_mb"] - figures["rocksdb_memtable_mb"], 2)
            elif name == "zookeeper":
                figures |= jvm_heap(pid)
            found[name] = figures
        for name, info in self.cluster.state.services.items():
            if info.kind == "partition_svc":
                found[name]["data_dir_mb"] = round(tree_bytes(Path(self.cluster.dir) / name) / MB, 2)
        return found

    def zookeeper(self) -> dict:
        figures = {"disk_mb": round(tree_bytes(Path(self.cluster.dir) / "zookeeper" / "data", allocated=True) / MB, 2)}
        try:
            counters = zookeeper_counters(self.cluster.state.zookeeper, timeout_s=5)
        except OSError:
            return figures
        return figures | {name: counters.get(key) for name, key in ZOOKEEPER_COUNTERS.items()}

    def machine(self, processes: dict[str, dict], seconds: float) -> dict:
        """CPUs busy since the last sample: the machine's, this run's (its processes
        and this one, which holds the ZooKeeper proxies), the others' (a neighbour on
        a shared machine: the throughput falls with them) and stolen."""
        (machine_before, own_before), now = self.cpu_before, (machine_cpu_seconds(), cpu_seconds(os.getpid()))
        self.cpu_before = now
        if None in (machine_before, now[0], own_before, now[1]) or not self.samples:
            return {}
        run = sum(p.get("cpu", 0.0) for p in processes.values()) + (now[1] - own_before) / seconds
        busy = (now[0][0] - machine_before[0]) / seconds
        return {"busy_cpus": round(busy, 3), "run_cpus": round(run, 3), "others_cpus": round(max(busy - run, 0.0), 3),
                "stolen_cpus": round((now[0][1] - machine_before[1]) / seconds, 3)}

    def take(self) -> dict:
        t_s = time.monotonic() - self.started
        processes = self.processes()
        seconds = t_s - (self.samples[-1]["t_s"] if self.samples else 0.0)
        ended = self.outcomes.since_last()
        machine = self.machine(processes, seconds)
        transactions = {**ended, "committed_per_minute": round(ended["committed"] * 60 / seconds, 1) if self.samples else None,
                        "committed_per_run_cpu_s": round(ended["committed"] / (machine["run_cpus"] * seconds), 2)
                        if machine.get("run_cpus") else None}
        sample = {"t_s": round(t_s, 1), "processes": processes, "zookeeper": self.zookeeper(),
                  "transactions": transactions, "machine": machine}
        self.samples.append(sample)
        return sample


def progress_line(sample: dict) -> str:
    processes = sample["processes"]
    services = " ".join(f"{name.replace('_svc', '')}={p.get('rss_mb', 'down')}MB/{p.get('fds', '-')}fd/{p.get('threads', '-')}t"
                        for name, p in processes.items() if not name.startswith("worker-"))
    zookeeper = sample["zookeeper"]
    return (f"t={sample['t_s']:.0f}s committed/min={sample['transactions']['committed_per_minute']} "
            f"others' cpus={sample['machine'].get('others_cpus')} {services} "
            f"zk: {zookeeper.get('znodes')} znodes, {zookeeper.get('watches')} watches, {zookeeper['disk_mb']} MB on disk")


# --- the fits ------------------------------------------------------------------------------


def within_slope(points: list[tuple[float, float, int]], covariate: list[float] | None = None) -> dict | None:
    """One least-squares slope shared by groups (t in hours, value, group):
    each group's points centred on their own means, so that a restarted
    process's lower start does not pass for a trend; None with too few points.
    With ``covariate`` (one value per point, centred the same way), the slope
    is the time's coefficient of a fit on both: the drift left once what moves
    with the covariate is taken out (``covariate_coefficient``, per unit)."""
    groups: dict[int, list[tuple[float, float, float]]] = {}
    for index, (t, value, group) in enumerate(points):
        groups.setdefault(group, []).append((t, value, covariate[index] if covariate else 0.0))
    centred = []
    for members in groups.values():
        means = [sum(member[i] for member in members) / len(members) for i in range(3)]
        centred += [tuple(member[i] - means[i] for i in range(3)) for member in members]
    s_tt = sum(dt * dt for dt, _, _ in centred)
    s_cc = sum(dc * dc for _, _, dc in centred)
    s_tc = sum(dt * dc for dt, _, dc in centred)
    s_tv = sum(dt * dv for dt, dv, _ in centred)
    s_cv = sum(dc * dv for _, dv, dc in centred)
    controlled = covariate is not None and s_cc > 0 and s_tt * s_cc - s_tc * s_tc > 1e-12 * s_tt * s_cc
    freedom = len(centred) - len(groups) - (2 if controlled else 1)
    if s_tt <= 0 or freedom < 1:
        return None
    if controlled:
        determinant = s_tt * s_cc - s_tc * s_tc
        slope, coefficient = (s_tv * s_cc - s_cv * s_tc) / determinant, (s_cv * s_tt - s_tv * s_tc) / determinant
        slope_spread = determinant / s_cc  # the time's spread left once the covariate is taken out
    else:
        slope, coefficient, slope_spread = s_tv / s_tt, 0.0, s_tt
    residual = sum((dv - slope * dt - coefficient * dc) ** 2 for dt, dv, dc in centred) / freedom
    error = math.sqrt(residual / slope_spread)
    t_value = slope / error if error > 0 else (math.inf if slope else 0.0)
    fit = {"slope": slope, "t": t_value, "points": len(centred), "incarnations": len(groups)}
    return fit | {"covariate_coefficient": coefficient} if controlled else fit


def judged(points: list[tuple[float, float, int]], mean: float | None, step: float,
           covariate: list[float] | None = None) -> dict | None:
    """The fit of ``points`` (within_slope, with ``covariate`` if given) against the warm-up
    ``mean``: slope and growth per hour, the change over the fitted span, and the verdict."""
    fit = within_slope(points, covariate)
    if fit is None:
        return None
    growth = fit["slope"] / mean if mean else None
    change = fit["slope"] * (max(p[0] for p in points) - min(p[0] for p in points))
    beyond = abs(change) > step and (abs(growth) > GROWTH_PER_HOUR_MAX if growth is not None else fit["slope"] != 0)
    significant = abs(fit["t"]) >= SIGNIFICANT_T
    return {"slope_per_hour": round(fit["slope"], 4), "growth_per_hour": None if growth is None else round(growth, 4),
            "fitted_change": round(change, 3), "slope_t": round(fit["t"], 2) if math.isfinite(fit["t"]) else None,
            "fitted_samples": fit["points"], "incarnations": fit["incarnations"],
            **({"per_covariate_unit": round(fit["covariate_coefficient"], 4)} if "covariate_coefficient" in fit else {}),
            "verdict": "flat" if not beyond else ("unclear" if not significant else "grows" if fit["slope"] > 0 else "shrinks")}


def fitted(values: list, times_h: list[float], warmup: int, groups: list[int] | None = None,
           left_out: list[bool] | None = None, step: float = 0.0, caps: list[float | None] | None = None,
           covariate: list[float | None] | None = None, covariate_name: str | None = None) -> dict:
    """A series' samples, and after the warm-up its slope per hour, its growth
    per hour against the warm-up mean, the change the slope makes over the
    fitted span, and the verdict (module docstring): ``flat``, ``grows`` (over
    the fitted span and over its second half), ``settles`` (grows over the
    span, but its second half does not: a warm-up longer than the one left
    out, or a level that rose and stays), ``shrinks``, or ``unclear``
    (beyond the bound, but not 3 standard errors from 0). A fitted change of
    at most ``step`` (one fd, thread or znode more, once) is flat. With
    ``caps`` (each sample's limit by design, bench.soak_bounds), a series
    that is not flat is ``bounded`` when every fitted sample is within its
    limit; ``over_bound`` counts those that are not. With ``covariate`` (a
    series the value moves with by design, ``covariate_name``), the slope is
    the drift left once that is taken out (within_slope); the samples
    without it are left out, and ``uncontrolled`` is the judgement without it."""
    groups = groups or [0] * len(values)
    left_out = left_out or [False] * len(values)
    caps = caps or [None] * len(values)
    controls = covariate or [0.0] * len(values)
    base = [v for v in values[:warmup] if v is not None]
    mean = sum(base) / len(base) if base else None
    kept = [(t, v, g, cap, c) for t, v, g, out, cap, c in zip(times_h[warmup:], values[warmup:], groups[warmup:], left_out[warmup:],
                                                             caps[warmup:], controls[warmup:], strict=True)
            if v is not None and c is not None and not out]
    points = [(t, v, g) for t, v, g, *_ in kept]
    against = [c for *_, c in kept] if covariate else None
    whole = judged(points, mean, step, against)
    if whole is None:
        return {"values": values, "fitted_samples": len(points), "verdict": "too few samples", "flat": None, "grows": None}
    middle = (points[0][0] + points[-1][0]) / 2
    later = [i for i, p in enumerate(points) if p[0] >= middle]
    second_half = judged([points[i] for i in later], mean, step, [against[i] for i in later] if against else None)
    if whole["verdict"] == "grows" and (second_half is None or second_half["verdict"] != "grows"):
        whole["verdict"] = "settles"  # it grew, but does not go on growing in the second half
    within = bound_verdict([v for _, v, _, cap, _ in kept], [cap for _, _, _, cap, _ in kept])
    if within is not None:
        whole |= within
        if whole["verdict"] != "flat" and not within["over_bound"]:
            whole["verdict"] = "bounded"  # it fills towards a limit the design sets, and stayed within it
    if against:  # the same judgement on time alone (every sample, with or without the covariate)
        alone = fitted(values, times_h, warmup, groups, left_out, step, caps)
        whole |= {"controlled_for": covariate_name, "uncontrolled": {k: v for k, v in alone.items() if k != "values"}}
    return {"values": values, "warmup_mean": None if mean is None else round(mean, 3), **whole,
            "second_half": second_half, "flat": whole["verdict"] == "flat", "grows": whole["verdict"] == "grows"}


PROCESS_SERIES = ("rss_mb", "anon_mb", "anon_less_memtable_mb", "anon_less_rocksdb_mb", "fds", "threads", "cpu", "metrics_series", "data_dir_mb", "rocksdb_sst_mb",
                  "rocksdb_blob_mb", "rocksdb_memtable_mb", "rocksdb_block_cache_mb", "rocksdb_table_readers_mb",
                  "malloc_in_use_mb", "malloc_free_mb", "native_less_rocksdb_mb", "anon_less_rocksdb_and_free_mb", "python_blocks_k",
                  "producer_ids", "aborted_transactions", "partitions_led", *JVM_HEAP)
COUNT_SERIES = {"fds", "threads", "metrics_series", "producer_ids", "aborted_transactions", "partitions_led",
                *ZOOKEEPER_COUNTERS}


# A partition_svc's leader does the appends, markers and reads of what it leads and keeps its aborted
# index: these follow its partitions_led when faults move leadership, so their drift is fitted with it.
MOVES_WITH_LEADERSHIP = ("cpu", "aborted_transactions")
ROCKSDB_HELD = ("rocksdb_memtable_mb", "rocksdb_block_cache_mb", "rocksdb_table_readers_mb")  # by design, bounded


def with_derived(row: dict) -> dict:
    """The row with what is derived at report time (so a run's samples can be reported again):
    ``anon_less_rocksdb_mb``, anonymous memory less what RocksDB holds by design, and
    ``native_less_rocksdb_mb``, the C allocator's bytes in use less the same: native memory a leak would show
    in, without the sawtooth of the freed memtables the allocator keeps for the next one (which anonymous
    memory carries); and ``anon_less_rocksdb_and_free_mb``, anonymous memory less RocksDB's holdings and that
    free heap (kept up to the trim threshold, services.runtime.malloc), so pymalloc's arenas, stacks and
    whatever else is anonymous but not the C allocator's are in it too."""
    if any(row.get(part) is None for part in ROCKSDB_HELD):
        return row
    held = sum(row[part] for part in ROCKSDB_HELD)
    derived = {f"{whole}_less_rocksdb_mb": round(row[source] - held, 2)
               for whole, source in (("anon", "anon_mb"), ("native", "malloc_in_use_mb")) if row.get(source) is not None}
    if row.get("anon_mb") is not None and row.get("malloc_free_mb") is not None:
        derived["anon_less_rocksdb_and_free_mb"] = round(row["anon_mb"] - held - row["malloc_free_mb"], 2)
    return {**row, **derived}


def process_report(samples: list[dict], name: str, times_h: list[float], warmup: int, fresh_s: float,
                   bounds: dict, workload: dict) -> dict:
    """One process's series, fitted within each incarnation, its samples younger
    than ``fresh_s`` left out (but for its data directory, which a restart keeps);
    the series with a limit by design judged against it too (bench.soak_bounds)."""
    rows = [with_derived(s["processes"].get(name, {"down": True})) for s in samples]
    pids = [row.get("pid") for row in rows]
    fresh = [row.get("age_s", 0.0) < fresh_s for row in rows]
    report: dict = {"pids": pids, "age_s": [row.get("age_s") for row in rows], "fresh": fresh,
                    "restarts": sum(1 for row in rows if row.get("restarted")),
                    "down_samples": sum(1 for row in rows if row.get("down"))}
    for key in PROCESS_SERIES:
        values = [row.get(key) for row in rows]
        if all(v is None for v in values):
            continue
        step = COUNT_STEP if key in COUNT_SERIES else 0.0
        if key == "data_dir_mb":
            report[key] = fitted(values, times_h, warmup)
        else:
            led = [row.get("partitions_led") for row in rows] if key in MOVES_WITH_LEADERSHIP else None
            report[key] = fitted(values, times_h, warmup, groups=[p or 0 for p in pids], left_out=fresh, step=step,
                                 caps=None if name.startswith("worker-") else process_caps(key, rows, pids, bounds, workload),
                                 covariate=led if led and any(v is not None for v in led) else None,
                                 covariate_name="partitions_led")
    return report


def verdicts(reports: dict[str, dict]) -> dict[str, str]:
    """The verdict of every series (``owner.series``) that is not flat."""
    return {f"{owner}.{key}": series["verdict"] for owner, report in reports.items() for key, series in report.items()
            if isinstance(series, dict) and series.get("flat") is False}


def report(samples: list[dict], args: argparse.Namespace, faults: list[dict], fault_counts: dict, extra: dict) -> dict:
    """The fits and verdicts of a run's samples. ``extra`` carries the run's design
    bounds and workload (both recorded by the run; a run recorded before them gets
    the bounds the code and its cluster folder give, and no workload: its
    /metrics series are judged by their slope alone)."""
    bounds, workload = extra.get("bounds") or design_bounds(Path(args.dir or ".") / "cluster"), extra.get("workload", {})
    times_h = [s["t_s"] / 3600 for s in samples]
    warmup = min(max(2, math.ceil(args.warmup_fraction * len(samples))), len(samples))
    names = list(dict.fromkeys(name for s in samples for name in s["processes"]))
    services = {name: process_report(samples, name, times_h, warmup, args.fresh_s, bounds, workload) for name in names
                if not name.startswith("worker-")}
    clients = {name: process_report(samples, name, times_h, warmup, args.fresh_s, bounds, workload)
               for name in names if name.startswith("worker-")}
    zookeeper = {key: fitted([s["zookeeper"].get(key) for s in samples], times_h, warmup,
                             step=COUNT_STEP if key in COUNT_SERIES else 0.0,
                             caps=zookeeper_disk_caps([s["zookeeper"].get("data_kb") for s in samples], bounds)
                             if key == "disk_mb" else None) for key in ("disk_mb", *ZOOKEEPER_COUNTERS)}
    throughput = {key: fitted([s["transactions"][key] for s in samples], times_h, warmup)
                  for key in ("committed_per_minute", "committed_per_run_cpu_s")}
    throughput |= {key: fitted([s["machine"].get(key) for s in samples], times_h, warmup) for key in ("run_cpus", "others_cpus")}
    throughput |= {outcome: sum(s["transactions"][outcome] for s in samples) for outcome in OUTCOMES}
    throughput["faults_by_sample"] = [sorted(f["kind"] for f in faults if before < f["t_s"] <= s["t_s"])
                                      for before, s in zip([-math.inf] + [s["t_s"] for s in samples[:-1]], samples, strict=True)]
    not_flat = verdicts({**services, "zookeeper_data": zookeeper, **clients})
    grows = [name for name, verdict in not_flat.items() if verdict == "grows"]
    over_bound = {f"{owner}.{key}": series["over_bound"] for owner, part in {**services, "zookeeper_data": zookeeper, **clients}.items()
                  for key, series in part.items() if isinstance(series, dict) and series.get("over_bound")}
    txlog_grows = [g for g in grows if g.split(".", 1)[0] in services and not g.startswith("zookeeper.")]
    return {
        "benchmark": "soak: a cluster under steady transactional load with faults; does any service's memory, "
                     "fds, threads, RocksDB or ZooKeeper grow?",
        "parameters": {"minutes": args.minutes, "sample_s": args.sample_s, "fault_interval_s": args.fault_interval_s,
                       "faults": list(args.faults), "warmup_samples": warmup, "fresh_s": args.fresh_s,
                       "retention_s": args.retention_s, "cut_probability": args.cut_probability, "seed": args.seed,
                       "flat": f"|growth per hour against the warm-up mean| <= {GROWTH_PER_HOUR_MAX:.0%}, or a fitted "
                               f"change of at most {COUNT_STEP} for a count (fds, threads, series, znodes)",
                       "grows": f"not flat, slope > 0 and >= {SIGNIFICANT_T:g} standard errors (shrinks: < 0; unclear: "
                                "within them)",
                       "mb": "10^6 bytes"},
        "machine": {"cpus": os.cpu_count()},
        **extra,
        "sample_t_s": [s["t_s"] for s in samples],
        "throughput": throughput,
        "faults": {"counts": fault_counts, "log": faults},
        "services": services,
        "zookeeper_data": zookeeper,
        "clients": clients,
        "not_flat": not_flat,
        "grows": grows,
        "over_bound": over_bound,
        "bounds": bounds,
        "targets": {"no_series_over_its_bound": not over_bound,
                    "no_txlog_service_series_grows": not txlog_grows,
                    "zookeeper_flat": not [g for g in grows if g.startswith(("zookeeper.", "zookeeper_data."))],
                    "throughput_flat": throughput["committed_per_minute"]["flat"],
                    "throughput_per_run_cpu_flat": throughput["committed_per_run_cpu_s"]["flat"],
                    "no_client_series_grows": not [g for g in grows if g.startswith("worker-")],
                    "no_series_grows": not grows},
    }


# --- the run -------------------------------------------------------------------------------


def expiration_args(args: argparse.Namespace) -> list[str]:
    """partition_svc's flags for how long producers and compacted markers are kept (the service's defaults unless given)."""
    found = []
    if args.producer_id_expiration_ms is not None:
        found += ["--producer-id-expiration-ms", str(args.producer_id_expiration_ms),
                  "--producer-id-expiration-check-interval-ms", str(max(args.producer_id_expiration_ms // 10, 1000))]
    if getattr(args, "delete_retention_ms", None) is not None:
        found += ["--log-cleaner-delete-retention-ms", str(args.delete_retention_ms)]
    return found


def workload_names(cluster: LocalCluster) -> dict[str, list[str]]:
    """The topics and groups the run made: the values its /metrics labels may name (soak_bounds)."""
    with Admin(cluster.state.bootstrap) as admin:
        return {"topics": sorted({*admin.list_topics(), TRANSACTION_STATE_TOPIC, CONSUMER_OFFSETS_TOPIC}),
                "groups": sorted(group.group_id for group in admin.list_groups())}


def soak(directory: Path, args: argparse.Namespace) -> dict:
    routes = ZookeeperRoutes()  # partition_zookeeper cuts a process's own path to ZooKeeper
    cluster = LocalCluster(directory / "cluster", zookeeper_route=routes.route)
    workers, nemesis, sampler, extra = None, None, None, {}
    try:
        progress(f"cluster in {directory}")
        cluster.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=2,
                   service_args={"coordinator_svc": chaos.COORDINATOR_ARGS, "partition_svc": chaos.PARTITION_ARGS + expiration_args(args)})
        cluster.wait_until_coordinators_settle()
        with Admin(cluster.state.bootstrap) as admin:
            admin.create_topics(list(chaos.TOPICS.items()), {"retention.ms": str(int(args.retention_s * 1000))})
        workers = chaos.Workers(directory, cluster.state.bootstrap, args.seed, args.cut_probability)
        workers.start()
        sampler = Sampler(cluster, workers, directory)
        if args.fault_interval_s > 0:
            nemesis = Nemesis(cluster, random.Random(args.seed), args.fault_interval_s, workers.producer_pids(),
                              members=workers, directory=directory, kinds=args.faults, topics=tuple(chaos.TOPICS),
                              routes=routes, producer_pause_s=chaos.TXN_TIMEOUT_MS / 1000 + 2,
                              leader_pause_s=chaos.PARTITION_SESSION_S + 2, zookeeper_cut_s=chaos.PARTITION_SESSION_S + 3)
            nemesis.start()
        progress(f"{len(workers.processes)} workers, faults {', '.join(args.faults) if nemesis else 'none'}, "
                 f"for {args.minutes:g} min, a sample every {args.sample_s:g} s")
        count = int(args.minutes * 60 // args.sample_s)
        for index in range(count + 1):
            time.sleep(max(0.0, sampler.started + index * args.sample_s - time.monotonic()))
            progress(progress_line(sampler.take()))
        extra["load_s"] = round(time.monotonic() - sampler.started, 1)
        extra["bounds"] = design_bounds(directory / "cluster")
        extra["workload"] = workload_names(cluster)
    finally:
        if nemesis is not None:
            nemesis.stop()
            extra["healed"] = nemesis.heal()
        if workers is not None:
            extra["stuck_workers"] = chaos.stop_workers(directory, workers.processes)
        cluster.down(grace_s=5)
        routes.close()
    faults = [{"kind": e.kind, "target": e.target, "t_s": round(e.start_s - sampler.started_wall, 1),
               "seconds": round(e.end_s - e.start_s, 1), **({"error": e.error} if e.error else {})}
              for e in (nemesis.log if nemesis else [])]
    counts = {kind: n for kind, n in (nemesis.counts() if nemesis else {}).items() if n}
    (directory / SAMPLES_FILE).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "from_samples"},
                                                      "samples": sampler.samples, "faults": faults,
                                                      "fault_counts": counts, "extra": extra}))
    return report(sampler.samples, args, faults, counts, extra)


def main(argv=None) -> int:
    args = parse_args(argv)
    # stopped (kill PID; a background job ignores SIGINT): the cluster and the workers are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.from_samples:
        saved = json.loads(Path(args.from_samples).read_text())
        again = argparse.Namespace(**{**saved["args"], "warmup_fraction": args.warmup_fraction, "fresh_s": args.fresh_s})
        again.faults = tuple(again.faults)
        result = report(saved["samples"], again, saved["faults"], saved["fault_counts"], saved["extra"])
    elif args.dir:
        directory = Path(args.dir).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        result = soak(directory, args)
    else:
        with tempfile.TemporaryDirectory(prefix="txlog-bench-soak-") as workdir:
            result = soak(Path(workdir), args)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
