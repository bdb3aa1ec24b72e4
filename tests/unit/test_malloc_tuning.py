"""services.malloc: large buffers reused from the heap instead of faulted in
afresh, checked by the page faults of a child process (the setting is
process-wide, so the test's own process is left alone)."""

from __future__ import annotations

import json
import subprocess
import sys

from services import malloc

CHILD = """
import json, resource, sys
from services import malloc
tuned = malloc.keep_large_buffers(int(sys.argv[1]))
chunk = b"x" * (4 << 20)
for _ in range(3):  # warm: the first buffers are faulted in either way
    bytes(chunk[1:])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):  # two fresh 4 MB buffers at once, then freed, as a fetch's batches and its response
    first, second = bytes(chunk[1:]), bytes(chunk[2:])
    del first, second
print(json.dumps({"tuned": tuned, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def faults_of(threshold_bytes: int) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(threshold_bytes)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def test_large_buffers_are_reused_instead_of_faulted_in_each_time():
    default, tuned = faults_of(0), faults_of(32 << 20)
    assert (default["tuned"], tuned["tuned"]) == (False, True)
    # 100 fresh 4 MB buffers are ~100,000 pages faulted in under glibc's default (the freed heap top is
    # trimmed each time); reused, about the 1,000 of the first two
    assert default["faults"] > 20_000, default
    assert tuned["faults"] < default["faults"] / 10, (default, tuned)


def test_zero_changes_nothing():
    assert malloc.keep_large_buffers(0) is False
