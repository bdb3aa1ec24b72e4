"""The driver's commit of one micro-batch of a streaming query, step by step.

The streaming sink's protocol (``streaming_sink`` says why it is exactly
once), apart from the I/O: a ``BatchCommit`` performs one step a call on a
``Cluster``, so that the model test can run the commits of several drivers of
one query (a live one and zombies) interleaved, and stop any of them anywhere.

The steps, in order (``NEXT`` lists every legal transition):

- FENCE: init the query's ledger transactional id (fences earlier drivers:
  their ledger transaction can no longer commit);
- CHECK: read the last batch id recorded; B recorded already (Spark runs
  its last batch again after a driver died between the group commit and its
  own commit log): abort every undecided task transaction of the query and
  stop, committing nothing; a later batch recorded: fail (the ledger is not
  this query's, or this driver is stale);
- RECORD: prepare the ledger transaction that records B;
- SETTLE: abort every other undecided task transaction of the query (failed
  attempts, losing speculative copies, a dead driver's prepared output) and
  wait until none is open;
- COMMIT: commit the tasks' handles and the ledger's in one group commit.

A failure in SETTLE or COMMIT aborts the ledger transaction before it is raised.
"""

from __future__ import annotations

import enum
from typing import Protocol

from txlog.structs import TransactionHandle


class Cluster(Protocol):
    def fence(self) -> None: ...

    def last_committed(self) -> int | None: ...

    def abort_undecided(self, keep: frozenset[str]) -> None:
        """Aborts every undecided task transaction of the query outside ``keep``, and waits until none is open."""

    def record(self, batch_id: int) -> TransactionHandle: ...

    def group_commit(self, handles: list[TransactionHandle]) -> None: ...

    def abort_record(self, handle: TransactionHandle) -> None: ...


class LedgerAheadError(RuntimeError):
    """The ledger records a later batch than the one being committed."""


class Step(enum.Enum):
    FENCE = "fence"
    CHECK = "check"
    RECORD = "record"
    SETTLE = "settle"
    COMMIT = "commit"
    DONE = "done"


NEXT = {
    Step.FENCE: {Step.CHECK},
    Step.CHECK: {Step.RECORD, Step.DONE},  # DONE: the batch was committed before
    Step.RECORD: {Step.SETTLE},
    Step.SETTLE: {Step.COMMIT},
    Step.COMMIT: {Step.DONE},
    Step.DONE: set(),
}


class BatchCommit:
    def __init__(self, cluster: Cluster, batch_id: int, handles: list[TransactionHandle]):
        self.cluster = cluster
        self.batch_id = batch_id
        self.handles = list(handles)
        self.step = Step.FENCE
        self.recorded: TransactionHandle | None = None
        self.committed: bool | None = None  # True: this commit committed the batch; False: it was committed before

    def advance(self) -> Step:
        """Performs the current step; returns the next one."""
        step = self.step
        if step is Step.FENCE:
            self.cluster.fence()
            following = Step.CHECK
        elif step is Step.CHECK:
            following = self._check(self.cluster.last_committed())
        elif step is Step.RECORD:
            self.recorded = self.cluster.record(self.batch_id)
            following = Step.SETTLE
        elif step in (Step.SETTLE, Step.COMMIT):
            try:  # a failure from here on must not leave the record prepared: require_stable readers would wait on it
                if step is Step.SETTLE:
                    self.cluster.abort_undecided(frozenset(h.transactional_id for h in self.handles))
                else:
                    self.cluster.group_commit([*self.handles, self.recorded])
                    self.committed = True
            except BaseException:
                self.cluster.abort_record(self.recorded)
                raise
            following = Step.COMMIT if step is Step.SETTLE else Step.DONE
        else:
            raise RuntimeError(f"the commit of batch {self.batch_id} is done")
        assert following in NEXT[step], (step, following)
        self.step = following
        return following

    def _check(self, last: int | None) -> Step:
        if last is None or last < self.batch_id:
            return Step.RECORD
        if last > self.batch_id:  # Spark re-runs only its last batch: this is another query's ledger, or a stale driver
            raise LedgerAheadError(
                f"micro-batch {self.batch_id}: the query's ledger already records batch {last}; a query restarted "
                "from a new checkpoint needs a new transactionalIdPrefix (the default, txlog-stream-<query id>, is new "
                "with every checkpoint)")
        self.cluster.abort_undecided(frozenset())  # committed before: this run's output must not stay prepared
        self.committed = False
        return Step.DONE

    def run(self, before_commit=lambda: None) -> bool:
        """Every step; ``before_commit`` is called just before COMMIT. True if this call committed the batch."""
        while self.step is not Step.DONE:
            if self.step is Step.COMMIT:
                before_commit()
            self.advance()
        return bool(self.committed)
