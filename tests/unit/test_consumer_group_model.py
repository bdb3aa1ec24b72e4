"""Consumer-group membership (partition_svc/consumer_group.py) against what
clients may see (issue 16, KIP-848): a hypothesis state machine runs up to
four clients of one group, each with its own view (member id, epoch, the
partitions it consumes), through joins, heartbeats whose answers are lost,
subscription changes, static restarts, leaves, session timeouts (the client
is then a zombie that still believes it owns its partitions) and partition
count changes, and coordinator moves: the group rebuilt from the records it
wrote (``records()``/``restore``), also when the write of a heartbeat's
records failed (its answer then never reached the client).

Checked after every step:
- the coordinator holds each partition in at most one member (assigned, or
  owned pending revocation);
- a live member's client consumes only partitions the coordinator holds for
  it: no two live clients consume one partition;
- once nothing changes and every client has heartbeated twice, every
  subscribed partition is assigned and every member is STABLE;
- a zombie's (or a fenced member's) offset commit is refused;
- a coordinator move loses nothing written and fences no live member (a
  live client is still a member at its epoch afterwards: no rebalance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from partition_svc.consumer_group import GROUP_RECORD, STABLE, ConsumerGroup, GroupError, Heartbeat

CLIENTS = ("c0", "c1", "c2", "c3")
TOPICS = ("a", "b")
SESSION_MS = 10_000


@dataclass
class Client:
    name: str
    member_id: str = ""
    epoch: int = -1  # -1: not in the group
    owned: frozenset = frozenset()
    subscribed: frozenset = frozenset(TOPICS)
    static: bool = False
    zombie: bool = False  # removed by the coordinator without knowing it
    history: list = field(default_factory=list)


class GroupMembership(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.group = ConsumerGroup("g", assignor="uniform")
        self.now = 0
        self.counts = {"a": 3, "b": 2}
        self.clients = {name: Client(name, static=name == "c3") for name in CLIENTS}
        self.joins = 0
        self.log: dict[str, bytes] = {}  # the group's records as the __consumer_offsets partition holds them

    def persist(self) -> None:
        """The coordinator's write of what changed (answers go out only after it)."""
        for member_id, value in self.group.records():
            if value is None:
                self.log.pop(member_id, None)
            else:
                self.log[member_id] = value

    def move_coordinator(self) -> None:
        self.group = ConsumerGroup.restore("g", self.log, self.now, heartbeat_interval_ms=self.group.heartbeat_interval_ms)

    def beat(self, client: Client, *, lose_answer: bool = False, subscribed=None, write_fails: bool = False) -> None:
        if not client.member_id:
            self.joins += 1
            client.member_id = f"{client.name}-{self.joins}"  # made by the client and kept across retries (KIP-1082)
        beat = Heartbeat(client.member_id, 0 if client.epoch < 0 else client.epoch,
                         instance_id=client.name if client.static else None,
                         subscribed=subscribed if subscribed is not None else (client.subscribed if client.epoch <= 0 else None),
                         owned=client.owned, session_timeout_ms=SESSION_MS)
        try:
            answer = self.group.heartbeat(beat, self.now, self.counts)
        except GroupError as error:
            assert error.code in ("FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID", "UNRELEASED_INSTANCE_ID"), error
            if error.code == "UNRELEASED_INSTANCE_ID":  # only while another member holds the instance id, never its own
                assert any(m.instance_id == client.name and m.member_id != client.member_id
                           for m in self.group.members.values()), error.message
            if error.code != "UNRELEASED_INSTANCE_ID":
                client.epoch, client.owned, client.zombie = -1, frozenset(), False  # drops everything, rejoins as itself
            return
        if write_fails:  # the coordinator drops the group and reloads it from the log; the client hears an error
            self.group.records()
            self.move_coordinator()
            return
        self.persist()
        if lose_answer:
            return
        # the client made its member id and keeps it (KIP-1082): the answer names the same member
        assert answer.member_id == client.member_id, (answer.member_id, client.member_id)
        client.epoch, client.owned = answer.member_epoch, answer.assigned

    @rule(name=st.sampled_from(CLIENTS), lose=st.booleans())
    def heartbeat(self, name, lose):
        client = self.clients[name]
        if client.zombie:
            return  # a zombie no longer heartbeats (it is stuck); see zombie_commits
        self.beat(client, lose_answer=lose)

    @rule(name=st.sampled_from(CLIENTS), topics=st.sets(st.sampled_from(TOPICS), min_size=1))
    def change_subscription(self, name, topics):
        client = self.clients[name]
        if client.epoch <= 0 or client.zombie:
            return
        client.subscribed = frozenset(topics)
        self.beat(client, subscribed=client.subscribed)

    @rule(name=st.sampled_from(CLIENTS), new_process=st.booleans())
    def leave(self, name, new_process):
        client = self.clients[name]
        if client.epoch < 0 or client.zombie:
            return
        client.owned = frozenset()  # it stops consuming first
        epoch = -2 if client.static else -1
        self.group.heartbeat(Heartbeat(client.member_id, epoch, instance_id=client.name if client.static else None), self.now, self.counts)
        self.persist()
        client.epoch = -1
        if not client.static or new_process:  # a restarted process makes a new member id; its instance id stays
            client.member_id = ""

    @rule(ms=st.sampled_from([1_000, 6_000, 11_000]))
    def time_passes(self, ms):
        self.now += ms
        for member_id in self.group.expire(self.now):
            for client in self.clients.values():
                if client.member_id == member_id and client.epoch >= 0:
                    client.zombie = True  # it still believes it owns its partitions
        self.persist()

    @rule()
    def coordinator_moves(self):
        before = self.group
        self.move_coordinator()
        assert set(self.group.members) == set(before.members)
        for member_id in [GROUP_RECORD, *before.members]:
            assert self.group._record(member_id) == before._record(member_id), f"{member_id or 'the group'} changed by a move"

    @rule(name=st.sampled_from(CLIENTS))
    def heartbeat_whose_write_fails(self, name):
        client = self.clients[name]
        if not client.zombie:
            self.beat(client, write_fails=True)

    @rule(topic=st.sampled_from(TOPICS), count=st.integers(1, 4))
    def partitions_added(self, topic, count):
        self.counts[topic] = max(self.counts[topic], count)

    @precondition(lambda self: any(c.zombie for c in self.clients.values()))
    @rule()
    def zombie_commits_are_refused_and_it_rejoins(self):
        for client in self.clients.values():
            if client.zombie:
                try:
                    self.group.check_commit(client.member_id, client.epoch)
                except GroupError as error:
                    assert error.code in ("UNKNOWN_MEMBER_ID", "STALE_MEMBER_EPOCH")
                else:
                    raise AssertionError(f"zombie {client.name} ({client.member_id}) committed")
                client.epoch, client.owned, client.zombie = -1, frozenset(), False

    # --- what must hold --------------------------------------------------------------------

    @invariant()
    def the_coordinator_holds_each_partition_once(self):
        seen = {}
        for member in self.group.members.values():
            assert member.state is None or member.state in (STABLE, "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS")
            for tp in member.holds():
                assert tp not in seen, f"{tp} held by {seen[tp]} and {member.member_id}"
                seen[tp] = member.member_id

    @invariant()
    def live_clients_consume_only_what_the_coordinator_holds_for_them(self):
        consumed = {}
        for client in self.clients.values():
            if client.zombie or client.epoch < 0:
                continue
            member = self.group.members.get(client.member_id)
            assert member is not None, f"{client.name} believes it is {client.member_id}, unknown to the group"
            assert client.owned <= member.holds(), f"{client.name} consumes {client.owned - member.holds()} not held for it"
            for tp in client.owned:
                assert tp not in consumed, f"{tp} consumed by {consumed[tp]} and {client.name}"
                consumed[tp] = client.name

    def teardown(self):
        """Quiet: everyone heartbeats until nothing moves; then all is assigned and stable."""
        for client in self.clients.values():
            client.zombie = False
        for _ in range(2):  # members left for a restart that never came back time out
            for client in self.clients.values():
                if client.epoch >= 0:
                    self.beat(client)
            self.now += SESSION_MS - 1
            self.group.expire(self.now)
        for _ in range(4):
            for client in self.clients.values():
                if client.epoch >= 0 or client.member_id:
                    self.beat(client)
        if not self.group.members:
            return
        wanted = {(t, p) for m in self.group.members.values() for t in m.subscribed for p in range(self.counts[t])}
        assigned = {tp for m in self.group.members.values() for tp in m.assigned}
        members = {m.member_id: (m.state, m.member_epoch) for m in self.group.members.values()}
        assert assigned == wanted, f"assigned {sorted(assigned)}, subscribed {sorted(wanted)}; members {members}"
        assert all(m.state == STABLE and m.member_epoch == self.group.assignment_epoch for m in self.group.members.values()
                   if not m.left_for_restart), members


GroupMembershipTest = GroupMembership.TestCase
GroupMembershipTest.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
