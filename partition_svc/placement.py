"""Where a topic's replicas go: pure, no I/O (issue 14, replication).

Kafka's assignment (AdminUtils.assignReplicasToBrokers): partition p's first
replica (its preferred leader) is node ``(start + p) mod n``, so leaders spread
evenly; its followers follow at a shift that grows by one every n partitions,
so the followers of one node's leaders spread over the others too.

Rack-aware when every node declares a rack: the nodes are first interleaved
rack by rack (a1, b1, c1, a2, b2, ...), so consecutive nodes are in different
racks, and a follower is skipped while its rack already holds a replica of
the partition, unless every rack does (more replicas than racks).
"""

from __future__ import annotations

from collections.abc import Mapping

Rack = str | None


def interleaved_by_rack(nodes: Mapping[int, Rack]) -> list[int]:
    """Node ids ordered so that neighbours are in different racks when racks allow."""
    by_rack: dict[Rack, list[int]] = {}
    for node_id in sorted(nodes):
        by_rack.setdefault(nodes[node_id], []).append(node_id)
    racks = sorted(by_rack, key=lambda r: (r is None, r or ""))
    ordered: list[int] = []
    for i in range(max(len(v) for v in by_rack.values())):
        ordered += [by_rack[r][i] for r in racks if i < len(by_rack[r])]
    return ordered


def assign_replicas(partition_count: int, replication_factor: int, nodes: Mapping[int, Rack],
                    start: int = 0, shift: int = 0) -> list[list[int]]:
    """Replica lists, the preferred leader first, for partitions 0..count-1.
    ``start`` and ``shift`` pick where the rotation begins (random in Kafka,
    so topics created one after another do not all lead on the same node)."""
    if partition_count < 1:
        raise ValueError(f"partition count must be >= 1, got {partition_count}")
    if not 1 <= replication_factor <= len(nodes):
        raise ValueError(f"replication factor {replication_factor} needs 1..{len(nodes)} live instances, "
                         f"there are {len(nodes)}")
    rack_aware = all(rack is not None for rack in nodes.values()) and len(set(nodes.values())) > 1
    order = interleaved_by_rack(nodes) if rack_aware else sorted(nodes)
    n = len(order)
    rack_count = len(set(nodes.values())) if rack_aware else 0
    assignment = []
    for p in range(partition_count):
        first = (start + p) % n
        replica_shift = (shift + p // n) % max(n - 1, 1)
        replicas = [order[first]]
        racks_used = {nodes[order[first]]}
        step = 0
        while len(replicas) < replication_factor:
            candidate = order[(first + 1 + (replica_shift + step) % (n - 1)) % n]
            step += 1
            if candidate in replicas:
                continue
            rack_taken = rack_aware and nodes[candidate] in racks_used and len(racks_used) < rack_count
            if rack_taken and step <= n * n:  # another rack is still free: skip this one for now
                continue
            replicas.append(candidate)
            racks_used.add(nodes[candidate])
        assignment.append(replicas)
    return assignment
