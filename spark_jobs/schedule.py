"""Running a job once, or every N seconds until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable

log = logging.getLogger("spark_jobs.schedule")

DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds in "500ms", "60s", "5m", "1h" or "60" (seconds)."""
    match = DURATION_RE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"not a positive duration (e.g. 60s, 5m, 1h): {text!r}")
    return float(match.group(1)) * UNIT_S[match.group(2)]


def run_every(interval_s: float, run: Callable[[], object], stop: threading.Event | None = None) -> None:
    """Calls ``run`` now and then every ``interval_s`` (a run that takes longer
    delays the next one; runs never overlap) until ``stop`` is set or a
    SIGTERM/SIGINT arrives, which lets the current run finish. A failed run is
    logged and the schedule goes on: the next run picks up where the committed
    offsets say."""
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                run()
            except Exception:
                log.exception("the run failed; the next one retries from the committed offsets")
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_on_signal(stop: Callable[[], object]) -> None:
    """Calls ``stop`` (in a thread of its own: a handler must not block) at the first SIGTERM/SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        return
    once = threading.Event()

    def handler(*_):
        if not once.is_set():
            once.set()
            threading.Thread(target=stop, name="stop-on-signal", daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)
