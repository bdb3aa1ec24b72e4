"""txlog partitions rebalance's plan (txlog/rebalance.py): even
replicas and leaders over the live nodes, with the fewest replicas moved."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from txlog.rebalance import rebalance
from txlog.structs import TopicPartition


def after(assignment, plan):
    return {tp: plan.get(tp, replicas) for tp, replicas in assignment.items()}


def moved(assignment, plan) -> int:
    return sum(len(set(replicas) - set(assignment[tp])) for tp, replicas in plan.items())


def test_a_new_instance_takes_its_share_and_nothing_else_moves():
    assignment = {TopicPartition("t", p): [p % 3, (p + 1) % 3] for p in range(6)}  # 12 replicas on nodes 0-2
    plan = rebalance(assignment, [0, 1, 2, 3])
    loads = Counter(n for replicas in after(assignment, plan).values() for n in replicas)
    assert loads == {0: 3, 1: 3, 2: 3, 3: 3}
    assert moved(assignment, plan) == 3, "the new node's share, nothing more"


def test_a_gone_instances_replicas_move_and_a_balanced_cluster_gets_an_empty_plan():
    assignment = {TopicPartition("t", p): [p % 3, (p + 1) % 3] for p in range(6)}
    assert rebalance(assignment, [0, 1, 2]) == {}
    plan = rebalance(assignment, [0, 1])
    assert all(sorted(replicas) == [0, 1] for replicas in after(assignment, plan).values())
    assert moved(assignment, plan) == 4  # node 2's four replicas


assignments = st.dictionaries(
    st.builds(TopicPartition, st.sampled_from(["a", "b", "c"]), st.integers(0, 7)),
    st.integers(1, 4).flatmap(lambda rf: st.lists(st.integers(0, 6), min_size=rf, max_size=rf, unique=True)),
    max_size=24)


@settings(max_examples=400, deadline=None)
@given(assignment=assignments, nodes=st.lists(st.integers(0, 6), min_size=1, max_size=6, unique=True))
def test_any_assignment_becomes_even_with_the_fewest_moves(assignment, nodes):
    plan = rebalance(assignment, nodes)
    result = after(assignment, plan)
    for tp, replicas in result.items():
        assert len(replicas) == len(set(replicas)) == min(len(assignment[tp]), len(nodes)), (tp, replicas)
        assert set(replicas) <= set(nodes)
    loads = Counter({n: 0 for n in nodes})
    loads.update(n for replicas in result.values() for n in replicas)
    assert max(loads.values()) - min(loads.values()) <= 1, loads
    # Each replica of a gone node moves, and each node above its share sheds its excess (the larger
    # shares to the nodes holding most); a gone node's replica that can only land on a full node (the
    # others hold the partition already) costs one more move, never more.
    base, extra = divmod(sum(loads.values()), len(nodes))
    held = Counter({n: 0 for n in nodes})
    held.update(n for replicas in assignment.values() for n in replicas if n in nodes)
    excess = sum(max(0, count - (base + 1 if i < extra else base))
                 for i, count in enumerate(sorted(held.values(), reverse=True)))
    filled = sum(len(replicas) - len(set(assignment[tp]) & set(nodes)) for tp, replicas in result.items())
    assert filled + excess <= moved(assignment, plan) <= 2 * filled + excess
    leads = Counter({n: 0 for n in nodes})
    leads.update(replicas[0] for replicas in result.values() if replicas)
    most, fewest = max(leads.values()), min(leads.values())
    if most - fewest > 1:  # then no reordering could narrow it: no partition a top node leads holds a bottom one
        assert not any(leads[r[0]] == most and any(leads[n] == fewest for n in r) for r in result.values() if r), leads
    assert all(plan[tp] != assignment[tp] for tp in plan), "only changes are planned"
    assert rebalance(result, nodes) == {}, "a rebalanced cluster plans nothing more"
