"""Two-phase participation through the real services: PrepareTransaction (a
Prepared state that outlives the transaction timeout and has its own),
CompleteTransaction by handle from any process, CommitTransactionGroup (one
decision record for every member, finished by the next owner after a crash),
the fence of a prepared transaction by a new producer, and the CLI.

Visibility is always checked on the partitions themselves (read_committed and
read_uncommitted fetches, the last stable offset); every wait polls with a
deadline."""

import json
import signal
import subprocess
import sys
import time

import grpc
import pytest
from support.errors import failure_name
from support.reads import COMMITTED, UNCOMMITTED, values
from support.waiting import wait_until

from coordinator_svc.transaction_state import GroupDecision, Handle
from coordinator_svc.txn_log import DECISION_KEY_PREFIX
from services.coordination import coordinators
from txlog import Admin, Producer
from txlog.protocol import TRANSACTION_STATE_TOPIC, errors
from txlog.protocol.hashing import partition_for_id
from txlog.structs import TransactionHandle, TransactionListing
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, partition_pb2

STATE_TOPIC = TRANSACTION_STATE_TOPIC
PREPARED_TIMEOUT_MS_DEFAULT = 24 * 3600 * 1000  # the coordinator's --prepared-transaction-timeout-ms default
TAKEOVER_TIMEOUT_S = 60  # ZooKeeper session expiry (10 s) + ownership check + load, with room for a slow machine


@pytest.fixture
def admin(txn_cluster):
    with Admin(txn_cluster.state.bootstrap, default_api_timeout_ms=30_000) as client:
        yield client


# --- helpers -----------------------------------------------------------------------------


def prepare(bootstrap, transactional_id, writes, *, prepared_timeout_ms=0, commit_first=None) -> TransactionHandle:
    """A producer with a 1 s transaction timeout writes ``writes`` [(topic, partition, value)] in a
    transaction and prepares it; with ``commit_first`` it first commits a transaction of that value."""
    with Producer(bootstrap, transactional_id=transactional_id, transaction_timeout_ms=1000) as producer:
        producer.init_transactions()
        if commit_first is not None:
            producer.begin_transaction()
            producer.send(commit_first[0], value=commit_first[2].encode(), partition=commit_first[1])
            producer.commit_transaction()
        producer.begin_transaction()
        for topic, partition, value in writes:
            producer.send(topic, value=value.encode(), partition=partition)
        return producer.prepare_transaction(prepared_timeout_ms)


def offsets(raw, topic, partition) -> tuple[int, int]:
    """(last stable offset, high watermark)."""
    result = raw.fetch(topic, partition, 0)
    assert result.error.code == 0, result.error
    return result.last_stable_offset, result.high_watermark


def describe(admin, transactional_id):
    return admin.describe_transactions([transactional_id])[0]


def wait_state(admin, transactional_id, state, timeout_s=20):
    return wait_until(lambda: (lambda d: d if d.state == state else None)(describe(admin, transactional_id)),
                    timeout_s, f"{transactional_id} to be {state}")


def coordinator_address(raw, key) -> str | None:
    """The address of the coordinator of a transactional id or group, None when it has none right now."""
    found = raw.metadata(partition_pb2.MetadataRequest(transactional_ids=[key])).transaction_coordinators[0]
    return found.address if found.error.code == 0 else None


def coordinator_stub(raw, address) -> coordinator_pb2_grpc.CoordinatorServiceStub:
    channel = raw._channels.setdefault(address, grpc.insecure_channel(address))
    return coordinator_pb2_grpc.CoordinatorServiceStub(channel)


def name_of(cluster, address) -> str:
    return next(name for name, info in cluster.state.services.items() if info.address == address)


def decisions_in(records) -> dict[bytes, list[common_pb2.Record]]:
    """The group decision records among a transaction log's ``records``, by key, in log order."""
    found: dict[bytes, list[common_pb2.Record]] = {}
    for record in records:
        if record.key.startswith(DECISION_KEY_PREFIX):
            found.setdefault(record.key, []).append(record)
    return found


def decision_records(raw, index) -> dict[bytes, list[common_pb2.Record]]:
    """The group decision records in a __transaction_state partition, from its log start
    (the coordinator moves it on past what it no longer needs)."""
    return decisions_in(raw.read_from_log_start(STATE_TOPIC, index)[1])


