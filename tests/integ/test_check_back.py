"""Transaction check-back through the real services (issue 19): a checker the
test serves over real gRPC (the application's side, written from the proto
alone, as another language would) answers the coordinator's CheckTransaction
for prepared transactions whose owner went silent."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from support.reads import values
from support.waiting import wait_until

from tests.integ.txn_raw import TxnProducer, retrying
from txlog.protocol import errors
from txlog.v1 import (
    coordinator_pb2,
    partition_pb2,
    transaction_check_pb2,
    transaction_check_pb2_grpc,
)

S = coordinator_pb2
TAKEOVER_TIMEOUT_S = 60  # ZooKeeper session expiry (10 s) + ownership check + load, with room for a slow machine
COMMIT, ABORT, UNKNOWN = (transaction_check_pb2.TRANSACTION_CHECK_ANSWER_COMMIT, transaction_check_pb2.TRANSACTION_CHECK_ANSWER_ABORT,
                          transaction_check_pb2.TRANSACTION_CHECK_ANSWER_UNKNOWN)


class Checker(transaction_check_pb2_grpc.TransactionCheckServiceServicer):
    """An application's checker: ``decide(request)`` gives the answer; every request is kept."""

    def __init__(self, decide):
        self.decide = decide
        self.requests: list[transaction_check_pb2.CheckTransactionRequest] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        transaction_check_pb2_grpc.add_TransactionCheckServiceServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def CheckTransaction(self, request, context):
        self.requests.append(request)
        return transaction_check_pb2.CheckTransactionResponse(answer=self.decide(request))

    def stop(self):
        self.server.stop(grace=None)


@pytest.fixture
def checkers():
    started = []
    yield lambda decide: started.append(Checker(decide)) or started[-1]
    for checker in started:
        checker.stop()


def group_stub(raw, group):
    return TxnProducer(raw, group).coordinator()  # a group's coordinator is its name's


def register(raw, group, address, lease_ms=30_000):
    return retrying(lambda: group_stub(raw, group).RegisterTransactionChecker(
        S.RegisterTransactionCheckerRequest(group_id=group, address=address, lease_ms=lease_ms), timeout=10))


def alter(raw, group, **settings):
    return retrying(lambda: group_stub(raw, group).AlterTransactionGroupConfig(S.AlterTransactionGroupConfigRequest(
        group_id=group, set={k.replace("_", "."): str(v) for k, v in settings.items()}), timeout=10)).configs


def prepared(raw, topic, transactional_id, value, metadata=b""):
    """A producer whose transaction wrote ``value`` to ``topic``-0 and is Prepared with ``metadata``; its owner then goes silent."""
    producer = TxnProducer(raw, transactional_id).init()
    producer.add((topic, 0))
    assert producer.send(topic, 0, value).error.code == 0
    handle = retrying(lambda: producer.coordinator().PrepareTransaction(S.PrepareTransactionRequest(
        transactional_id=transactional_id, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
        prepare_metadata=metadata), timeout=10)).handle
    return producer, handle


def state_is(producer, state):
    return lambda: producer.describe().state == state


def test_a_silent_owners_transaction_is_committed_by_the_checkers_answer_exactly_once(shared_raw, checkers):
    shared_raw.create_topic("orders", 1)
    checker = checkers(lambda r: COMMIT if r.prepare_metadata == b"db-tx-41" else UNKNOWN)
    register(shared_raw, "shop", checker.address)
    alter(shared_raw, "shop", transaction_check_interval_ms=500)
    producer, handle = prepared(shared_raw, "orders", "shop/order-41", "order 41 placed", b"db-tx-41")
    described = producer.describe()
    assert described.state == S.TRANSACTION_STATE_PREPARED and described.prepare_metadata == b"db-tx-41"
    assert described.next_check_time_ms >= described.prepared_time_ms + 500

    wait_until(state_is(producer, S.TRANSACTION_STATE_COMPLETE_COMMIT), message="the check-back's commit")
    wait_until(lambda: values(shared_raw, "orders") == ["order 41 placed"], message="the event, visible once")
    request = checker.requests[0]
    assert (request.transactional_id, request.producer_id, request.producer_epoch) == (handle.transactional_id, handle.producer_id, handle.producer_epoch)
    assert (request.group_id, request.attempt, request.prepare_metadata) == ("shop", 1, b"db-tx-41")
    assert len(checker.requests) == 1  # decided at the first check: never asked again


