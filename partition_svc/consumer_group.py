"""One consumer group's membership and assignment, KIP-848's protocol: pure,
no I/O (issue 16). The group coordinator (the leader of the group's
``__consumer_offsets`` partition, where its offsets live too) keeps one per
group, feeds it heartbeats and the clock, and stores what it decides.

Members heartbeat with their subscription and the partitions they own; the
group computes a target assignment on the server (assignors.py) whenever its
**group epoch** moves (a member joined, left, or changed its subscription;
a subscribed topic's partition count changed), and brings each member to it
one step at a time (cooperative, incremental):

1. A member that owns partitions its target does not include is told to own
   only the ones it keeps (``UNREVOKED_PARTITIONS``); its member epoch stays
   until a heartbeat reports the others revoked.
2. It then moves to the target's epoch and is given the target's new
   partitions that no other member still holds; the rest follow, with no
   epoch change, once their previous owners have revoked them
   (``UNRELEASED_PARTITIONS``), until it holds its whole target (``STABLE``).

So a partition is held (assigned, or still owned pending its revocation) by
at most one member at any moment: the invariant the model test checks. A
member has one heartbeat in flight at a time (the SDK waits for each answer,
as Kafka's consumer does); answers may be lost.

Member epochs fence: a heartbeat or an offset commit with another epoch than
the member's is refused (``FENCED_MEMBER_EPOCH`` for heartbeats,
``STALE_MEMBER_EPOCH`` for commits; the previous epoch is still accepted on
a heartbeat whose owned partitions are within the current assignment, so a
lost answer costs nothing); a member that misses heartbeats for its session
timeout is removed and its partitions freed, and so is one that keeps
partitions it was told to revoke past its rebalance timeout (a consumer that
stopped polling: Kafka's max.poll.interval.ms). Member epoch -1 leaves; -2 is a
static member (``instance_id``) leaving for a restart: it keeps its
partitions for the session timeout and the same ``instance_id`` rejoins with
them, without a rebalance (under the new member id its new process made: that
id takes the old one's place).

Durability: the coordinator writes the group to its ``__consumer_offsets``
partition as records (``records()``: the group's own record, its epochs,
assignor and partition counts under member id ``""``, and one per member,
with its target; a removed member's record is deleted), and answers a
heartbeat only once they are replicated. A new coordinator (the partition's
next leader) rebuilds the group from them (``restore``) with every session
started afresh, so a coordinator move changes no member's epoch or
partitions (Kafka's KIP-848 coordinator does the same).

The legal member states and transitions, all here:

    (join, epoch 0)     -> UNRELEASED_PARTITIONS or STABLE  (a rejoin of a known member id starts here too)
    STABLE              -> UNREVOKED_PARTITIONS   (the target took partitions away)
                        -> UNRELEASED_PARTITIONS  (the target added partitions others hold)
                        -> STABLE                 (the target only added free partitions)
    UNREVOKED           -> UNRELEASED or STABLE   (the member reported the revocation)
    UNRELEASED          -> STABLE                 (the partitions were freed)
                        -> UNREVOKED              (a newer target took partitions away)
    any                 -> (removed)              (leave, session timeout, fenced)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from partition_svc import assignors
from partition_svc.assignors import TopicPartition

STABLE, UNREVOKED, UNRELEASED = "STABLE", "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS"
TRANSITIONS = {
    None: {STABLE, UNRELEASED},
    STABLE: {STABLE, UNREVOKED, UNRELEASED},
    UNREVOKED: {UNREVOKED, UNRELEASED, STABLE},
    UNRELEASED: {UNRELEASED, STABLE, UNREVOKED},
}
LEAVE_EPOCH, STATIC_LEAVE_EPOCH, JOIN_EPOCH = -1, -2, 0
GROUP_RECORD = ""  # the member id the group's own record is kept under (no member has it: ids are never empty)


class GroupError(Exception):
    """A heartbeat or commit the group refuses: ``code`` is an ErrorCode name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    subscribed: frozenset[str]
    session_timeout_ms: int
    deadline_ms: int
    member_epoch: int = 0
    previous_epoch: int = -1
    state: str | None = None
    assigned: frozenset[TopicPartition] = frozenset()  # what it may own now
    revoking: frozenset[TopicPartition] = frozenset()  # what it still owns but must give up
    left_for_restart: bool = False  # a static member gone for a restart, its partitions kept
    rebalance_timeout_ms: int = 300_000
    revoke_by_ms: int | None = None  # removed if it still holds partitions to revoke then

    def holds(self) -> frozenset[TopicPartition]:
        return self.assigned | self.revoking

    def move(self, state: str) -> None:
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"member {self.member_id}: no transition {self.state} -> {state}")
        self.state = state


