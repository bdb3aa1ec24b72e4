"""Waiting for a condition with a deadline, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc

from txlog.protocol.errors import TxlogError

POLL_INTERVAL_S = 0.1


def refused_for_now(exc: BaseException) -> bool:
    """A call a service refuses for a moment (restarting, moving, loading): a
    gRPC error, or an error whose code is retriable (the SDK's, or an answer's)."""
    return isinstance(exc, grpc.RpcError) or (isinstance(exc, TxlogError) and exc.retriable)


def wait_until(condition: Callable[[], Any], timeout_s: float = 20, message: str | Callable[[], str] = "the condition", *,
               ignoring: Callable[[BaseException], bool] = refused_for_now, interval_s: float = POLL_INTERVAL_S) -> Any:
    """Asks ``condition()`` again until its answer is truthy, and returns that answer.

    After ``timeout_s`` raises AssertionError with ``message`` (a string, or a
    function returning one, called then) and the last answer. An exception for
    which ``ignoring(exc)`` holds (by default a call refused for now) counts as
    a falsy answer; any other propagates."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            last = condition()
            if last:
                return last
        except Exception as exc:
            if not ignoring(exc):
                raise
            last = exc
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")
        time.sleep(interval_s)
