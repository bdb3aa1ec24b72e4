"""The ISR and high watermark a leader keeps (partition_svc/isr.py)."""

from hypothesis import given
from hypothesis import strategies as st

from partition_svc.isr import FollowerProgress, ReplicaSet

LAG_MS = 10_000


def test_the_high_watermark_waits_for_every_in_sync_replica():
    replicas = ReplicaSet(leader=1, isr=frozenset({1, 2, 3}))
    replicas.on_fetch(2, 10, leader_log_end=10, now_ms=0)
    assert not replicas.advance_high_watermark(10)  # replica 3 has nothing yet
    replicas.on_fetch(3, 7, leader_log_end=10, now_ms=0)
    assert replicas.advance_high_watermark(10) and replicas.high_watermark == 7


def test_a_lagging_follower_leaves_the_isr_and_comes_back_once_caught_up():
    replicas = ReplicaSet(leader=1, isr=frozenset({1, 2, 3}))
    replicas.on_fetch(2, 10, 10, now_ms=0)
    replicas.on_fetch(3, 10, 10, now_ms=0)
    replicas.advance_high_watermark(10)
    replicas.on_fetch(2, 20, 20, now_ms=LAG_MS + 1)
    replicas.on_fetch(3, 12, 20, now_ms=LAG_MS + 1)  # fetching, but not caught up since 0
    assert replicas.isr_change(20, LAG_MS + 1, LAG_MS) == frozenset({1, 2})
    replicas.isr = frozenset({1, 2})
    assert not replicas.enough_replicas(3) and replicas.enough_replicas(2)
    replicas.advance_high_watermark(20)
    assert replicas.high_watermark == 20  # no longer held back by 3
    replicas.on_fetch(3, 20, 20, now_ms=LAG_MS + 5)
    assert replicas.isr_change(20, LAG_MS + 5, LAG_MS) == frozenset({1, 2, 3})
    replicas.isr = frozenset({1, 2, 3})
    assert replicas.isr_change(20, LAG_MS + 5, LAG_MS) is None


@given(st.lists(st.tuples(st.sampled_from([2, 3]), st.integers(0, 50), st.integers(0, 5)), max_size=30))
def test_the_high_watermark_never_moves_back_nor_past_an_isr_member(fetches):
    replicas = ReplicaSet(leader=1, isr=frozenset({1, 2, 3}))
    leader_end, now, seen = 0, 0, 0
    for follower, end, grow in fetches:
        leader_end += grow
        now += 1000
        replicas.on_fetch(follower, min(end, leader_end), leader_end, now)
        change = replicas.isr_change(leader_end, now, LAG_MS)
        if change is not None:
            replicas.isr = change
        replicas.advance_high_watermark(leader_end)
        assert replicas.high_watermark >= seen
        seen = replicas.high_watermark
        for node in replicas.isr - {1}:  # every follower in the ISR holds the HW and was caught up lately
            assert replicas.high_watermark <= replicas.followers[node].log_end_offset
            assert 0 <= now - replicas.followers[node].last_caught_up_ms <= LAG_MS


def test_a_follower_whose_log_went_backwards_leaves_the_isr_at_once():
    replicas = ReplicaSet(leader=1, isr=frozenset({1, 2}))
    replicas.on_fetch(2, 30, 30, now_ms=0)
    replicas.advance_high_watermark(30)
    replicas.on_fetch(2, 0, 30, now_ms=1)  # restarted with an empty disk, well within the lag time
    assert replicas.isr_change(30, 1, LAG_MS) == frozenset({1})
    assert replicas.high_watermark == 30  # never back


def test_a_follower_the_written_isr_dropped_comes_back_only_by_a_fetch_made_after():
    """The controller drops a restarted follower from the ISR; what the leader had recorded of it belongs to
    its previous process (a fetch of the killed process, received before the kill, said 30) and must not bring
    the new one, on an empty disk, back into the ISR. A suite run showed it: the wiped follower rejoined with
    nothing, then led with an empty log."""
    replicas = ReplicaSet(leader=1, isr=frozenset({1, 2, 3}))
    replicas.on_fetch(2, 30, 30, now_ms=0)
    replicas.on_fetch(3, 30, 30, now_ms=0)
    replicas.advance_high_watermark(30)
    replicas.set_isr(frozenset({1, 3}))  # as the controller wrote it: 2 restarted
    assert replicas.isr_change(30, 1, LAG_MS) is None
    replicas.on_fetch(2, 0, 30, now_ms=2)  # the new process, from scratch
    assert replicas.isr_change(30, 2, LAG_MS) is None
    replicas.on_fetch(2, 30, 30, now_ms=3)  # caught up again
    assert replicas.isr_change(30, 3, LAG_MS) == frozenset({1, 2, 3})
    replicas.set_isr(frozenset({1, 2, 3}))
    assert replicas.followers[2].log_end_offset == 30  # a follower the ISR keeps keeps its progress


def test_a_follower_on_other_storage_is_caught_up_only_by_what_it_says_now_and_its_storage_is_recorded():
    replicas = ReplicaSet(1, frozenset({1}), followers={2: FollowerProgress()})
    replicas.on_fetch(2, 10, 10, now_ms=1_000, storage_zxid=100)
    assert replicas.storage_of({2, 3}) == {2: 100}
    assert replicas.isr_change(10, 1_000, lag_max_ms=5_000) == frozenset({1, 2})
    replicas.on_fetch(2, 10, 10, now_ms=2_000, storage_zxid=None)
    assert replicas.storage_of({2}) == {2: 100}, "a fetch that does not say leaves what was said"
    replicas.on_fetch(2, 4, 10, now_ms=3_000, storage_zxid=300)
    assert replicas.storage_of({2}) == {2: 300} and replicas.followers[2].last_caught_up_ms == -1


def test_the_replicated_end_waits_for_every_assigned_replica_in_the_isr_or_not():
    replicas = ReplicaSet(leader=0, isr=frozenset({0, 1}), high_watermark=0)
    replicas.on_fetch(1, 10, leader_log_end=10, now_ms=1)
    replicas.advance_high_watermark(10)
    assert replicas.high_watermark == 10
    assert replicas.replicated_end((0, 1, 2)) == 0  # replica 2, out of the ISR, has not fetched from this leader
    replicas.on_fetch(2, 4, leader_log_end=10, now_ms=2)
    assert replicas.replicated_end((0, 1, 2)) == 4
    assert replicas.replicated_end((0, 1)) == 10  # 2 is no replica any more (reassigned): the high watermark
    replicas.on_fetch(2, 0, leader_log_end=10, now_ms=3)  # its disk wiped: it holds nothing now
    assert replicas.replicated_end((0, 1, 2)) == 0
