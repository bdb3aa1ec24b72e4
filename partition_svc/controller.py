"""The controller: one partition_svc instance, elected in ZooKeeper, that
elects partition leaders (Kafka's controller in ZooKeeper mode).

Election: the instance that creates the ephemeral ``<root>/controller`` node
is the controller; it then bumps ``<root>/controller_epoch`` (a conditional
write) and makes every partition-state write a ZooKeeper transaction that
checks that node's version, so a deposed controller (paused past its session,
say) can never write once another has taken over. Instances refuse
LeaderAndIsr from an older controller epoch than they have seen.

Work: on every change of the live partition_svc registrations (a ZooKeeper
watch), every new topic, and every ``controller_pass_interval_ms`` besides,
a pass takes every partition's state (as kept in memory: below) and applies
election.py's rules:
leaders of gone or restarted instances are replaced from the ISR, gone
followers leave the ISR, preferred leaders take leadership back. A restart
is an instance registered after the state's last write (its registration's
czxid above the state's mzxid), so it is found from ZooKeeper alone; one
back on a new disk registers a storage zxid (storage_zxid: when its storage
was made) other than the one the state records for it (election.py), or,
for a member without a record, above the state's mzxid. Each state written
records the storage its live ISR members are in the ISR with. Each state
it changes is written conditionally (on the znode version it read) and sent
with LeaderAndIsr to every live instance; an instance that is new or
restarted gets every state. A state changed since the last pass by someone
else (a leader changing its ISR) is sent too, so an instance that holds no
replica of a partition still answers Metadata with its ISR (instances read
only the states of partitions they hold: replica_manager.py). A change counts
as announced only once the announce returns: each state written, moved or
new is kept as unannounced until then, so a pass that fails after taking it
(a ZooKeeper error in a later write, in the reassignments' read) announces it
with the next pass; an instance the announce failed to tell, and the
newcomers of an announce that raised, are newcomers again to the next pass
(they get every state).

States in memory: the controller keeps every topic node and partition
state it read or wrote (WatchedStates), each read with a ZooKeeper data
watch, and a pass reads again only what a watch said changed (a leader's
ISR write, a topic's configs or replica lists, a deletion), what it has
never read (new topics, partitions added to one), and everything when it is
newly elected or its connection to ZooKeeper dropped (kazoo drops every
watch then, and ZooKeeper keeps none past a session). Rereading every state
every pass was, at 10,000 partitions, about 2,000 ZooKeeper reads a second
for ever, most of an idle cluster's ZooKeeper load. A fired watch marks its
node and does not wake a pass: the periodic pass announces a leader's ISR
change as soon as before (within one pass), without a pass per ISR change.
A pass first waits for kazoo to have run every watch fired before it began
(zk.watches_delivered), so a write another finished before the pass began
is seen by that pass, as when it read every state.
The states the controller writes are kept as the transaction results give
them back (new version and mzxid), so nothing is announced twice; their
watches fire for that write too and cost one read each (which sets the
watch again). As a safety net every node kept is read again once every
``sweep_passes`` passes anyway, a slice each pass, so a watch missed can
only delay. A stale state is never written over: every write is conditional
on the version it was decided on, and one that fails marks the state to be
read again.

Writes are batched: the states a pass changes go to ZooKeeper in
transactions of at most ``STATE_WRITES_PER_TRANSACTION`` writes, each one
the check of the controller-epoch node's version followed by conditional
sets (each on the version its decision was taken on), so every write keeps
exactly the conditions it had alone, in one round trip per chunk instead of
one per partition (a 10,000-partition restart: 10,000 round trips of 3-10 ms
each). ZooKeeper applies a transaction whole or not at all and names the
first operation that failed: a failed set (someone wrote first) drops that
partition from the pass (it is decided again at once, on a fresh read) and
the rest of the chunk is committed again; a failed check (another controller
bumped the epoch) writes nothing.

Deletions: each pass also removes every topic marked for deletion whose
instances have all acknowledged (topic_deletion.py); a watch on each pending
mark's acknowledgements runs a pass as soon as one comes, and a new
controller carries on from the marks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
import threading
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.recipe.watchers import ChildrenWatch

from partition_svc import election, topic_deletion
from partition_svc.election import LeaderAndIsr
from partition_svc.log_store import LogStore
from partition_svc.topics import TopicInfo, TopicRegistry
from services.coordination import zk
from services.runtime.logs import fields
from txlog.protocol.errors import TxlogError
from txlog.protocol.names import TopicPartition

log = logging.getLogger(__name__)

STATE_WRITES_PER_TRANSACTION = 200  # partition-state sets per ZooKeeper transaction (~200 bytes each, far below jute.maxbuffer)
SWEEP_PASSES = 12  # passes within which every state and topic node kept is read again anyway (60 s at the default interval)
READS_CONCURRENT_MAX = 1_000  # ZooKeeper reads one pass has outstanding at once
# Metadata's describe_cluster reads the controller and its epoch again while a newly elected one has not bumped
# the epoch yet: this many times, this far apart, at most.
CURRENT_READS_MAX, CURRENT_READ_PAUSE_S = 20, 0.05


PartitionStates = list[tuple[TopicInfo, int, LeaderAndIsr]]
# (controller epoch, {node id: address}, the states changed, nodes that get every state, every state)
# -> the node ids it failed to tell (None: every one told)
Announce = Callable[[int, dict[int, str], PartitionStates, set[int], PartitionStates], Awaitable[Iterable[int] | None]]


async def storage_zxid(client: KazooClient, root: str, kind: str, node_id: int, store: LogStore) -> int:
    """A ZooKeeper transaction id no earlier than the making of this
    instance's storage, made (by a write of its own znode) and kept in the
    store the first time the storage is opened empty; 0 for storage that
    held data before this mark existed (taken as kept). Registered with the
    instance, it tells the controller which partition states were written
    before the storage existed: of those, the instance holds nothing."""
    known = store.storage_zxid()
    if known is not None:
        return known
    zxid = 0
    if store.is_empty():
        path = posixpath.join(root, "storage", f"{kind}-{node_id}")
        await zk.call(client, "ensure_path", path)
        zxid = (await zk.call(client, "set", path, b"")).mzxid
    store.mark_storage(zxid)
    return zxid


@dataclass(frozen=True)
class Rereads:
    """What one pass reads again, taken from the marks at its start."""
    everything: bool
    topics: frozenset[str] = field(default_factory=frozenset)
    states: frozenset[TopicPartition] = field(default_factory=frozenset)
    sweep_slot: int = 0  # nodes whose sweep slot this is are read again whatever the marks say


class WatchedStates:
    """The topic nodes and partition states as the controller last read or
    wrote them, and which of them the next pass must read again.

    Invariant: every node kept either has a ZooKeeper data watch, set by the
    read that filled it (or by the read before the controller's own write,
    which fires it), or is marked. A watch that fires marks its node
    (``state_changed``, ``topic_changed``, from kazoo's threads); a pass
    takes the marks (``take``) before the reads they ask for, so a change
    during a read marks the node again and is never lost, and gives them
    back (``give_back``) when it fails before reading. A watch reset (kazoo
    drops every watcher when the connection drops and calls each with a
    NONE event), a change of the connection's state (``connection_changed``)
    and ``clear`` (elected, deposed) mark everything.

    A node is read again when it is marked, when it was never read (a new
    topic, partitions added to one), when everything is marked, or when its
    sweep slot comes (one of ``sweep_passes``, from a hash of its name, so
    every node kept is read at least once within ``sweep_passes`` passes,
    spread evenly over them).
    """

    def __init__(self, topics_base: str, sweep_passes: int = SWEEP_PASSES):
        self.topics_base = topics_base.rstrip("/") + "/"
        self.sweep_passes = sweep_passes
        self.topics: dict[str, tuple[TopicInfo, int]] = {}  # name -> (topic, znode version) as read or written last
        self.states: dict[TopicPartition, LeaderAndIsr] = {}  # as read or written last (zk_version, zk_mzxid included)
        self.passes = 0
        self._lock = threading.Lock()  # the marks: set from kazoo's threads, taken by the pass
        self._everything_marked = True
        self._topics_marked: set[str] = set()
        self._states_marked: set[TopicPartition] = set()

    # --- marks (any thread) ---------------------------------------------------------

    def state_changed(self, event: WatchedEvent) -> None:
        """The data watch of every state node read (one function, so kazoo keeps one watcher per node)."""
        self._mark(self._states_marked, self._state_key(event))

    def topic_changed(self, event: WatchedEvent) -> None:
        """The data watch of every topic node read."""
        self._mark(self._topics_marked, self._topic_name(event))

    def connection_changed(self, _connected: bool) -> None:
        self.mark_everything()

    def mark_everything(self) -> None:
        self._mark(self._states_marked, None)

    def mark_state(self, key: TopicPartition) -> None:
        self._mark(self._states_marked, key)

    def mark_topic(self, name: str) -> None:
        self._mark(self._topics_marked, name)

    def _mark(self, marks: set, key) -> None:
        """Marks ``key`` in ``marks``; everything when the key is None (a watch reset, a node not understood)."""
        with self._lock:
            if key is None:
                self._everything_marked = True
            else:
                marks.add(key)

    def _relative(self, event: WatchedEvent) -> list[str] | None:
        if event.type == EventType.NONE or not event.path or not event.path.startswith(self.topics_base):
            return None
        return event.path[len(self.topics_base):].split("/")

    def _state_key(self, event: WatchedEvent) -> TopicPartition | None:
        parts = self._relative(event)
        if parts is None or len(parts) != 4 or parts[1] != "partitions" or parts[3] != "state" or not parts[2].isdigit():
            return None  # not a state node: read everything rather than guess
        return parts[0], int(parts[2])

    def _topic_name(self, event: WatchedEvent) -> str | None:
        parts = self._relative(event)
        return parts[0] if parts is not None and len(parts) == 1 else None

    # --- the pass (the event loop) ----------------------------------------------------

    def take(self) -> Rereads:
        """The marks, cleared (before the reads they ask for), and this pass's sweep slot."""
        with self._lock:
            rereads = Rereads(self._everything_marked, frozenset(self._topics_marked), frozenset(self._states_marked),
                              self.passes % self.sweep_passes)
            self._everything_marked = False
            self._topics_marked.clear()
            self._states_marked.clear()
        self.passes += 1
        return rereads

    def give_back(self, rereads: Rereads) -> None:
        """The marks of a pass that failed before its reads ended."""
        with self._lock:
            self._everything_marked |= rereads.everything
            self._topics_marked |= rereads.topics
            self._states_marked |= rereads.states

    def topic_due(self, rereads: Rereads, name: str) -> bool:
        return (rereads.everything or name in rereads.topics or name not in self.topics
                or zlib.crc32(name.encode()) % self.sweep_passes == rereads.sweep_slot)

    def state_due(self, rereads: Rereads, key: TopicPartition) -> bool:
        return (rereads.everything or key in rereads.states or key not in self.states
                or (zlib.crc32(key[0].encode()) + key[1]) % self.sweep_passes == rereads.sweep_slot)

    def took_topic(self, name: str, versioned: tuple[TopicInfo, int] | None) -> None:
        if versioned is None:
            self.forget_topic(name)
        else:
            self.topics[name] = versioned

    def took_state(self, key: TopicPartition, state: LeaderAndIsr | None) -> bool:
        """Keeps a state as read; True when someone else wrote it since it
        was last read or written here (its last write is another)."""
        known = self.states.get(key)
        if state is None:
            self.states.pop(key, None)
            return False
        self.states[key] = state
        return known is not None and known.zk_mzxid != state.zk_mzxid

    def forget_topic(self, name: str) -> None:
        versioned = self.topics.pop(name, None)
        if versioned is not None:
            for index in range(versioned[0].partition_count):
                self.states.pop((name, index), None)

    def retain(self, names: Iterable[str]) -> None:
        """Forgets the topics not listed (deleted, or being deleted)."""
        for name in set(self.topics) - set(names):
            self.forget_topic(name)

    def clear(self) -> None:
        self.topics.clear()
        self.states.clear()
        self.mark_everything()


class Controller:
    def __init__(self, client: KazooClient, root: str, node_id: int, kind: str, topics: TopicRegistry, announce: Announce,
                 *, pass_interval_ms: int = 5_000, sweep_passes: int = SWEEP_PASSES):
        self.client = client
        self.root = root
        self.node_id = node_id
        self.topics = topics
        self.announce = announce
        self.pass_interval_ms = pass_interval_ms
        self.registrations = posixpath.join(root, "services", kind)
        self.controller_path = posixpath.join(root, "controller")
        self.epoch_path = posixpath.join(root, "controller_epoch")
        self.epoch = -1
        self.epoch_version = -1
        self.active = False
        self.offline_partitions = 0  # partitions without a live leader at the last pass (as the active controller saw them)
        self._sessions: dict[int, int] = {}  # node id -> ZooKeeper session of its registration, at the last pass
        self._topics_seen: dict[str, int] = {}  # topic -> partition count announced (CreatePartitions grows it)
        # partitions whose state changed (written here, moved by another, new) and was not announced yet: kept
        # until an announce returns, so a pass that fails after the cache took a change still gets it announced
        self._unannounced: set[TopicPartition] = set()
        self.cache = WatchedStates(topics.base, sweep_passes)
        zk.add_state_listener(client, self.cache.connection_changed)  # watches do not outlive a connection in kazoo
        self.deletions_pending: set[str] = set()  # topics marked for deletion, not all instances done yet
        self._marks_watched: set[str] = set()  # pending deletions whose acknowledgements wake a pass
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Runs a pass soon (a topic was created here)."""
        self._wake.set()

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()

        def wake(_children=None) -> None:
            loop.call_soon_threadsafe(self._wake.set)

        for path in (self.registrations, self.topics.base, self.topics.deletions_base):
            await zk.call(self.client, "ensure_path", path)
            ChildrenWatch(self.client, path, wake)
        self.client.DataWatch(self.controller_path, lambda *_: wake())
        while True:
            self._wake.clear()
            try:
                if not self.active:
                    await self._try_to_become_controller()
                if self.active:
                    await self.run_pass()
            except TxlogError as exc:  # ZooKeeper out of reach: the next pass tries again
                log.warning("controller pass failed", extra=fields(error=exc.message))
            except Exception:
                log.exception("controller pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.pass_interval_ms / 1000)
            except TimeoutError:
                pass

    def _watch_acknowledgements(self) -> None:
        """Wakes a pass on every acknowledgement of a pending deletion (the
        watch ends with its mark)."""
        loop = asyncio.get_running_loop()
        self._marks_watched &= self.deletions_pending
        for name in self.deletions_pending - self._marks_watched:
            ChildrenWatch(self.client, self.topics.deletion_path(name), lambda _children: loop.call_soon_threadsafe(self._wake.set))
            self._marks_watched.add(name)

    async def _try_to_become_controller(self) -> None:
        try:
            await zk.call(self.client, "create", self.controller_path, json.dumps({"node_id": self.node_id}).encode(),
                          ephemeral=True, makepath=True)
        except NodeExistsError:
            return
        while True:
            try:
                data, stat = await zk.call(self.client, "get", self.epoch_path)
            except NoNodeError:
                try:
                    await zk.call(self.client, "create", self.epoch_path, b"1", makepath=True)
                    self.epoch, self.epoch_version = 1, 0
                    break
                except NodeExistsError:
                    continue
            try:
                written = await zk.call(self.client, "set", self.epoch_path, str(int(data) + 1).encode(), version=stat.version)
            except BadVersionError:
                continue
            self.epoch, self.epoch_version = int(data) + 1, written.version
            break
        self.active = True
        self._sessions.clear()  # every live instance is new to this controller: it gets every state
        self._topics_seen.clear()
        self._unannounced.clear()
        self.cache.clear()
        log.info("elected controller", extra=fields(controller_epoch=self.epoch))

    async def current(self) -> tuple[int, int]:
        """(node id, controller epoch) of the controller ZooKeeper records now; node id -1 while none is elected.
        An elected controller creates its node, then bumps the epoch: while the epoch was last written before the
        node was created, the new controller has not bumped it yet, and the pair is read again (for a moment), so a
        new controller is not shown with its predecessor's epoch."""
        for _ in range(CURRENT_READS_MAX):
            try:
                data, node = await zk.call(self.client, "get", self.controller_path)
                node_id = int(json.loads(data)["node_id"])
            except NoNodeError:
                node_id, node = -1, None
            try:
                raw, stat = await zk.call(self.client, "get", self.epoch_path)
                epoch = int(raw)
            except NoNodeError:
                epoch, stat = 0, None
            if node is None or (stat is not None and stat.mzxid > node.czxid):
                break
            await asyncio.sleep(CURRENT_READ_PAUSE_S)
        return node_id, epoch

    async def _still_controller(self) -> bool:
        try:
            data, stat = await zk.call(self.client, "get", self.controller_path)
        except NoNodeError:
            data, stat = None, None
        mine = data is not None and json.loads(data)["node_id"] == self.node_id and stat.ephemeralOwner == self.client.client_id[0]
        if not mine:
            self.active = False
            self.cache.clear()
            log.warning("no longer the controller", extra=fields(controller_epoch=self.epoch))
        return mine

    async def live_sessions(self) -> dict[int, tuple[str, int, int, int]]:
        """{node id: (address, session, the ZooKeeper transaction that
        registered it, the one its storage was made before)} of the live instances."""
        try:
            children = await zk.call(self.client, "get_children", self.registrations)
        except NoNodeError:
            return {}
        found = {}
        for child in children:
            try:
                data, stat = await zk.call(self.client, "get", posixpath.join(self.registrations, child))
            except NoNodeError:
                continue
            info = json.loads(data)
            found[int(info["node_id"])] = (info["address"], stat.ephemeralOwner, stat.czxid, int(info.get("storage_zxid", 0)))
        return found

    async def run_pass(self) -> None:
        if not await self._still_controller():
            return
        self.deletions_pending = await topic_deletion.finish_deletions(self.topics, (self.epoch_path, self.epoch_version))
        self._watch_acknowledgements()
        sessions = await self.live_sessions()
        live = set(sessions)
        newcomers = {n for n, (_, session, _, _) in sessions.items() if self._sessions.get(n) != session}
        registered = {n: czxid for n, (_, _, czxid, _) in sessions.items()}
        storage_made = {n: storage for n, (_, _, _, storage) in sessions.items()}
        changed: PartitionStates = []
        everything: PartitionStates = []
        decided: PartitionStates = []  # states to write, each on the version it was decided on, not written yet
        names = await self.topics.names()
        moved = await self._reread(names)
        self._unannounced = {key for key in self._unannounced if key in self.cache.states} | moved  # deleted topics' go
        reassignments = await self.topics.reassignments()
        for name in names:
            if name not in self.cache.topics:
                continue
            info, version = self.cache.topics[name]
            unclean = info.configs.get("unclean.leader.election.enable") == "true"
            for index in range(info.partition_count):
                state = self.cache.states.get((name, index))
                if state is None:
                    continue
                target = reassignments.get((name, index))
                if target is not None:
                    stepped = await self._reassign(info, version, index, state, target, live)
                    if stepped is None:
                        continue
                    if stepped != (info, version, state):
                        info, version, state = stepped
                        self.cache.topics[name] = (info, version)
                        self.cache.states[(name, index)] = state
                        self._unannounced.add((name, index))
                        changed.append((info, index, state))
                replicas = info.replicas[index]
                # registered since the state's last write: restarted (or new) since; found from ZooKeeper alone,
                # so a new controller sees the restarts its predecessor had not handled
                restarted = {n for n in live if registered[n] > state.zk_mzxid}
                emptied = {n for n in live if election.lost_storage(state, n, storage_made[n], n in restarted)}
                wanted = election.after_restarts(replicas, state, live, restarted, unclean=unclean, emptied=emptied)
                wanted = election.preferred_leader(replicas, wanted, live)
                # the live members' storage, vetted above, is what they are in the ISR with from now on
                wanted = wanted.with_storage({n: storage_made[n] for n in wanted.isr if n in live})
                if wanted != state:
                    decided.append((info, index, replace(wanted, controller_epoch=self.epoch)))
                    if len(decided) >= STATE_WRITES_PER_TRANSACTION:
                        if not await self._write_decided(decided, changed, everything):
                            return
                        decided = []
                    continue
                if index >= self._topics_seen.get(name, 0):  # a new topic, or partitions added to one
                    self._unannounced.add((name, index))
                if (name, index) in self._unannounced:
                    # new, or written by another (a leader changing its ISR) since the last pass, or changed in a
                    # pass that failed before it announced
                    changed.append((info, index, state))
                everything.append((info, index, state))
        if decided and not await self._write_decided(decided, changed, everything):
            return
        self._topics_seen = {info.name: info.partition_count for info, index, _ in everything if index == 0}
        self.offline_partitions = sum(1 for _, _, state in everything if state.leader not in live)
        told = {n: session for n, (_, session, _, _) in sessions.items()}
        addresses = {n: address for n, (address, _, _, _) in sessions.items()}
        if changed or newcomers:
            # Taken as announced only once the announce returns: if it raises, the next pass announces them again
            # and its newcomers are newcomers again; an instance it failed to tell is a newcomer to the next pass
            # (told every state), whatever it missed.
            untold = await self.announce(self.epoch, addresses, changed, newcomers, everything)
            self._unannounced -= {(info.name, index) for info, index, _ in changed}
            for node in untold or ():
                told.pop(node, None)
        self._sessions = told

    async def _reread(self, names: list[str]) -> set[TopicPartition]:
        """Reads again, each with a data watch, the topic nodes and states
        due (WatchedStates) of the topics ``names`` lists, and forgets the
        others; returns the partitions whose state someone else wrote since
        the controller last read or wrote it."""
        await zk.watches_delivered(self.client)  # every change made before this pass began is marked by now
        rereads = self.cache.take()
        try:
            self.cache.retain(names)
            due_topics = [name for name in names if self.cache.topic_due(rereads, name)]
            topics = await zk.gather_in_chunks(lambda name: self.topics.versioned(name, watch=self.cache.topic_changed),
                                               due_topics, READS_CONCURRENT_MAX)
            for name, versioned in zip(due_topics, topics, strict=True):
                self.cache.took_topic(name, versioned)
            due_states = [(name, index) for name in names if name in self.cache.topics
                          for index in range(self.cache.topics[name][0].partition_count)
                          if self.cache.state_due(rereads, (name, index))]
            states = await zk.gather_in_chunks(lambda key: self.topics.state(*key, watch=self.cache.state_changed),
                                               due_states, READS_CONCURRENT_MAX)
        except BaseException:
            self.cache.give_back(rereads)
            raise
        return {key for key, state in zip(due_states, states, strict=True) if self.cache.took_state(key, state)}

    async def _write_decided(self, decided: PartitionStates, changed: PartitionStates, everything: PartitionStates) -> bool:
        """Writes the states decided (write_states), keeps those written (as
        written: version, mzxid) and adds them to ``changed`` and
        ``everything``, and marks the others to be read again; False when
        this instance is no longer the controller (the pass ends)."""
        written = await self.write_states(decided)
        if written is None:
            if not await self._still_controller():
                return False
            written = []
        if len(written) < len(decided):
            self._wake.set()  # someone (the leader changing its ISR) wrote first: decide those again on a fresh read
            kept = {(info.name, index) for info, index, _ in written}
            for key in {(info.name, index) for info, index, _ in decided} - kept:
                self.cache.mark_state(key)
        for info, index, state in written:
            log.info("partition state", extra=fields(topic=info.name, partition=index, leader=state.leader,
                                                     leader_epoch=state.leader_epoch, isr=list(state.isr)))
            self.cache.states[(info.name, index)] = state
            self._unannounced.add((info.name, index))
            changed.append((info, index, state))
            everything.append((info, index, state))
        return True

    async def write_states(self, decided: PartitionStates) -> PartitionStates | None:
        """Writes partition states, each only if its znode is still at the
        version it was decided on (``state.zk_version``) and only while this
        controller's epoch is the current one (the epoch node still at the
        version this controller set): chunks of at most
        ``STATE_WRITES_PER_TRANSACTION`` in one ZooKeeper transaction each,
        behind a check of the epoch node. Returns the states as written (with
        their new versions and zxids), in order, without those someone else
        wrote first; None when the epoch check failed (nothing of that chunk
        or after it is written)."""
        written: PartitionStates = []
        for start in range(0, len(decided), STATE_WRITES_PER_TRANSACTION):
            chunk = await self._write_chunk(decided[start:start + STATE_WRITES_PER_TRANSACTION])
            if chunk is None:
                return None
            written += chunk
        return written

    async def _write_chunk(self, chunk: PartitionStates) -> PartitionStates | None:
        """One chunk: committed whole; when a set fails (that state moved:
        someone wrote first) it leaves the chunk and the rest is committed
        again, so each attempt writes one fewer at most ``len(chunk)`` times."""
        remaining = list(chunk)
        while remaining:
            transaction = self.client.transaction()
            transaction.check(self.epoch_path, self.epoch_version)
            for info, index, state in remaining:
                transaction.set_data(self.topics.state_path(info.name, index), state.encode(), version=state.zk_version)
            results = await zk.commit(self.client, transaction)
            failed = next((i for i, r in enumerate(results) if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
            if failed is None:
                return [(info, index, replace(state, zk_version=stat.version, zk_mzxid=stat.mzxid))
                        for (info, index, state), stat in zip(remaining, results[1:], strict=True)]
            if failed == 0:
                if isinstance(results[0], (BadVersionError, NoNodeError)):
                    return None  # the controller epoch moved: another controller
                raise results[0]
            if not isinstance(results[failed], (BadVersionError, NoNodeError)):
                raise results[failed]
            info, index, state = remaining.pop(failed - 1)
            log.info("partition state written by another first; deciding again",
                     extra=fields(topic=info.name, partition=index, version=state.zk_version))
        return []

    def _lost_race(self, name: str, index: int | None = None) -> None:
        """Someone wrote the topic's node (or the partition's state) first: read it again and decide again at once."""
        if index is None:
            self.cache.mark_topic(name)
        else:
            self.cache.mark_state((name, index))
        self._wake.set()

    async def _reassign(self, info: TopicInfo, version: int, index: int, state: LeaderAndIsr, target: tuple[int, ...],
                        live: set[int]) -> tuple[TopicInfo, int, LeaderAndIsr] | None:
        """One step of a reassignment (KIP-455): first the target's new
        replicas join the replica list (they start following and catching up);
        once every target replica is in the ISR, leadership moves into the
        target if it must (a new leader epoch), the ISR and the replica list
        become the target's, and the old replicas are told to go. Returns the
        topic, its version and the state after the step (the same when
        nothing could be done yet), or None when a write lost a race (the
        next pass decides again)."""
        current = info.replicas[index]
        if set(target) - set(current):
            written = await self.topics.write_replicas(info, index, current + tuple(t for t in target if t not in current), version)
            if written is None:
                self._lost_race(info.name)
                return None
            log.info("reassignment: replicas added", extra=fields(topic=info.name, partition=index, replicas=list(written.replicas[index])))
            return written, version + 1, state
        if current == target:
            await self.topics.reassignment_done(info.name, index)
            return info, version, state
        if not set(target) <= set(state.isr):
            return info, version, state  # the new replicas are still catching up
        wanted = replace(state, isr=tuple(n for n in state.isr if n in target), controller_epoch=self.epoch)
        if state.leader not in target:
            leaders = [t for t in target if t in live and t in state.isr]
            if not leaders:
                return info, version, state
            wanted = replace(wanted, leader=leaders[0], leader_epoch=state.leader_epoch + 1)
        written_state = await self.topics.write_state(info.name, index, wanted, (self.epoch_path, self.epoch_version))
        if written_state is None:
            self._lost_race(info.name, index)
            return None
        written = await self.topics.write_replicas(info, index, target, version)
        if written is None:
            self._lost_race(info.name)
            return info, version, written_state
        await self.topics.reassignment_done(info.name, index)
        log.info("reassignment done", extra=fields(topic=info.name, partition=index, replicas=list(target),
                                                   leader=written_state.leader, leader_epoch=written_state.leader_epoch))
        return written, version + 1, written_state
