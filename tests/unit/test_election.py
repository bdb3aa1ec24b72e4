"""The controller's rules (partition_svc/election.py): examples and properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from partition_svc.election import (
    NO_LEADER,
    LeaderAndIsr,
    after_liveness,
    after_restarts,
    initial_state,
    lost_storage,
    preferred_leader,
)

REPLICAS = (1, 2, 3)


def test_a_live_leader_keeps_leading_and_gone_followers_leave_the_isr():
    state = LeaderAndIsr(1, 4, (1, 2, 3))
    assert after_liveness(REPLICAS, state, {1, 2, 3}, unclean=False) is state
    assert after_liveness(REPLICAS, state, {1, 3}, unclean=False) == LeaderAndIsr(1, 4, (1, 3))


def test_a_gone_leader_is_replaced_by_the_first_live_isr_member_in_preference_order():
    state = LeaderAndIsr(1, 4, (3, 1, 2))
    assert after_liveness(REPLICAS, state, {2, 3}, unclean=False) == LeaderAndIsr(2, 5, (3, 2))


def test_no_live_isr_member_leaves_the_partition_offline_with_its_last_isr_unless_unclean():
    state = LeaderAndIsr(1, 4, (1, 2))
    offline = after_liveness(REPLICAS, state, {3}, unclean=False)
    assert offline == LeaderAndIsr(NO_LEADER, 5, (1, 2))
    assert after_liveness(REPLICAS, offline, {3}, unclean=False) is offline  # no new epoch while nothing changes
    assert after_liveness(REPLICAS, offline, {2, 3}, unclean=False) == LeaderAndIsr(2, 6, (2,))  # an ISR member is back
    assert after_liveness(REPLICAS, state, {3}, unclean=True) == LeaderAndIsr(3, 5, (3,))


def test_a_restarted_node_leaves_the_isr_unless_it_is_all_that_is_left():
    state = LeaderAndIsr(1, 4, (1, 2, 3))
    assert after_restarts(REPLICAS, state, {1, 2, 3}, {1}, unclean=False) == LeaderAndIsr(2, 5, (2, 3))
    alone = LeaderAndIsr(1, 4, (1,))
    # every ISR member restarted (a whole-cluster restart): the last one leads again rather than nobody
    assert after_restarts(REPLICAS, alone, {1, 2, 3}, {1}, unclean=False) == LeaderAndIsr(1, 6, (1,))


def test_a_node_back_on_a_new_disk_leaves_the_isr_even_as_its_last_member():
    state = LeaderAndIsr(1, 4, (1, 2, 3))
    # the other two are gone: the node whose disk was replaced holds nothing and must not lead
    assert after_restarts(REPLICAS, state, {3}, {3}, unclean=False, emptied={3}) == LeaderAndIsr(NO_LEADER, 5, (1, 2))
    alone = LeaderAndIsr(3, 4, (3,))
    assert after_restarts(REPLICAS, alone, {3}, {3}, unclean=False, emptied={3}) == LeaderAndIsr(NO_LEADER, 5, ())
    # the offline partition leads again once a replica that kept its log is back
    assert after_liveness(REPLICAS, LeaderAndIsr(NO_LEADER, 5, (1, 2)), {1, 3}, unclean=False) == LeaderAndIsr(1, 6, (1,))
    # only an unclean election (the operator's choice) makes it lead
    assert after_restarts(REPLICAS, alone, {3}, {3}, unclean=True, emptied={3}) == LeaderAndIsr(3, 6, (3,))


def test_a_member_on_other_storage_than_recorded_lost_its_data_whenever_it_restarted():
    state = LeaderAndIsr(1, 4, (1, 2), zk_mzxid=500, isr_storage=((1, 100), (2, 120)))
    assert not lost_storage(state, 1, 100, restarted=True), "the storage it is in the ISR with"
    assert lost_storage(state, 2, 300, restarted=False), "storage older than the state's last write, but not the recorded one"
    assert lost_storage(state, 2, 0, restarted=False)
    unrecorded = LeaderAndIsr(1, 4, (1, 2), zk_mzxid=500)
    assert lost_storage(unrecorded, 2, 600, restarted=True) and not lost_storage(unrecorded, 2, 300, restarted=True)
    assert not lost_storage(unrecorded, 2, 600, restarted=False), "without a record, only a seen restart is judged"
    assert lost_storage(state, 3, 600, restarted=True), "not a member: no record, judged by the last write"


def test_an_emptied_member_the_state_does_not_know_restarted_is_neither_elected_nor_kept():
    state = LeaderAndIsr(3, 4, (1, 2, 3), zk_mzxid=500, isr_storage=((1, 100), (2, 120), (3, 130)))
    after = after_restarts(REPLICAS, state, {1, 2}, restarted=set(), unclean=False, emptied={1})
    assert after.leader == 2 and after.isr == (2,), after


def test_storage_records_are_kept_for_members_only_and_survive_encoding():
    state = LeaderAndIsr(1, 4, (1, 2), controller_epoch=3).with_storage({1: 100, 2: 120, 3: 130})
    assert state.storage_records() == {1: 100, 2: 120}
    assert state.with_storage({1: 100}) is state
    shrunk = LeaderAndIsr(state.leader, state.leader_epoch, (1,), 3, isr_storage=state.isr_storage)
    assert shrunk.storage_records() == {1: 100} and b'"2"' not in shrunk.encode()
    decoded = LeaderAndIsr.decode(state.encode(), zk_version=7, zk_mzxid=900)
    assert decoded == LeaderAndIsr(1, 4, (1, 2), 3, 7, 900, ((1, 100), (2, 120)))
    legacy = b'{"controller_epoch": 3, "isr": [1, 2], "leader": 1, "leader_epoch": 4}'
    assert LeaderAndIsr.decode(legacy, 1).storage_records() == {} and LeaderAndIsr(1, 4, (1, 2), 3).encode() == legacy


def test_the_preferred_leader_leads_again_once_live_and_in_sync():
    state = LeaderAndIsr(2, 5, (2, 3))
    assert preferred_leader(REPLICAS, state, {1, 2, 3}) is state  # not in the ISR yet
    caught_up = LeaderAndIsr(2, 5, (2, 3, 1))
    assert preferred_leader(REPLICAS, caught_up, {1, 2, 3}) == LeaderAndIsr(1, 6, (2, 3, 1))
    assert initial_state((3, 1, 2), controller_epoch=7) == LeaderAndIsr(3, 0, (3, 1, 2), 7)


def test_a_state_is_ordered_by_leader_epoch_then_znode_version():
    assert LeaderAndIsr(1, 5, (1,), zk_version=0).newer_than(LeaderAndIsr(1, 4, (1, 2), zk_version=9))
    assert LeaderAndIsr(1, 5, (1,), zk_version=3).newer_than(LeaderAndIsr(1, 5, (1, 2), zk_version=2))
    assert not LeaderAndIsr(1, 5, (1,), zk_version=2).newer_than(LeaderAndIsr(1, 5, (1, 2), zk_version=2))
    assert LeaderAndIsr.decode(LeaderAndIsr(2, 3, (2, 1), 4).encode(), 8) == LeaderAndIsr(2, 3, (2, 1), 4, 8)


nodes = st.sets(st.sampled_from(REPLICAS))


@given(st.sampled_from([*REPLICAS, NO_LEADER]), st.integers(0, 100), st.lists(st.sampled_from(REPLICAS), min_size=1, unique=True),
       nodes, nodes, nodes, st.booleans())
def test_every_decision_keeps_the_rules(leader, epoch, isr, live, restarted, emptied, unclean):
    if leader != NO_LEADER and leader not in isr:
        isr = [leader, *isr]
    state = LeaderAndIsr(leader, epoch, tuple(isr))
    emptied &= restarted & live
    after = after_restarts(REPLICAS, state, live, restarted & live, unclean=unclean, emptied=emptied)
    assert after.isr or set(state.isr) <= emptied, "the ISR is emptied only of replicas that lost their disks"
    if after.leader != NO_LEADER:
        assert after.leader in after.isr and after.leader in live
        if not unclean:
            assert after.leader in state.isr, "a clean election picks an ISR member"
            assert after.leader not in emptied, "a replica on a new disk never leads cleanly"
    assert set(after.isr) <= set(state.isr) or (unclean and after.isr == (after.leader,))
    if after.leader != state.leader:
        assert after.leader_epoch > state.leader_epoch, "a leader change always bumps the epoch"
    else:
        assert after.leader_epoch >= state.leader_epoch
