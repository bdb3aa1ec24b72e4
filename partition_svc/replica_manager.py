"""This instance's replicas: which partitions it holds, whether it leads or
follows each, and the partition states it knows (issue 14, replication).

A replica leads only on a state written after this instance registered in
its current ZooKeeper session (the state's mzxid above its registration's
czxid): a restarted instance must not resume leading on its old state, from
a log and a high watermark that may be behind what its successor had; the
controller sees the restart and writes a new state.

A state (leader, leader epoch, ISR, from ZooKeeper) reaches an instance by
the controller's LeaderAndIsr (pushed to every live instance at each change,
the controller's or a leader's ISR change: controller.py), by a read when a
request names a partition it has not heard of, and by a resync, the safety
net under LeaderAndIsr (so a lost one delays, never breaks).

A resync reads only the states of partitions this instance is a replica of
or holds, never the others': every ``partition_state_refresh_ms`` it reads
the nodes of the topics it has partitions of (configs, replica lists) and a
share of those states, at least ``RESYNC_STATES_MIN``, so that all are read
within ``RESYNC_SWEEP_PASSES`` passes. (A pod that held none of 10,000
partitions read all 10,000 every 5 s: about 2,000 ZooKeeper reads a second, a
fifth of a core, per pod.) The states of partitions held elsewhere, kept for
Metadata, are forgotten every ``others_forget_ms`` (a minute by default) and
read again when next asked for, and every topic's node is read then too (a
reassignment that made this instance a replica): this repairs a LeaderAndIsr
lost on its way here. A topic node cached here may so be a minute old: a
partition beyond its cached count (CreatePartitions grew the topic since),
named by a LeaderAndIsr or a request, has the node read again once before it
is refused (``topic_of``).

A state is taken only when newer than the one known (leader epoch,
then znode version). Taking it makes this replica the leader (become_leader)
or a follower fetching from the leader (replica_fetcher.py).

A leader changes its partition's ISR itself, as Kafka's did in ZooKeeper
mode: a follower that caught up joins, one that lags for
``replica_lag_time_max_ms`` leaves, each by a conditional write on the
version it knows; a write that fails (the controller wrote first) re-reads
the state and takes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from partition_svc.election import LeaderAndIsr
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition, now_ms
from partition_svc.replica_fetcher import ReplicaFetcher
from partition_svc.topics import TopicInfo, TopicRegistry
from services.coordination import zk
from services.coordination.rpc import PeerClient
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.names import TopicPartition, is_topic_name

log = logging.getLogger(__name__)


RESYNC_STATES_MIN = 200  # states of this instance's partitions a resync reads at least (all of them when fewer)
RESYNC_SWEEP_PASSES = 6  # resyncs over which every state of this instance's partitions is read once, at most
RESYNC_READS_CONCURRENT_MAX = 1_000  # state reads one resync has outstanding at once
OTHERS_FORGET_MS_MIN = 60_000  # states of partitions held elsewhere are forgotten (read again on use) this often at least
OTHERS_FORGET_PASSES = 12  # ... or every this many resyncs, whichever is longer


class ReplicaManager:
    def __init__(self, node_id: int, store: LogStore, writer: GroupCommitWriter, topics: TopicRegistry, peers: PeerClient,
                 live_nodes: Callable[[], Awaitable[dict[int, str]]], registration_path: str, *, lag_max_ms: int,
                 fetch_wait_ms: int, fetch_bytes_max: int):
        self.registration_path = registration_path
        self.storage_zxid: int | None = None  # the mark of this instance's storage (set once read): said in every fetch
        self._registration: tuple[int, int] | None = None  # (ZooKeeper session, czxid of this instance's registration)
        self.node_id = node_id
        self.store = store
        self.writer = writer
        self.topics = topics
        self.peers = peers
        self.live_nodes = live_nodes
        self.lag_max_ms = lag_max_ms
        self.fetch_wait_ms = fetch_wait_ms
        self.fetch_bytes_max = fetch_bytes_max
        self.partitions: dict[TopicPartition, Partition] = {}
        self.states: dict[TopicPartition, LeaderAndIsr] = {}
        self.controller_epoch = 0
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._isr_writes: set[TopicPartition] = set()
        self._resync_cursor = 0  # where the next resync's share of this instance's states starts
        self.resync_state_reads = 0  # states read by resyncs since start (tests and benchmarks watch it)

    # --- states -----------------------------------------------------------------------

    async def state(self, topic: str, index: int, *, fresh: bool = False) -> LeaderAndIsr | None:
        """The partition's state as known here (read from ZooKeeper when not
        known yet, or when ``fresh``); None when the partition does not exist."""
        if topic in self.topics.deleting:
            return None  # marked for deletion: unknown at once, though its replicas may not be dropped yet
        known = self.states.get((topic, index))
        if known is not None and not fresh:
            return known
        if not is_topic_name(topic):
            return None
        info = await self.topic_of(topic, index)
        if info is None or not 0 <= index < info.partition_count:
            return None
        state = await self.topics.state(topic, index)
        if state is not None:
            await self.take(info, index, state)
        return self.states.get((topic, index))

    async def topic_of(self, topic: str, index: int) -> TopicInfo | None:
        """The topic, for its partition ``index``: the cached node, read again
        once when it has fewer partitions than that (CreatePartitions grew the
        topic since; resyncs re-read only the topics this instance has
        partitions of, so a node cached here may be a minute old). None when
        the topic does not exist; an index it still has not is the caller's to refuse."""
        info = await self.topics.get(topic)
        if info is not None and index >= info.partition_count:
            info = await self.topics.get(topic, fresh=True)
        return info

    async def take(self, info: TopicInfo, index: int, state: LeaderAndIsr, replicas: tuple[int, ...] | None = None) -> None:
        """Takes a partition state if it is newer than the one known, and acts
        on it. ``replicas`` come with the controller's LeaderAndIsr, which is
        authoritative: a replica it leaves out (a reassignment moved it away)
        deletes its copy of the partition."""
        key = (info.name, index)
        # The one await, before anything changes: from here to the role taken nothing else may run, or a
        # request could find the partition created but its role not set yet.
        registered_at = await self.registered_at() if state.leader == self.node_id else 0
        if info.name in self.topics.deleting:
            return  # marked for deletion while this state was on its way: its partitions are going, not coming
        if replicas is not None:
            self.topics.learned_replicas(info.name, index, replicas)
            if key in self.partitions and self.node_id in replicas:
                self.partitions[key].replicas = replicas  # a reassignment added followers: the leader serves them
        known = self.states.get(key)
        joined = replicas is not None and self.node_id in replicas and key not in self.partitions  # a reassignment added it
        if state.newer_than(known):
            self.states[key] = state
        elif joined:
            state = known
        else:
            return
        partition = self.partitions.get(key)
        if self.node_id not in (replicas or info.replicas[index]):
            self._stop_following(key)
            if partition is not None:
                partition.become_follower(state.leader_epoch)
                if replicas is not None:
                    del self.partitions[key]
                    await partition.delete()
                    log.info("replica removed", extra=fields(topic=info.name, partition=index, replicas=list(replicas)))
            return
        replicas = replicas or info.replicas[index]
        if partition is None:
            partition = self.partitions[key] = Partition(info.name, index, info.configs, self.store, self.writer,
                                                         node_id=self.node_id, partition_count=info.partition_count,
                                                         sole_replica=False)
        partition.replicas = tuple(replicas)
        if state.leader == self.node_id and state.zk_mzxid <= registered_at:
            self._stop_following(key)
            partition.become_follower(state.leader_epoch)
            log.info("not leading on a state from before this instance registered; the controller decides again",
                     extra=fields(topic=info.name, partition=index, leader_epoch=state.leader_epoch,
                                  state_mzxid=state.zk_mzxid, registered_at=registered_at))
        elif state.leader == self.node_id:
            self._stop_following(key)
            was_leader = partition.is_leader
            partition.become_leader(state.leader_epoch, frozenset(state.isr), now_ms())
            if not was_leader:
                log.info("leading", extra=fields(topic=info.name, partition=index, leader_epoch=state.leader_epoch,
                                                 isr=list(state.isr), log_end=partition.next_offset))
        else:
            partition.become_follower(state.leader_epoch)
            if state.leader in self.fetchers and self.fetchers[state.leader].follows(key, state.leader_epoch):
                return  # an ISR change only
            self._stop_following(key)
            if state.leader >= 0:
                fetcher = self.fetchers.get(state.leader)
                if fetcher is None:
                    fetcher = self.fetchers[state.leader] = ReplicaFetcher(self, state.leader)
                fetcher.add(key, partition, state.leader_epoch)

    async def registered_at(self) -> int:
        """The ZooKeeper transaction that registered this instance in its
        current session (2**63 until it has: nothing is new enough to lead on)."""
        session = self.topics.client.client_id[0] if self.topics.client.client_id else None
        if self._registration is not None and self._registration[0] == session:
            return self._registration[1]
        stat = await zk.call(self.topics.client, "exists", self.registration_path)
        if stat is None or stat.ephemeralOwner != session:
            return 2**63
        self._registration = (session, stat.czxid)
        return stat.czxid

    def _stop_following(self, key: TopicPartition) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove(key)

    async def refresh(self, topic: str, index: int) -> None:
        """Reads the partition's state again (a fetch answered that this
        replica's view is stale)."""
        await self.state(topic, index, fresh=True)

    def is_mine(self, info: TopicInfo, index: int) -> bool:
        """This instance is a replica of the partition (by the topic's node) or holds it."""
        return self.node_id in info.replicas[index] or (info.name, index) in self.partitions

    async def resync(self, *, every_topic: bool = True) -> None:
        """The safety net under LeaderAndIsr: reads the topics' nodes (replica
        lists change by reassignment, configs by AlterTopicConfigs), unless
        ``every_topic`` only those this instance has a partition of as last
        read, and those never read; then a share of the states of this
        instance's own partitions, the next ones after the last resync's (every
        one within RESYNC_SWEEP_PASSES resyncs); never the state of a partition
        this instance neither is a replica of nor holds."""
        mine: list[tuple[TopicInfo, int]] = []
        for name in await self.topics.names():
            cached = self.topics.cached(name)
            if every_topic or cached is None or any(self.is_mine(cached, i) for i in range(cached.partition_count)):
                info = await self.topics.get(name, fresh=True)
            else:
                info = cached
            if info is None:
                continue
            self.apply_configs(info)
            mine += [(info, index) for index in range(info.partition_count) if self.is_mine(info, index)]
        if not mine:
            return
        share = min(len(mine), max(RESYNC_STATES_MIN, -(-len(mine) // RESYNC_SWEEP_PASSES)))
        start = self._resync_cursor % len(mine)
        chosen = (mine + mine)[start:start + share]
        self._resync_cursor = start + share

        async def take_read(group: list[tuple[TopicInfo, int]], states: list[LeaderAndIsr | None]) -> None:
            # each chunk's states are taken before the next chunk is read: a read failing later keeps these
            self.resync_state_reads += len(group)
            for (info, index), state in zip(group, states, strict=True):
                if state is not None:
                    await self.take(info, index, state)

        await zk.gather_in_chunks(lambda key: self.topics.state(key[0].name, key[1]), chosen, RESYNC_READS_CONCURRENT_MAX,
                                  each_chunk=take_read)

    def forget_others(self) -> int:
        """Forgets the states of partitions this instance neither is a replica
        of nor holds (read again when next asked for); how many."""
        others = [key for key in self.states if key not in self.partitions and not self._assigned_here(key)]
        for key in others:
            del self.states[key]
        return len(others)

    def _assigned_here(self, key: TopicPartition) -> bool:
        info = self.topics.cached(key[0])
        return info is not None and 0 <= key[1] < info.partition_count and self.node_id in info.replicas[key[1]]

    async def drop_topic(self, name: str) -> int:
        """Stops every replica of the topic here and deletes every key of each
        on disk, loaded or not (an instance down while the topic was deleted
        loads none of them again); how many were on disk."""
        for key in [key for key in self.partitions if key[0] == name]:
            self._stop_following(key)
            partition = self.partitions.pop(key)
            partition.become_follower(partition.leader_epoch + 1)  # a request still holding it is refused from here
        for key in [key for key in self.states if key[0] == name]:
            del self.states[key]
        prefix = name.encode() + b"\x00"
        stored = [pkey for pkey, _ in self.store.partitions() if pkey.startswith(prefix) and len(pkey) == len(prefix) + 4]
        for pkey in stored:  # after whatever the replicas submitted before (one writer, in order)
            await self.writer.submit(self.store.wipe_changes(pkey))
        return len(stored)

    def apply_configs(self, info: TopicInfo) -> None:
        """The topic's configs as ZooKeeper holds them, taken by every replica
        of it here (each reads its configs on use: retention, limits, acks)."""
        for (topic, _), partition in self.partitions.items():
            if topic == info.name and partition.configs != info.configs:
                partition.configs = dict(info.configs)

    async def recover(self) -> None:
        """Takes the state of every partition this instance has data for."""
        for pkey, _ in list(self.store.partitions()):
            topic, index = pkey[:-5].decode(), int.from_bytes(pkey[-4:], "big")
            try:
                await self.state(topic, index)
            except TxlogError as exc:
                log.warning("partition state unreadable", extra=fields(topic=topic, partition=index, error=exc.message))
        log.info("recovered partitions", extra=fields(count=len(self.partitions)))

    # --- leading --------------------------------------------------------------------

    async def leader(self, topic: str, index: int) -> Partition:
        """The partition, if this instance leads it; else a TxlogError saying where to go."""
        partition = self.partitions.get((topic, index)) if topic not in self.topics.deleting else None
        if partition is not None and partition.is_leader:
            return partition
        state = await self.state(topic, index)
        if state is None:
            raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"{topic[:300]!r} partition {index} does not exist")
        partition = self.partitions.get((topic, index))
        if partition is not None and partition.is_leader:
            return partition
        if state.leader < 0:
            raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"),
                             f"{topic} partition {index} has no leader: no replica in its ISR {list(state.isr)} is live")
        if state.leader == self.node_id:
            raise TxlogError(ErrorCode.Value("LEADER_NOT_AVAILABLE"),
                             f"{topic} partition {index}: node {self.node_id} restarted since it was elected; the controller "
                             "elects a leader again (retry shortly)")
        raise TxlogError(ErrorCode.Value("NOT_LEADER"),
                         f"{topic} partition {index} is led by node {state.leader}, not node {self.node_id}; refresh metadata")

    def follower_fetched(self, partition: Partition, follower: int, log_end_offset: int, log_start_offset: int = 0,
                         storage_zxid: int | None = None) -> None:
        partition.follower_fetched(follower, log_end_offset, now_ms(), log_start_offset, storage_zxid)
        self.check_isr(partition)

    def check_isr(self, partition: Partition) -> None:
        """Starts an ISR change when the leader's view of its followers calls for one."""
        key = (partition.topic, partition.index)
        if not partition.is_leader or key in self._isr_writes:
            return
        wanted = partition.replica_set.isr_change(partition.durable_end, now_ms(), self.lag_max_ms)
        if wanted is not None:
            self._isr_writes.add(key)
            asyncio.ensure_future(self._write_isr(partition, wanted))

    async def _write_isr(self, partition: Partition, wanted: frozenset[int]) -> None:
        key = (partition.topic, partition.index)
        try:
            state = self.states.get(key)
            if state is None or state.leader != self.node_id or not partition.is_leader:
                return
            # a follower added back is recorded with the storage its fetches came from (election.py)
            changed = replace(state, isr=tuple(sorted(wanted))).with_storage(
                partition.replica_set.storage_of(wanted - set(state.isr)))
            written = await self.topics.write_state(partition.topic, partition.index, changed)
            if written is None:  # the controller wrote first: take what it wrote
                await self.refresh(*key)
                return
            self.states[key] = written
            partition.isr_changed(frozenset(written.isr))
            log.info("ISR changed", extra=fields(topic=partition.topic, partition=partition.index, isr=list(written.isr),
                                                 was=list(state.isr), high_watermark=partition.high_watermark))
        except TxlogError as exc:
            log.warning("ISR change not written", extra=fields(topic=partition.topic, partition=partition.index, error=exc.message))
        finally:
            self._isr_writes.discard(key)

    async def maintain_forever(self, refresh_ms: int) -> None:
        """Shrinks the ISRs of lagging followers (every half lag time),
        resyncs (every ``refresh_ms``) and forgets the states of partitions
        held elsewhere and reads every topic's node (every
        ``others_forget_ms(refresh_ms)``)."""
        loop = asyncio.get_running_loop()
        last_resync, last_forget = 0.0, loop.time()
        while True:
            await asyncio.sleep(min(self.lag_max_ms, refresh_ms) / 2000)
            try:
                for partition in list(self.partitions.values()):
                    self.check_isr(partition)
                every_topic = loop.time() - last_forget >= others_forget_ms(refresh_ms) / 1000
                if every_topic:
                    last_forget = loop.time()
                    self.forget_others()
                if every_topic or loop.time() - last_resync >= refresh_ms / 1000:
                    last_resync = loop.time()
                    await self.resync(every_topic=every_topic)
            except TxlogError as exc:
                log.warning("replica maintenance failed", extra=fields(error=exc.message))
            except Exception:
                log.exception("replica maintenance failed")

    async def close(self) -> None:
        for fetcher in self.fetchers.values():
            await fetcher.close()


def others_forget_ms(refresh_ms: int) -> int:
    """How often the states of partitions held elsewhere are forgotten."""
    return max(OTHERS_FORGET_MS_MIN, OTHERS_FORGET_PASSES * refresh_ms)
