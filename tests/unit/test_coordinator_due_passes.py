"""The two ways a loaded partition's due times are set, and the one loop both
coordinator passes take due ids with (TransactionStateManager.take_due).

- LoadedPartition.schedule_all (at load, in bulk: a load's time counts) states
  the same rules as LoadedPartition.schedule (one id, after each transition):
  for any set of ids, the bulk build holds exactly what schedule() applied to
  every id holds.
- take_due: what is taken, when the loop is yielded, and when a pass stops
  (the partition unloaded; the timers, not the check round, also when its log breaks).
- A check round reads a group's settings afresh after each yield: an id
  rescheduled by settings changed meanwhile is judged by them, not by the old
  ones (it would otherwise come back due in the same round, for ever).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_coordinator_model import GROUP, Harness

from coordinator_svc import check_rules
from coordinator_svc.state_manager import (
    PASS_IDS_PER_YIELD,
    CoordinatorConfig,
    LoadedPartition,
    TransactionStateManager,
)
from coordinator_svc.transaction_state import TransactionMetadata, TransactionState
from services.coordination import coordinators

S = TransactionState
OWNER = coordinators.PartitionOwner(1, 5, 900)
GROUPS = ("g", "h", "solo")


@dataclass
class LogStandIn:
    broken: str | None = None


def partition(transactions, group_configs) -> LoadedPartition:
    loaded = LoadedPartition(0, OWNER, LogStandIn(), group_configs=dict(group_configs))
    loaded.transactions.update(transactions)
    return loaded


def due_times(loaded: LoadedPartition) -> dict:
    """Everything the due times are: each index's times (and the order ids come out), the unchecked, the open ids."""
    held = {}
    for name in ("timeouts", "idle", "checks"):
        index = getattr(loaded, name)
        held[name] = {t: index.get(t) for t in index.ids()}
        held[name + " order"] = index.pop_due(10**15, 10**6)
    return held | {"unchecked": loaded.unchecked, "open_ids": loaded.open_ids}


CONFIGS = st.builds(lambda interval, max_, keep: check_rules.altered(check_rules.DEFAULT_CONFIG, {
    check_rules.CHECK_INTERVAL_MS: str(interval), check_rules.CHECK_MAX: str(max_), check_rules.CHECK_EXHAUSTED: "keep" if keep else "abort"}, []),
    st.integers(100, 5_000), st.integers(1, 3), st.booleans())
META_FIELDS = st.fixed_dictionaries(dict(
    producer_id=st.just(7), producer_epoch=st.just(0), txn_timeout_ms=st.integers(1, 5_000), state=st.sampled_from(list(S)),
    txn_start_ms=st.integers(-1, 10_000), last_update_ms=st.integers(-1, 10_000), prepared_ms=st.integers(-1, 10_000),
    prepared_timeout_ms=st.integers(0, 5_000), checks_done=st.integers(0, 4), last_check_ms=st.integers(-1, 10_000),
    pending_state=st.sampled_from([None, None, S.ONGOING, S.PREPARE_ABORT])))
IDS = st.lists(st.tuples(st.sampled_from(GROUPS), st.integers(0, 30)), unique=True, max_size=40)


@settings(max_examples=300, derandomize=True)
@given(ids=IDS, fields=st.data(), configs=st.dictionaries(st.sampled_from(GROUPS), CONFIGS), leftover=IDS)
def test_schedule_all_holds_what_schedule_applied_to_every_id_holds(ids, fields, configs, leftover):
    transactions = {}
    for group, n in ids:
        tid = group if group == "solo" and n == 0 else f"{group}/{n}"
        transactions[tid] = TransactionMetadata(tid, **fields.draw(META_FIELDS))
    bulk = partition(transactions, configs)
    for group, n in leftover:  # what the indexes held before (a reload in place): all of it goes
        bulk.timeouts.set(f"{group}/gone-{n}", n)
        bulk.checks.set(f"{group}/gone-{n}", n)
        bulk.unchecked.setdefault(group, set()).add(f"{group}/gone-{n}")
        bulk.open_ids.add(f"{group}/gone-{n}")
    bulk.schedule_all()
    one_by_one = partition(transactions, configs)
    for meta in transactions.values():
        one_by_one.schedule(meta)
    assert due_times(bulk) == due_times(one_by_one)


# --- take_due ---------------------------------------------------------------------------------------

IDS_DUE = 2 * PASS_IDS_PER_YIELD + PASS_IDS_PER_YIELD // 2


def served(count: int) -> tuple[TransactionStateManager, LoadedPartition]:
    config = CoordinatorConfig(node_id=1, zookeeper_root="/txlog", transaction_state_partitions=1, transaction_timeout_ms_max=60_000,
                               transactional_id_expiration_ms=10**9)
    manager = TransactionStateManager(config, None, None, None, None, on_loaded=None, clock_ms=lambda: 1_000)
    loaded = partition({f"g/{n:05}": TransactionMetadata(f"g/{n:05}", 7, 0, 60_000, state=S.ONGOING, txn_start_ms=n)
                        for n in range(count)}, {})
    loaded.schedule_all()
    manager.partitions[0] = loaded
    return manager, loaded


