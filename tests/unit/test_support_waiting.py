"""tests/support's wait_until: the answer it returns, the message and last answer of a timeout,
what it polls through and what it lets out."""

from __future__ import annotations

import pytest
from support.waiting import wait_until

from txlog.errors import RetriableError
from txlog.protocol.errors import ErrorCode


def test_returns_the_first_truthy_answer():
    answers = iter([None, [], {"done": 1}])
    assert wait_until(lambda: next(answers), 10, "an answer", interval_s=0) == {"done": 1}


def test_a_timeout_names_what_it_waited_for_and_the_last_answer():
    with pytest.raises(AssertionError, match=r"waiting for the moon; last: \[\]"):
        wait_until(lambda: [], 0, "the moon")
    with pytest.raises(AssertionError, match="waiting for a message made late"):
        wait_until(lambda: False, 0, lambda: "a message made late")


def refused():
    raise RetriableError(ErrorCode.Value("NOT_LEADER"), "moving")


def test_refused_calls_are_polled_through_and_other_errors_are_not():
    answers = iter([RetriableError(ErrorCode.Value("NOT_LEADER"), "moving"), "led"])

    def condition():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_until(condition, 10, "a leader", interval_s=0) == "led"
    with pytest.raises(KeyError):
        wait_until(lambda: {}["missing"], 10, "a key")
    with pytest.raises(AssertionError, match="NOT_LEADER"):  # a timeout shows the last refusal
        wait_until(refused, 0, "a leader")
