"""Each fetched record's transactional outcome (txlog/protocol/txn_outcomes.py): the
leader's answer for a read range, and the reader's outcome of each batch from
that answer alone, against the truth of randomly generated logs (a printed
seed replays a failure)."""

from __future__ import annotations

import bisect
import random

import pytest

from txlog.config import ConsumerConfig
from txlog.protocol import txn_outcomes
from txlog.protocol.txn_outcomes import ABORTED, COMMITTED, NOT_TRANSACTIONAL, OPEN, Outcomes, leader_answer


def random_log(rng: random.Random):
    """A partition's batches in offset order ((producer id, base offset, transactional, truth)), its aborted
    spans by producer and its producers' open transactions' first offsets, as a leader keeps them."""
    batches, aborted = [], {}
    current: dict[int, list[int]] = {}  # producer -> base offsets of its open transaction's batches
    offset = 0
    for _ in range(rng.randrange(1, 60)):
        producer = rng.randrange(4)
        step = rng.random()
        if step < 0.15:
            batches.append((10 + producer, offset, False, NOT_TRANSACTIONAL))  # idempotent, not transactional
        elif step < 0.35 and producer in current:  # its marker: decided now
            outcome = rng.choice((COMMITTED, ABORTED))
            bases = current.pop(producer)
            if outcome == ABORTED:
                aborted.setdefault(producer, []).append((bases[0], offset))
            batches = [(p, b, t, outcome if p == producer and b in bases else truth) for p, b, t, truth in batches]
        else:
            current.setdefault(producer, []).append(offset)
            batches.append((producer, offset, True, OPEN))
        offset += rng.randrange(1, 4)
    open_first = {producer: bases[0] for producer, bases in current.items()}
    return batches, aborted, open_first


def answer_for(batches, aborted, open_first):
    def aborted_span(producer_id, offset):
        spans = aborted.get(producer_id, [])
        index = bisect.bisect_right(spans, (offset, 2**63)) - 1
        return spans[index] if index >= 0 and spans[index][0] <= offset <= spans[index][1] else None

    returned = [(p, b) for p, b, transactional, _ in batches if transactional]
    return leader_answer(returned, aborted_span, lambda p: open_first.get(p, -1))


def test_a_reader_tells_each_batch_outcome_from_the_leaders_answer_for_the_range_it_read():
    for seed in range(300):
        check_one_log(seed)


def check_one_log(seed: int) -> None:
    rng = random.Random(seed)
    batches, aborted, open_first = random_log(rng)
    first = rng.randrange(len(batches))
    read = batches[first:rng.randrange(first, len(batches)) + 1]  # any range a fetch returned
    answered_aborted, answered_open = answer_for(read, aborted, open_first)
    outcomes = Outcomes(answered_aborted, answered_open)
    assert [outcomes.of(t, p, b) for p, b, t, _ in read] == [truth for *_, truth in read], f"seed {seed}"
    # only the transactions a returned batch belongs to, each once
    assert {(p, first) for p, first, _ in answered_aborted} == \
        {(p, aborted_first) for p, b, _, truth in read if truth == ABORTED
         for aborted_first, last in aborted[p] if aborted_first <= b <= last}, f"seed {seed}"
    assert {p for p, _ in answered_open} == {p for p, _, _, truth in read if truth == OPEN}, f"seed {seed}"
    assert len(set(answered_aborted)) == len(answered_aborted) and len(set(answered_open)) == len(answered_open)


def test_a_batch_before_its_producers_open_transaction_was_committed_and_one_in_it_is_open():
    outcomes = Outcomes(aborted=[(7, 0, 4)], opened=[(7, 10)])
    assert [outcomes.of(True, 7, offset) for offset in (0, 4, 5, 9, 10, 12)] == \
        [ABORTED, ABORTED, COMMITTED, COMMITTED, OPEN, OPEN]
    assert outcomes.of(True, 8, 10) == COMMITTED  # another producer's
    assert outcomes.of(False, 7, 2) == NOT_TRANSACTIONAL
    assert txn_outcomes.OUTCOMES == (COMMITTED, ABORTED, OPEN, NOT_TRANSACTIONAL)


def test_outcomes_are_asked_for_with_read_uncommitted_only():
    assert ConsumerConfig(isolation_level="read_uncommitted", include_transaction_outcomes=True).include_transaction_outcomes
    with pytest.raises(ValueError, match="include_transaction_outcomes=True needs isolation_level='read_uncommitted'"):
        ConsumerConfig(include_transaction_outcomes=True)
    with pytest.raises(ValueError, match="must be True or False"):
        ConsumerConfig(isolation_level="read_uncommitted", include_transaction_outcomes="yes")
