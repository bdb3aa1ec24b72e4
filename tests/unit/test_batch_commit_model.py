"""The streaming sink's micro-batch commit (spark_jobs.batch_commit): examples of
the pure core, and a model-based test in which a query's drivers are killed at
any step, keep going as zombies (late steps), repeat group commits (duplicated
messages) and interleave (reordered messages), against a reference model:
every micro-batch's output is committed at most once, and exactly once when
Spark has logged the batch as done.

``QueryGroup`` is the transaction group as the coordinator keeps it (init
fences an id's earlier epoch and aborts its undecided transaction; a group
commit commits all of its prepared handles or none); it stands in for the
cluster, which this test does not test (the coordinator's own model tests do).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from spark_jobs.batch_commit import NEXT, BatchCommit, LedgerAheadError, Step
from txlog.structs import TransactionHandle

LEDGER = "q/batches"


class Refused(Exception):
    """What the coordinator answers a fenced or undecidable request."""


@dataclass
class Txn:
    epoch: int
    state: str  # ongoing, prepared, committed, aborted
    batch: int
    run: int


@dataclass
class QueryGroup:
    ledger_epoch: int = 0
    ledger: Txn | None = None
    recorded: int | None = None  # the last batch id committed in the ledger
    tasks: dict[str, Txn] = field(default_factory=dict)
    outputs: dict[int, set[int]] = field(default_factory=dict)  # batch -> the driver runs whose output committed

    def undecided(self) -> set[str]:
        return {tid for tid, t in self.tasks.items() if t.state in ("ongoing", "prepared")}


class DriverCluster:
    """One driver's calls (a ``batch_commit.Cluster``)."""

    def __init__(self, group: QueryGroup):
        self.group = group
        self.epoch: int | None = None

    def fence(self) -> None:
        g = self.group
        g.ledger_epoch += 1
        self.epoch = g.ledger_epoch
        if g.ledger is not None and g.ledger.state == "prepared":
            g.ledger.state = "aborted"

    def last_committed(self) -> int | None:
        return self.group.recorded

    def abort_undecided(self, keep: frozenset[str]) -> None:
        for tid in self.group.undecided() - keep:
            self.group.tasks[tid].state = "aborted"

    def record(self, batch_id: int) -> TransactionHandle:
        if self.epoch != self.group.ledger_epoch:
            raise Refused("ledger fenced")
        self.group.ledger = Txn(self.epoch, "prepared", batch_id, -1)
        return TransactionHandle(LEDGER, 1, self.epoch)

    def group_commit(self, handles: list[TransactionHandle]) -> None:
        g = self.group
        txns = [g.ledger if h.transactional_id == LEDGER else g.tasks.get(h.transactional_id) for h in handles]
        if any(t is None or t.epoch != h.producer_epoch for t, h in zip(txns, handles, strict=True)):
            raise Refused("a handle of another epoch")
        if all(t.state == "committed" for t in txns):
            return  # a repeated group commit changes nothing
        if any(t.state != "prepared" for t in txns):
            raise Refused("not every transaction is prepared")
        for t in txns:
            t.state = "committed"
        ledger = next(t for t, h in zip(txns, handles, strict=True) if h.transactional_id == LEDGER)
        g.recorded = ledger.batch
        for t, h in zip(txns, handles, strict=True):
            if h.transactional_id != LEDGER:
                g.outputs.setdefault(t.batch, set()).add(t.run)

    def abort_record(self, handle: TransactionHandle) -> None:
        if self.group.ledger is not None and self.group.ledger.epoch == handle.producer_epoch \
                and self.group.ledger.state == "prepared":
            self.group.ledger.state = "aborted"


# --- the pure core, by example -----------------------------------------------------------------

def prepared_tasks(group: QueryGroup, batch: int, run: int, count: int) -> list[TransactionHandle]:
    handles = []
    for i in range(count):
        tid = f"q/r{batch}-{run:x}.p{i}.t{len(group.tasks)}"
        group.tasks[tid] = Txn(0, "prepared", batch, run)
        handles.append(TransactionHandle(tid, 100 + len(group.tasks), 0))
    return handles