def take(manager, loaded, up_to_ms, meanwhile=None, **options) -> tuple[list[str], list[int]]:
    """The ids a pass takes, and how many it had taken each time another task ran (``meanwhile`` at the first)."""
    taken, let_in = [], []

    async def other():
        while True:
            let_in.append(len(taken))
            if meanwhile is not None and len(let_in) == 1:
                meanwhile()
            await asyncio.sleep(0)

    async def go():
        task = asyncio.ensure_future(other())
        async for meta in manager.take_due(loaded, loaded.timeouts, up_to_ms, **options):
            taken.append(meta.transactional_id)
        task.cancel()
    asyncio.run(go())
    return taken, let_in


def test_a_pass_takes_the_due_ids_earliest_first_and_lets_others_in_every_thousand():
    manager, loaded = served(IDS_DUE + 10)
    del loaded.transactions["g/00003"]  # in the index, no longer held: dropped
    taken, let_in = take(manager, loaded, IDS_DUE + 60_000)  # due at txn_start_ms + the timeout + 1: the first IDS_DUE
    assert taken == [f"g/{n:05}" for n in range(IDS_DUE) if n != 3]
    assert let_in == [PASS_IDS_PER_YIELD - 1, 2 * PASS_IDS_PER_YIELD - 1], "the loop is yielded after each thousand taken out"
    assert sorted(loaded.timeouts.ids()) == [f"g/{n:05}" for n in range(IDS_DUE, IDS_DUE + 10)], "the rest stay"


@pytest.mark.parametrize("stop_if_broken", [True, False])
def test_a_pass_stops_once_its_partition_is_unloaded(stop_if_broken):
    manager, loaded = served(IDS_DUE)
    taken, _ = take(manager, loaded, 10**9, lambda: manager.partitions.pop(0), stop_if_broken=stop_if_broken)
    assert len(taken) == PASS_IDS_PER_YIELD and len(loaded.timeouts) == IDS_DUE - PASS_IDS_PER_YIELD


@pytest.mark.parametrize("stop_if_broken", [True, False])
def test_the_timers_pass_stops_once_the_log_breaks_the_check_rounds_does_not(stop_if_broken):
    manager, loaded = served(IDS_DUE)

    def breaks():
        loaded.log.broken = "a write failed"
    taken, _ = take(manager, loaded, 10**9, breaks, stop_if_broken=stop_if_broken)
    assert len(taken) == (PASS_IDS_PER_YIELD if stop_if_broken else IDS_DUE)


# --- a check round and settings changed during it ----------------------------------------------------

@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def test_a_check_round_judges_ids_after_a_yield_by_the_settings_changed_meanwhile(h):
    """The first thousand prepared ids are due under the group's 5 s interval, the next thousand not; while the
    round lets others in, the interval becomes 1 s, which makes those due: the round queues them (judged by the
    old settings, each would be put back due and taken again, the round never ending)."""
    loaded, check_back = h.loaded, h.coordinator.check_back
    loaded.group_configs[GROUP] = check_rules.altered(check_rules.DEFAULT_CONFIG, {check_rules.CHECK_INTERVAL_MS: "5000"}, [])
    for n in range(2 * PASS_IDS_PER_YIELD):
        tid = f"{GROUP}/p-{n:05}"
        prepared_ms = h.now_ms - (10_000 if n < PASS_IDS_PER_YIELD else 2_000)
        loaded.transactions[tid] = TransactionMetadata(tid, 10_000 + n, 0, 60_000, state=S.PREPARED, txn_start_ms=prepared_ms,
                                                       prepared_ms=prepared_ms, prepared_timeout_ms=10**9, last_update_ms=prepared_ms)
    loaded.schedule_all()
    assert sum(loaded.checks.get(t) <= h.now_ms for t in loaded.checks.ids()) == PASS_IDS_PER_YIELD, "as set up"
    check_back.checks_in_flight_max = 0  # queued, not started: the round alone

    async def go():
        async def change():
            while len(loaded.checks) == 2 * PASS_IDS_PER_YIELD:
                await asyncio.sleep(0)  # until the round took its first thousand and let others in
            loaded.group_configs[GROUP] = check_rules.altered(loaded.group_configs[GROUP], {check_rules.CHECK_INTERVAL_MS: "1000"}, [])
            loaded.reschedule_group(GROUP)
            return len(check_back._queue), len(loaded.checks)
        other = asyncio.ensure_future(change())
        await asyncio.wait_for(check_back.check_due(), 10)  # not for ever if it went wrong
        return await other
    assert h.loop.run_until_complete(go()) == (0, PASS_IDS_PER_YIELD), "changed during the round, the first thousand taken"
    assert len(check_back._queue) == 2 * PASS_IDS_PER_YIELD and len(loaded.checks) == 0, "every one judged due once"
