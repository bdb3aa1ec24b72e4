"""What an operator alerts on in a coordinator: transactions begun, completed
(by outcome), timed out and fenced, as counters; open transactions by state
and the age of the oldest, read from the loaded partitions' open ids at each scrape.

Counted where the coordinator's transitions are written (coordinator.py), so
a transaction counts once, on the coordinator that wrote its record."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from coordinator_svc.transaction_state import TransactionState as S
from txlog.protocol import OPEN_TRANSACTION_STATES

COMPLETED = {S.COMPLETE_COMMIT: {"outcome": "committed"}, S.COMPLETE_ABORT: {"outcome": "aborted"}}
FOLDED = {S.PREPARE_COMMIT: S.COMPLETE_COMMIT, S.PREPARE_ABORT: S.COMPLETE_ABORT}


class TransactionMetrics:
    def __init__(self, meter: Meter, partitions: Callable[[], Iterable], clock_ms: Callable[[], int]):
        self._partitions = partitions
        self._clock_ms = clock_ms
        self.begun = meter.create_counter("txlog.transactions.begun", description="transactions that became Ongoing")
        self.completed = meter.create_counter("txlog.transactions.completed",
                                              description="transactions completed, by outcome (committed, aborted)")
        self.timed_out = meter.create_counter("txlog.transactions.timed_out",
                                              description="transactions the coordinator aborted at their timeout")
        self.fenced = meter.create_counter("txlog.transactions.fenced",
                                           description="open transactions aborted because a newer producer epoch fenced them")
        meter.create_observable_gauge("txlog.transactions.open", [self._open],
                                      description="open transactions (Ongoing, Prepared, PrepareCommit, ...) by state")
        meter.create_observable_gauge("txlog.transactions.oldest_open_age", [self._oldest], unit="s",
                                      description="age of the oldest open transaction (0 when none is open)")

    def transitioned(self, before: S, after: S) -> None:
        if after is S.ONGOING and before is not S.ONGOING:
            self.begun.add(1)
            if before in FOLDED:  # the completion folded into the next transaction's first add
                self.completed.add(1, COMPLETED[FOLDED[before]])
        elif after in COMPLETED:
            self.completed.add(1, COMPLETED[after])

    def _open_transactions(self):
        for loaded in self._partitions():
            if loaded.loaded:
                # Only the open ids are read (LoadedPartition.open_ids), not every id held. A scrape runs on
                # the exporter's thread while the loop changes them: list() copies the set in one step (under
                # the GIL), and an id that moved on or left since is skipped.
                for tid in list(loaded.open_ids):
                    meta = loaded.transactions.get(tid)
                    if meta is not None and meta.state in OPEN_TRANSACTION_STATES:
                        yield meta

    def _open(self, _: CallbackOptions) -> Iterable[Observation]:
        by_state = Counter(m.state.value for m in self._open_transactions())
        return [Observation(by_state.get(state.value, 0), {"state": state.value}) for state in sorted(OPEN_TRANSACTION_STATES, key=str)]

    def _oldest(self, _: CallbackOptions) -> Iterable[Observation]:
        starts = [m.txn_start_ms for m in self._open_transactions() if m.txn_start_ms >= 0]
        return [Observation(max(self._clock_ms() - min(starts), 0) / 1000 if starts else 0.0)]
