"""services.runtime.malloc: what the setting promises, checked in a child process (the
setting is process-wide, so the test's own process is left alone).

glibc's own state says where a buffer came from: ``mallinfo2()`` counts the
heap (``arena``), the part of it in use (``uordblks``) and the bytes in mmapped chunks (``hblkhd``). Once the
threshold is set it is fixed (glibc stops adapting it), so what the tuned
child does is the same on any machine; what glibc's adaptive default does
depends on the process's earlier frees, so the comparison with the default
(page faults, a matter of speed) is bench/malloc_tuning.py's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from services.runtime import malloc

MiB = 1 << 20

CHILD = """
import ctypes, ctypes.util, json, resource, sys
from services.runtime import malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.mallinfo2.restype = MallInfo2

def heap_and_mapped():
    info = libc.mallinfo2()
    return {"heap": info.arena, "heap_in_use": info.uordblks, "mapped": info.hblkhd}

threshold, buffer_bytes = int(sys.argv[1]), int(sys.argv[2])
report = {"tuned": malloc.keep_large_buffers(threshold)}
chunk = b"x" * (buffer_bytes + 2)
report["before"] = heap_and_mapped()
first, second = bytes(chunk[1:]), bytes(chunk[2:])  # two fresh buffers, as a fetch's batches and its response
report["held"] = heap_and_mapped()
del first, second
report["freed"] = heap_and_mapped()
faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    first, second = bytes(chunk[1:]), bytes(chunk[2:])
    del first, second
report["loop_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
print(json.dumps(report))
"""


def child_run(threshold_bytes: int, buffer_bytes: int) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(threshold_bytes), str(buffer_bytes)],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


@pytest.mark.parametrize("threshold_bytes", [1 * MiB, 32 * MiB])
def test_buffers_below_the_threshold_come_from_the_heap_and_stay_there_once_freed(threshold_bytes):
    buffer_bytes = threshold_bytes // 8  # 4 MiB under partition_svc's default of 32 MiB
    run = child_run(threshold_bytes, buffer_bytes)
    assert run["tuned"] is True
    before, held, freed = run["before"], run["held"], run["freed"]
    assert held["mapped"] == before["mapped"], run  # not one of the two buffers was mmapped
    assert held["heap_in_use"] - before["heap_in_use"] >= 2 * buffer_bytes, run
    # the freed top (two buffers) is below the trim threshold (two thresholds): the heap keeps it
    assert freed["heap"] == held["heap"], run


@pytest.mark.parametrize("threshold_bytes", [1 * MiB, 4 * MiB])
def test_buffers_above_the_threshold_are_still_mapped_and_returned(threshold_bytes):
    run = child_run(threshold_bytes, 2 * threshold_bytes)
    assert run["tuned"] is True
    before, held, freed = run["before"], run["held"], run["freed"]
    assert held["mapped"] - before["mapped"] >= 4 * threshold_bytes, run
    assert freed["mapped"] == before["mapped"], run


def test_large_buffers_are_reused_instead_of_faulted_in_each_time():
    buffer_bytes = 4 * MiB
    run = child_run(32 * MiB, buffer_bytes)
    assert run["tuned"] is True
    # 100 fresh 4 MiB buffers faulted in afresh would be 100 x 1,024 pages; reused from the heap the loop
    # touches pages already there (none at all once the two buffers before it were freed)
    pages_if_faulted_each_time = 100 * buffer_bytes // 4096
    assert run["loop_faults"] < pages_if_faulted_each_time / 10, run


def test_zero_changes_nothing():
    assert malloc.keep_large_buffers(0) is False


ARENAS_CHILD = """
import ctypes, ctypes.util, sys, threading
from services.runtime import malloc

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
print("capped" if malloc.cap_arenas(int(sys.argv[1])) else "default", flush=True)
started = threading.Barrier(8)
held = []

def allocate():
    started.wait()  # all eight alive at once, each taking the allocator for itself
    held.append(libc.malloc(4096))

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc.malloc_stats()  # one "Arena N:" section per arena, on stderr
"""


def arenas_of_eight_threads(arena_max: int) -> tuple[str, int]:
    # glibc's own settings from the environment (a container image's) would decide the uncapped count
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
    run = subprocess.run([sys.executable, "-c", ARENAS_CHILD, str(arena_max)], capture_output=True, text=True,
                         check=True, env=env)
    return run.stdout.strip(), sum(1 for line in run.stderr.splitlines() if line.startswith("Arena "))


def test_the_arena_cap_bounds_the_heaps_threads_take():
    told, uncapped = arenas_of_eight_threads(0)
    assert told == "default" and uncapped > 2, "eight threads at once take arenas of their own unless capped"
    told, capped = arenas_of_eight_threads(2)
    assert told == "capped" and 1 <= capped <= 2


def test_the_heap_figures_count_what_the_process_holds_and_frees():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = malloc.heap_bytes()
    assert set(before) == {"in_use", "free"} and min(before.values()) >= 0
    held = [libc.malloc(1 << 20) for _ in range(32)]  # 32 MiB held, whether from the heap or mmap
    try:
        assert malloc.heap_bytes()["in_use"] - before["in_use"] >= 32 << 20
    finally:
        for block in held:
            libc.free(block)
    assert malloc.heap_bytes()["in_use"] < before["in_use"] + (32 << 20), "what was freed no longer counts as in use"
