"""ProducerStates: the open-transaction index behind the last stable offset,
against a model that scans every entry (what the LSO was computed with)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from partition_svc.producer_state import NO_OFFSET, ProducerStateEntry, ProducerStates


def entry(producer_id: int, txn_first: int = NO_OFFSET) -> ProducerStateEntry:
    return ProducerStateEntry(producer_id, 0, current_txn_first_offset=txn_first)


def test_the_oldest_open_transaction_bounds_and_ended_ones_do_not():
    states = ProducerStates()
    assert states.first_open_offset() is None
    states[1] = entry(1, 40)
    states[2] = entry(2, 10)
    states[3] = entry(3)
    assert states.first_open_offset() == 10
    states[2] = replace(states[2], current_txn_first_offset=NO_OFFSET)  # its marker
    assert states.first_open_offset() == 40
    states[2] = entry(2, 90)  # its next transaction
    del states[1]
    assert states.first_open_offset() == 90
    assert states.open_transactions == {2: 90}
    assert states.pop(2).current_txn_first_offset == 90
    assert states.first_open_offset() is None


def test_a_long_open_transaction_under_many_short_ones_keeps_the_heap_bounded():
    states = ProducerStates()
    states[0] = entry(0, 5)
    for offset in range(10, 10_000):
        states[1] = entry(1, offset)
        states[1] = entry(1)
    assert states.first_open_offset() == 5
    assert len(states._heap) <= 2 * len(states._open) + 65


def test_bulk_changes_that_would_bypass_the_index_are_refused():
    states = ProducerStates()
    for change in (lambda: states.update({1: entry(1, 3)}), lambda: states.setdefault(1, entry(1, 3)), states.clear):
        with pytest.raises(TypeError):
            change()
    assert states.first_open_offset() is None and dict(states) == {}


class IndexAgainstScan(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.states = ProducerStates()
        self.model: dict[int, ProducerStateEntry] = {}

    @rule(producer_id=st.integers(0, 6), txn_first=st.one_of(st.just(NO_OFFSET), st.integers(0, 50)))
    def write(self, producer_id, txn_first):
        # A duplicated or re-sent write of the same entry, a late marker after
        # a newer transaction opened: all are just assignments in some order.
        self.states[producer_id] = self.model[producer_id] = entry(producer_id, txn_first)

    @rule(producer_id=st.integers(0, 6))
    def expire(self, producer_id):
        assert (self.states.pop(producer_id, None) is None) == (self.model.pop(producer_id, None) is None)

    @invariant()
    def first_open_is_the_scans_minimum(self):
        opened = [e.current_txn_first_offset for e in self.model.values() if e.current_txn_first_offset >= 0]
        assert self.states.first_open_offset() == (min(opened) if opened else None)
        assert dict(self.states) == self.model
        assert self.states.open_transactions == {p: e.current_txn_first_offset for p, e in self.model.items()
                                                 if e.current_txn_first_offset >= 0}


TestIndexAgainstScan = IndexAgainstScan.TestCase
TestIndexAgainstScan.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
