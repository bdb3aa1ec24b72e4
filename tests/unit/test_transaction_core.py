"""The coordinator's request rules (coordinator_svc/transaction_core.py), pure:
each rule of each handler, as values, with no log, network or clock."""

from dataclasses import replace

import pytest

from coordinator_svc import transaction_core as core
from coordinator_svc.transaction_core import Answer, NeedProducerIds, Refuse, Reply, Then, Transit
from coordinator_svc.transaction_state import Handle, TransactionMetadata
from txlog.protocol import PRODUCER_EPOCH_MAX
from txlog.protocol import TransactionState as S
from txlog.protocol.errors import ErrorCode

TID = "app-1"
NOW = 1_700_000_000_000
TP = ("events", 0)


def meta(state=S.EMPTY, producer_id=7, epoch=3, **fields) -> TransactionMetadata:
    return TransactionMetadata(TID, producer_id, epoch, 60_000, state=state, **fields)


def refused(outcome) -> str:
    assert isinstance(outcome, Refuse), outcome
    return ErrorCode.Name(outcome.error.code)


# --- InitProducerId ----------------------------------------------------------------------------


def test_a_new_id_needs_a_producer_id_then_is_registered_empty_at_epoch_0():
    assert core.decide_init(None, TID, 60_000, -1, -1, []) == NeedProducerIds(1)
    outcome = core.decide_init(None, TID, 60_000, -1, -1, [1000])
    assert isinstance(outcome, Transit) and outcome.to_state is S.EMPTY and outcome.reply is Answer.PRODUCER
    assert (outcome.changes["producer_id"], outcome.changes["producer_epoch"], outcome.changes["txn_timeout_ms"]) == (1000, 0, 60_000)


def test_an_init_of_a_known_id_bumps_the_epoch_and_remembers_only_the_requesters_own():
    new_incarnation = core.decide_init(meta(), TID, 30_000, -1, -1, [])
    assert new_incarnation.changes["producer_epoch"] == 4 and new_incarnation.changes["last_producer_epoch"] == -1
    kip360 = core.decide_init(meta(), TID, 30_000, 7, 3, [])
    assert kip360.changes["producer_epoch"] == 4 and kip360.changes["last_producer_epoch"] == 3


def test_a_retried_kip360_init_answers_the_current_epoch_and_a_stranger_is_fenced():
    after = meta(epoch=4, last_producer_epoch=3)
    assert core.decide_init(after, TID, 60_000, 7, 3, []) == Reply((7, 4))
    assert refused(core.decide_init(after, TID, 60_000, 7, 2, [])) == "PRODUCER_FENCED"
    assert refused(core.decide_init(after, TID, 60_000, 8, 4, [])) == "PRODUCER_FENCED"


def test_an_init_over_an_open_transaction_aborts_it_first_and_a_new_incarnation_fences_twice():
    open_txn = meta(S.ONGOING, partitions=frozenset({TP}))
    own = core.decide_init(open_txn, TID, 60_000, 7, 3, [])
    assert own.to_state is S.PREPARE_ABORT and own.then is Then.COMPLETE and not own.fence
    assert own.changes["producer_epoch"] == 4 and ErrorCode.Name(own.reply.code) == "CONCURRENT_TRANSACTIONS"
    zombie_fenced = core.decide_init(open_txn, TID, 60_000, -1, -1, [])
    assert zombie_fenced.fence and zombie_fenced.to_state is S.PREPARE_ABORT
    assert (zombie_fenced.changes["producer_epoch"], zombie_fenced.changes["last_producer_epoch"]) == (5, 4)


def test_an_exhausted_epoch_takes_a_new_producer_id():
    tired = meta(epoch=PRODUCER_EPOCH_MAX - 1)
    assert core.decide_init(tired, TID, 60_000, -1, -1, []) == NeedProducerIds(1)
    outcome = core.decide_init(tired, TID, 60_000, -1, -1, [2000])
    assert (outcome.changes["producer_id"], outcome.changes["producer_epoch"], outcome.changes["previous_producer_id"]) == (2000, 0, 7)
    fenced = core.decide_init(meta(S.ONGOING, epoch=PRODUCER_EPOCH_MAX - 2), TID, 60_000, -1, -1, [2000])
    assert fenced.fence and (fenced.changes["producer_id"], fenced.changes["last_producer_epoch"]) == (2000, PRODUCER_EPOCH_MAX)