def decided_then_removed(raw, index, expected_members) -> bool:
    """True when the partition holds one decision, naming ``expected_members``, and its tombstone
    last; or none any more, its log start having moved past both (the decision was written: the
    group's members committed). The state topic is compacted: once the tombstone is below the
    LSO, compaction may delete the decision record before the tombstone, which stays."""
    start, records = raw.read_from_log_start(STATE_TOPIC, index)
    found = decisions_in(records)
    if not found and start > 0:
        return True
    if len(found) != 1:
        return False
    [(key, records)] = found.items()
    if records[-1].HasField("value"):
        return False
    for record in records[:-1]:
        assert record.HasField("value"), records  # one decision, one tombstone
        decision = GroupDecision.decode(key[len(DECISION_KEY_PREFIX):].decode(), record.value)
        assert decision.members == tuple(Handle(*h) for h in expected_members), decision
    return True


# --- 1. the Prepared state outlives the transaction timeout --------------------------------


def test_a_prepared_transaction_outlives_the_transaction_timeout_until_its_handle_commits_it(raw, admin, txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    raw.create_topic("held", 1)
    raw.create_topic("held-control", 1)
    tid = "p1/held"
    handle = prepare(bootstrap, tid, [("held", 0, f"held-{i}") for i in range(3)])
    assert handle.transactional_id == tid and handle.group == "p1"
    # a control transaction of the same group (same coordinator, same timer) with the same 1 s timeout, left Ongoing
    control = Producer(bootstrap, transactional_id="p1/control", transaction_timeout_ms=1000)
    try:
        control.init_transactions()
        control.begin_transaction()
        control.send("held-control", value=b"control", partition=0)
        control.flush()
        prepared = describe(admin, tid)
        assert (prepared.state, prepared.producer_id, prepared.producer_epoch) == ("Prepared", handle.producer_id, handle.producer_epoch)
        assert prepared.transaction_timeout_ms == 1000
        assert prepared.prepared_time_ms >= prepared.transaction_start_time_ms > 0, prepared
        assert prepared.prepared_timeout_ms == PREPARED_TIMEOUT_MS_DEFAULT, prepared
        wait_state(admin, "p1/control", "CompleteAbort", 15)  # the timer aborted the Ongoing one
    finally:
        control.close()
    # ... and the prepared one survives three of its transaction timeouts (the property is a length of time:
    # a slower machine only waits longer; the control's abort shows the timer runs)
    time.sleep(max(0.0, prepared.prepared_time_ms / 1000 + 3 - time.time()))
    assert describe(admin, tid) == prepared
    assert values(raw, "held", 0, COMMITTED) == []
    assert values(raw, "held", 0, UNCOMMITTED) == ["held-0", "held-1", "held-2"]
    assert offsets(raw, "held", 0) == (0, 4)  # it holds the last stable offset at its first record (3 records, the seal)
    assert raw.list_offset("held", 0, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset == 0
    assert admin.list_transactions(states=["Prepared"], prefix="p1/") == [
        TransactionListing(tid, handle.producer_id, "Prepared", handle.producer_epoch)]
    assert admin.list_transactions(states=["Prepared"], prefix="p1/")[0].handle == handle
    assert admin.find_hanging(["held"], max_transaction_timeout_ms=1000) == []  # it waits for its handle: not hanging

    admin.complete_transaction(handle, True)
    wait_until(lambda: values(raw, "held", 0, COMMITTED) == ["held-0", "held-1", "held-2"], 15, "the commit")
    done = wait_state(admin, tid, "CompleteCommit")
    assert (done.producer_id, done.producer_epoch) == (handle.producer_id, handle.producer_epoch + 1)
    assert (done.prepared_time_ms, done.prepared_timeout_ms, done.transaction_start_time_ms) == (-1, 0, -1)
    assert offsets(raw, "held", 0) == (5, 5)  # three records, the PREPARED seal and the COMMIT marker


# --- 2. the prepared timeout aborts --------------------------------------------------------


def test_the_prepared_timeout_aborts_and_the_handle_can_then_only_abort(raw, admin, txn_cluster):
    raw.create_topic("expire", 1)
    tid = "p2/expiring"
    handle = prepare(txn_cluster.state.bootstrap, tid, [("expire", 0, "e-0"), ("expire", 0, "e-1")], prepared_timeout_ms=1500)
    first = describe(admin, tid)
    assert (first.state, first.prepared_timeout_ms) == ("Prepared", 1500), first
    seen = []

    def aborted():
        assert values(raw, "expire", 0, COMMITTED) == []  # never visible to read_committed, at any point
        described = describe(admin, tid)
        now_ms = time.time() * 1000
        seen.append((now_ms, described.state))
        if now_ms < first.prepared_time_ms + 1300:  # well before its prepared timeout: still Prepared
            assert described.state == "Prepared", seen
        return described if described.state == "CompleteAbort" else None

    after = wait_until(aborted, 20, "the prepared timeout to abort it")
    assert seen[-1][0] >= first.prepared_time_ms + 1500, seen
    assert (after.producer_id, after.producer_epoch) == (handle.producer_id, handle.producer_epoch + 1)
    wait_until(lambda: offsets(raw, "expire", 0) == (4, 4), 10, "the ABORT marker")  # 2 records, the seal, the marker
    assert values(raw, "expire", 0, COMMITTED) == []
    assert values(raw, "expire", 0, UNCOMMITTED) == ["e-0", "e-1"]

    assert failure_name(lambda: admin.complete_transaction(handle, True)) == "PRODUCER_FENCED"
    admin.complete_transaction(handle, False)  # it was aborted: aborting it again is a repeat
    admin.complete_transaction(handle, False)
    assert describe(admin, tid) == after
    assert offsets(raw, "expire", 0) == (4, 4) and values(raw, "expire", 0, COMMITTED) == []


# --- 3. CompleteTransaction: repeats, refusals, bad input -----------------------------------


def test_complete_transaction_repeats_and_every_refusal_change_nothing(raw, admin, txn_cluster):
    raw.create_topic("once", 1)
    tid = "p3/once"
    handle = prepare(txn_cluster.state.bootstrap, tid, [("once", 0, "second")], commit_first=("once", 0, "first"))
    assert handle.producer_epoch == 1  # the first transaction's commit bumped it
    prepared = describe(admin, tid)
    assert prepared.state == "Prepared"
    stale = handle._replace(producer_epoch=handle.producer_epoch - 1)
    newer = handle._replace(producer_epoch=handle.producer_epoch + 1)
    wrong_producer = handle._replace(producer_id=handle.producer_id + 1000)
    unknown = TransactionHandle("p3/never-initialised", handle.producer_id, 0)
    address = coordinator_address(raw, tid)
    stub = coordinator_stub(raw, address)

    def unchanged(description, committed, high_watermark):
        assert describe(admin, tid) == description
        assert values(raw, "once", 0, COMMITTED) == committed
        assert offsets(raw, "once", 0)[1] == high_watermark

    refusals = [
        (lambda: admin.complete_transaction(stale, True), "PRODUCER_FENCED"),
        (lambda: admin.complete_transaction(stale, False), "PRODUCER_FENCED"),
        (lambda: admin.complete_transaction(newer, True), "INVALID_PRODUCER_EPOCH"),
        (lambda: admin.complete_transaction(wrong_producer, True), "INVALID_PRODUCER_ID_MAPPING"),
        (lambda: admin.complete_transaction(unknown, True), "INVALID_PRODUCER_ID_MAPPING"),
        (lambda: admin.complete_transaction(unknown, False), "INVALID_PRODUCER_ID_MAPPING"),
    ]
    for call, expected in refusals:
        assert failure_name(call) == expected
        unchanged(prepared, ["first"], 4)  # first, its marker, second, its PREPARED seal

    # bad input straight to the coordinator
    def complete_raw(transactional_id, committed=True):
        request = coordinator_pb2.CompleteTransactionRequest(handle=coordinator_pb2.TransactionHandle(
            transactional_id=transactional_id, producer_id=handle.producer_id, producer_epoch=handle.producer_epoch), committed=committed)
        return lambda: stub.CompleteTransaction(request, timeout=10)

    def prepare_raw(prepared_timeout_ms):
        request = coordinator_pb2.PrepareTransactionRequest(transactional_id=tid, producer_id=handle.producer_id,
                                                            producer_epoch=handle.producer_epoch, prepared_timeout_ms=prepared_timeout_ms)
        return lambda: stub.PrepareTransaction(request, timeout=10)

    for bad_id in ("", "bad id!", "p3/" + "x" * 300, "/member", "p3/once\n"):
        with pytest.raises(grpc.RpcError) as info:
            complete_raw(bad_id)()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad_id
        assert errors.from_rpc_error(info.value).name == "INVALID_TRANSACTIONAL_ID", bad_id
    for bad_timeout in (PREPARED_TIMEOUT_MS_DEFAULT + 1, -1, -PREPARED_TIMEOUT_MS_DEFAULT):
        with pytest.raises(grpc.RpcError) as info:
            prepare_raw(bad_timeout)()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad_timeout
        assert errors.from_rpc_error(info.value).name == "INVALID_TRANSACTION_TIMEOUT", bad_timeout
    for bad_group, handles in (("", [handle]), ("p3", []), ("p3/once", [handle]), ("other", [handle]), ("p3", [handle, handle])):
        request = coordinator_pb2.CommitTransactionGroupRequest(group_id=bad_group, handles=[
            coordinator_pb2.TransactionHandle(transactional_id=h.transactional_id, producer_id=h.producer_id, producer_epoch=h.producer_epoch)
            for h in handles])
        assert failure_name(lambda r=request: stub.CommitTransactionGroup(r, timeout=10)) == "INVALID_REQUEST", (bad_group, handles)
    unchanged(prepared, ["first"], 4)
    # a repeated PrepareTransaction of the prepared transaction is a retry: it changes nothing either
    assert stub.PrepareTransaction(coordinator_pb2.PrepareTransactionRequest(
        transactional_id=tid, producer_id=handle.producer_id, producer_epoch=handle.producer_epoch), timeout=10).handle.producer_epoch == handle.producer_epoch
    unchanged(prepared, ["first"], 4)  # the repeated seal wrote nothing

    admin.complete_transaction(handle, True)
    wait_until(lambda: values(raw, "once", 0, COMMITTED) == ["first", "second"], 15, "the commit")
    committed = wait_state(admin, tid, "CompleteCommit")
    assert committed.producer_epoch == handle.producer_epoch + 1
    admin.complete_transaction(handle, True)  # a repeat: OK
    reply = complete_raw(tid)()
    assert (reply.producer_id, reply.producer_epoch) == (committed.producer_id, committed.producer_epoch)
    after_commit = [
        (lambda: admin.complete_transaction(handle, False), "INVALID_TXN_STATE"),  # abort after commit
        (lambda: admin.complete_transaction(stale, True), "PRODUCER_FENCED"),
        (lambda: admin.complete_transaction(wrong_producer, False), "INVALID_PRODUCER_ID_MAPPING"),
        (lambda: admin.complete_transaction(unknown, True), "INVALID_PRODUCER_ID_MAPPING"),
    ]
    for call, expected in after_commit:
        assert failure_name(call) == expected
        unchanged(committed, ["first", "second"], 5)  # first, marker, second, seal, marker
    # A later transaction of the same id (same coordinator, same partition leader): its COMMIT marker is
    # written after any marker a repeat had sent, so once it is visible the log shows whether there was one.
    with Producer(txn_cluster.state.bootstrap, transactional_id=tid) as later:
        later.init_transactions()
        later.begin_transaction()
        later.send("once", value=b"third", partition=0)
        later.commit_transaction()
    wait_until(lambda: values(raw, "once", 0, COMMITTED) == ["first", "second", "third"], 15, "the later commit")
    assert offsets(raw, "once", 0)[1] == 7  # ..., third, its marker: no second COMMIT marker from the repeats
    assert values(raw, "once", 0, UNCOMMITTED) == ["first", "second", "third"]  # the data is there once


# --- 4. CommitTransactionGroup ----------------------------------------------------------------


def test_a_group_commit_is_all_or_nothing_and_takes_only_its_own_prepared_members(raw, admin, txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    raw.create_topic("grouped", 2)
    leaders = raw.leaders("grouped")
    assert leaders[0] != leaders[1]  # the members' transactions span both partition_svc instances
    members = ["g1/a", "g1/b", "g1/c"]
    handles = [prepare(bootstrap, tid, [("grouped", p, f"{tid}-{p}") for p in (0, 1)]) for tid in members]
    assert {h.group for h in handles} == {"g1"}

    # every member, and the group itself, lives on one transaction log partition and its coordinator
    count = len(raw.leaders(STATE_TOPIC))
    index = partition_for_id("g1", count)
    assert {coordinators.transaction_log_partition(t, count) for t in members} == {index}
    any_coordinator = coordinator_stub(raw, next(i.address for i in txn_cluster.state.services.values() if i.kind == "coordinator_svc"))
    found = [any_coordinator.FindCoordinator(coordinator_pb2.FindCoordinatorRequest(key=k), timeout=10) for k in [*members, "g1"]]
    assert {(f.coordinator_id, f.address, f.partition, f.coordinator_epoch) for f in found} == {
        (found[0].coordinator_id, found[0].address, index, found[0].coordinator_epoch)}
    metadata = raw.metadata(partition_pb2.MetadataRequest(transactional_ids=[*members, "g1"])).transaction_coordinators
    assert [m.error.code for m in metadata] == [0] * 4 and {m.address for m in metadata} == {found[0].address}
    assert [x.handle for x in admin.list_transactions(states=["Prepared"], prefix="g1/")] == handles
    assert values(raw, "grouped", 0, COMMITTED) == [] and values(raw, "grouped", 1, COMMITTED) == []

    admin.commit_transaction_group("g1", handles)
    for p in (0, 1):
        wait_until(lambda p=p: values(raw, "grouped", p, COMMITTED) == [f"{t}-{p}" for t in members], 15, f"the group on partition {p}")
    for tid, handle in zip(members, handles, strict=True):
        done = wait_state(admin, tid, "CompleteCommit")
        assert (done.producer_id, done.producer_epoch) == (handle.producer_id, handle.producer_epoch + 1)
    wait_until(lambda: decided_then_removed(raw, index, handles), 10, "the decision record and its tombstone")
    for p in (0, 1):
        # 3 records, 3 seals, 3 markers each
        wait_until(lambda p=p: offsets(raw, "grouped", p) == (9, 9), 10, "every marker")
    committed_a = describe(admin, "g1/a")

    admin.commit_transaction_group("g1", handles)  # a repeat: OK
    admin.commit_transaction_group("g1", handles[1:])  # every one named is committed already: OK
    admin.complete_transaction(handles[1], True)  # one member's commit, repeated alone: OK
    # a member committed by the group decision cannot be aborted
    assert failure_name(lambda: admin.complete_transaction(handles[0], False)) == "INVALID_TXN_STATE"
    assert describe(admin, "g1/a") == committed_a
    assert len(decision_records(raw, index)) == 1  # no repeat wrote a new decision

    # the second round: g1/d and g1/e, and g2/x of another group, all prepared
    d, e = (prepare(bootstrap, f"g1/{m}", [("grouped", p, f"g1/{m}-{p}") for p in (0, 1)]) for m in "de")
    x = prepare(bootstrap, "g2/x", [("grouped", 0, "g2/x-0")])
    second_round = {"g1/d": d, "g1/e": e, "g2/x": x}
    before = {tid: describe(admin, tid) for tid in second_round}
    assert {b.state for b in before.values()} == {"Prepared"}
    visible = {p: values(raw, "grouped", p, COMMITTED) for p in (0, 1)}

    def nothing_decided():
        assert {tid: describe(admin, tid) for tid in second_round} == before
        assert {p: values(raw, "grouped", p, COMMITTED) for p in (0, 1)} == visible
        assert len(decision_records(raw, index)) == 1

    refused = [
        (lambda: admin.commit_transaction_group("g1", [d, e, x]), "INVALID_REQUEST"),  # a handle of group g2
        (lambda: admin.commit_transaction_group("g2", [x, d]), "INVALID_REQUEST"),  # a handle of group g1
        (lambda: admin.commit_transaction_group("g1", [d, e, d]), "INVALID_REQUEST"),  # an id twice
        (lambda: admin.commit_transaction_group("g1", [handles[0], d, e]), "INVALID_TXN_STATE"),  # committed and prepared
        # e is at its first epoch (0): one below it is no epoch at all; a stale epoch is fenced further down
        (lambda: admin.commit_transaction_group("g1", [d, e._replace(producer_epoch=e.producer_epoch - 1)]), "INVALID_REQUEST"),
    ]
    for call, expected in refused:
        assert failure_name(call) == expected
        nothing_decided()

    admin.complete_transaction(d, False)  # one member is aborted first
    wait_state(admin, "g1/d", "CompleteAbort")
    before["g1/d"] = describe(admin, "g1/d")
    for group_handles in ([d, e], [e, d]):
        assert failure_name(lambda h=group_handles: admin.commit_transaction_group("g1", h)) == "PRODUCER_FENCED"
        nothing_decided()  # g1/e is still Prepared: nothing was decided
    assert describe(admin, "g1/e").state == "Prepared"

    admin.complete_transaction(e, False)
    admin.complete_transaction(x, False)
    wait_state(admin, "g1/e", "CompleteAbort")
    wait_state(admin, "g2/x", "CompleteAbort")
    for p in (0, 1):
        wait_until(lambda p=p: (lambda lso, hw: lso == hw)(*offsets(raw, "grouped", p)), 10, "the ABORT markers")
        assert values(raw, "grouped", p, COMMITTED) == visible[p] == [f"{t}-{p}" for t in members]
    assert values(raw, "grouped", 0, UNCOMMITTED) == [f"{t}-0" for t in members] + ["g1/d-0", "g1/e-0", "g2/x-0"]
    assert values(raw, "grouped", 1, UNCOMMITTED) == [f"{t}-1" for t in members] + ["g1/d-1", "g1/e-1"]
    assert failure_name(lambda: admin.commit_transaction_group("g1", [e])) == "PRODUCER_FENCED"


# --- 5. a new producer fences a prepared transaction ---------------------------------------


def test_a_new_producer_with_the_id_fences_and_aborts_the_prepared_transaction(raw, admin, txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    raw.create_topic("fenced", 1)
    tid = "p5/job"
    handle = prepare(bootstrap, tid, [("fenced", 0, "old")])
    stub = coordinator_stub(raw, coordinator_address(raw, tid))
    init = coordinator_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1)
    assert failure_name(lambda: stub.InitProducerId(init, timeout=10)) == "CONCURRENT_TRANSACTIONS"  # aborting the prepared one
    aborted = wait_state(admin, tid, "CompleteAbort")
    assert (aborted.producer_id, aborted.producer_epoch) == (handle.producer_id, handle.producer_epoch + 2)  # fenced: bumped twice
    wait_until(lambda: offsets(raw, "fenced", 0) == (3, 3), 10, "the ABORT marker")  # the record, its seal, the marker
    assert values(raw, "fenced", 0, COMMITTED) == [] and values(raw, "fenced", 0, UNCOMMITTED) == ["old"]
    for committed in (True, False):  # fenced: the handle's epoch is neither current nor last, not even for an abort
        assert failure_name(lambda c=committed: admin.complete_transaction(handle, c)) == "PRODUCER_FENCED"
    assert describe(admin, tid) == aborted

    with Producer(bootstrap, transactional_id=tid, transaction_timeout_ms=1000) as successor:
        successor.init_transactions()
        registered = describe(admin, tid)
        assert (registered.state, registered.producer_id, registered.producer_epoch) == ("Empty", handle.producer_id, handle.producer_epoch + 3)
        for committed in (True, False):  # the id moved on: the handle names nothing any more
            assert failure_name(lambda c=committed: admin.complete_transaction(handle, c)) == "PRODUCER_FENCED"
        successor.begin_transaction()
        successor.send("fenced", value=b"new", partition=0)
        successor.commit_transaction()
    wait_until(lambda: values(raw, "fenced", 0, COMMITTED) == ["new"], 15, "the successor's commit")
    assert values(raw, "fenced", 0, UNCOMMITTED) == ["old", "new"]


# --- 6. a coordinator dies between the decision and the markers ------------------------------


def test_a_group_commit_decided_before_its_coordinator_died_is_finished_by_the_other(raw, txn_cluster):
    cluster = txn_cluster
    raw.create_topic("decided", 2)
    leaders = raw.leaders("decided")
    partition_svcs = sorted(i.address for i in cluster.state.services.values() if i.kind == "partition_svc")
    # pause the partition_svc coordinators do not ask for metadata (they ask the first live address), so only
    # the markers to its partition hang
    live_address, paused_address = partition_svcs[0], partition_svcs[-1]
    assert sorted(leaders.values()) == partition_svcs
    [paused_partition] = [p for p, a in leaders.items() if a == paused_address]
    [live_partition] = [p for p, a in leaders.items() if a == live_address]
    state_leaders = raw.leaders(STATE_TOPIC)
    count = len(state_leaders)
    # a group whose transaction log is on the partition_svc that stays up: the decision is written while the other is paused
    group = next(f"dg{i}" for i in range(1000) if state_leaders[partition_for_id(f"dg{i}", count)] == live_address)
    index = partition_for_id(group, count)
    members = [f"{group}/{m}" for m in "abc"]
    handles = [prepare(cluster.state.bootstrap, tid, [("decided", p, f"{tid}-{p}") for p in (0, 1)]) for tid in members]
    old_address = coordinator_address(raw, group)
    old_name = name_of(cluster, old_address)
    old_epoch = coordinator_stub(raw, old_address).FindCoordinator(coordinator_pb2.FindCoordinatorRequest(key=group), timeout=10).coordinator_epoch
    paused_name = name_of(cluster, paused_address)
    live_stub = raw.stub(live_address)
    expected = {p: [f"{t}-{p}" for t in members] for p in (0, 1)}

    cluster.kill(paused_name, signal.SIGSTOP)
    try:
        with Admin(live_address) as admin:
            admin.commit_transaction_group(group, handles, timeout_s=20)  # returns once the decision is durable
        # the leader that is up acknowledges its markers: the decision is being carried out
        wait_until(lambda: values(raw, "decided", live_partition, COMMITTED, stub=live_stub) == expected[live_partition], 15,
                 "the markers on the partition_svc that is up")
        cluster.kill(old_name)  # SIGKILL, with the paused leader's markers unacknowledged
    finally:
        cluster.kill(paused_name, signal.SIGCONT)

    with Admin(cluster.state.bootstrap, default_api_timeout_ms=30_000) as admin:
        for tid, handle in zip(members, handles, strict=True):
            done = wait_state(admin, tid, "CompleteCommit", TAKEOVER_TIMEOUT_S)
            assert (done.producer_id, done.producer_epoch) == (handle.producer_id, handle.producer_epoch + 1)
        for p in (0, 1):
            assert values(raw, "decided", p, COMMITTED) == expected[p]
            # 3 records each, none written twice; every transaction closed (its seal, its marker, and the new
            # owner's re-sent marker where it recorded a higher coordinator epoch: control batches readers skip)
            assert values(raw, "decided", p, UNCOMMITTED) == expected[p]
            lso, hw = offsets(raw, "decided", p)
            assert lso == hw and 9 <= hw <= 12, (lso, hw)
        # only the other coordinator can have finished it
        new_address = wait_until(lambda: (lambda a: a if a != old_address else None)(coordinator_address(raw, group)), 20, "routing to the new owner")
        found = coordinator_stub(raw, new_address).FindCoordinator(coordinator_pb2.FindCoordinatorRequest(key=group), timeout=10)
        assert (found.partition, found.address) == (index, new_address) and found.coordinator_epoch > old_epoch
        wait_until(lambda: decided_then_removed(raw, index, handles), 10, "the decision's tombstone")
        assert {t.state for t in admin.list_transactions(prefix=f"{group}/")} == {"CompleteCommit"}
        admin.commit_transaction_group(group, handles)  # a repeat at the new owner: OK
        assert failure_name(lambda: admin.complete_transaction(handles[0], False)) == "INVALID_TXN_STATE"


def test_a_decision_record_found_at_load_commits_the_members_it_names_and_only_them(raw, txn_cluster):
    cluster = txn_cluster
    raw.create_topic("resumed", 1)
    group, named, bystander = "rg", ["rg/a", "rg/b"], "rg/c"
    handles = {tid: prepare(cluster.state.bootstrap, tid, [("resumed", 0, tid)]) for tid in [*named, bystander]}
    count = len(raw.leaders(STATE_TOPIC))
    index = partition_for_id(group, count)
    owner_name = name_of(cluster, coordinator_address(raw, group))
    with Admin(cluster.state.bootstrap) as admin:
        bystander_before = describe(admin, bystander)
    assert bystander_before.state == "Prepared"
    decision = GroupDecision("test-decision", group, tuple(Handle(*handles[t]) for t in named), int(time.time() * 1000))

    # a crash right after the decision record: nothing of the members moved yet. Written as the owner's log
    # producer would write it (only it may write there), with the owner paused so that nothing else is written.
    cluster.kill(owner_name, signal.SIGSTOP)
    try:
        (writer,) = [p for p in raw.producers(STATE_TOPIC, index).producers if p.last_sequence >= 0]
        batch = common_pb2.RecordBatch(producer_id=writer.producer_id, producer_epoch=writer.producer_epoch,
                                       base_sequence=writer.last_sequence + 1,
                                       records=[common_pb2.Record(key=b"#decision:test-decision", value=decision.encode())])
        result = raw.produce(STATE_TOPIC, index, batch)
        assert result.error.code == 0, result.error
    finally:
        cluster.kill(owner_name)  # SIGKILL, paused or not
    cluster.start(owner_name)

    with Admin(cluster.state.bootstrap, default_api_timeout_ms=30_000) as admin:
        for tid in named:
            done = wait_state(admin, tid, "CompleteCommit", TAKEOVER_TIMEOUT_S)
            assert (done.producer_id, done.producer_epoch) == (handles[tid].producer_id, handles[tid].producer_epoch + 1)
        wait_until(lambda: values(raw, "resumed", 0, COMMITTED) == named, 15, "the named members' commit")
        # of the group, prepared, but not named: untouched, reloaded as it was (its prepared time and timeout too)
        assert describe(admin, bystander) == bystander_before
        assert (bystander_before.producer_id, bystander_before.producer_epoch) == handles[bystander][1:]
        assert values(raw, "resumed", 0, UNCOMMITTED) == [*named, bystander]
        # the bystander holds the last stable offset at its record (each member: its record, its seal)
        assert offsets(raw, "resumed", 0)[0] == 4
        wait_until(lambda: decided_then_removed(raw, index, [handles[t] for t in named]), 10, "the decision's tombstone")
        assert decision_records(raw, index).keys() == {b"#decision:test-decision"}
        assert {(t.transactional_id, t.state) for t in admin.list_transactions(prefix="rg/")} == {
            ("rg/a", "CompleteCommit"), ("rg/b", "CompleteCommit"), ("rg/c", "Prepared")}

        admin.complete_transaction(handles[bystander], False)
        wait_state(admin, bystander, "CompleteAbort")
        wait_until(lambda: (lambda lso, hw: lso == hw)(*offsets(raw, "resumed", 0)), 10, "the bystander's ABORT marker")
        assert values(raw, "resumed", 0, COMMITTED) == named


# --- 7. the CLI -------------------------------------------------------------------------------


def txlog(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "txlog.cli", *args], capture_output=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def test_cli_lists_prepared_transactions_by_prefix_and_completes_them_by_handle(raw, admin, txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    where = ("--bootstrap", bootstrap)
    raw.create_topic("cli-out", 1)
    with Producer(bootstrap, transactional_id="g1/done", transaction_timeout_ms=1000) as producer:  # of g1, not Prepared
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("cli-out", value=b"g1/done", partition=0)
        producer.commit_transaction()
    handles = {tid: prepare(bootstrap, tid, [("cli-out", 0, tid)]) for tid in ("g1/a", "g1/b", "g10/a")}

    def listed(*filters):
        return [json.loads(line) for line in txlog("transactions", "list", *filters, *where).stdout.splitlines()]

    def as_json(tid, state):
        h = handles[tid]
        return {"transactional_id": tid, "producer_id": h.producer_id, "state": state, "producer_epoch": h.producer_epoch}

    assert listed("--prefix", "g1/", "--state", "Prepared") == [as_json("g1/a", "Prepared"), as_json("g1/b", "Prepared")]
    assert {x["transactional_id"]: x["state"] for x in listed("--prefix", "g1")} == {
        "g1/a": "Prepared", "g1/b": "Prepared", "g1/done": "CompleteCommit", "g10/a": "Prepared"}
    described = json.loads(txlog("transactions", "describe", "g1/a", *where).stdout)
    assert (described["state"], described["prepared_timeout_ms"]) == ("Prepared", PREPARED_TIMEOUT_MS_DEFAULT)
    assert described["prepared_time_ms"] > 0

    def complete(outcome, tid, check=True, handle=None):
        h = handle or handles[tid]
        return txlog("transactions", "complete", outcome, "--transactional-id", tid, "--producer-id", str(h.producer_id),
                     "--producer-epoch", str(h.producer_epoch), *where, check=check)

    out = json.loads(complete("commit", "g1/a").stdout)
    assert out == {"completed": True, "committed": True, **handles["g1/a"]._asdict()}
    wait_until(lambda: values(raw, "cli-out", 0, COMMITTED) == ["g1/done", "g1/a"], 15, "the commit of g1/a")
    complete("commit", "g1/a")  # a repeat: OK
    refusals = (("abort", "g1/a", None, "INVALID_TXN_STATE"),  # abort after commit
                ("commit", "g1/b", handles["g1/b"]._replace(producer_id=handles["g1/b"].producer_id + 1000), "INVALID_PRODUCER_ID_MAPPING"),
                ("commit", "g1/unknown", handles["g1/b"], "INVALID_PRODUCER_ID_MAPPING"))
    for outcome, tid, handle, code in refusals:
        failed = complete(outcome, tid, check=False, handle=handle)
        stderr = failed.stderr.decode()
        assert failed.returncode == 1 and stderr.startswith(f"error: {code}: ") and stderr.count("\n") == 1, stderr
    complete("abort", "g1/b")
    complete("abort", "g10/a")
    wait_state(admin, "g1/b", "CompleteAbort")
    wait_state(admin, "g10/a", "CompleteAbort")
    assert listed("--prefix", "g1", "--state", "Prepared") == []
    assert {x["transactional_id"]: x["state"] for x in listed("--prefix", "g1/")} == {
        "g1/a": "CompleteCommit", "g1/b": "CompleteAbort", "g1/done": "CompleteCommit"}
    wait_until(lambda: (lambda lso, hw: lso == hw)(*offsets(raw, "cli-out", 0)), 10, "the ABORT markers")
    assert values(raw, "cli-out", 0, COMMITTED) == ["g1/done", "g1/a"]
