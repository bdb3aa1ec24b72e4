"""Each fetched record's transactional outcome, both halves of the contract
(FetchRequest.include_transaction_outcomes): pure, no I/O.

A READ_UNCOMMITTED reader sees records of every transaction; asked, the
leader answers which transactions the returned transactional batches belong
to that were aborted (producer id, first and last offset: the ABORT marker's)
or are still open (producer id, first offset): ``leader_answer``. The reader
tells each batch's outcome from that answer alone (``Outcomes.of``): aborted
when its base offset lies in an aborted span of its producer, open when it
lies at or after its producer's open transaction's first offset, committed
otherwise; a batch outside any transaction has none.

Guarantees: the answer names only transactions a returned batch belongs to,
each once, in offset order; what the leader knows when it reads is what it
answers, so "committed" never turns "aborted" nor the other way (a marker is
written only once its coordinator decided; a leader change before it is
replicated can show "open" again until the coordinator writes it again),
and "open" becomes one of them on a later read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

COMMITTED = "committed"
ABORTED = "aborted"
OPEN = "open"
NOT_TRANSACTIONAL = "none"
OUTCOMES = (COMMITTED, ABORTED, OPEN, NOT_TRANSACTIONAL)

Span = tuple[int, int]  # (first offset, last offset)


def leader_answer(
    batches: Iterable[tuple[int, int]],
    aborted_span: Callable[[int, int], Span | None],
    open_first_offset: Callable[[int], int],
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """For the returned transactional ``batches`` ((producer id, base offset),
    markers excluded): the aborted transactions ((producer id, first, last))
    and the open ones ((producer id, first)) they belong to. ``aborted_span``
    finds the aborted span holding an offset of a producer (None: none does);
    ``open_first_offset`` is a producer's open transaction's first offset (-1
    when it has none)."""
    aborted: dict[tuple[int, int, int], None] = {}
    opened: dict[tuple[int, int], None] = {}
    for producer_id, base_offset in batches:
        span = aborted_span(producer_id, base_offset)
        if span is not None:
            aborted[(producer_id, *span)] = None
            continue
        first = open_first_offset(producer_id)
        if 0 <= first <= base_offset:
            opened[(producer_id, first)] = None
    return sorted(aborted, key=lambda a: (a[1], a[0])), sorted(opened, key=lambda o: (o[1], o[0]))


class Outcomes:
    """A reader's view of one partition's answer: the outcome of each returned batch."""

    def __init__(self, aborted: Iterable[tuple[int, int, int]], opened: Iterable[tuple[int, int]]):
        self._aborted: dict[int, list[Span]] = {}
        for producer_id, first, last in aborted:
            self._aborted.setdefault(producer_id, []).append((first, last))
        self._open_first = {producer_id: first for producer_id, first in opened}

    @classmethod
    def of_result(cls, result) -> Outcomes:
        """From a FetchPartitionResult."""
        return cls(((a.producer_id, a.first_offset, a.last_offset) for a in result.aborted_transactions),
                   ((o.producer_id, o.first_offset) for o in result.open_transactions))

    def of(self, is_transactional: bool, producer_id: int, base_offset: int) -> str:
        if not is_transactional:
            return NOT_TRANSACTIONAL
        if any(first <= base_offset <= last for first, last in self._aborted.get(producer_id, ())):
            return ABORTED
        if base_offset >= self._open_first.get(producer_id, 2**63):
            return OPEN
        return COMMITTED