def test_a_first_commit_goes_through_every_step_in_order_and_records_the_batch():
    group = QueryGroup()
    commit = BatchCommit(DriverCluster(group), 0, prepared_tasks(group, 0, 1, 2))
    steps = [commit.advance() for _ in range(5)]
    assert steps == [Step.CHECK, Step.RECORD, Step.SETTLE, Step.COMMIT, Step.DONE]
    assert commit.committed is True and group.recorded == 0 and group.outputs == {0: {1}}
    assert all(following in NEXT[step] for step, following in itertools.pairwise([Step.FENCE, *steps]))


def test_a_batch_recorded_before_is_not_committed_again_and_its_new_output_is_aborted():
    group = QueryGroup()
    assert BatchCommit(DriverCluster(group), 0, prepared_tasks(group, 0, 1, 1)).run()
    rerun = prepared_tasks(group, 0, 2, 2)
    commit = BatchCommit(DriverCluster(group), 0, rerun)
    assert commit.run() is False
    assert [group.tasks[h.transactional_id].state for h in rerun] == ["aborted", "aborted"]
    assert group.outputs == {0: {1}}


def test_a_dead_drivers_prepared_output_is_aborted_before_the_new_run_commits():
    group = QueryGroup()
    dead = prepared_tasks(group, 0, 1, 2)
    dead_commit = BatchCommit(DriverCluster(group), 0, dead)
    while dead_commit.step is not Step.COMMIT:
        dead_commit.advance()  # killed just before its group commit
    assert BatchCommit(DriverCluster(group), 0, prepared_tasks(group, 0, 2, 1)).run()
    assert {group.tasks[h.transactional_id].state for h in dead} == {"aborted"}
    with pytest.raises(Refused):
        dead_commit.advance()  # the zombie's late group commit
    assert group.outputs == {0: {2}} and group.recorded == 0


def test_a_failed_group_commit_aborts_its_ledger_transaction():
    group = QueryGroup()
    handles = prepared_tasks(group, 0, 1, 1)
    commit = BatchCommit(DriverCluster(group), 0, handles)
    while commit.step is not Step.COMMIT:
        commit.advance()
    group.tasks[handles[0].transactional_id].state = "aborted"  # a task's transaction timed out meanwhile
    with pytest.raises(Refused):
        commit.advance()
    assert group.ledger.state == "aborted" and group.recorded is None


def test_a_ledger_ahead_of_the_batch_fails_the_commit_and_leaves_the_output_prepared_for_the_next_commit():
    group = QueryGroup()
    assert BatchCommit(DriverCluster(group), 5, prepared_tasks(group, 5, 1, 1)).run()  # another query, same prefix
    handles = prepared_tasks(group, 0, 2, 1)
    with pytest.raises(LedgerAheadError, match="already records batch 5"):
        BatchCommit(DriverCluster(group), 0, handles).run()
    assert group.outputs == {5: {1}} and group.tasks[handles[0].transactional_id].state == "prepared"


def test_a_failed_settle_aborts_the_ledger_transaction():
    group = QueryGroup()
    cluster = DriverCluster(group)
    commit = BatchCommit(cluster, 0, prepared_tasks(group, 0, 1, 1))
    while commit.step is not Step.SETTLE:
        commit.advance()

    def timed_out(keep):
        raise TimeoutError("transactions were still open")

    cluster.abort_undecided = timed_out
    with pytest.raises(TimeoutError):
        commit.advance()
    assert group.ledger.state == "aborted"


# --- the model -----------------------------------------------------------------------------------

@dataclass
class Driver:
    run: int
    cluster: DriverCluster
    batch: int
    commit: BatchCommit | None = None
    committed: list[TransactionHandle] = field(default_factory=list)  # handles of its group commits, to repeat


class BatchCommitModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.group = QueryGroup()
        self.spark_done = -1  # the last batch Spark's commit log has
        self.runs = itertools.count(1)
        self.live = self._start()
        self.zombies: list[Driver] = []

    def _start(self) -> Driver:
        """A driver starting from the checkpoint: it runs the batch after the last one Spark logged."""
        return Driver(next(self.runs), DriverCluster(self.group), self.spark_done + 1)

    def _tasks_prepare(self, driver: Driver, tasks: int, strays: list[str]) -> None:
        """A driver's micro-batch: its tasks prepare; failed attempts and losing
        speculative copies leave ``strays`` that Spark does not hand the driver."""
        handles = prepared_tasks(self.group, driver.batch, driver.run, tasks)
        for state in strays:
            self.group.tasks[f"q/r{driver.batch}-{driver.run:x}.p9.t{len(self.group.tasks)}"] = Txn(0, state, driver.batch, driver.run)
        driver.commit = BatchCommit(driver.cluster, driver.batch, handles)

    @precondition(lambda self: self.live.commit is None)
    @rule(tasks=st.integers(1, 3), strays=st.lists(st.sampled_from(["ongoing", "prepared"]), max_size=2))
    def tasks_prepare(self, tasks, strays):
        self._tasks_prepare(self.live, tasks, strays)

    @precondition(lambda self: any(z.commit is None for z in self.zombies))
    @rule(data=st.data(), tasks=st.integers(1, 3))
    def zombie_tasks_prepare(self, data, tasks):
        """A driver cut off before its tasks finished still runs them, late."""
        self._tasks_prepare(data.draw(st.sampled_from([z for z in self.zombies if z.commit is None])), tasks, [])

    @precondition(lambda self: self.live.commit is not None)
    @rule()
    def live_step(self):
        commit = self.live.commit
        try:
            commit.advance()
        except Refused:  # the batch failed (a zombie aborted its output): Spark restarts the query
            self.live = self._start()
            return
        if commit.step is Step.DONE:
            if commit.committed:
                self.live.committed.append([*commit.handles, commit.recorded])
            self.spark_done = self.live.batch  # Spark logs the batch as done
            self.zombies.append(self.live)  # it may still repeat what it sent
            self.live = Driver(self.live.run, self.live.cluster, self.spark_done + 1)

    @rule()
    def kill_live_driver(self):
        """kill -9, or cut off and still running: its later steps arrive late."""
        self.zombies.append(self.live)
        self.live = self._start()

    @precondition(lambda self: any(z.commit is not None and z.commit.step is not Step.DONE for z in self.zombies))
    @rule(data=st.data())
    def zombie_step(self, data):
        zombie = data.draw(st.sampled_from([z for z in self.zombies if z.commit is not None and z.commit.step is not Step.DONE]))
        try:
            zombie.commit.advance()
        except (Refused, LedgerAheadError):
            zombie.commit.step = Step.DONE  # the zombie's commit failed: it stops
            return
        if zombie.commit.step is Step.DONE and zombie.commit.committed:
            zombie.committed.append([*zombie.commit.handles, zombie.commit.recorded])

    @precondition(lambda self: any(d.committed for d in [*self.zombies, self.live]))
    @rule(data=st.data())
    def group_commit_repeated(self, data):
        driver = data.draw(st.sampled_from([d for d in [*self.zombies, self.live] if d.committed]))
        handles = data.draw(st.sampled_from(driver.committed))
        try:
            driver.cluster.group_commit(handles)
        except Refused:
            pass

    @invariant()
    def each_batch_is_committed_at_most_once_and_once_when_spark_logged_it(self):
        assert all(len(runs) == 1 for runs in self.group.outputs.values()), self.group.outputs
        for batch in range(self.spark_done + 1):
            assert len(self.group.outputs.get(batch, ())) == 1, (batch, self.group.outputs)

    @invariant()
    def the_ledger_never_records_a_batch_whose_output_is_not_committed(self):
        if self.group.recorded is not None:
            assert self.group.recorded in self.group.outputs


TestBatchCommitModel = BatchCommitModel.TestCase
TestBatchCommitModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