def test_unknown_answers_are_counted_until_exhausted_then_the_group_policy_applies(shared_raw, checkers):
    shared_raw.create_topic("pending", 1)
    checker = checkers(lambda r: UNKNOWN)
    for group, policy in (("undecided", "abort"), ("patient", "keep")):
        register(shared_raw, group, checker.address)
        alter(shared_raw, group, transaction_check_interval_ms=300, transaction_check_max=3, transaction_check_exhausted=policy)
    aborted, _ = prepared(shared_raw, "pending", "undecided/a", "a")
    kept, _ = prepared(shared_raw, "pending", "patient/k", "k")

    wait_until(state_is(aborted, S.TRANSACTION_STATE_COMPLETE_ABORT), message="the abort once 3 checks decided nothing")
    wait_until(lambda: kept.describe().checks_done == 3, message="the kept transaction's 3 checks")
    described = kept.describe()
    assert described.state == S.TRANSACTION_STATE_PREPARED and described.next_check_time_ms == -1
    assert described.last_check_answer == UNKNOWN
    assert sorted(r.attempt for r in checker.requests if r.group_id == "undecided") == [1, 2, 3]
    assert values(shared_raw, "pending") == []


def test_an_answer_after_the_owner_completed_changes_nothing(shared_raw, checkers):
    shared_raw.create_topic("late-answer", 1)
    asked, release = threading.Event(), threading.Event()

    def slow_abort(request):
        asked.set()
        release.wait(30)
        return ABORT  # the opposite of what the owner decided, and late
    checker = checkers(slow_abort)
    register(shared_raw, "late", checker.address)
    alter(shared_raw, "late", transaction_check_interval_ms=200)
    producer, handle = prepared(shared_raw, "late-answer", "late/t", "kept")
    assert asked.wait(30), "the coordinator never checked back"
    retrying(lambda: producer.coordinator().CompleteTransaction(S.CompleteTransactionRequest(handle=handle, committed=True), timeout=10))
    wait_until(state_is(producer, S.TRANSACTION_STATE_COMPLETE_COMMIT), message="the owner's commit")
    release.set()
    wait_until(lambda: len(checker.requests) == 1 and values(shared_raw, "late-answer") == ["kept"], message="the commit, visible")
    assert producer.describe().state == S.TRANSACTION_STATE_COMPLETE_COMMIT


def test_a_check_answered_for_a_stale_epoch_is_fenced(shared_raw, checkers):
    shared_raw.create_topic("stale", 1)
    asked, release = threading.Event(), threading.Event()

    def answer(request):
        if request.producer_epoch == stale_epoch[0]:
            asked.set()
            release.wait(30)
            return COMMIT  # for the fenced incarnation's transaction
        return UNKNOWN
    stale_epoch = [None]
    checker = checkers(answer)
    register(shared_raw, "fence", checker.address)
    alter(shared_raw, "fence", transaction_check_interval_ms=200, transaction_check_max=1000)
    old, old_handle = prepared(shared_raw, "stale", "fence/t", "old")
    stale_epoch[0] = old_handle.producer_epoch
    assert asked.wait(30)
    new, new_handle = prepared(shared_raw, "stale", "fence/t", "new")  # a new incarnation: fences and aborts the old one
    assert new_handle.producer_epoch > old_handle.producer_epoch
    release.set()
    wait_until(lambda: any(r.producer_epoch == new_handle.producer_epoch for r in checker.requests), message="a check of the new transaction")
    described = new.describe()
    assert described.state == S.TRANSACTION_STATE_PREPARED and described.producer_epoch == new_handle.producer_epoch
    assert values(shared_raw, "stale") == []  # neither the fenced transaction nor the new one committed


def test_with_two_checkers_registered_and_one_gone_the_live_one_decides_at_the_first_check(shared_raw, checkers):
    shared_raw.create_topic("two", 1)
    gone = checkers(lambda r: COMMIT)
    live = checkers(lambda r: COMMIT)
    register(shared_raw, "pair", gone.address)
    register(shared_raw, "pair", live.address)
    gone.stop()  # registered, lease still running, nobody listening
    alter(shared_raw, "pair", transaction_check_interval_ms=200, transaction_check_max=1)
    producer, _ = prepared(shared_raw, "two", "pair/t", "v")
    wait_until(state_is(producer, S.TRANSACTION_STATE_COMPLETE_COMMIT), message="the live checker's commit")
    assert values(shared_raw, "two") == ["v"] and len(live.requests) == 1 and not gone.requests


