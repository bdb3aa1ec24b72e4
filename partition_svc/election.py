"""What the controller decides for one partition: pure, no I/O (issue 14,
replication; Kafka's controller in ZooKeeper mode).

A partition's state is its leader, leader epoch and in-sync replicas (ISR).
The rules, all here:

- A live leader keeps leading; followers that are gone leave the ISR (the
  leader stays in it).
- A gone leader is replaced by the first replica, in preference order, that
  is live and in the ISR: every record the old leader acknowledged is on it.
  The leader epoch grows by one, so the old leader is fenced everywhere.
- With no such replica the partition goes offline (leader -1, epoch + 1) and
  keeps its last ISR, so that the first of them to come back leads again;
  only with ``unclean.leader.election.enable`` may a live replica outside the
  ISR lead (it may lack acknowledged records: Kafka's trade of durability
  for availability, off by default).
- The ISR is never emptied, except of replicas that lost their disks (below).
- The preferred leader (the first replica) takes leadership back once it is
  live and in the ISR (it caught up).

A node that restarted since the state was written (its registration is newer
than the state's last write) is treated as gone and back: it leaves the ISR
and rejoins as a follower once it has caught up, because its log may lack
what it did not sync, and it never leads on a state from before its restart.
It stays in the ISR when it is all that is left of it (a whole-cluster
restart: its durable log holds what was acknowledged). Not so a node that
came back on a new disk (its storage was made after the state's last write):
it holds nothing of what the state records, so it leaves the ISR even as its
last member, and the partition stays offline until a replica that kept its
log returns (or an unclean election, which the operator chooses): Kafka's
lost-disk case (KIP-966), where electing it would silently empty the log.

Which storage each ISR member was in the ISR with is recorded in the state
(``isr_storage``: member -> the zxid its storage was marked with, as KIP-966
records broker epochs): the controller records it for the live members of
every state it writes, and a leader for the followers it adds back (their
fetches say their storage). A live member whose storage is not the one
recorded lost its data, whenever that happened: wiped and restarted twice, or
wiped, restarted and stopped again before the controller saw it, while some
write of the state came between; comparing with the state's last write alone
took such a replica as kept. A member without a record (a state from before
records) is judged by that comparison still.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

NO_LEADER = -1


@dataclass(frozen=True)
class LeaderAndIsr:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int = 0
    zk_version: int = -1  # the znode version this was read at or written as; not stored
    zk_mzxid: int = -1  # the ZooKeeper transaction of that write; not stored
    # (member, the zxid of the storage it is in the ISR with), sorted by member; only members' records count
    isr_storage: tuple[tuple[int, int], ...] = ()

    def encode(self) -> bytes:
        raw = {"leader": self.leader, "leader_epoch": self.leader_epoch, "isr": list(self.isr),
               "controller_epoch": self.controller_epoch}
        recorded = self.storage_records()
        if recorded:
            raw["isr_storage"] = {str(node): zxid for node, zxid in recorded.items()}
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, zk_version: int, zk_mzxid: int = -1) -> LeaderAndIsr:
        raw = json.loads(data)
        recorded = tuple(sorted((int(node), int(zxid)) for node, zxid in raw.get("isr_storage", {}).items()))
        return cls(raw["leader"], raw["leader_epoch"], tuple(raw["isr"]), raw["controller_epoch"], zk_version, zk_mzxid,
                   recorded)

    def storage_records(self) -> dict[int, int]:
        """{ISR member: the storage zxid it is in the ISR with} for the members that have a record."""
        return {node: zxid for node, zxid in self.isr_storage if node in self.isr}

    def storage_of(self, node: int) -> int | None:
        return self.storage_records().get(node)

    def with_storage(self, known: Mapping[int, int]) -> LeaderAndIsr:
        """The state with ``known`` recorded for the ISR members it names (others
        keep theirs; records of non-members are dropped)."""
        records = {**self.storage_records(), **{n: z for n, z in known.items() if n in self.isr}}
        isr_storage = tuple(sorted(records.items()))
        return self if isr_storage == self.isr_storage else replace(self, isr_storage=isr_storage)

    def newer_than(self, other: LeaderAndIsr | None) -> bool:
        return other is None or (self.leader_epoch, self.zk_version) > (other.leader_epoch, other.zk_version)


def initial_state(replicas: Sequence[int], controller_epoch: int) -> LeaderAndIsr:
    return LeaderAndIsr(replicas[0], 0, tuple(replicas), controller_epoch)


def after_liveness(replicas: Sequence[int], state: LeaderAndIsr, live: Collection[int], *, unclean: bool) -> LeaderAndIsr:
    """The state once the controller has seen which nodes are ``live`` (the
    same object when nothing changes)."""
    if state.leader in live:
        isr = tuple(n for n in state.isr if n in live)
        return state if isr == state.isr else replace(state, isr=isr)
    candidates = [r for r in replicas if r in live and r in state.isr]
    if candidates:
        leader = candidates[0]
        return replace(state, leader=leader, leader_epoch=state.leader_epoch + 1,
                       isr=tuple(n for n in state.isr if n in live))
    if unclean:
        survivors = [r for r in replicas if r in live]
        if survivors:
            return replace(state, leader=survivors[0], leader_epoch=state.leader_epoch + 1, isr=(survivors[0],))
    if state.leader == NO_LEADER:
        return state
    return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1)


def lost_storage(state: LeaderAndIsr, node: int, storage: int, restarted: bool) -> bool:
    """Whether ``node``, live on the storage marked ``storage``, lost what
    ``state`` says it holds: its storage is not the one recorded; without a
    record, it ``restarted`` on storage made after the state's last write."""
    recorded = state.storage_of(node)
    if recorded is not None:
        return storage != recorded
    return restarted and storage > state.zk_mzxid


def after_restarts(replicas: Sequence[int], state: LeaderAndIsr, live: Collection[int], restarted: Collection[int],
                   *, unclean: bool, emptied: Collection[int] = ()) -> LeaderAndIsr:
    """:func:`after_liveness`, with the ``restarted`` nodes first treated as
    gone (they leave the ISR unless they are all that is left of it) and then
    as back; those ``emptied`` (on a new disk; restarted, whether the state
    says so or not) leave the ISR in any case."""
    restarted = set(restarted) | set(emptied)
    departed = after_liveness(replicas, state, [n for n in live if n not in restarted], unclean=unclean)
    if set(emptied) & set(departed.isr):
        departed = replace(departed, isr=tuple(n for n in departed.isr if n not in emptied))
    return after_liveness(replicas, departed, live, unclean=unclean)


def preferred_leader(replicas: Sequence[int], state: LeaderAndIsr, live: Collection[int]) -> LeaderAndIsr:
    """Leadership back to the preferred replica once it is live and in sync
    (the same object when it leads already or cannot)."""
    preferred = replicas[0]
    if state.leader == preferred or preferred not in live or preferred not in state.isr:
        return state
    return replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1)