@dataclass(frozen=True)
class Heartbeat:
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    subscribed: frozenset[str] | None = None  # None: unchanged since the last heartbeat
    owned: frozenset[TopicPartition] | None = None  # None: unchanged
    session_timeout_ms: int = 45_000
    assignor: str | None = None
    rebalance_timeout_ms: int = 300_000


@dataclass(frozen=True)
class Answer:
    member_id: str
    member_epoch: int
    assigned: frozenset[TopicPartition]
    heartbeat_interval_ms: int


@dataclass
class ConsumerGroup:
    group_id: str
    assignor: str = assignors.DEFAULT_ASSIGNOR
    heartbeat_interval_ms: int = 3_000
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)  # members whose record may have changed since records()
    _written: dict[str, bytes] = field(default_factory=dict)  # member id (GROUP_RECORD: the group) -> its record as written

    # --- heartbeats -------------------------------------------------------------------------

    def heartbeat(self, beat: Heartbeat, now_ms: int, partition_counts: Mapping[str, int]) -> Answer:
        """The member's answer; GroupError for a beat the group refuses (nothing changes then)."""
        if beat.assignor is not None and beat.assignor not in assignors.ASSIGNORS:
            raise GroupError("INVALID_REQUEST", f"unknown assignor {beat.assignor!r}; known: {', '.join(assignors.ASSIGNORS)}")
        if beat.member_epoch == JOIN_EPOCH:
            member = self._join(beat, now_ms)
        elif beat.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            member = self._known(beat)
            if beat.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id:
                member.left_for_restart = True
                member.deadline_ms = now_ms + member.session_timeout_ms
            else:
                self.remove(member.member_id)
            self._dirty.add(member.member_id)
            return Answer(member.member_id, beat.member_epoch, frozenset(), self.heartbeat_interval_ms)
        else:
            member = self._known(beat)
            self._check_epoch(member, beat)
            if beat.subscribed is not None and beat.subscribed != member.subscribed:
                member.subscribed = beat.subscribed
                self.group_epoch += 1
        self._note_partition_counts(partition_counts)  # after every refusal: a refused beat changes nothing
        if beat.assignor is not None and beat.assignor != self.assignor:
            self.assignor = beat.assignor
            self.group_epoch += 1
        member.deadline_ms = now_ms + member.session_timeout_ms
        if beat.owned is not None and beat.member_epoch == member.member_epoch:
            # what it reports no longer owning is revoked (it cannot claim what it was not given); only from
            # a beat of its current epoch: one from before could predate partitions it has since been given
            member.revoking = member.revoking & beat.owned
        member.rebalance_timeout_ms = beat.rebalance_timeout_ms
        self._refresh_target()
        self._reconcile(member)
        if not member.revoking:
            member.revoke_by_ms = None
        elif member.revoke_by_ms is None:
            member.revoke_by_ms = now_ms + member.rebalance_timeout_ms
        self._dirty.add(member.member_id)
        return Answer(member.member_id, member.member_epoch, member.assigned, self.heartbeat_interval_ms)

    def _join(self, beat: Heartbeat, now_ms: int) -> Member:
        if beat.subscribed is None:
            raise GroupError("INVALID_REQUEST", "a joining member names its subscription (subscribed topics)")
        if beat.instance_id:
            static = next((m for m in self.members.values() if m.instance_id == beat.instance_id), None)
            # under its own id, and not back from a restart, it is a rejoin of that member (below): a join whose
            # answer was lost, or a fenced member
            if static is not None and (static.left_for_restart or static.member_id != beat.member_id):
                if not static.left_for_restart:
                    raise GroupError("UNRELEASED_INSTANCE_ID", f"instance id {beat.instance_id!r} is in use by member "
                                     f"{static.member_id}; it must leave (member epoch -2) first")
                # the same identity back from a restart: its partitions and epoch, no rebalance
                if beat.member_id and beat.member_id != static.member_id:
                    self._rename(static, beat.member_id)  # first: it may refuse, and a refused beat changes nothing
                static.left_for_restart = False
                static.revoking = frozenset()
                if beat.subscribed != static.subscribed:
                    static.subscribed = beat.subscribed
                    self.group_epoch += 1
                return static
        member_id = beat.member_id or uuid.uuid4().hex
        known = self.members.get(member_id)
        if known is not None:
            # a rejoin (KIP-1082: the client made its member id and keeps it): a join whose answer was lost,
            # or a fenced member coming back; at epoch 0 it consumes nothing, so what it held is free
            known.assigned, known.revoking, known.state, known.member_epoch, known.previous_epoch = frozenset(), frozenset(), None, 0, -1
            known.session_timeout_ms = beat.session_timeout_ms
            if beat.subscribed != known.subscribed:
                known.subscribed = beat.subscribed
                self.group_epoch += 1
            return known
        member = Member(member_id, beat.instance_id or None, beat.subscribed, beat.session_timeout_ms, now_ms + beat.session_timeout_ms)
        self.members[member_id] = member
        self.group_epoch += 1
        return member

    def _rename(self, member: Member, member_id: str) -> None:
        """A restarted static member comes back as a new process under the id
        it made (KIP-1082); that id takes the old one's place, which is gone."""
        if member_id in self.members:
            raise GroupError("INVALID_REQUEST", f"member id {member_id!r} is already another member of group "
                             f"{self.group_id!r}; a restarted static member joins with a new one")
        old_id, member.member_id = member.member_id, member_id
        self.members[member_id] = self.members.pop(old_id)
        if old_id in self.target:
            self.target[member_id] = self.target.pop(old_id)
        self._dirty.update((old_id, member_id))

    def _known(self, beat: Heartbeat) -> Member:
        member = self.members.get(beat.member_id)
        if member is None:
            raise GroupError("UNKNOWN_MEMBER_ID", f"member {beat.member_id!r} is not in group {self.group_id!r} "
                             "(it left, was fenced or timed out); rejoin with member epoch 0")
        return member

    def _check_epoch(self, member: Member, beat: Heartbeat) -> None:
        if beat.member_epoch == member.member_epoch:
            return
        # the previous epoch: the member missed our last answer; fine if it owns nothing it should not
        if beat.member_epoch == member.previous_epoch and beat.owned is not None and beat.owned <= member.holds():
            return
        raise GroupError("FENCED_MEMBER_EPOCH", f"member {member.member_id} sent epoch {beat.member_epoch}, its epoch is "
                         f"{member.member_epoch}: it must drop its partitions and rejoin with member epoch 0")

    # --- time --------------------------------------------------------------------------------

    def expire(self, now_ms: int) -> list[str]:
        """Removes the members whose session ran out; returns their ids."""
        gone = [m.member_id for m in self.members.values()
                if m.deadline_ms <= now_ms or (m.revoke_by_ms is not None and m.revoke_by_ms <= now_ms)]
        for member_id in gone:
            self.remove(member_id)
        return gone

    def remove(self, member_id: str) -> None:
        if self.members.pop(member_id, None) is not None:
            self.group_epoch += 1
            self.target.pop(member_id, None)
            self._dirty.add(member_id)

    # --- assignment ---------------------------------------------------------------------------

    def _note_partition_counts(self, counts: Mapping[str, int]) -> None:
        subscribed = {t for m in self.members.values() for t in m.subscribed}
        changed = {t: c for t, c in counts.items() if self.partition_counts.get(t) != c}
        self.partition_counts.update(counts)
        if set(changed) & subscribed:
            self.group_epoch += 1

    def _refresh_target(self) -> None:
        if self.assignment_epoch == self.group_epoch:
            return
        subscriptions = {m.member_id: m.subscribed for m in self.members.values()}
        current = {m.member_id: m.assigned for m in self.members.values()}
        before, self.target = self.target, assignors.assign(self.assignor, subscriptions, self.partition_counts, current)
        self._dirty.update(m for m in self.members if before.get(m) != self.target.get(m))
        self.assignment_epoch = self.group_epoch

    def _held_by_others(self, member: Member) -> frozenset[TopicPartition]:
        return frozenset(tp for other in self.members.values() if other is not member for tp in other.holds())

    def _reconcile(self, member: Member) -> None:
        target = self.target.get(member.member_id, frozenset())
        losing = member.assigned - target
        if losing or member.revoking:
            # step 1: give up what the target took; the epoch waits for the revocation
            member.revoking |= losing
            member.assigned = member.assigned & target
            member.move(UNREVOKED)
            if member.revoking:
                return
        if member.member_epoch != self.assignment_epoch:
            member.previous_epoch, member.member_epoch = member.member_epoch, self.assignment_epoch
        wanted = target - member.assigned
        if wanted:  # the scan of every other member only when there is something to take
            member.assigned = member.assigned | (wanted - self._held_by_others(member))
        member.move(STABLE if member.assigned == target else UNRELEASED)

    # --- offset commits --------------------------------------------------------------------

    def check_commit(self, member_id: str, member_epoch: int) -> None:
        """A commit from a member of the group must carry its current epoch
        (KIP-447: a zombie's commit is refused). A commit without a member
        (epoch -1, an admin or a batch job) only into a group nobody is in."""
        if member_id == "" and member_epoch < 0:
            if self.members:
                raise GroupError("UNKNOWN_MEMBER_ID", f"group {self.group_id!r} has {len(self.members)} live members: "
                                 "a commit from outside the group would fight them (commit as a member, or stop them)")
            return
        member = self.members.get(member_id)
        if member is None:
            raise GroupError("UNKNOWN_MEMBER_ID", f"member {member_id!r} is not in group {self.group_id!r}: a commit "
                             "from a member that left or timed out is refused")
        if member_epoch != member.member_epoch:
            raise GroupError("STALE_MEMBER_EPOCH", f"member {member_id} committed with epoch {member_epoch}, its epoch is "
                             f"{member.member_epoch}: the commit is refused (the partitions may have moved)")

    # --- durability ---------------------------------------------------------------------------

    def records(self) -> list[tuple[str, bytes | None]]:
        """The records to write for what changed since the last call: (member
        id, or GROUP_RECORD for the group's own; the value, None for a member
        removed). Once written, ``restore`` rebuilds this group from them."""
        changed = []
        for member_id in [GROUP_RECORD, *sorted(self._dirty)]:
            value = self._record(member_id)
            if self._written.get(member_id) != value:
                changed.append((member_id, value))
                if value is None:
                    self._written.pop(member_id, None)
                else:
                    self._written[member_id] = value
        self._dirty.clear()
        return changed

    def _record(self, member_id: str) -> bytes | None:
        if member_id == GROUP_RECORD:
            return _encode({"group_epoch": self.group_epoch, "assignment_epoch": self.assignment_epoch,
                            "assignor": self.assignor, "partition_counts": self.partition_counts})
        member = self.members.get(member_id)
        if member is None:
            return None
        return _encode({"instance_id": member.instance_id, "subscribed": sorted(member.subscribed),
                        "session_timeout_ms": member.session_timeout_ms, "rebalance_timeout_ms": member.rebalance_timeout_ms,
                        "member_epoch": member.member_epoch, "previous_epoch": member.previous_epoch, "state": member.state,
                        "assigned": sorted(member.assigned), "revoking": sorted(member.revoking),
                        "left_for_restart": member.left_for_restart, "target": sorted(self.target.get(member_id, ()))})

    @classmethod
    def restore(cls, group_id: str, records: Mapping[str, bytes], now_ms: int, *, heartbeat_interval_ms: int) -> ConsumerGroup:
        """The group as ``records`` (member id -> value, as records() wrote them)
        left it; every member's session (and revocation deadline) starts at ``now_ms``."""
        group = cls(group_id, heartbeat_interval_ms=heartbeat_interval_ms)
        if GROUP_RECORD in records:
            meta = json.loads(records[GROUP_RECORD])
            group.group_epoch, group.assignment_epoch = meta["group_epoch"], meta["assignment_epoch"]
            group.assignor, group.partition_counts = meta["assignor"], dict(meta["partition_counts"])
        for member_id, raw in records.items():
            if member_id == GROUP_RECORD:
                continue
            m = json.loads(raw)
            member = Member(member_id, m["instance_id"], frozenset(m["subscribed"]), m["session_timeout_ms"],
                            now_ms + m["session_timeout_ms"], m["member_epoch"], m["previous_epoch"], m["state"],
                            _partitions(m["assigned"]), _partitions(m["revoking"]), m["left_for_restart"], m["rebalance_timeout_ms"])
            if member.revoking:
                member.revoke_by_ms = now_ms + member.rebalance_timeout_ms
            group.members[member_id] = member
            group.target[member_id] = _partitions(m["target"])
        group._written = dict(records)
        return group

    # --- views -----------------------------------------------------------------------------

    def state(self) -> str:
        if not self.members:
            return "Empty"
        settled = all(m.state == STABLE and m.member_epoch == self.assignment_epoch for m in self.members.values()
                      if not m.left_for_restart)
        return "Stable" if settled and self.assignment_epoch == self.group_epoch else "Reconciling"

    def owners(self) -> dict[TopicPartition, str]:
        return {tp: m.member_id for m in self.members.values() for tp in m.holds()}

    def describe(self) -> list[Member]:
        return sorted(self.members.values(), key=lambda m: m.member_id)


def _encode(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _partitions(pairs) -> frozenset[TopicPartition]:
    return frozenset((topic, partition) for topic, partition in pairs)


def topics_of(partitions: Iterable[TopicPartition]) -> set[str]:
    return {t for t, _ in partitions}
