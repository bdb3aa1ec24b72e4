"""Server-side partition assignors of consumer groups (issue 16, KIP-848):
pure functions from the members' subscriptions and the topics' partition
counts (and, for the uniform one, the current assignment) to a target
assignment. Every partition of a subscribed topic goes to exactly one member
subscribed to it; a topic nobody subscribes to is not assigned.

- ``range`` (Kafka's RangeAssignor): per topic, its partitions in order are
  split into contiguous ranges over the members subscribed to it, sorted by
  member id (the first ones get one more when it does not divide). Members
  subscribed to the same topics get the same partition numbers of each,
  which co-partitioned joins want.
- ``uniform`` (Kafka's default server-side assignor): as even as the
  subscriptions allow, and sticky: a partition stays with its owner unless
  that owner has more than its share, so a member joining or leaving moves
  as few partitions as balance needs.
"""

from __future__ import annotations

from collections.abc import Mapping

from txlog.protocol.names import TopicPartition

Assignment = dict[str, frozenset[TopicPartition]]
ASSIGNORS = ("uniform", "range")
DEFAULT_ASSIGNOR = "uniform"


def range_assignment(subscriptions: Mapping[str, frozenset[str]], partition_counts: Mapping[str, int]) -> Assignment:
    assigned: dict[str, set[TopicPartition]] = {member: set() for member in subscriptions}
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        count = partition_counts.get(topic, 0)
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        if not members or count <= 0:
            continue
        share, extra = divmod(count, len(members))
        start = 0
        for index, member in enumerate(members):
            size = share + (1 if index < extra else 0)
            assigned[member].update((topic, p) for p in range(start, start + size))
            start += size
    return {m: frozenset(tps) for m, tps in assigned.items()}


def uniform_assignment(subscriptions: Mapping[str, frozenset[str]], partition_counts: Mapping[str, int],
                       current: Mapping[str, frozenset[TopicPartition]]) -> Assignment:
    members = sorted(subscriptions)
    assigned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    if not members:
        return {}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    counts = {t: max(partition_counts.get(t, 0), 0) for t in topics}
    partitions = [(topic, p) for topic in topics for p in range(counts[topic])]
    subscribers = {t: [m for m in members if t in subscriptions[m]] for t in topics}  # per topic: O(members x topics)
    eligible = {tp: subscribers[tp[0]] for tp in partitions}
    # Each member's share: what an even spread over the members eligible for its topics allows.
    total_eligible = {m: sum(counts[t] for t in subscriptions[m] if t in counts) for m in members}
    quota = {m: -(-total_eligible[m] // max(1, len(members))) if total_eligible[m] else 0 for m in members}
    owner = {tp: m for m, tps in current.items() if m in assigned for tp in tps}
    unassigned = []
    for tp in partitions:
        kept = owner.get(tp)
        if kept is not None and tp[0] in subscriptions[kept] and len(assigned[kept]) < max(quota[kept], 1):
            assigned[kept].add(tp)
        else:
            unassigned.append(tp)
    for tp in unassigned:
        candidates = eligible[tp]
        if candidates:
            chosen = min(candidates, key=lambda m: (len(assigned[m]), m))
            assigned[chosen].add(tp)
    _balance(assigned, eligible)
    return {m: frozenset(tps) for m, tps in assigned.items()}


def _balance(assigned: dict[str, set[TopicPartition]], eligible: Mapping[TopicPartition, list[str]]) -> None:
    """Moves partitions from the fullest member to the emptiest eligible one
    while that narrows the spread (stickiness kept some owners above it)."""
    while True:
        moved = False
        for source in sorted(assigned, key=lambda m: (-len(assigned[m]), m)):
            for tp in sorted(assigned[source]):
                target = min((m for m in eligible[tp] if m != source), key=lambda m: (len(assigned[m]), m), default=None)
                if target is not None and len(assigned[target]) + 1 < len(assigned[source]):
                    assigned[source].remove(tp)
                    assigned[target].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


def assign(assignor: str, subscriptions: Mapping[str, frozenset[str]], partition_counts: Mapping[str, int],
           current: Mapping[str, frozenset[TopicPartition]]) -> Assignment:
    if assignor == "range":
        return range_assignment(subscriptions, partition_counts)
    if assignor == "uniform":
        return uniform_assignment(subscriptions, partition_counts, current)
    raise ValueError(f"unknown assignor {assignor!r}; known: {', '.join(ASSIGNORS)}")