@pytest.mark.parametrize("state", [S.PREPARE_COMMIT, S.PREPARE_ABORT])
def test_an_init_while_the_last_transaction_completes_is_concurrent(state):
    assert refused(core.decide_init(meta(state), TID, 60_000, -1, -1, [])) == "CONCURRENT_TRANSACTIONS"
    assert refused(core.decide_init(meta(pending_state=S.ONGOING), TID, 60_000, -1, -1, [])) == "CONCURRENT_TRANSACTIONS"


# --- AddPartitionsToTxn ------------------------------------------------------------------------


def test_partitions_join_the_transaction_once_and_unknown_ones_are_answered_apart():
    unknown = {("nope", 0): core.error("UNKNOWN_TOPIC_OR_PARTITION", "nope-0 does not exist")}
    first = core.decide_add_partitions(meta(), TID, 7, 3, [TP, ("nope", 0)], unknown, NOW)
    assert first.to_state is S.ONGOING and first.changes == {"partitions": frozenset({TP}), "txn_start_ms": NOW}
    assert first.reply == {TP: None, ("nope", 0): unknown[("nope", 0)]}
    ongoing = meta(S.ONGOING, partitions=frozenset({TP}), txn_start_ms=NOW - 5)
    assert core.decide_add_partitions(ongoing, TID, 7, 3, [TP], {}, NOW) == Reply({TP: None})  # nothing new: no write
    grown = core.decide_add_partitions(ongoing, TID, 7, 3, [("events", 1)], {}, NOW)
    assert grown.changes["txn_start_ms"] == NOW - 5 and grown.changes["partitions"] == {TP, ("events", 1)}


def test_add_partitions_refuses_strangers_zombies_prepared_and_completing_transactions():
    assert refused(core.decide_add_partitions(None, TID, 7, 3, [TP], {}, NOW)) == "INVALID_PRODUCER_ID_MAPPING"
    assert refused(core.decide_add_partitions(meta(), TID, 8, 3, [TP], {}, NOW)) == "INVALID_PRODUCER_ID_MAPPING"
    assert refused(core.decide_add_partitions(meta(), TID, 7, 2, [TP], {}, NOW)) == "PRODUCER_FENCED"
    assert refused(core.decide_add_partitions(meta(), TID, 7, 4, [TP], {}, NOW)) == "INVALID_PRODUCER_EPOCH"
    assert refused(core.decide_add_partitions(meta(S.PREPARED), TID, 7, 3, [TP], {}, NOW)) == "INVALID_TXN_STATE"
    assert refused(core.decide_add_partitions(meta(S.PREPARE_COMMIT), TID, 7, 3, [TP], {}, NOW)) == "CONCURRENT_TRANSACTIONS"



def test_the_next_transactions_adds_are_decided_on_the_completed_state_and_open_it_in_one_record():
    decided = meta(S.PREPARE_COMMIT, epoch=4, last_producer_epoch=3, partitions=frozenset({TP}), txn_start_ms=NOW - 50)
    other = ("events", 1)
    adds = [core.NextAdd(7, 4, (TP,), {}), core.NextAdd(7, 4, (TP, other), {}), core.NextAdd(7, 3, (other,), {})]
    changes, outcomes = core.decide_completion_into_next(decided, adds, NOW)
    assert changes["partitions"] == frozenset({TP, other}) and changes["txn_start_ms"] == NOW  # the next transaction, begun now
    assert changes["prepared_ms"] == -1 and changes["checks_done"] == 0  # and the last one's completion resets
    assert [type(o) for o in outcomes[:2]] == [Transit, Transit] and outcomes[0].reply == {TP: None}
    assert refused(outcomes[2]) == "PRODUCER_FENCED"  # a late add of the decided transaction's epoch
    assert decided.state is S.PREPARE_COMMIT and decided.partitions == frozenset({TP})  # nothing applied: written first


