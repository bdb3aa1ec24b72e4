"""Consumer groups by example (issue 16): the assignors, cooperative
revocation, fencing by member epoch, static membership and commit checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partition_svc import assignors
from partition_svc.consumer_group import STABLE, UNRELEASED, UNREVOKED, ConsumerGroup, GroupError, Heartbeat

COUNTS = {"t": 4}


def join(group, member_id, now=0, topics=("t",), **kw):
    return group.heartbeat(Heartbeat(member_id, 0, subscribed=frozenset(topics), owned=frozenset(), **kw), now, COUNTS)


def beat(group, answer, owned=None, now=0, **kw):
    owned = answer.assigned if owned is None else owned
    return group.heartbeat(Heartbeat(answer.member_id, answer.member_epoch, owned=frozenset(owned), **kw), now, COUNTS)


def test_range_gives_contiguous_ranges_in_member_order():
    subscriptions = {"m2": frozenset({"t"}), "m1": frozenset({"t", "u"})}
    assert assignors.range_assignment(subscriptions, {"t": 5, "u": 2}) == {
        "m1": frozenset({("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)}), "m2": frozenset({("t", 3), ("t", 4)})}


def test_uniform_is_sticky_when_a_member_joins():
    before = assignors.uniform_assignment({"a": frozenset({"t"}), "b": frozenset({"t"})}, {"t": 6}, {})
    after = assignors.uniform_assignment({"a": frozenset({"t"}), "b": frozenset({"t"}), "c": frozenset({"t"})}, {"t": 6}, before)
    assert sorted(len(p) for p in after.values()) == [2, 2, 2]
    assert after["a"] <= before["a"] and after["b"] <= before["b"], "only what the newcomer needs moved"


@given(st.dictionaries(st.sampled_from("abcde"), st.sets(st.sampled_from(["t", "u", "v"]), min_size=1).map(frozenset), min_size=1),
       st.fixed_dictionaries({"t": st.integers(0, 7), "u": st.integers(0, 7), "v": st.integers(0, 3)}), st.sampled_from(assignors.ASSIGNORS))
def test_every_assignor_assigns_each_subscribed_partition_once_to_a_subscriber(subscriptions, counts, name):
    result = assignors.assign(name, subscriptions, counts, {})
    owners = [(tp, m) for m, tps in result.items() for tp in tps]
    assert len(owners) == len({tp for tp, _ in owners})
    assert {tp for tp, _ in owners} == {(t, p) for ts in subscriptions.values() for t in ts for p in range(counts[t])}
    assert all(tp[0] in subscriptions[m] for tp, m in owners)
    if name == "uniform" and len({frozenset(s) for s in subscriptions.values()}) == 1:
        sizes = [len(result[m]) for m in subscriptions]
        assert max(sizes) - min(sizes) <= 1, "even when everyone subscribes to the same topics"


def test_a_partition_moves_only_after_its_owner_revoked_it():
    group = ConsumerGroup("g")
    first = join(group, "m1")
    assert first.assigned == {("t", p) for p in range(4)} and group.members["m1"].state == STABLE
    second = join(group, "m2")
    assert second.assigned == frozenset() and group.members["m2"].state == UNRELEASED  # m1 still holds them
    told = beat(group, first)
    assert len(told.assigned) == 2 and group.members["m1"].state == UNREVOKED and told.member_epoch == first.member_epoch
    assert len(beat(group, second).assigned) == 0, "nothing moves before m1 reports the revocation"
    revoked = beat(group, told)
    assert revoked.member_epoch == group.assignment_epoch and group.members["m1"].state == STABLE
    given_now = beat(group, second)
    assert given_now.assigned == {("t", p) for p in range(4)} - revoked.assigned and group.members["m2"].state == STABLE


def test_a_stale_epoch_is_fenced_and_a_lost_answer_is_not():
    group = ConsumerGroup("g")
    first = join(group, "m1")
    join(group, "m2")
    told = beat(group, first)
    revoked = beat(group, told)  # epoch moves on; suppose this answer was lost
    assert beat(group, told, owned=revoked.assigned).member_epoch == revoked.member_epoch  # the previous epoch is fine
    with pytest.raises(GroupError) as fenced:
        group.heartbeat(Heartbeat("m1", revoked.member_epoch + 5, owned=frozenset()), 0, COUNTS)
    assert fenced.value.code == "FENCED_MEMBER_EPOCH"
    with pytest.raises(GroupError) as unknown:
        group.heartbeat(Heartbeat("nobody", 3, owned=frozenset()), 0, COUNTS)
    assert unknown.value.code == "UNKNOWN_MEMBER_ID"


def test_a_static_member_restarts_without_a_rebalance():
    group = ConsumerGroup("g")
    a = join(group, "a1", instance_id="worker-a")
    b = join(group, "b1", instance_id="worker-b")
    a = beat(group, beat(group, a))
    b = beat(group, b)
    epoch = group.group_epoch
    group.heartbeat(Heartbeat("a1", -2, instance_id="worker-a"), 100, COUNTS)
    with pytest.raises(GroupError) as taken:
        join(group, "b2", instance_id="worker-b")
    assert taken.value.code == "UNRELEASED_INSTANCE_ID"
    back = join(group, "a1", now=200, instance_id="worker-a")
    assert back.assigned == a.assigned and group.group_epoch == epoch, "same partitions, no new group epoch"
    group.heartbeat(Heartbeat("b1", -2, instance_id="worker-b"), 300, COUNTS)
    beat(group, back, now=45_000)
    assert group.expire(300 + 45_000) == ["b1"], "gone for longer than its session: removed"


def test_a_static_member_restarted_as_a_new_process_takes_its_old_member_over_under_its_new_id():
    """A restart is a new process with a new member id (the client makes it,
    KIP-1082); the instance id is what survives. The new id takes the old
    member's place, partitions and epoch; the old id is gone."""
    group = ConsumerGroup("g")
    a = join(group, "a1", instance_id="worker-a")
    b = join(group, "b1", instance_id="worker-b")
    a = beat(group, beat(group, a))
    b = beat(group, b)
    group.records()
    epoch = group.group_epoch
    group.heartbeat(Heartbeat("a1", -2, instance_id="worker-a"), 100, COUNTS)
    back = join(group, "a2", now=200, instance_id="worker-a")
    assert (back.member_id, back.assigned, back.member_epoch) == ("a2", a.assigned, a.member_epoch)
    assert group.group_epoch == epoch, "no rebalance"
    assert beat(group, back, now=300).assigned == a.assigned, "its next heartbeat, under its new id, is accepted"
    with pytest.raises(GroupError) as gone:
        group.heartbeat(Heartbeat("a1", a.member_epoch, owned=a.assigned), 300, COUNTS)
    assert gone.value.code == "UNKNOWN_MEMBER_ID"
    written = dict(group.records())
    assert written["a1"] is None and written["a2"] is not None, "the old id's record deleted, the new one's written"
    assert ConsumerGroup.restore("g", {k: v for k, v in written.items() if v is not None} | {"b1": group._record("b1")},
                                 0, heartbeat_interval_ms=5000).members["a2"].assigned == a.assigned


