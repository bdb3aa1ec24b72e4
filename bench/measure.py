"""What the benchmarks in bench/ share: progress lines, wall and CPU time, latencies.

* ``progress(message)``: a ``[bench]`` line on stderr (stdout is for the JSON report);
* ``cpu_seconds(pid)``: user + system CPU time of a process, from /proc;
* ``machine_cpu_seconds()``: busy and stolen CPU time of the whole machine, from
  /proc/stat; ``Phase.others_cpu_utilisation()`` turns it into the CPUs that
  processes outside the phase's ``pids`` kept busy (a neighbour on a shared box);
* ``Phase(pids)``: a context manager timing one phase - wall time and the CPU time
  each named process spent in it - with its figures per operation
  (``cpu_ms_per_op``) and per record and MB of payload (``rates``);
* ``Phase.combined(phases)``: one phase's figures from several slices of it;
* ``latency_summary(latencies)``: mean, p50, p99 and max of latencies in seconds,
  in ms;
* ``mean_of(before, after, key)``: the mean of one figure of two runs (a baseline
  taken before and after the service runs).

Only the standard library: the benchmarks import it as ``bench.measure`` (they run
as ``python -m bench.NAME`` from the repository root).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MB = 1_000_000  # MB/s figures count 10^6 bytes of payload
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (all its threads); None where /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, stolen) CPU seconds of the whole machine, all CPUs, since boot: busy
    is user + nice + system + irq + softirq (guest time is inside user), stolen is
    what the hypervisor gave to others; None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / CLOCK_TICKS, steal / CLOCK_TICKS


@dataclass
class Phase:
    """Wall time and per-process CPU time of one timed phase."""

    pids: dict[str, int]
    seconds: float = 0.0
    cpu: dict[str, float | None] = field(default_factory=dict)
    _started: float = 0.0
    _cpu_before: dict[str, float | None] = field(default_factory=dict)
    machine: tuple[float, float] | None = None  # (busy, stolen) CPU seconds of the whole machine in the phase
    _machine_before: tuple[float, float] | None = None

    def __enter__(self) -> Phase:
        self._cpu_before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine_before = machine_cpu_seconds()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        self.seconds = time.perf_counter() - self._started
        for name, pid in self.pids.items():
            before, after = self._cpu_before[name], cpu_seconds(pid)
            self.cpu[name] = None if before is None or after is None else after - before
        machine = machine_cpu_seconds()
        if machine is not None and self._machine_before is not None:
            self.machine = (machine[0] - self._machine_before[0], machine[1] - self._machine_before[1])

    @classmethod
    def combined(cls, phases: list[Phase]) -> Phase:
        """One phase made of several (slices of one mode run between others): their
        wall times, CPU times and machine times added up."""
        total = cls(dict(phases[0].pids))
        total.seconds = sum(p.seconds for p in phases)
        for name in total.pids:
            spent = [p.cpu.get(name) for p in phases]
            total.cpu[name] = None if any(s is None for s in spent) else sum(spent)
        if all(p.machine is not None for p in phases):
            total.machine = (sum(p.machine[0] for p in phases), sum(p.machine[1] for p in phases))
        return total

    def others_cpu_utilisation(self) -> dict[str, float | None]:
        """CPUs kept busy in the phase by the whole machine, by processes other than
        ``pids`` (kernel threads included), and stolen by the hypervisor."""
        if self.machine is None or not self.seconds or any(spent is None for spent in self.cpu.values()):
            return {"machine": None, "other_processes": None, "stolen": None}
        busy, stolen = self.machine
        return {
            "machine": round(busy / self.seconds, 3),
            "other_processes": round(max(busy - sum(self.cpu.values()), 0.0) / self.seconds, 3),
            "stolen": round(stolen / self.seconds, 3),
        }

    def cpu_ms_per_op(self, ops: int) -> dict[str, float | None]:
        """CPU ms each process spent per operation, ``ops`` operations in the phase."""
        return {name: None if spent is None else round(spent / ops * 1000, 3) for name, spent in self.cpu.items()}

    def rates(self, records: int, record_bytes: int) -> dict:
        """Throughput of ``records`` records of ``record_bytes`` payload bytes each, and the CPU it took."""
        mb = records * record_bytes / MB
        return {
            "records": records,
            "seconds": round(self.seconds, 4),
            "records_per_s": round(records / self.seconds, 1),
            "mb_per_s": round(mb / self.seconds, 2),
            "cpu_seconds": {name: None if spent is None else round(spent, 3) for name, spent in self.cpu.items()},
            "cpu_utilisation": {
                name: None if spent is None else round(spent / self.seconds, 3) for name, spent in self.cpu.items()
            },
            "cpu_ms_per_mb": {
                name: None if spent is None else round(spent / mb * 1000, 3) for name, spent in self.cpu.items()
            },
        }


def latency_summary(latencies: list[float]) -> dict:
    """Mean, p50, p99 and max of latencies in seconds, in ms (percentiles: nearest rank below)."""
    ordered = sorted(latencies)
    return {
        "mean": round(statistics.fmean(ordered) * 1000, 3),
        "p50": round(ordered[len(ordered) // 2] * 1000, 3),
        "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 3),
        "max": round(ordered[-1] * 1000, 3),
    }


def mean_of(before: dict, after: dict, key: str = "mb_per_s", ndigits: int = 2) -> float:
    """The mean of ``key`` in two runs' figures, rounded to ``ndigits``."""
    return round((before[key] + after[key]) / 2, ndigits)


def alternating_runs(modes: Sequence[str], rounds: int, prefix: str, one_run: Callable[[Path, str], dict]) -> dict[str, list[dict]]:
    """``one_run(workdir, mode)`` for each mode in turn, ``rounds`` times (a, b,
    a, b, ...), so drift on a noisy machine favours no mode."""
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
        for round_index in range(rounds):
            for mode in modes:
                progress(f"round {round_index + 1}: {mode}")
                runs[mode].append(one_run(Path(workdir) / f"{mode}-{round_index}", mode))
    return runs


def compared(runs: dict[str, list[dict]], figures: Sequence[str], base: str, other: str, target: float, ratio_key: str) -> dict:
    """Each figure's median per mode and ``other``'s ratio to ``base`` (as
    ``ratio_key``) against ``target``."""
    medians = {mode: {name: round(statistics.median(r[name] for r in rs), 2) for name in figures} for mode, rs in runs.items()}
    ratios = {name: round(medians[other][name] / medians[base][name], 3) for name in figures}
    return {"machine": {"cpus": os.cpu_count()}, "mb_per_s_median": medians, "runs": runs,
            ratio_key: ratios, "target": target, "meets_target": all(r >= target for r in ratios.values())}