def test_without_a_registered_checker_nothing_is_checked_or_counted(shared_raw):
    shared_raw.create_topic("nobody", 1)
    alter(shared_raw, "alone", transaction_check_interval_ms=100, transaction_check_max=1)
    producer, _ = prepared(shared_raw, "nobody", "alone/t", "v")
    wait_until(lambda: producer.describe().prepared_time_ms + 1_000 < time.time() * 1000, message="ten intervals")
    described = producer.describe()
    assert described.state == S.TRANSACTION_STATE_PREPARED and described.checks_done == 0


def test_group_settings_are_kept_durably_and_described_with_the_checkers(raw, checkers, txn_cluster):
    checker = checkers(lambda r: UNKNOWN)
    register(raw, "kept", checker.address, lease_ms=60_000)
    configs = alter(raw, "kept", transaction_check_max=7, transaction_check_exhausted="keep")
    assert configs["transaction.check.max"] == "7" and configs["transaction.check.interval.ms"] == "60000"
    described = group_stub(raw, "kept").DescribeTransactionGroupConfig(S.DescribeTransactionGroupConfigRequest(group_id="kept"), timeout=10)
    assert sorted(described.overridden) == ["transaction.check.exhausted", "transaction.check.max"]
    assert [c.address for c in described.checkers] == [checker.address] and 0 < described.checkers[0].lease_remaining_ms <= 60_000
    deleted = retrying(lambda: group_stub(raw, "kept").AlterTransactionGroupConfig(S.AlterTransactionGroupConfigRequest(
        group_id="kept", delete=["transaction.check.exhausted"]), timeout=10)).configs
    assert deleted["transaction.check.exhausted"] == "abort" and deleted["transaction.check.max"] == "7"
    group_stub(raw, "kept").UnregisterTransactionChecker(S.UnregisterTransactionCheckerRequest(group_id="kept", address=checker.address), timeout=10)
    described = group_stub(raw, "kept").DescribeTransactionGroupConfig(S.DescribeTransactionGroupConfigRequest(group_id="kept"), timeout=10)
    assert not described.checkers and list(described.overridden) == ["transaction.check.max"]


@pytest.mark.parametrize("request_, code", [
    (S.RegisterTransactionCheckerRequest(group_id="bad/group", address="127.0.0.1:1"), "INVALID_REQUEST"),
    (S.RegisterTransactionCheckerRequest(group_id="g", address="0.0.0.0:9"), "INVALID_REQUEST"),
    (S.RegisterTransactionCheckerRequest(group_id="g", address="127.0.0.1:0"), "INVALID_REQUEST"),
    (S.RegisterTransactionCheckerRequest(group_id="g", address="no-port"), "INVALID_REQUEST"),
    (S.RegisterTransactionCheckerRequest(group_id="g", address="127.0.0.1:1", lease_ms=10), "INVALID_REQUEST"),
    (S.AlterTransactionGroupConfigRequest(group_id="g", set={"transaction.check.max": "0"}), "INVALID_CONFIG"),
    (S.AlterTransactionGroupConfigRequest(group_id="g", set={"transaction.check.exhausted": "retry"}), "INVALID_CONFIG"),
    (S.AlterTransactionGroupConfigRequest(group_id="g", set={"no.such.key": "1"}), "INVALID_CONFIG"),
    (S.AlterTransactionGroupConfigRequest(group_id="g", set={"transaction.check.max": "5"}, delete=["transaction.check.max"]), "INVALID_CONFIG"),
])
def test_bad_requests_are_refused_with_our_code_and_change_nothing(shared_raw, request_, code):
    stub = group_stub(shared_raw, "g")
    method = {S.RegisterTransactionCheckerRequest: stub.RegisterTransactionChecker,
              S.AlterTransactionGroupConfigRequest: stub.AlterTransactionGroupConfig}[type(request_)]
    with pytest.raises(grpc.RpcError) as info:
        retrying(lambda: method(request_, timeout=10))
    assert errors.from_rpc_error(info.value).name == code
    described = stub.DescribeTransactionGroupConfig(S.DescribeTransactionGroupConfigRequest(group_id="g"), timeout=10)
    assert not described.checkers and not described.overridden


