"""Retrying as a policy object: exponential back-off with jitter, a cap on the
delay, a cap on attempts and a deadline; clock, sleep and randomness are
injected so tests run without waiting."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from txlog.protocol.errors import ErrorCode

LIMIT_EXCEEDED = ErrorCode.Value("LIMIT_EXCEEDED")


@dataclass
class RetryPolicy:
    attempts_max: int = 10
    backoff_initial_ms: float = 20.0
    backoff_max_ms: float = 1000.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.2  # each delay is scaled by a random factor in [1 - jitter, 1 + jitter]
    deadline_ms: float | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)

    def delay_ms(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1 = the first retry)."""
        base = min(self.backoff_max_ms, self.backoff_initial_ms * self.backoff_multiplier ** (attempt - 1))
        return base * self.rng.uniform(1 - self.jitter, 1 + self.jitter)

    def delay_after(self, attempt: int, error: BaseException | None) -> float:
        """Delay before retry number ``attempt`` after ``error``: the policy's, or,
        after a refusal for load (LIMIT_EXCEEDED: an overloaded server, a client
        over its quota), longer when its RetryInfo asks for longer, up to
        ``backoff_max_ms``. The RetryInfo every other retriable error carries
        (100 ms unless the server says more) does not slow the policy's own
        retries."""
        asked = getattr(error, "retry_delay_ms", None) or 0
        if getattr(error, "code", None) != LIMIT_EXCEEDED:
            asked = 0
        return max(self.delay_ms(attempt), min(asked, self.backoff_max_ms))

    async def run(self, operation: Callable[[], Awaitable], retriable: Callable[[BaseException], bool]):
        """Runs ``operation`` until it succeeds, fails with a non-retriable error,
        or attempts or the deadline run out (then the last error is raised)."""
        started = self.clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await operation()
            except Exception as exc:
                if not retriable(exc) or attempt >= self.attempts_max:
                    raise
                delay = self.delay_after(attempt, exc)
                if self.deadline_ms is not None and (self.clock() - started) * 1000 + delay > self.deadline_ms:
                    raise
                await self.sleep(delay / 1000)
