"""The SDK's group write (txlog/two_phase.py), the protocol the Spark
data source follows, through the real services without Spark: task attempts
prepare their transactions, the driver commits exactly the winners' handles
as one, the losers are aborted and settled first, and the next run aborts
what an earlier run whose driver died left undecided."""

import pytest
from support.reads import values
from support.waiting import wait_until

from tests.integ.raw import Raw
from txlog import Admin, Producer
from txlog.protocol import TransactionState
from txlog.two_phase import GroupWrite, new_run_id, task_transactional_id

TOPIC = "group-write"
PREFIX = "gw-job"


@pytest.fixture
def raw(txn_cluster):
    client = Raw(txn_cluster)
    client.create_topic(TOPIC, 2)
    yield client
    client.close()


@pytest.fixture
def admin(txn_cluster):
    with Admin(txn_cluster.state.bootstrap) as client:
        yield client


def attempt(bootstrap, run, task, attempt_id, values, *, prepare=True):
    """One task attempt: its rows in its own transaction, prepared (its handle) or left open (None)."""
    producer = Producer(bootstrap, transactional_id=task_transactional_id(PREFIX, run, task, attempt_id),
                        transaction_timeout_ms=60_000)
    producer.init_transactions()
    producer.begin_transaction()
    for value in values:
        producer.send(TOPIC, value=value.encode(), partition=task)
    if not prepare:
        producer.flush()
        return producer, None  # the attempt is still writing (or died): its transaction stays open
    handle = producer.prepare_transaction()
    producer.close()
    return None, handle


def states(admin, run):
    return {t.transactional_id: TransactionState(t.state) for t in admin.list_transactions(prefix=f"{PREFIX}/{run}.")}


def test_a_group_write_commits_exactly_the_winning_attempts_after_the_losers_settle(raw, admin, txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    run = new_run_id()
    _, winner0 = attempt(bootstrap, run, 0, 1, ["a0", "a1"])
    _, loser0 = attempt(bootstrap, run, 0, 2, ["speculative copy"])  # a speculative copy Spark did not choose
    _, winner1 = attempt(bootstrap, run, 1, 3, ["b0"])
    still_writing, _ = attempt(bootstrap, run, 1, 4, ["failed attempt"], prepare=False)
    try:
        aborted = GroupWrite(admin, bootstrap, PREFIX, run).commit([winner0, winner1])
    finally:
        still_writing.close()
    assert sorted(aborted) == sorted([loser0.transactional_id, task_transactional_id(PREFIX, run, 1, 4)])
    wait_until(lambda: values(raw, TOPIC, 0) == ["a0", "a1"] and values(raw, TOPIC, 1) == ["b0"], message="the commit")
    found = states(admin, run)
    assert found[winner0.transactional_id] in (TransactionState.PREPARE_COMMIT, TransactionState.COMPLETE_COMMIT)
    assert found[loser0.transactional_id] is TransactionState.COMPLETE_ABORT  # by its handle, settled before the commit
    # the open one by a new producer with its id: its transaction aborted, the id left Empty at a new epoch
    assert found[task_transactional_id(PREFIX, run, 1, 4)] is TransactionState.EMPTY
    # repeating the commit (a driver retrying) changes nothing
    assert GroupWrite(admin, bootstrap, PREFIX, run).commit([winner0, winner1]) == []
    assert values(raw, TOPIC, 0) == ["a0", "a1"] and values(raw, TOPIC, 1) == ["b0"]


def test_the_next_run_aborts_what_a_dead_driver_left_and_a_failed_run_aborts_itself(raw, admin, txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    dead_run, run = new_run_id(), new_run_id()
    _, orphan = attempt(bootstrap, dead_run, 0, 1, ["orphan"])  # its driver died before the group commit
    open_producer, _ = attempt(bootstrap, dead_run, 1, 2, ["orphan open"], prepare=False)
    try:
        write = GroupWrite(admin, bootstrap, PREFIX, run)
        assert sorted(write.abort_earlier_runs()) == sorted([orphan.transactional_id, task_transactional_id(PREFIX, dead_run, 1, 2)])
    finally:
        open_producer.close()
    wait_until(lambda: states(admin, dead_run) == {orphan.transactional_id: TransactionState.COMPLETE_ABORT,
                                                   task_transactional_id(PREFIX, dead_run, 1, 2): TransactionState.EMPTY},
               message="the orphans aborted")

    _, mine = attempt(bootstrap, run, 0, 3, ["of a failed job"])
    assert write.abort() == [mine.transactional_id]
    wait_until(lambda: states(admin, run)[mine.transactional_id] is TransactionState.COMPLETE_ABORT, message="the failed run aborted")
    assert write.abort_earlier_runs() == []  # nothing of another run is left undecided
    assert values(raw, TOPIC, 0) == [] and values(raw, TOPIC, 1) == []
