"""Replica placement (partition_svc/placement.py): every partition gets distinct
replicas, preferred leaders spread evenly, and with racks the replicas of a
partition span as many racks as they can."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partition_svc.placement import assign_replicas, interleaved_by_rack


def test_kafkas_rotation_without_racks():
    assert assign_replicas(6, 3, {0: None, 1: None, 2: None}) == [
        [0, 1, 2], [1, 2, 0], [2, 0, 1],  # shift 0
        [0, 2, 1], [1, 0, 2], [2, 1, 0],  # after n partitions the followers shift by one
    ]


def test_racks_are_interleaved_and_each_partition_spans_three_racks():
    nodes = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    assert interleaved_by_rack(nodes) == [0, 2, 4, 1, 3, 5]
    for replicas in assign_replicas(12, 3, nodes):
        assert sorted(nodes[r] for r in replicas) == ["a", "b", "c"], replicas


@pytest.mark.parametrize("bad", [(0, 1), (3, 0), (3, 4)])
def test_impossible_requests_are_refused(bad):
    with pytest.raises(ValueError):
        assign_replicas(bad[0], bad[1], {0: None, 1: None, 2: None})


@given(n=st.integers(1, 9), partitions=st.integers(1, 40), data=st.data())
def test_replicas_are_distinct_and_leaders_spread_evenly(n, partitions, data):
    rf = data.draw(st.integers(1, n))
    start, shift = data.draw(st.integers(0, 20)), data.draw(st.integers(0, 20))
    racks = data.draw(st.one_of(st.none(), st.lists(st.sampled_from("abc"), min_size=n, max_size=n)))
    nodes = {i: (racks[i] if racks else None) for i in range(n)}
    assignment = assign_replicas(partitions, rf, nodes, start, shift)
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == rf == len(set(replicas)) and set(replicas) <= set(nodes)
        if racks and len(set(racks)) > 1:  # as many racks as the replicas can cover
            assert len({nodes[r] for r in replicas}) == min(rf, len(set(racks)))
    leaders = Counter(r[0] for r in assignment)
    assert max(leaders.values()) - min(leaders.get(i, 0) for i in nodes) <= 1, leaders
