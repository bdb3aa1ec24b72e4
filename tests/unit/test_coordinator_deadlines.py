"""The coordinator's due times (state_manager.DeadlineIndex and the LoadedPartition
indexes): a timer or check-back pass looks only at the ids whose time came, and
still aborts, checks and expires every one of them at the time the rules say.

Pure parts first (the index against a reference, the due functions against
transaction_core's rules), then the real TransactionCoordinator on the model
harness (test_coordinator_model.py): work proportional to what is due, a load
rebuilding the indexes, a transition in flight or completing during a pass.
The hypothesis machines of test_coordinator_model.py and test_check_back_model.py
check the indexes against the metadata after every step (Checker._check_due_times).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_coordinator_model import (
    CHECK_INTERVAL_MS,
    GROUP,
    TIDS,
    TXN_TIMEOUT_MS,
    Checker,
    Harness,
    Req,
    add,
    end,
    init,
    prepare,
)

from coordinator_svc import check_rules
from coordinator_svc import transaction_core as core
from coordinator_svc import transaction_state as ts
from coordinator_svc.state_manager import (
    PASS_IDS_PER_YIELD,
    DeadlineIndex,
    LoadedPartition,
    idle_since_ms,
    timeout_due_ms,
)
from coordinator_svc.transaction_state import TransactionMetadata, TransactionState

S = TransactionState
IDLE_IDS = 10_000


# --- the index, pure -------------------------------------------------------------------------

def test_ids_come_out_at_their_time_earliest_first_each_once():
    index = DeadlineIndex([("c", 30), ("a", 10), ("b", 10)])
    assert index.pop_due(9, 100) == []
    assert index.pop_due(10, 100) == [(10, "a"), (10, "b")], "ties by id"
    assert index.pop_due(10, 100) == [], "taken out once"
    assert index.next_ms() == 30 and len(index) == 1


def test_a_moved_id_comes_out_only_at_its_new_time_and_a_cleared_one_never():
    index = DeadlineIndex()
    index.set("a", 10)
    index.set("a", 50)  # later: its entry at 10 is stale
    index.set("b", 20)
    index.set("b", None)
    index.set("c", 40)
    index.set("c", 5)  # sooner
    assert index.pop_due(45, 100) == [(5, "c")]
    assert index.pop_due(100, 100) == [(50, "a")]
    assert len(index) == 0 and index.next_ms() is None


def test_a_pass_takes_at_most_its_limit_the_rest_stays_due():
    index = DeadlineIndex((f"id-{n:03}", n) for n in range(10))
    assert [tid for _, tid in index.pop_due(100, 4)] == ["id-000", "id-001", "id-002", "id-003"]
    assert len(index.pop_due(100, 100)) == 6


def test_stale_entries_stay_bounded_by_the_live_ones():
    index = DeadlineIndex()
    for ms in range(50_000):  # one busy id, moved at every transition
        index.set("busy", ms)
    assert len(index) == 1 and index.heap_entries() <= 2 + DeadlineIndex.STALE_MIN + 1
    assert index.pop_due(10**9, 10) == [(49_999, "busy")]


OPS = st.lists(st.tuples(st.sampled_from(["set", "clear", "pop"]), st.sampled_from("abcdef"), st.integers(0, 50),
                         st.integers(1, 4)), max_size=60)


@settings(max_examples=300, derandomize=True)
@given(ops=OPS)
def test_the_index_answers_as_a_dict_of_times_would(ops):
    index, times = DeadlineIndex(), {}
    for op, tid, ms, limit in ops:
        if op == "set":
            index.set(tid, ms)
            times[tid] = ms
        elif op == "clear":
            index.discard(tid)
            times.pop(tid, None)
        else:
            expected = sorted((t, i) for i, t in times.items() if t <= ms)[:limit]
            assert index.pop_due(ms, limit) == expected
            for _, i in expected:
                del times[i]
        assert len(index) == len(times) and all(index.get(i) == t for i, t in times.items())
    assert index.next_ms() == (min(times.values()) if times else None)


# --- the due functions are the rules' -----------------------------------------------------------

METAS = st.builds(
    TransactionMetadata, transactional_id=st.sampled_from(["g/a", "g/b", "other"]), producer_id=st.just(7), producer_epoch=st.just(0),
    txn_timeout_ms=st.integers(1, 5_000), state=st.sampled_from(list(S)), txn_start_ms=st.integers(-1, 10_000),
    last_update_ms=st.integers(-1, 10_000), prepared_ms=st.integers(-1, 10_000), prepared_timeout_ms=st.integers(0, 5_000),
    checks_done=st.integers(0, 4), last_check_ms=st.integers(-1, 10_000),
    pending_state=st.sampled_from([None, None, S.ONGOING, S.PREPARE_ABORT]))
CONFIGS = st.builds(lambda max_, keep: check_rules.altered(check_rules.DEFAULT_CONFIG, {
    check_rules.CHECK_INTERVAL_MS: "1000", check_rules.CHECK_MAX: str(max_), check_rules.CHECK_EXHAUSTED: "keep" if keep else "abort"}, []),
    st.integers(1, 3), st.booleans())


@settings(max_examples=500, derandomize=True)
@given(meta=METAS, now_ms=st.integers(0, 20_000), expiration_ms=st.integers(0, 5_000), config=CONFIGS)
def test_an_id_is_due_in_the_indexes_exactly_when_the_rules_say(meta, now_ms, expiration_ms, config):
    settled = dataclasses.replace(meta, pending_state=None)
    due_ms, idle_ms = timeout_due_ms(meta), idle_since_ms(meta)
    assert core.timed_out(settled, now_ms) == (due_ms is not None and due_ms <= now_ms)
    assert core.expired(settled, now_ms, expiration_ms) == (idle_ms is not None and idle_ms + expiration_ms < now_ms)
    assert check_rules.next_check_ms(meta, config) == (None if meta.pending_state else check_rules.check_due_ms(meta, config))
    assert (timeout_due_ms(settled), idle_since_ms(settled)) == (due_ms, idle_ms), "a transition in flight does not move them"


# --- the real coordinator: work only for what is due ---------------------------------------------

@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def examined(monkeypatch) -> list[str]:
    """The transactional ids whose metadata the timers' and the check-back's rules look at."""
    seen: list[str] = []
    for module, name in ((core, "timed_out"), (core, "expired"), (check_rules, "next_check_ms")):
        rule = getattr(module, name)

        def counted(meta, *args, _rule=rule):
            seen.append(meta.transactional_id)
            return _rule(meta, *args)
        monkeypatch.setattr(module, name, counted)
    return seen


def load_idle_ids(h: Harness, count: int, **fields) -> None:
    """``count`` ids in memory as a load puts them (then the indexes are rebuilt, as take_over does)."""
    for n in range(count):
        tid = f"{GROUP}/idle-{n:05}"
        h.loaded.transactions[tid] = TransactionMetadata(tid, 10_000 + n, 0, 60_000, last_update_ms=h.now_ms, **fields)
    h.loaded.schedule_all()


def test_a_timer_pass_looks_only_at_the_one_transaction_past_its_timeout_among_ten_thousand_idle_ids(h, monkeypatch):
    load_idle_ids(h, IDLE_IDS)
    tid = TIDS[0]
    pid, epoch = h.send(init(tid))[1]
    assert h.send(add(tid, pid, epoch))[0] == "ok"
    h.tick(TXN_TIMEOUT_MS + 1)
    seen = examined(monkeypatch)
    h.send(Req("timeouts"))
    assert h.meta(tid).state is S.COMPLETE_ABORT and h.meta(tid).producer_epoch == epoch + 1, "aborted, the epoch bumped"
    assert set(seen) == {tid}, f"the pass looked at {len(set(seen)):,} ids (the walk it replaces: {IDLE_IDS + 1:,})"
    seen.clear()
    h.send(Req("timeouts"))
    assert seen == [], "a pass with nothing due looks at nothing"


def test_a_check_round_looks_only_at_the_one_prepared_transaction_due_among_ten_thousand_prepared_later(h, monkeypatch):
    tid = TIDS[0]
    pid, epoch = h.send(init(tid))[1]
    assert h.send(add(tid, pid, epoch))[0] == "ok" and h.send(prepare(tid, pid, epoch))[0] == "ok"
    h.tick(CHECK_INTERVAL_MS // 2)
    load_idle_ids(h, IDLE_IDS, state=S.PREPARED, prepared_ms=h.now_ms, prepared_timeout_ms=10**9, txn_start_ms=h.now_ms)
    h.tick(CHECK_INTERVAL_MS // 2 + CHECK_INTERVAL_MS // check_rules.JITTER_FRACTION)  # the first one due, the others not
    seen = examined(monkeypatch)
    h.send(Req("checks_due", answer="UNKNOWN"))
    assert [r.transactional_id for r in h.checker.asked] == [tid] and h.meta(tid).checks_done == 1
    assert set(seen) == {tid}, f"the round looked at {len(set(seen)):,} ids (the walk it replaces: {IDLE_IDS + 1:,})"


def test_an_id_idle_past_its_expiration_is_expired_and_only_it_is_looked_at(h, monkeypatch):
    h.coordinator.config = dataclasses.replace(h.coordinator.config, transactional_id_expiration_ms=60_000)
    tid = TIDS[0]
    h.send(init(tid))
    h.tick(30_000)
    load_idle_ids(h, IDLE_IDS)  # updated 30 s after it
    for n in range(3):  # some of them move on: their stale entries are skipped
        h.loaded.transactions[f"{GROUP}/idle-{n:05}"].last_update_ms = h.now_ms + 1_000
        h.loaded.schedule(h.loaded.transactions[f"{GROUP}/idle-{n:05}"])
    h.tick(30_001)
    seen = examined(monkeypatch)
    h.send(Req("timeouts"))
    assert h.meta(tid) is None and h.log.entries[-1] == (tid.encode(), None), "expired: a tombstone, and gone from memory"
    assert tid not in h.loaded.idle and len(h.loaded.idle) == IDLE_IDS
    assert set(seen) == {tid}
    h.tick(30_000)
    seen.clear()
    h.send(Req("timeouts"))
    assert len(h.loaded.transactions) == 3 and len(set(seen)) == IDLE_IDS - 3, "the others expire at their own time"


def test_a_large_pass_lets_other_work_in(h):
    load_idle_ids(h, 3 * PASS_IDS_PER_YIELD, state=S.PREPARED, prepared_ms=h.now_ms, prepared_timeout_ms=10**9, txn_start_ms=h.now_ms)
    h.tick(2 * CHECK_INTERVAL_MS)  # every one due a check
    h.coordinator.check_back.checks_in_flight_max = 0  # queued, not started: the pass alone

    async def go():
        left_when_let_in = []

        async def other_request():
            left_when_let_in.append(len(h.loaded.checks))
        other = asyncio.ensure_future(other_request())
        await h.coordinator.check_back.check_due()
        await other
        return left_when_let_in[0]
    left = h.loop.run_until_complete(go())
    assert 0 < left < 3 * PASS_IDS_PER_YIELD, f"another task ran when {left} ids were still to be taken"
    assert len(h.coordinator.check_back._queue) == 3 * PASS_IDS_PER_YIELD


# --- load, unload, and transitions around a pass ---------------------------------------------------

def reloaded(h: Harness) -> LoadedPartition:
    """The partition as a new owner loads it from the log: the latest record of each id, then the indexes."""
    fresh = LoadedPartition(0, h.loaded.owner, h.log, loaded=True, confirmed_s=h.now_ms / 1000, group_configs=dict(h.loaded.group_configs))
    for _, record in h.log.records():
        fresh.transactions[record.transactional_id] = TransactionMetadata.from_record(record)
    fresh.schedule_all()
    return fresh


def test_a_partition_loaded_after_a_failover_has_the_same_due_times_and_its_timers_act_on_them(h):
    (a, b), other = TIDS, f"{GROUP}/c"
    pa, ea = h.send(init(a))[1]
    h.send(add(a, pa, ea))  # open
    pb, eb = h.send(init(b))[1]
    h.send(add(b, pb, eb))
    h.send(prepare(b, pb, eb))  # prepared
    h.tick(CHECK_INTERVAL_MS * 2)
    h.send(Req("checks_due", answer="UNKNOWN"))  # checked once
    h.send(init(other))  # settled
    fresh = reloaded(h)
    for name in ("timeouts", "idle", "checks"):
        old, new = getattr(h.loaded, name), getattr(fresh, name)
        assert {t: old.get(t) for t in old.ids()} == {t: new.get(t) for t in new.ids()}, name
    assert h.loaded.open_ids == fresh.open_ids == {a, b}, "the open ids a metrics scrape reads"
    h.coordinator.state.unload(0, "moved to another coordinator")
    assert len(h.loaded.timeouts) == len(h.loaded.idle) == len(h.loaded.checks) == 0, "dropped with the partition"
    h.coordinator.state.partitions[0] = h.loaded = fresh
    h.tick(10_000)
    h.send(Req("timeouts"))
    assert h.meta(a).state is S.COMPLETE_ABORT and h.meta(b).state is S.COMPLETE_ABORT, "the new owner's timers abort both"
    assert fresh.open_ids == set()


def test_an_abandoned_transition_leaves_the_id_due_as_it_was(h):
    """A pass that meets an id with a transition in flight leaves it to the next pass; if the write then
    fails (abandoned), the id is still due at its old time, not forgotten."""
    tid = TIDS[0]
    pid, epoch = h.send(init(tid))[1]
    h.send(add(tid, pid, epoch))
    h.tick(TXN_TIMEOUT_MS + 1)
    meta = h.meta(tid)
    ts.prepare_transition(meta, S.ONGOING, last_update_ms=h.now_ms)  # an add being written
    h.send(Req("timeouts"))
    assert meta.state is S.ONGOING and h.loaded.timeouts.get(tid) == timeout_due_ms(meta) <= h.now_ms
    ts.abandon_transition(meta)  # its write failed
    h.send(Req("timeouts"))
    assert meta.state is S.COMPLETE_ABORT


def test_a_transition_completing_during_a_pass_is_not_lost(h):
    """Both ids are past their timeout; while the pass writes the first one's abort, the second one's
    producer commits: the pass then finds it decided and leaves it (its due times follow the commit)."""
    first, second = TIDS
    clients = {}
    for tid in TIDS:
        clients[tid] = h.send(init(tid))[1]
        h.send(add(tid, *clients[tid]))
        h.tick(1)
    h.tick(TXN_TIMEOUT_MS)

    async def go():
        timers = asyncio.ensure_future(h.coordinator.abort_timed_out())
        while h.meta(first).pending_state is None:
            await asyncio.sleep(0)
        committed = await h.call(end(second, *clients[second], True))
        await timers
        await h.settle()
        return committed
    assert h.loop.run_until_complete(go())[0] == "ok"
    assert h.meta(first).state is S.COMPLETE_ABORT and h.meta(second).state is S.COMPLETE_COMMIT
    Checker(h)._check_due_times()


def test_a_check_due_while_no_checker_is_registered_waits_for_one(h):
    tid = TIDS[0]
    pid, epoch = h.send(init(tid))[1]
    h.send(add(tid, pid, epoch))
    h.send(prepare(tid, pid, epoch))
    h.send(Req("unregister"))
    h.tick(2 * CHECK_INTERVAL_MS)
    h.send(Req("checks_due"))
    assert h.checker.asked == [] and tid in h.loaded.unchecked[GROUP] and tid not in h.loaded.checks
    h.send(Req("checks_due"))
    assert h.checker.asked == []
    h.send(Req("register"))
    h.send(Req("checks_due"))
    assert [r.transactional_id for r in h.checker.asked] == [tid] and not h.loaded.unchecked


def test_an_unexpected_failure_while_aborting_leaves_the_id_due_and_the_next_pass_aborts_it(h, monkeypatch):
    """A pass took up to 1,000 ids out of the index: an error that is not a refusal (a bug, ZooKeeper
    failing under the producer-id source) must not drop the id, or it would never time out again."""
    tid = TIDS[0]
    pid, epoch = h.send(init(tid))[1]
    assert h.send(add(tid, pid, epoch))[0] == "ok"
    h.tick(TXN_TIMEOUT_MS + 1)
    rule = core.decide_timeout
    failures = []

    def failing_once(*args):
        if not failures:
            failures.append(args[0].transactional_id)
            raise RuntimeError("planted")
        return rule(*args)
    monkeypatch.setattr(core, "decide_timeout", failing_once)
    h.send(Req("timeouts"))
    assert failures == [tid] and h.meta(tid).state is S.ONGOING and h.meta(tid).pending_state is None
    assert h.loaded.timeouts.get(tid) is not None, "still due"
    h.send(Req("timeouts"))
    assert h.meta(tid).state is S.COMPLETE_ABORT


def test_a_checker_renewing_its_registration_reschedules_only_the_checks_that_waited_for_one(h, monkeypatch):
    tid = TIDS[0]
    pid, epoch = h.send(init(tid))[1]
    h.send(add(tid, pid, epoch))
    h.send(prepare(tid, pid, epoch))
    load_idle_ids(h, 2_000, state=S.PREPARED, prepared_ms=h.now_ms, prepared_timeout_ms=10**9, txn_start_ms=h.now_ms)
    scheduled: list[str] = []
    schedule = h.loaded.schedule
    monkeypatch.setattr(h.loaded, "schedule", lambda meta: (scheduled.append(meta.transactional_id), schedule(meta)))
    h.send(Req("register"))
    assert scheduled == [], f"a renewal looked at {len(scheduled):,} checks none of which waited for a checker"
