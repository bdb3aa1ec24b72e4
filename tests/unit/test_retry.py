import asyncio

import pytest

from txlog.protocol.errors import ErrorCode
from txlog.protocol.retry import RetryPolicy


class Transient(Exception):
    pass


def _policy(**kwargs):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    now = [0.0]
    return RetryPolicy(sleep=sleep, clock=lambda: now[0], jitter=0.0, **kwargs), slept


def test_retries_until_success_with_exponential_backoff_capped():
    policy, slept = _policy(attempts_max=10, backoff_initial_ms=10, backoff_max_ms=50)
    calls = []

    async def operation():
        calls.append(1)
        if len(calls) < 5:
            raise Transient()
        return "ok"

    assert asyncio.run(policy.run(operation, lambda e: isinstance(e, Transient))) == "ok"
    assert slept == [0.01, 0.02, 0.04, 0.05]


def test_non_retriable_errors_are_raised_at_once():
    policy, slept = _policy()

    async def operation():
        raise ValueError("bad")

    with pytest.raises(ValueError):
        asyncio.run(policy.run(operation, lambda e: isinstance(e, Transient)))
    assert slept == []


def test_gives_up_after_attempts_max():
    policy, slept = _policy(attempts_max=3)

    async def operation():
        raise Transient()

    with pytest.raises(Transient):
        asyncio.run(policy.run(operation, lambda e: True))
    assert len(slept) == 2


def test_jitter_stays_within_bounds():
    policy = RetryPolicy(backoff_initial_ms=100, jitter=0.2)
    delays = [policy.delay_ms(1) for _ in range(200)]
    assert min(delays) >= 80 and max(delays) <= 120 and max(delays) > min(delays)


LIMIT_EXCEEDED = ErrorCode.Value("LIMIT_EXCEEDED")


class Refused(Exception):
    """A retriable refusal whose server asked for a delay (RetryInfo), as an overloaded one does."""

    def __init__(self, retry_delay_ms, code=LIMIT_EXCEEDED):
        super().__init__("refused")
        self.retry_delay_ms = retry_delay_ms
        self.code = code


def test_a_delay_an_overloaded_server_asks_for_is_waited_up_to_the_policys_maximum():
    policy, slept = _policy(attempts_max=10, backoff_initial_ms=10, backoff_max_ms=500)
    asked = iter([Refused(120), Refused(2_000), Refused(0), Refused(None), Refused(300, ErrorCode.Value("NOT_LEADER"))])

    async def operation():
        refusal = next(asked, None)
        if refusal is None:
            return "ok"
        raise refusal

    assert asyncio.run(policy.run(operation, lambda exc: True)) == "ok"
    assert slept == [0.12, 0.5, 0.04, 0.08, 0.16], \
        "the server's delay when longer (capped); the policy's own for other errors, whatever their RetryInfo"
