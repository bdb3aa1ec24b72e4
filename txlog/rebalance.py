"""The plan of ``txlog partitions rebalance``: replicas and preferred leaders
spread evenly over the live instances, moving as few replicas as it can
(pure: an assignment and the live nodes in, reassignments out).

Guarantees, for any assignment and any non-empty set of live nodes:

* every partition keeps min(its replication factor, live nodes) distinct
  replicas, all on live nodes;
* the replica counts of the live nodes differ by at most one;
* a replica moves only off a node that is gone or that holds more than its
  share, onto the least loaded node the partition is not on yet: the moves
  are the gone nodes' replicas and each node's excess over its share, plus
  at most one per gone replica that could only land on a full node (the
  others already hold its partition);
* preferred leaders (the first replica, the one the controller restores) are
  then evened out by reordering replicas within partitions, which moves no
  data: a node leads at most one partition more than another wherever a swap
  can make it so;
* the same input gives the same plan (ties go to the lower node id, then to
  the first partition in topic-partition order).

Only partitions whose replica list changes are in the plan. Racks are not
considered (the placement of new topics is rack-aware; a rebalance of a
rack-aware cluster may put two replicas in one rack).
"""

from __future__ import annotations

from collections import Counter

from txlog.structs import TopicPartition


def rebalance(assignment: dict[TopicPartition, list[int]], nodes: list[int]) -> dict[TopicPartition, list[int]]:
    """{partition: new replica list} for the partitions that change."""
    live = sorted(set(nodes))
    if not live:
        return {}
    placed = {tp: _kept(replicas, set(live)) for tp, replicas in sorted(assignment.items())}
    load = Counter({node: 0 for node in live})
    for replicas in placed.values():
        load.update(n for n in replicas if n is not None)
    for replicas in placed.values():  # replicas of gone nodes: onto the least loaded
        for slot, node in enumerate(replicas):
            if node is None:
                replicas[slot] = _least_loaded(load, exclude=replicas)
                load[replicas[slot]] += 1
    _spread_replicas(placed, load)
    _spread_leaders(placed, live)
    return {tp: replicas for tp, replicas in placed.items() if replicas != list(assignment[tp])}


def _kept(replicas: list[int], live: set[int]) -> list[int | None]:
    """The replica slots a partition keeps: min(factor, live nodes) of them, a
    gone node's slot empty (None) to be filled; surplus slots (a factor above
    the live nodes) are dropped from the gone ones first."""
    factor = min(len(replicas), len(live))
    slots: list[int | None] = [n if n in live else None for n in replicas]
    while len(slots) > factor:
        if None in slots:
            slots.remove(None)
        else:
            slots.pop()
    return slots


def _least_loaded(load: Counter, exclude) -> int:
    return min((n for n in load if n not in exclude), key=lambda n: (load[n], n))


def _spread_replicas(placed: dict[TopicPartition, list[int]], load: Counter) -> None:
    """Moves one replica at a time from the most loaded node to the least
    loaded one that can take it, until no two loads differ by more than one."""
    while True:
        move = _replica_move(placed, load)
        if move is None:
            return
        tp, slot, over, under = move
        placed[tp][slot] = under
        load[over] -= 1
        load[under] += 1


def _replica_move(placed: dict[TopicPartition, list[int]], load: Counter):
    """(partition, slot, from, to) of the next replica to move, or None."""
    for over in sorted(load, key=lambda n: (-load[n], n)):
        for under in sorted(load, key=lambda n: (load[n], n)):
            if load[over] - load[under] <= 1:
                break
            for tp, replicas in placed.items():
                if over in replicas and under not in replicas:
                    return tp, replicas.index(over), over, under
    return None


def _spread_leaders(placed: dict[TopicPartition, list[int]], live: list[int]) -> None:
    """Brings a replica of the node leading fewest to the front of a partition
    led by the node leading most, while that narrows the gap."""
    leads = Counter({node: 0 for node in live})
    leads.update(replicas[0] for replicas in placed.values() if replicas)
    while True:
        swap = _leader_swap(placed, leads)
        if swap is None:
            return
        tp, most, fewest = swap
        replicas = placed[tp]
        slot = replicas.index(fewest)
        replicas[0], replicas[slot] = replicas[slot], replicas[0]
        leads[most] -= 1
        leads[fewest] += 1


def _leader_swap(placed: dict[TopicPartition, list[int]], leads: Counter):
    """(partition, its leader, the replica to lead instead) of the next swap, or None."""
    for most in sorted(leads, key=lambda n: (-leads[n], n)):
        for fewest in sorted(leads, key=lambda n: (leads[n], n)):
            if leads[most] - leads[fewest] <= 1:
                break
            for tp, replicas in placed.items():
                if replicas and replicas[0] == most and fewest in replicas:
                    return tp, most, fewest
    return None
