"""The C allocator's handling of large buffers, for services that move them,
and of the heaps it keeps per thread.

glibc serves an allocation above its mmap threshold (adaptive, from 128 KiB)
with a fresh mmap and returns it to the kernel when freed, and trims the heap
top above its trim threshold: so every 1 MB batch value RocksDB returns and
every response of tens of MB a Fetch joins is faulted in page by page, each
time (about 460 minor faults per MB fetched, measured by bench/produce_fetch.py
on partition_svc). Below a fixed, higher threshold such buffers come from the
heap and are reused. The cost is memory kept after a burst: up to the trim
threshold of freed heap stays resident.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

from services.runtime import config as config_mod
from services.runtime.logs import fields

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # mallopt parameters (malloc.h)
TRIM_THRESHOLD_FACTOR = 2  # freed heap kept before trimming: two of the largest buffers


ARENA_MAX_SETTING = config_mod.Setting(
    "malloc_arena_max", 2, "most heaps (arenas) the C allocator keeps for this process's threads (glibc; 0 keeps its "
    "default of eight a core): each thread that frees a buffer keeps that memory in its own heap, so under a flood "
    "of requests gRPC's threads held tens of MB each beyond the admission bounds", config_mod.non_negative_int)


def _mallopt():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def cap_arenas(arena_max: int) -> bool:
    """At most ``arena_max`` arenas (0: glibc's default, unchanged); False where the C library is not glibc.
    Called before the process starts its threads: an arena a thread already has stays."""
    mallopt = _mallopt() if arena_max > 0 else None
    if mallopt is None:
        return False
    done = mallopt(M_ARENA_MAX, arena_max) == 1
    log.info("allocator arenas capped" if done else "the allocator refused the arena cap", extra=fields(arena_max=arena_max))
    return done


def keep_large_buffers(mmap_threshold_bytes: int) -> bool:
    """Serves allocations up to ``mmap_threshold_bytes`` from the reused heap
    (0: glibc's adaptive default, unchanged); False where the C library is
    not glibc (nothing is changed there)."""
    mallopt = _mallopt() if mmap_threshold_bytes > 0 else None
    if mallopt is None:
        return False
    trim_bytes = mmap_threshold_bytes * TRIM_THRESHOLD_FACTOR
    done = mallopt(M_MMAP_THRESHOLD, mmap_threshold_bytes) == 1 and mallopt(M_TRIM_THRESHOLD, trim_bytes) == 1
    log.info("allocator tuned for large buffers" if done else "the allocator refused the large-buffer settings",
             extra=fields(mmap_threshold_bytes=mmap_threshold_bytes, trim_threshold_bytes=trim_bytes))
    return done


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _mallinfo2()


def heap_bytes() -> dict[str, int]:
    """The C allocator's bytes over all its arenas: ``in_use`` by the program
    (RocksDB's memtables and caches, gRPC's buffers, large Python objects;
    not pymalloc's small objects, which live in arenas of their own) and
    ``free`` kept for reuse; {} where the C library is not glibc >= 2.33.
    A leak in native code shows as in_use rising; fragmentation as free rising."""
    if _MALLINFO2 is None:
        return {}
    info = _MALLINFO2()
    return {"in_use": info.uordblks + info.hblkhd, "free": info.fordblks}
