"""Topics and partition states in ZooKeeper, as Kafka's ZooKeeper mode kept them.

    <root>/topics/<name>                          JSON {"partitions", "configs", "replicas": [[node, ...], ...], "internal"}
    <root>/topics/<name>/partitions/<p>/state     JSON {"leader", "leader_epoch", "isr", "controller_epoch"}
    <root>/reassignments/<name>/<p>               JSON {"target": [node, ...]}: a reassignment the controller carries out
    <root>/admin/delete_topics/<name>             the topic is being deleted (Kafka's deletion mark)
    <root>/admin/delete_topics/<name>/<node>      that instance holds nothing of it any more (topic_deletion.py)

A topic is created once, its node and every partition's state in one
ZooKeeper transaction that fails if the topic exists, so two concurrent
creations of one name cannot both win. Its replica lists (the preferred
leader first) change only by reassignment. A partition state changes only by
a conditional write on its znode version (the controller electing a leader,
the leader changing its ISR): a writer whose view is stale fails and reads
again, so no decision is ever taken on an outdated ISR.

A topic is deleted as in Kafka's ZooKeeper mode: a deletion mark, created in
one transaction with a check of the topic's node (so only an existing topic
is marked), hides it at once from every read of this registry (``get``,
``versioned``, ``names``); its nodes, its reassignments and the mark go
together in one transaction once every instance concerned has acknowledged
(topic_deletion.py). A creation fails while a mark of its name exists (it
creates and deletes the mark in its own transaction), so a topic is never
created again before the old one is gone.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, replace

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from partition_svc.election import LeaderAndIsr, initial_state
from services.coordination import zk
from txlog.protocol import INTERNAL_TOPIC_PREFIX
from txlog.protocol.errors import ErrorCode, TxlogError

INTERNAL_PREFIX = INTERNAL_TOPIC_PREFIX
ABSENT_NAMES_MAX = 10_000  # unknown topic names remembered as absent, at most
MARK_ATTEMPTS = 5  # conditional marks of a topic raced by writes of its node (a reassignment, a config change)


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partition_count: int
    configs: dict
    replicas: tuple[tuple[int, ...], ...]
    internal: bool

    @property
    def replication_factor(self) -> int:
        return len(self.replicas[0])

    def encode(self) -> bytes:
        return json.dumps({"partitions": self.partition_count, "configs": self.configs,
                           "replicas": [list(r) for r in self.replicas], "internal": self.internal}, sort_keys=True).encode()

    @classmethod
    def decode(cls, name: str, data: bytes) -> TopicInfo:
        raw = json.loads(data)
        return cls(name, raw["partitions"], raw["configs"], tuple(tuple(r) for r in raw["replicas"]), raw["internal"])


class TopicRegistry:
    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.base = posixpath.join(root, "topics")
        self.reassignments_base = posixpath.join(root, "reassignments")
        self.deletions_base = posixpath.join(root, "admin", "delete_topics")
        self._cache: dict[str, TopicInfo] = {}
        self.deleting: frozenset[str] = frozenset()  # topics marked for deletion, as last seen (a watch keeps it)
        # Names found absent, each with an exists-watch that drops it when the topic is created: an unknown
        # topic asked for again and again (a misconfigured client) costs no ZooKeeper read. Dropped whole
        # when the connection goes (watches do not outlive a session); the oldest go past ABSENT_NAMES_MAX.
        self._absent: dict[str, None] = {}
        self._absent_listened = False

    def state_path(self, topic: str, partition: int) -> str:
        return posixpath.join(self.base, topic, "partitions", str(partition), "state")

    def cached(self, name: str) -> TopicInfo | None:
        """The topic as last read, without reading ZooKeeper (None if never read)."""
        return self._cache.get(name)

    async def get(self, name: str, *, fresh: bool = False) -> TopicInfo | None:
        """The topic, None when it does not exist or is being deleted."""
        if name in self.deleting:
            return None
        if not fresh:
            info = self._cache.get(name)
            if info is not None:
                return info
            if name in self._absent and self.client.state == KazooState.CONNECTED:
                return None
        try:
            data, _ = await zk.call(self.client, "get", posixpath.join(self.base, name))
        except NoNodeError:
            await self._remember_absent(name)
            return None
        info = TopicInfo.decode(name, data)
        self._cache[name] = info
        self._absent.pop(name, None)
        return info

    async def _remember_absent(self, name: str) -> None:
        def created(_event) -> None:  # kazoo's thread: a dict pop is one step under the GIL
            self._absent.pop(name, None)

        if not self._absent_listened:
            zk.add_state_listener(self.client, lambda connected: None if connected else self._absent.clear())
            self._absent_listened = True
        if await zk.call(self.client, "exists", posixpath.join(self.base, name), watch=created) is not None:
            return  # created since the read: not absent after all
        self._absent[name] = None
        while len(self._absent) > ABSENT_NAMES_MAX:
            try:
                self._absent.pop(next(iter(self._absent)), None)
            except (StopIteration, RuntimeError):  # emptied or changed by a watch meanwhile
                break

    async def create(self, info: TopicInfo, controller_epoch: int) -> TopicInfo:
        """Creates the topic with its partitions' first states; if it exists
        already, returns the existing one instead."""
        transaction = self.client.transaction()
        transaction.create(posixpath.join(self.base, info.name), info.encode())
        transaction.create(posixpath.join(self.base, info.name, "partitions"), b"")
        for index, replicas in enumerate(info.replicas):
            transaction.create(posixpath.join(self.base, info.name, "partitions", str(index)), b"")
            transaction.create(self.state_path(info.name, index), initial_state(replicas, controller_epoch).encode())
        transaction.create(self.deletion_path(info.name), b"")  # fails while the name is marked for deletion
        transaction.delete(self.deletion_path(info.name))
        await zk.call(self.client, "ensure_path", self.base)
        await zk.call(self.client, "ensure_path", self.deletions_base)
        results = await zk.commit(self.client, transaction)
        if any(isinstance(r, NodeExistsError) for r in results):
            if await zk.call(self.client, "exists", self.deletion_path(info.name)) is not None:
                raise TxlogError(ErrorCode.Value("TOPIC_ALREADY_EXISTS"),
                                 f"topic {info.name!r} is being deleted; create it again once it is gone")
            existing = await self.get(info.name, fresh=True)
            if existing is None:
                raise NodeExistsError(f"topic {info.name} was being created and deleted")
            return existing
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        self._cache[info.name] = info
        self._absent.pop(info.name, None)
        return info

    async def versioned(self, name: str, *, deleting: bool = False, watch: Callable | None = None) -> tuple[TopicInfo, int] | None:
        """The topic as stored now, with its znode version (for a conditional
        rewrite); None when it does not exist or, unless ``deleting``, is being deleted.
        ``watch``: a ZooKeeper data watch left on the topic's node (set only when it exists)."""
        if name in self.deleting and not deleting:
            return None
        try:
            data, stat = await zk.call(self.client, "get", posixpath.join(self.base, name), watch=watch)
        except NoNodeError:
            return None
        info = TopicInfo.decode(name, data)
        self._cache[name] = info
        return info, stat.version

    async def write_replicas(self, info: TopicInfo, index: int, replicas: tuple[int, ...], version: int) -> TopicInfo | None:
        """Rewrites one partition's replica list if the topic is still at
        ``version``; the topic as written, or None when someone wrote first."""
        return await self._rewrite(replace(info, replicas=tuple(replicas if i == index else r for i, r in enumerate(info.replicas))),
                                   version)

    async def write_configs(self, info: TopicInfo, configs: dict, version: int) -> TopicInfo | None:
        """Rewrites the topic's configs if it is still at ``version``; the topic
        as written, or None when someone wrote first."""
        return await self._rewrite(replace(info, configs=configs), version)

    async def add_partitions(self, info: TopicInfo, replicas: list[tuple[int, ...]], version: int,
                             controller_epoch: int) -> TopicInfo | None:
        """Grows the topic by partitions with ``replicas`` (and their first
        states) in one ZooKeeper transaction, if the topic is still at
        ``version``; the topic as written, or None when someone wrote first."""
        grown = replace(info, partition_count=info.partition_count + len(replicas), replicas=info.replicas + tuple(replicas))
        transaction = self.client.transaction()
        transaction.set_data(posixpath.join(self.base, info.name), grown.encode(), version=version)
        for index, members in enumerate(replicas, start=info.partition_count):
            transaction.create(posixpath.join(self.base, info.name, "partitions", str(index)), b"")
            transaction.create(self.state_path(info.name, index), initial_state(members, controller_epoch).encode())
        results = await zk.commit(self.client, transaction)
        if any(isinstance(r, (BadVersionError, NoNodeError, NodeExistsError)) for r in results):
            return None
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        self._cache[info.name] = grown
        return grown

    async def _rewrite(self, changed: TopicInfo, version: int) -> TopicInfo | None:
        try:
            await zk.call(self.client, "set", posixpath.join(self.base, changed.name), changed.encode(), version=version)
        except (BadVersionError, NoNodeError):
            return None
        self._cache[changed.name] = changed
        return changed

    def learned_replicas(self, name: str, index: int, replicas: tuple[int, ...]) -> None:
        """The controller said so: the cached topic takes the partition's new replica list."""
        info = self._cache.get(name)
        if info is not None and 0 <= index < info.partition_count and info.replicas[index] != replicas:
            self._cache[name] = replace(info, replicas=tuple(replicas if i == index else r for i, r in enumerate(info.replicas)))

    async def request_reassignment(self, topic: str, index: int, target: tuple[int, ...]) -> None:
        path = posixpath.join(self.reassignments_base, topic, str(index))
        data = json.dumps({"target": list(target)}).encode()
        # The controller deletes a finished reassignment's node at any moment,
        # so "exists" may be stale by the time it is overwritten: go round
        # until one of the two writes lands.
        while True:
            try:
                await zk.call(self.client, "create", path, data, makepath=True)
                return
            except NodeExistsError:
                pass
            try:
                await zk.call(self.client, "set", path, data)
                return
            except NoNodeError:
                pass

    async def reassignments(self) -> dict[tuple[str, int], tuple[int, ...]]:
        """Every reassignment in progress: {(topic, partition): target replicas}."""
        found = {}
        try:
            topics = await zk.call(self.client, "get_children", self.reassignments_base)
        except NoNodeError:
            return found
        for topic in topics:
            try:
                indexes = await zk.call(self.client, "get_children", posixpath.join(self.reassignments_base, topic))
            except NoNodeError:
                continue
            for index in indexes:
                try:
                    data, _ = await zk.call(self.client, "get", posixpath.join(self.reassignments_base, topic, index))
                except NoNodeError:
                    continue
                found[(topic, int(index))] = tuple(json.loads(data)["target"])
        return found

    async def reassignment_done(self, topic: str, index: int) -> None:
        try:
            await zk.call(self.client, "delete", posixpath.join(self.reassignments_base, topic, str(index)))
        except NoNodeError:
            pass

    async def names(self) -> list[str]:
        """Every topic but those being deleted."""
        try:
            return sorted(set(await zk.call(self.client, "get_children", self.base)) - self.deleting)
        except NoNodeError:
            return []

    # --- deletion ---------------------------------------------------------------------

    def deletion_path(self, name: str) -> str:
        return posixpath.join(self.deletions_base, name)

    def marks_seen(self, marked: set[str]) -> set[str]:
        """Takes the topics marked for deletion as ZooKeeper lists them now;
        returns those newly marked. Their cached nodes go, so a topic of the
        same name created later is read afresh."""
        new = set(marked) - self.deleting
        for name in self.deleting | new:
            self._cache.pop(name, None)
        self.deleting = frozenset(marked)
        return new

    def forget_gone(self, existing: set[str]) -> None:
        """Drops the cached nodes of topics ZooKeeper no longer holds (one
        deleted while this instance missed its short-lived mark)."""
        for name in [name for name in self._cache if name not in existing]:
            self._cache.pop(name, None)

    async def read_marks(self) -> set[str]:
        """The topics marked for deletion, read from ZooKeeper (and taken)."""
        try:
            marked = set(await zk.call(self.client, "get_children", self.deletions_base))
        except NoNodeError:
            marked = set()
        self.marks_seen(marked)
        return marked

    async def mark_for_deletion(self, name: str) -> bool:
        """Marks an existing topic for deletion (conditional on its node, so a
        topic deleted meanwhile is not marked); True when it is marked (now or
        before), False when it does not exist."""
        await zk.call(self.client, "ensure_path", self.deletions_base)
        for _ in range(MARK_ATTEMPTS):
            try:
                _, stat = await zk.call(self.client, "get", posixpath.join(self.base, name))
            except NoNodeError:
                return False
            transaction = self.client.transaction()
            transaction.check(posixpath.join(self.base, name), stat.version)
            transaction.create(self.deletion_path(name), b"")
            results = await zk.commit(self.client, transaction)
            if isinstance(results[1], NodeExistsError):
                break
            if not any(isinstance(r, Exception) for r in results):
                break
            if not isinstance(results[0], (BadVersionError, NoNodeError)):
                raise next(r for r in results if isinstance(r, Exception))
        else:
            raise TxlogError(ErrorCode.Value("REQUEST_TIMED_OUT"), f"topic {name!r} kept changing while it was marked; retry")
        self.marks_seen(set(self.deleting) | {name})
        return True

    async def is_marked(self, name: str) -> bool:
        return await zk.call(self.client, "exists", self.deletion_path(name)) is not None

    async def acknowledge_deletion(self, name: str, node_id: int) -> None:
        """This instance holds nothing of the topic any more (a mark already gone is fine)."""
        try:
            await zk.call(self.client, "create", posixpath.join(self.deletion_path(name), str(node_id)), b"")
        except (NodeExistsError, NoNodeError):
            pass

    async def deletion_acks(self, name: str) -> set[int]:
        try:
            return {int(child) for child in await zk.call(self.client, "get_children", self.deletion_path(name))}
        except NoNodeError:
            return set()

    async def remove(self, name: str, controller: tuple[str, int]) -> bool:
        """Deletes the topic's nodes (partition states, reassignments) and its
        deletion mark in one ZooKeeper transaction, while ``controller`` (the
        controller-epoch path and the version it set) is still the
        controller; False when something changed meanwhile (the caller reads
        again)."""
        paths = []
        for root in (posixpath.join(self.base, name), posixpath.join(self.reassignments_base, name), self.deletion_path(name)):
            paths += await self._subtree(root)
        transaction = self.client.transaction()
        transaction.check(*controller)
        for path in paths:
            transaction.delete(path)
        results = await zk.commit(self.client, transaction)
        if any(isinstance(r, Exception) for r in results):
            return False
        self._cache.pop(name, None)
        return True

    async def _subtree(self, path: str) -> list[str]:
        """The node and every node below it, children first (the order to delete them); none if it does not exist."""
        if await zk.call(self.client, "exists", path) is None:
            return []
        below = []
        for child in await self._children(path):
            below += await self._subtree(posixpath.join(path, child))
        return below + [path]

    async def _children(self, path: str) -> list[str]:
        try:
            return await zk.call(self.client, "get_children", path)
        except NoNodeError:
            return []

    async def state(self, topic: str, partition: int, *, watch: Callable | None = None) -> LeaderAndIsr | None:
        """The partition's state as stored now (None when it does not exist);
        ``watch``: a ZooKeeper data watch left on its node (set only when it exists)."""
        try:
            data, stat = await zk.call(self.client, "get", self.state_path(topic, partition), watch=watch)
        except NoNodeError:
            return None
        return LeaderAndIsr.decode(data, stat.version, stat.mzxid)

    async def write_state(self, topic: str, partition: int, state: LeaderAndIsr,
                          controller: tuple[str, int] | None = None) -> LeaderAndIsr | None:
        """Writes ``state`` if the znode is still at ``state.zk_version`` (the
        version the decision was taken on) and, for the ``controller`` (the
        controller-epoch path and the version it set), while that controller
        is still the one; the state as written (its new version), or None when
        someone else wrote first."""
        path = self.state_path(topic, partition)
        if controller is None:
            try:
                stat = await zk.call(self.client, "set", path, state.encode(), version=state.zk_version)
            except (BadVersionError, NoNodeError):
                return None
            return replace(state, zk_version=stat.version, zk_mzxid=stat.mzxid)
        transaction = self.client.transaction()
        transaction.check(*controller)
        transaction.set_data(path, state.encode(), version=state.zk_version)
        results = await zk.commit(self.client, transaction)
        if any(isinstance(r, Exception) for r in results):
            return None
        return replace(state, zk_version=results[1].version, zk_mzxid=results[1].mzxid)
