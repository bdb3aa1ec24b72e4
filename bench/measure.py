"""What the benchmarks in bench/ share: progress lines, wall and CPU time, latencies.

* ``progress(message)``: a ``[bench]`` line on stderr (stdout is for the JSON report);
* ``cpu_seconds(pid)``: user + system CPU time of a process, from /proc;
* ``Phase(pids)``: a context manager timing one phase - wall time and the CPU time
  each named process spent in it - with its figures per operation
  (``cpu_ms_per_op``) and per record and MB of payload (``rates``);
* ``latency_summary(latencies)``: mean, p50, p99 and max of latencies in seconds,
  in ms;
* ``mean_of(before, after, key)``: the mean of one figure of two runs (a baseline
  taken before and after the service runs).

Only the standard library: the scripts import it as ``measure`` with their own
folder on ``sys.path`` (see the top of each script).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field

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


@dataclass
class Phase:
    """Wall time and per-process CPU time of one timed phase."""

    pids: dict[str, int]
    seconds: float = 0.0
    cpu: dict[str, float | None] = field(default_factory=dict)
    _started: float = 0.0
    _cpu_before: dict[str, float | None] = field(default_factory=dict)

    def __enter__(self) -> Phase:
        self._cpu_before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        self.seconds = time.perf_counter() - self._started
        for name, pid in self.pids.items():
            before, after = self._cpu_before[name], cpu_seconds(pid)
            self.cpu[name] = None if before is None or after is None else after - before

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