def test_without_an_add_that_opens_the_next_transaction_the_completion_is_written_alone():
    decided = meta(S.PREPARE_ABORT, epoch=4, last_producer_epoch=3, partitions=frozenset({TP}))
    assert core.decide_completion_into_next(decided, [], NOW) == (None, [])
    zombie_and_unknown = [core.NextAdd(7, 3, (TP,), {}), core.NextAdd(7, 4, (("gone", 0),), {("gone", 0): core.error("UNKNOWN_TOPIC_OR_PARTITION", "x")})]
    changes, outcomes = core.decide_completion_into_next(decided, zombie_and_unknown, NOW)
    assert changes is None and refused(outcomes[0]) == "PRODUCER_FENCED"
    assert isinstance(outcomes[1], Reply) and ErrorCode.Name(outcomes[1].value[("gone", 0)].code) == "UNKNOWN_TOPIC_OR_PARTITION"

def test_verification_answers_per_partition_and_fences_a_zombie():
    ongoing = meta(S.ONGOING, partitions=frozenset({TP}))
    answer = core.verify_partitions(ongoing, 7, 3, [TP, ("events", 1)])
    assert answer[TP] is None and ErrorCode.Name(answer[("events", 1)].code) == "INVALID_TXN_STATE"
    assert refused(core.verify_partitions(ongoing, 7, 2, [TP])) == "PRODUCER_FENCED"
    assert ErrorCode.Name(core.verify_partitions(meta(), 7, 3, [TP])[TP].code) == "INVALID_TXN_STATE"  # nothing open


# --- EndTxn ------------------------------------------------------------------------------------


def test_end_txn_decides_with_the_epoch_bumped_and_a_retry_is_answered_from_the_outcome():
    ongoing = meta(S.ONGOING, partitions=frozenset({TP}))
    commit = core.decide_end_txn(ongoing, TID, 7, 3, True, [])
    assert commit.to_state is S.PREPARE_COMMIT and commit.then is Then.COMPLETE and commit.changes["producer_epoch"] == 4
    decided = meta(S.COMPLETE_COMMIT, epoch=4, last_producer_epoch=3)
    assert core.decide_end_txn(decided, TID, 7, 3, True, []) == Reply(Answer.PRODUCER)
    assert refused(core.decide_end_txn(decided, TID, 7, 3, False, [])) == "INVALID_TXN_STATE"
    aborted = replace(decided, state=S.COMPLETE_ABORT)
    assert refused(core.decide_end_txn(aborted, TID, 7, 3, True, [])) == "PRODUCER_FENCED"  # the coordinator aborted it


def test_end_txn_commits_only_an_open_transaction_and_an_empty_abort_still_bumps():
    assert refused(core.decide_end_txn(meta(), TID, 7, 3, True, [])) == "INVALID_TXN_STATE"
    abort = core.decide_end_txn(meta(), TID, 7, 3, False, [])
    assert abort.to_state is S.PREPARE_ABORT and abort.changes["producer_epoch"] == 4


# --- two-phase ---------------------------------------------------------------------------------


def test_prepare_seals_before_answering_and_a_retry_seals_again_without_a_write():
    handle = Handle(TID, 7, 3)
    outcome = core.decide_prepare(meta(S.ONGOING, txn_start_ms=NOW - 9), handle, 1000, NOW, b"db-tx-1")
    assert outcome == Transit(S.PREPARED, {"prepared_ms": NOW, "prepared_timeout_ms": 1000, "txn_start_ms": NOW - 9,
                                           "prepare_metadata": b"db-tx-1", "checks_done": 0, "last_check_ms": -1}, Then.SEAL, handle)
    assert core.decide_prepare(meta(S.PREPARED, prepare_metadata=b"db-tx-1"), handle, 1000, NOW, b"db-tx-1") == Reply(handle, Then.SEAL)


def test_a_prepare_repeated_with_other_metadata_is_refused_not_taken_for_a_retry():
    handle = Handle(TID, 7, 3)
    prepared = meta(S.PREPARED, prepare_metadata=b"db-tx-1")
    assert refused(core.decide_prepare(prepared, handle, 1000, NOW, b"db-tx-2")) == "INVALID_TXN_STATE"
    assert refused(core.decide_prepare(prepared, handle, 1000, NOW)) == "INVALID_TXN_STATE"