def test_prepare_metadata_over_the_bound_is_refused_and_nothing_is_prepared(shared_raw):
    shared_raw.create_topic("big-meta", 1)
    producer = TxnProducer(shared_raw, "big/t").init()
    producer.add(("big-meta", 0))
    with pytest.raises(grpc.RpcError) as info:
        producer.coordinator().PrepareTransaction(S.PrepareTransactionRequest(
            transactional_id="big/t", producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
            prepare_metadata=b"x" * 4097), timeout=10)
    assert errors.from_rpc_error(info.value).name == "INVALID_REQUEST"
    assert producer.describe().state == S.TRANSACTION_STATE_ONGOING


def owner_of(raw, group) -> str | None:
    """The address of the coordinator owning ``group``'s transaction log partition, None while it has none."""
    found = raw.metadata(partition_pb2.MetadataRequest(transactional_ids=[group])).transaction_coordinators[0]
    return found.address if found.error.code == 0 else None


def test_the_check_count_survives_a_coordinator_failover_and_the_new_owner_asks_the_next_attempt(raw, checkers, txn_cluster):
    raw.create_topic("failover", 1)
    owner_gone, decided = threading.Event(), threading.Event()

    def first_owners_checker(request):
        if request.attempt >= 3:
            owner_gone.wait(TAKEOVER_TIMEOUT_S)  # the third check stays unanswered until its coordinator is killed
        return UNKNOWN
    first = checkers(first_owners_checker)
    second = checkers(lambda r: COMMIT if decided.is_set() else UNKNOWN)
    register(raw, "fo", first.address)
    alter(raw, "fo", transaction_check_interval_ms=300, transaction_check_max=1000, transaction_check_timeout_ms=60_000)
    producer, handle = prepared(raw, "failover", "fo/t", "once")
    old_owner = owner_of(raw, "fo")
    try:
        wait_until(lambda: producer.describe().checks_done == 2, message="two checks answered UNKNOWN at the first owner")
        wait_until(lambda: [r.attempt for r in first.requests] == [1, 2, 3], message="the first owner's third check, in flight")
        txn_cluster.kill(next(n for n, info in txn_cluster.state.services.items() if info.address == old_owner))  # SIGKILL
    finally:
        owner_gone.set()
    # Registrations live in the coordinator's memory: the application registers again at the new owner (its renewal loop would).
    wait_until(lambda: owner_of(raw, "fo") not in (None, old_owner), TAKEOVER_TIMEOUT_S, message="another coordinator owning the group")
    wait_until(lambda: register(raw, "fo", second.address).lease_ms > 0, TAKEOVER_TIMEOUT_S, message="the checker registered at the new owner")

    wait_until(lambda: len(second.requests) >= 2, TAKEOVER_TIMEOUT_S, message="two checks by the new owner")
    # the third check died with the first owner unanswered, so uncounted: the new owner asks it again, then the fourth
    assert [r.attempt for r in second.requests[:2]] == [3, 4]
    assert {(r.transactional_id, r.producer_id, r.producer_epoch, r.group_id) for r in second.requests} == {
        (handle.transactional_id, handle.producer_id, handle.producer_epoch, "fo")}
    assert len({r.prepared_time_ms for r in first.requests + second.requests}) == 1
    wait_until(lambda: producer.describe().checks_done >= 4, message="the new owner's count")
    assert [r.attempt for r in first.requests] == [1, 2, 3]  # the first owner's checker was asked nothing since

    decided.set()  # the application's database now says the transaction committed
    wait_until(state_is(producer, S.TRANSACTION_STATE_COMPLETE_COMMIT), message="the check-back's commit at the new owner")
    wait_until(lambda: values(raw, "failover") == ["once"], message="the record, visible to read_committed")
    attempts = [r.attempt for r in second.requests]
    assert attempts == list(range(3, 3 + len(attempts))), attempts  # one attempt each, counting on from the first owner's
    assert values(raw, "failover") == ["once"]
