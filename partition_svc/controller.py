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
a pass reads every partition's state and applies election.py's rules:
leaders of gone or restarted instances are replaced from the ISR, gone
followers leave the ISR, preferred leaders take leadership back. A restart
is an instance registered after the state's last write (its registration's
czxid above the state's mzxid), so it is found from ZooKeeper alone; one
back on a new disk registers a storage zxid above the state's mzxid too
(storage_zxid: its storage was made after the state was written). Each state
it changes is written conditionally (on the znode version it read) and sent
with LeaderAndIsr to every live instance; an instance that is new or
restarted gets every state. A state changed since the last pass by someone
else (a leader changing its ISR) is sent too, so an instance that holds no
replica of a partition still answers Metadata with its ISR (instances read
only the states of partitions they hold: replica_manager.py).

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
from collections.abc import Awaitable, Callable
from dataclasses import replace

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.recipe.watchers import ChildrenWatch

from partition_svc import election, topic_deletion
from partition_svc.election import LeaderAndIsr
from partition_svc.log_store import LogStore
from partition_svc.topics import TopicInfo, TopicRegistry
from services import zk
from services.errors import TxlogError
from services.logs import fields

log = logging.getLogger(__name__)

STATE_WRITES_PER_TRANSACTION = 200  # partition-state sets per ZooKeeper transaction (~200 bytes each, far below jute.maxbuffer)

PartitionStates = list[tuple[TopicInfo, int, LeaderAndIsr]]
# (controller epoch, {node id: address}, the states changed, nodes that get every state, every state)
Announce = Callable[[int, dict[int, str], PartitionStates, set[int], PartitionStates], Awaitable[None]]


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


class Controller:
    def __init__(self, client: KazooClient, root: str, node_id: int, kind: str, topics: TopicRegistry, announce: Announce,
                 *, pass_interval_ms: int = 5_000):
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
        self._versions_seen: dict[tuple[str, int], int] = {}  # (topic, partition) -> znode version announced or read last pass
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
        self._sessions.clear()
        self._topics_seen.clear()
        self._versions_seen.clear()
        log.info("elected controller", extra=fields(controller_epoch=self.epoch))

    async def _still_controller(self) -> bool:
        try:
            data, stat = await zk.call(self.client, "get", self.controller_path)
        except NoNodeError:
            data, stat = None, None
        mine = data is not None and json.loads(data)["node_id"] == self.node_id and stat.ephemeralOwner == self.client.client_id[0]
        if not mine:
            self.active = False
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
        seen: dict[tuple[str, int], int] = {}  # the version of every state as read, or as this pass wrote it
        names = await self.topics.names()
        reassignments = await self.topics.reassignments()
        for name in names:
            versioned = await self.topics.versioned(name)
            if versioned is None:
                continue
            info, version = versioned
            states = await asyncio.gather(*(self.topics.state(name, p) for p in range(info.partition_count)))
            unclean = info.configs.get("unclean.leader.election.enable") == "true"
            for index, state in enumerate(states):
                if state is None:
                    continue
                target = reassignments.get((name, index))
                if target is not None:
                    moved = await self._reassign(info, version, index, state, target, live)
                    if moved is None:
                        continue
                    if moved != (info, version, state):
                        info, version, state = moved
                        changed.append((info, index, state))
                seen[(name, index)] = state.zk_version
                replicas = info.replicas[index]
                # registered since the state's last write: restarted (or new) since; found from ZooKeeper alone,
                # so a new controller sees the restarts its predecessor had not handled
                restarted = {n for n in live if registered[n] > state.zk_mzxid}
                emptied = {n for n in restarted if storage_made[n] > state.zk_mzxid}
                wanted = election.after_restarts(replicas, state, live, restarted, unclean=unclean, emptied=emptied)
                wanted = election.preferred_leader(replicas, wanted, live)
                if wanted != state:
                    decided.append((info, index, replace(wanted, controller_epoch=self.epoch)))
                    if len(decided) >= STATE_WRITES_PER_TRANSACTION:
                        if not await self._write_decided(decided, changed, everything, seen):
                            return
                        decided = []
                    continue
                if index >= self._topics_seen.get(name, 0):  # a new topic, or partitions added to one
                    changed.append((info, index, state))
                elif self._versions_seen.get((name, index), state.zk_version) != state.zk_version:
                    changed.append((info, index, state))  # written by another (a leader changing its ISR) since the last pass
                everything.append((info, index, state))
        if decided and not await self._write_decided(decided, changed, everything, seen):
            return
        self._topics_seen = {info.name: info.partition_count for info, index, _ in everything if index == 0}
        self.offline_partitions = sum(1 for _, _, state in everything if state.leader not in live)
        self._versions_seen = seen
        self._sessions = {n: session for n, (_, session, _, _) in sessions.items()}
        addresses = {n: address for n, (address, _, _, _) in sessions.items()}
        if changed or newcomers:
            await self.announce(self.epoch, addresses, changed, newcomers, everything)

    async def _write_decided(self, decided: PartitionStates, changed: PartitionStates, everything: PartitionStates,
                             seen: dict[tuple[str, int], int]) -> bool:
        """Writes the states decided (write_states) and adds those written to
        ``changed`` and ``everything``; False when this instance is no longer
        the controller (the pass ends)."""
        written = await self.write_states(decided)
        if written is None:
            if not await self._still_controller():
                return False
            written = []
        if len(written) < len(decided):
            self._wake.set()  # someone (the leader changing its ISR) wrote first: decide those again on a fresh read
        for info, index, state in written:
            log.info("partition state", extra=fields(topic=info.name, partition=index, leader=state.leader,
                                                     leader_epoch=state.leader_epoch, isr=list(state.isr)))
            seen[(info.name, index)] = state.zk_version
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
                self._wake.set()
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
            self._wake.set()
            return None
        written = await self.topics.write_replicas(info, index, target, version)
        if written is None:
            self._wake.set()
            return info, version, written_state
        await self.topics.reassignment_done(info.name, index)
        log.info("reassignment done", extra=fields(topic=info.name, partition=index, replicas=list(target),
                                                   leader=written_state.leader, leader_epoch=written_state.leader_epoch))
        return written, version + 1, written_state