def test_a_handle_completes_only_its_prepared_transaction_and_repeats_are_answered():
    handle = Handle(TID, 7, 3)
    assert core.decide_complete(meta(S.PREPARED), handle, True, []).to_state is S.PREPARE_COMMIT
    assert refused(core.decide_complete(meta(S.ONGOING), handle, True, [])) == "INVALID_TXN_STATE"
    assert refused(core.decide_complete(meta(S.PREPARED, epoch=4), handle, True, [])) == "PRODUCER_FENCED"
    committed = meta(S.COMPLETE_COMMIT, epoch=4, last_producer_epoch=3)
    assert core.decide_complete(committed, handle, True, []) == Reply(Answer.PRODUCER)
    assert refused(core.decide_complete(committed, handle, False, [])) == "INVALID_TXN_STATE"
    aborted = replace(committed, state=S.COMPLETE_ABORT)
    assert refused(core.decide_complete(aborted, handle, True, [])) == "PRODUCER_FENCED"


# --- timers ------------------------------------------------------------------------------------


def test_a_transaction_past_its_timeout_is_aborted_and_a_prepared_one_by_its_own_timeout():
    ongoing = meta(S.ONGOING, txn_start_ms=NOW - 60_001)
    assert core.decide_timeout(ongoing, NOW, []).to_state is S.PREPARE_ABORT
    assert core.decide_timeout(replace(ongoing, txn_start_ms=NOW - 60_000), NOW, []) is None
    prepared = meta(S.PREPARED, txn_start_ms=NOW - 10**9, prepared_ms=NOW - 100, prepared_timeout_ms=1000)
    assert core.decide_timeout(prepared, NOW, []) is None  # the transaction timeout does not apply once prepared
    assert core.decide_timeout(replace(prepared, prepared_timeout_ms=99), NOW, []).to_state is S.PREPARE_ABORT
    assert core.decide_timeout(replace(ongoing, pending_state=S.PREPARE_ABORT), NOW, []) is None


# --- CommitTransactionGroup --------------------------------------------------------------------


def member(name, state=S.PREPARED, epoch=3, **fields) -> TransactionMetadata:
    return TransactionMetadata(f"g/{name}", 7, epoch, 60_000, state=state, **fields)


def test_a_group_commits_every_prepared_member_together_or_refuses_whole():
    a, b = member("a"), member("b", epoch=PRODUCER_EPOCH_MAX - 1)
    handles = [Handle("g/a", 7, 3), Handle("g/b", 7, PRODUCER_EPOCH_MAX - 1)]
    assert core.decide_group_commit([a, b], handles, []) == NeedProducerIds(1)  # b's epoch is exhausted
    outcome = core.decide_group_commit([a, b], handles, [2000])
    assert [c["producer_epoch"] for c in outcome.changes] == [4, 0] and outcome.changes[1]["producer_id"] == 2000
    ongoing = replace(b, state=S.ONGOING)
    assert refused(core.decide_group_commit([a, ongoing], handles, [2000])) == "INVALID_TXN_STATE"  # not prepared: nothing


def test_a_repeated_group_commit_is_answered_and_a_half_committed_one_refused():
    handles = [Handle("g/a", 7, 3), Handle("g/b", 7, 3)]
    done = member("a", S.COMPLETE_COMMIT, epoch=4, last_producer_epoch=3)
    assert core.decide_group_commit([done, replace(done, transactional_id="g/b")], handles, []) == Reply()
    assert refused(core.decide_group_commit([done, member("b")], handles, [])) == "INVALID_TXN_STATE"
    aborted = replace(done, state=S.COMPLETE_ABORT)
    assert refused(core.decide_group_commit([aborted, member("b")], handles, [])) == "PRODUCER_FENCED"


def test_a_group_commit_takes_only_its_own_ids_each_once():
    assert refused(core.check_group_request("g", [])) == "INVALID_REQUEST"
    assert refused(core.check_group_request("g", [Handle("h/a", 7, 3)])) == "INVALID_REQUEST"
    assert refused(core.check_group_request("g", [Handle("g/a", 7, 3), Handle("g/a", 7, 3)])) == "INVALID_REQUEST"
    assert core.check_group_request("g", [Handle("g/a", 7, 3), Handle("g/b", 8, 1)]) is None


def test_an_id_idle_past_its_expiration_expires_only_when_settled():
    idle = meta(S.COMPLETE_COMMIT, last_update_ms=NOW - 1001)
    assert core.expired(idle, NOW, 1000) and not core.expired(replace(idle, last_update_ms=NOW - 1000), NOW, 1000)
    assert not core.expired(replace(idle, state=S.ONGOING), NOW, 1000)
    assert not core.expired(replace(idle, pending_state=S.ONGOING), NOW, 1000)