def test_a_static_member_whose_join_answer_was_lost_joins_again_under_the_same_id():
    """Found in review: after a restarted static member took its old place
    under its new id, a retry of that join (its answer lost, or the member
    fenced) was refused as UNRELEASED_INSTANCE_ID until its own session ran
    out. A join under the member's own id is a rejoin of that member."""
    group = ConsumerGroup("g")
    a = join(group, "a1", instance_id="worker-a")
    a = beat(group, beat(group, a))
    group.heartbeat(Heartbeat("a1", -2, instance_id="worker-a"), 100, COUNTS)
    join(group, "a2", now=200, instance_id="worker-a")  # its answer lost
    again = join(group, "a2", now=300, instance_id="worker-a")
    again = beat(group, beat(group, again, now=400), now=500)
    assert (again.member_id, again.assigned) == ("a2", a.assigned)
    assert [m.member_id for m in group.describe()] == ["a2"]
    with pytest.raises(GroupError) as taken:
        join(group, "a3", now=600, instance_id="worker-a")
    assert taken.value.code == "UNRELEASED_INSTANCE_ID", "another process with its instance id is still refused"


def test_commits_need_the_members_current_epoch():
    group = ConsumerGroup("g")
    group.check_commit("", -1)  # an empty group takes commits from outside (admin tools, batch jobs)
    first = join(group, "m1")
    group.check_commit("m1", first.member_epoch)
    for member_id, epoch, code in (("m1", first.member_epoch - 1, "STALE_MEMBER_EPOCH"), ("zombie", 1, "UNKNOWN_MEMBER_ID"),
                                   ("", -1, "UNKNOWN_MEMBER_ID")):
        with pytest.raises(GroupError) as refused:
            group.check_commit(member_id, epoch)
        assert refused.value.code == code
    group.expire(10**9)
    with pytest.raises(GroupError, match="left or timed out"):
        group.check_commit("m1", first.member_epoch)


def test_heartbeat_requests_that_cannot_be_are_refused_naming_the_field():
    """The hostile suite found a 100,000-character member id echoed into an
    error message too large for gRPC's headers."""
    from partition_svc.group_coordinator import check_member_id, heartbeat_of
    from txlog.protocol.errors import ErrorCode, TxlogError
    from txlog.v1 import partition_pb2

    def refused(**fields) -> str:
        with pytest.raises(TxlogError) as error:
            heartbeat_of(partition_pb2.ConsumerGroupHeartbeatRequest(group_id="g", **fields))
        assert ErrorCode.Name(error.value.code) == "INVALID_REQUEST"
        return error.value.message

    assert "more than 255" in refused(member_id="x" * 100_000, member_epoch=0)
    assert "instance_id" in refused(member_id="m", member_epoch=0, instance_id="i" * 300)
    assert "server_assignor" in refused(member_id="m", member_epoch=0, server_assignor="sticky" * 1000)
    assert "member_epoch -3" in refused(member_id="m", member_epoch=-3)
    assert "names its member_id" in refused(member_epoch=4)
    assert "at least one topic" in refused(member_id="m", member_epoch=0, subscribed_topics=partition_pb2.TopicNames())
    assert "session_timeout_ms" in refused(member_id="m", member_epoch=0, session_timeout_ms=10)
    with pytest.raises(TxlogError, match="more than 255"):
        check_member_id("m" * 256)


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_removed():
    group = ConsumerGroup("g")
    first = join(group, "m1", rebalance_timeout_ms=5_000)
    second = join(group, "m2")
    beat(group, first, now=1_000, rebalance_timeout_ms=5_000)  # told to give two partitions up; it never reports them revoked
    beat(group, second, now=2_000)
    assert group.expire(5_999) == []
    assert group.expire(6_000) == ["m1"], "stuck past its rebalance timeout"
    assert len(beat(group, second, now=6_100).assigned) == 4, "the partitions it held move on"
