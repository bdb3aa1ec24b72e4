"""The time a call's handler runs on the event loop: the sum of its steps,
between the awaits that suspend it. That is what Kafka's request quota
(KIP-124, ``request_percentage``) counts of a request-handler thread; this
instance's one such thread is its event loop, shared by every call in flight,
so neither the wall time of the call nor the thread's CPU time would do.
Each step is timed on the thread's CPU clock, so a step is not charged for
the time the thread waited for the GIL or the CPU. Work done elsewhere is not
counted: on other threads (RocksDB's writes and reads), and on the loop by
other tasks for the call (the group commit, gRPC's parsing of the request
and serializing of the answer)."""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any


@dataclass
class Stopwatch:
    seconds: float = 0.0


@types.coroutine
def timed(coroutine: Coroutine[Any, Any, Any], watch: Stopwatch, clock: Callable[[], float] = time.thread_time):
    """Awaits ``coroutine`` (or an async generator's ``__anext__()``), adding the time each of its steps runs
    to ``watch``; what it returns or raises is passed on, and what the awaiting task is sent or thrown (a
    cancellation) is passed in."""
    value, error = None, None
    while True:
        started = clock()
        try:
            step = coroutine.send(value) if error is None else coroutine.throw(error)
        except StopIteration as done:
            return done.value
        finally:
            watch.seconds += clock() - started
        try:
            value, error = (yield step), None
        except GeneratorExit:
            coroutine.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - the task's, handed to the coroutine it awaits
            value, error = None, exc
