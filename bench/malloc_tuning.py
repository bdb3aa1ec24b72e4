"""Benchmark: page faults of large buffers under glibc's default and with
services.runtime.malloc.keep_large_buffers (partition_svc's --malloc-mmap-threshold-bytes).

What it measures, in a child process per setting (the setting is process-wide):
a loop of ``--rounds`` rounds, each two fresh ``--buffer-mib`` MiB buffers
allocated and freed, as a fetch's batches and its response; the minor page
faults of the loop (after a few warm-up buffers), and per MiB allocated.

Under glibc's default the figure depends on the process's history: its mmap
threshold adapts to earlier frees of mmapped chunks (up to 32 MiB on 64-bit),
so the same loop has measured from ~3,000 to ~33,000 faults for 100
buffers of 4 MiB depending on what ran before it. The tests
(tests/unit/test_malloc_tuning.py) check the setting itself; this compares.

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.malloc_tuning [--rounds N] [--buffer-mib N] [--threshold-mib N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench import measure

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import json, resource, sys
from services.runtime import malloc
threshold_bytes, buffer_bytes, rounds = (int(arg) for arg in sys.argv[1:4])
tuned = malloc.keep_large_buffers(threshold_bytes)
chunk = b"x" * (buffer_bytes + 2)
for _ in range(3):  # warm: the first buffers are faulted in either way
    bytes(chunk[1:])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(rounds):
    first, second = bytes(chunk[1:]), bytes(chunk[2:])
    del first, second
print(json.dumps({"tuned": tuned, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def faults_of(threshold_bytes: int, buffer_bytes: int, rounds: int) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(threshold_bytes), str(buffer_bytes), str(rounds)],
                         capture_output=True, text=True, check=True, cwd=REPOSITORY)
    result = json.loads(run.stdout)
    result["faults_per_mib"] = round(result["faults"] / (2 * rounds * buffer_bytes / (1 << 20)), 1)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="rounds of two buffers (default 50)")
    parser.add_argument("--buffer-mib", type=int, default=4, help="size of each buffer in MiB (default 4)")
    parser.add_argument("--threshold-mib", type=int, default=32, help="the tuned mmap threshold in MiB (default 32)")
    args = parser.parse_args(argv)
    buffer_bytes = args.buffer_mib << 20
    measure.progress("glibc's default")
    default = faults_of(0, buffer_bytes, args.rounds)
    measure.progress(f"mmap threshold {args.threshold_mib} MiB")
    tuned = faults_of(args.threshold_mib << 20, buffer_bytes, args.rounds)
    print(json.dumps({"rounds": args.rounds, "buffer_mib": args.buffer_mib, "default": default, "tuned": tuned}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
