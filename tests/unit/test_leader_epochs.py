"""Leader epochs and log divergence (txlog/protocol/leader_epochs.py, KIP-101/279):
examples, and a property test against the definition: two replicas' logs agree
up to the first offset written in different epochs (an epoch has one leader,
which writes each offset once)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txlog.protocol.leader_epochs import UNDEFINED, AskAgain, LeaderEpochCache, truncation_step


def cache(*entries) -> LeaderEpochCache:
    return LeaderEpochCache(list(entries))


def test_the_end_offset_of_an_epoch_is_where_the_next_one_starts():
    c = cache((0, 0), (3, 80), (6, 120))
    assert c.end_offset_for(0, 150) == (0, 80)
    assert c.end_offset_for(4, 150) == (3, 120)  # the largest epoch at or below the asked one
    assert c.end_offset_for(9, 150) == (6, 150)  # the latest ends at the log end
    assert cache((2, 10)).end_offset_for(1, 50) == (UNDEFINED, UNDEFINED)


def test_epochs_only_move_forward_and_truncation_forgets_them():
    c = cache()
    assert c.assign(0, 0) and not c.assign(0, 5) and c.assign(2, 10)
    with pytest.raises(ValueError):
        c.assign(1, 20)
    with pytest.raises(ValueError):
        c.assign(3, 5)
    c.truncate_from_end(10)
    assert c.entries == [(0, 0)]
    c = cache((0, 0), (2, 10), (4, 30))
    c.truncate_from_start(15)
    assert c.entries == [(2, 15), (4, 30)]


def test_an_old_leaders_unreplicated_tail_is_truncated_in_one_or_two_rounds():
    # the follower led epoch 5 and wrote 100..119 that nobody copied; the leader led 3 from 80 and 6 from 120
    follower, leader = cache((0, 0), (5, 100)), cache((0, 0), (3, 80), (6, 120))
    step = truncation_step(follower, 120, *leader.end_offset_for(5, 140))  # the leader answers (3, 120)
    assert step == AskAgain(0)
    assert truncation_step(follower, 120, *leader.end_offset_for(0, 140)) == 80  # epoch 0 ended at 80 on the leader
    assert truncation_step(cache((0, 0), (3, 80)), 130, *leader.end_offset_for(3, 140)) == 120
    assert truncation_step(cache((1, 0)), 30, *cache((2, 0)).end_offset_for(1, 10)) == 0  # nothing in common


def rounds(follower: LeaderEpochCache, follower_end: int, leader: LeaderEpochCache, leader_end: int) -> int:
    epoch = follower.latest_epoch
    for _ in range(100):
        step = truncation_step(follower, follower_end, *leader.end_offset_for(epoch, leader_end))
        if not isinstance(step, AskAgain):
            return step
        assert step.epoch < epoch, "every round asks a lower epoch"
        epoch = step.epoch
    raise AssertionError("the rounds did not end")


def cache_of(epochs_per_offset: list[int]) -> LeaderEpochCache:
    c = LeaderEpochCache()
    for offset, epoch in enumerate(epochs_per_offset):
        c.assign(epoch, offset)
    return c


runs = st.lists(st.integers(1, 4), max_size=4)  # record counts of consecutive epochs


@given(common=runs, continued=st.integers(0, 3), follower_tail=runs, leader_tail=runs, continuer=st.sampled_from("fl"))
def test_the_follower_truncates_to_exactly_where_the_logs_diverge(common, continued, follower_tail, leader_tail, continuer):
    # a shared history, then each replica's own epochs (every epoch one leader: odd ones the follower's, even the leader's);
    # the leader of the last shared epoch may have written more of it than the other copied
    shared = [e for e, count in enumerate(common) for _ in range(count)]
    last = shared[-1] if shared else -1
    f_log, l_log = list(shared), list(shared)
    (f_log if continuer == "f" else l_log).extend([last] * (continued if shared else 0))
    base = last + 1
    f_log += [base + 2 * i + 1 for i, count in enumerate(follower_tail) for _ in range(count)]
    l_log += [base + 2 * i + 2 for i, count in enumerate(leader_tail) for _ in range(count)]
    expected = next((o for o in range(min(len(f_log), len(l_log))) if f_log[o] != l_log[o]), min(len(f_log), len(l_log)))
    assert rounds(cache_of(f_log), len(f_log), cache_of(l_log), len(l_log)) == expected


def test_the_epoch_of_an_offset_is_the_last_one_started_at_or_before_it():
    cache = LeaderEpochCache([(0, 0), (3, 10), (5, 10), (7, 25)])
    assert [cache.epoch_at(o) for o in (0, 9, 10, 24, 25, 1000)] == [0, 0, 5, 5, 7, 7]
    assert LeaderEpochCache().epoch_at(4) == 0
