"""Which ``__transaction_state`` partitions this coordinator serves, and their
state in memory: ownership read and written in ZooKeeper (conditional writes,
a coordinator epoch that grows with every owner), the lease that stops a
paused coordinator answering from state another owner may have changed since
(confirmed against an injected monotonic clock), loading a partition's log
into TransactionMetadata, and finding an id's metadata. What a loaded
partition's decided transactions need next (completion, group decisions,
seals) is the coordinator's, through ``on_loaded``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kazoo.exceptions import BadVersionError, NodeExistsError

from coordinator_svc import transaction_state as ts
from coordinator_svc.check_rules import DEFAULT_CONFIG, GroupCheckConfig, altered
from coordinator_svc.transaction_core import error
from coordinator_svc.transaction_state import GroupDecision, TransactionMetadata
from coordinator_svc.txn_log import FENCE_KEY, TransactionLogPartition
from services import coordinators, names, zk
from services.errors import ErrorCode, TxlogError
from services.logs import fields
from services.producer_ids import ProducerIdSource
from services.protocol import TRANSACTION_STATE_TOPIC
from services.rpc import PeerClient
from services.stubs.txlog.v1 import partition_pb2

log = logging.getLogger(__name__)
# Fatal answers read from an id's state in memory (not from the request alone): given only by a confirmed owner.
ANSWERS_FROM_STATE = frozenset(ErrorCode.Value(c) for c in (
    "INVALID_PRODUCER_ID_MAPPING", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_TXN_STATE", "TRANSACTIONAL_ID_NOT_FOUND"))


@dataclass
class LoadedPartition:
    index: int
    owner: coordinators.PartitionOwner
    log: TransactionLogPartition
    transactions: dict[str, TransactionMetadata] = field(default_factory=dict)
    loaded: bool = False
    tasks: set = field(default_factory=set)
    completing: dict = field(default_factory=dict)  # transactional id -> asyncio.Event set when its completion ends
    writing: dict = field(default_factory=dict)  # transactional id -> asyncio.Event set when its record in flight is written (or not)
    decisions: dict[str, GroupDecision] = field(default_factory=dict)  # group decisions not finished yet
    group_configs: dict[str, GroupCheckConfig] = field(default_factory=dict)  # groups whose check-back settings were changed
    config_changes: asyncio.Lock = field(default_factory=asyncio.Lock)  # one group-config write at a time: no lost update
    confirmed_s: float = 0.0  # monotonic time ZooKeeper last confirmed this owner and epoch


@dataclass(frozen=True)
class CoordinatorConfig:
    node_id: int
    zookeeper_root: str
    transaction_state_partitions: int
    transaction_timeout_ms_max: int
    transactional_id_expiration_ms: int
    ownership_lease_ms: int = 3_000
    prepared_transaction_timeout_ms: int = 24 * 3600 * 1000
    checks_in_flight_max: int = 16


class TransactionStateManager:
    def __init__(self, config: CoordinatorConfig, zookeeper, registry, client: PeerClient, producer_ids: ProducerIdSource,
                 on_loaded: Callable[[LoadedPartition, list[GroupDecision]], Awaitable[None]],
                 clock_ms: Callable[[], int], monotonic: Callable[[], float] = time.monotonic):
        self.config = config
        self.zookeeper = zookeeper
        self.registry = registry
        self.client = client
        self.producer_ids = producer_ids
        self.clock_ms = clock_ms
        self.monotonic = monotonic
        self.partitions: dict[int, LoadedPartition] = {}
        self.partition_count: int | None = None
        # A partition is served only while ZooKeeper confirmed its ownership this
        # recently: a coordinator that was paused (or cut off from ZooKeeper) stops
        # answering from state another owner may have changed since. Shorter than
        # the ZooKeeper session timeout, after which another owner can take over.
        self.lease_s = config.ownership_lease_ms / 1000
        self.owners = coordinators.WatchedOwners(zookeeper, config.zookeeper_root)
        # What the coordinator does once a partition's records are in memory: resume its decisions, mark it loaded.
        self.on_loaded = on_loaded

    async def ensure_log_topic(self) -> int:
        if self.partition_count is None:
            count = await self.client.partition_count(TRANSACTION_STATE_TOPIC)
            if count is None:
                reply = await self.client.call_any_partition_svc(
                    "CreateTopics",
                    partition_pb2.CreateTopicsRequest(
                        topics=[partition_pb2.CreatableTopic(name=TRANSACTION_STATE_TOPIC, partition_count=self.config.transaction_state_partitions)]
                    ),
                )
                if reply.results[0].error.code not in (0, ErrorCode.Value("TOPIC_ALREADY_EXISTS")):
                    raise TxlogError(reply.results[0].error.code, reply.results[0].error.message)
                await self.client.refresh([TRANSACTION_STATE_TOPIC])
                count = await self.client.partition_count(TRANSACTION_STATE_TOPIC)
            self.partition_count = count
        return self.partition_count

    async def balance(self) -> None:
        """Confirms the partitions this node serves (renewing their leases), lets
        go of the ones it lost, then takes over the ones it should own."""
        count = await self.ensure_log_topic()
        live = sorted(await asyncio.to_thread(self.registry.live, coordinators.COORDINATOR_KIND))
        if self.config.node_id not in live:
            return
        owners = [await coordinators.read_owner(self.zookeeper, self.config.zookeeper_root, index) for index in range(count)]
        confirmed_s = self.monotonic()
        to_take = []
        for index, current in enumerate(owners):
            loaded = self.partitions.get(index)
            if loaded is not None and (current is None or current[0].coordinator_epoch != loaded.owner.coordinator_epoch):
                self.unload(index, "now owned by another coordinator" if current is None else f"now owned by node {current[0].node_id} at epoch {current[0].coordinator_epoch}",
                            handed_over=current is not None and current[0].node_id in live)
                loaded = None
            if loaded is not None and loaded.log.broken:
                self.unload(index, loaded.log.broken)
                loaded = None
            if loaded is not None:
                loaded.confirmed_s = confirmed_s
                continue
            if live[index % len(live)] == self.config.node_id:  # partition p goes to the p-th live coordinator
                to_take.append((index, current))
        for index, current in to_take:
            await self.take_over(index, current)

    async def take_over(self, index: int, current) -> None:
        if current is None:
            owner = coordinators.PartitionOwner(self.config.node_id, 0, await self.producer_ids.next_id())
            try:
                await zk.call(self.zookeeper, "create", coordinators.owner_path(self.config.zookeeper_root, index), owner.encode(), makepath=True)
            except NodeExistsError:
                return  # someone else was faster; the next round looks again
        else:
            previous, version = current
            owner = previous.successor(self.config.node_id)
            if owner.log_producer_id < 0:
                owner = dataclasses.replace(owner, log_producer_id=await self.producer_ids.next_id())
            try:
                await zk.call(self.zookeeper, "set", coordinators.owner_path(self.config.zookeeper_root, index), owner.encode(), version=version)
            except BadVersionError:
                return
        log.info("taking over transaction log partition", extra=fields(partition=index, coordinator_epoch=owner.coordinator_epoch))
        loaded = LoadedPartition(index, owner, TransactionLogPartition(self.client, index, owner.log_producer_id, owner.log_producer_epoch), confirmed_s=self.monotonic())
        self.partitions[index] = loaded
        try:
            await loaded.log.append(FENCE_KEY, str(owner.coordinator_epoch).encode())  # fences the previous owner's writes
            transactions, decisions, group_configs = await loaded.log.read_all()
        except TxlogError as exc:
            self.unload(index, f"loading failed: {exc}")
            return
        loaded.transactions.update(transactions)
        for group_id, overrides in group_configs.items():
            try:
                loaded.group_configs[group_id] = altered(DEFAULT_CONFIG, overrides, [])
            except TxlogError as exc:  # written by a version with other settings: the defaults, rather than no partition
                log.warning("ignoring a transaction group's stored settings", extra=fields(group_id=group_id, error=str(exc)))
        await self.on_loaded(loaded, list(decisions.values()))


    def unload(self, index: int, reason: str, *, handed_over: bool = False) -> None:
        """Stops serving a partition. ``handed_over``: a live coordinator took its
        share (a coordinator joined): routine, logged at INFO; anything else is a
        warning an operator should see."""
        loaded = self.partitions.pop(index, None)
        if loaded is not None:
            (log.info if handed_over else log.warning)("no longer serving transaction log partition",
                                                       extra=fields(partition=index, reason=reason))
            for task in loaded.tasks:
                task.cancel()

    def spawn(self, loaded: LoadedPartition, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        loaded.tasks.add(task)
        task.add_done_callback(loaded.tasks.discard)

    def partition_of(self, transactional_id: str) -> int:
        if self.partition_count is None:
            raise error("COORDINATOR_NOT_AVAILABLE", "the transaction log is not set up yet; retry")
        return coordinators.transaction_log_partition(transactional_id, self.partition_count)

    def loaded_partition(self, transactional_id: str) -> LoadedPartition:
        index = self.partition_of(transactional_id)
        loaded = self.partitions.get(index)
        if loaded is None:
            raise error("NOT_COORDINATOR", f"this coordinator (node {self.config.node_id}) does not own transaction log partition {index}")
        if not loaded.loaded:
            raise error("COORDINATOR_LOAD_IN_PROGRESS", f"transaction log partition {index} is still loading; retry")
        if loaded.log.broken:
            raise error("NOT_COORDINATOR", f"transaction log partition {index} is being reloaded")
        if self.monotonic() - loaded.confirmed_s > self.lease_s:
            raise error("NOT_COORDINATOR", f"ownership of transaction log partition {index} is not confirmed by ZooKeeper; retry")
        return loaded

    async def confirm_ownership(self, key: str) -> None:
        """Reads the owner of ``key``'s log partition from ZooKeeper and raises
        NOT_COORDINATOR (unloading the partition) unless it is still this node at
        the epoch it loaded. Memory is only as good as the ownership behind it: a
        coordinator whose partition moved keeps its old view until its next
        balance round, and must not give a fatal answer from that view
        (INVALID_PRODUCER_ID_MAPPING for an id the new owner just created)."""
        index = self.partition_of(key)
        loaded = self.partitions.get(index)
        current = await coordinators.read_owner(self.zookeeper, self.config.zookeeper_root, index)
        if loaded is not None and current is not None and current[0].node_id == self.config.node_id \
                and current[0].coordinator_epoch == loaded.owner.coordinator_epoch:
            loaded.confirmed_s = self.monotonic()
            return
        reason = "no owner" if current is None else f"owned by node {current[0].node_id} at epoch {current[0].coordinator_epoch}"
        if self.partitions.get(index) is loaded:
            self.unload(index, reason)
        raise error("NOT_COORDINATOR", f"transaction log partition {index} is {reason}, not served here any more; find the coordinator again")

    async def answer_as_owner(self, key: str, answer):
        """Awaits ``answer`` (a handler's coroutine); a fatal error it raises is
        given only once ZooKeeper confirms this node still owns ``key``'s
        partition, else NOT_COORDINATOR, which the client retries elsewhere."""
        try:
            return await answer
        except TxlogError as exc:
            if exc.code in ANSWERS_FROM_STATE:
                await self.confirm_ownership(key)
            raise

    def list_local(self, states: set, producer_ids: set, duration_ms: int, prefix: str = "") -> list[TransactionMetadata]:
        now = self.clock_ms()
        found = []
        loading = sorted(i for i, p in self.partitions.items() if not p.loaded)
        if loading:
            raise error("COORDINATOR_LOAD_IN_PROGRESS", f"transaction log partitions {loading} are still loading; retry")
        for loaded in self.partitions.values():
            for meta in loaded.transactions.values():
                if states and meta.state not in states:
                    continue
                if producer_ids and meta.producer_id not in producer_ids:
                    continue
                if duration_ms and not (meta.state in ts.UNDECIDED_STATES and now - meta.txn_start_ms > duration_ms):
                    continue
                if not meta.transactional_id.startswith(prefix):
                    continue
                found.append(meta)
        return sorted(found, key=lambda m: m.transactional_id)

    def group_config(self, loaded: LoadedPartition, group_id: str) -> GroupCheckConfig:
        return loaded.group_configs.get(group_id, DEFAULT_CONFIG)

    def describe(self, transactional_id: str) -> TransactionMetadata:
        names.check_transactional_id(transactional_id)
        meta = self.loaded_partition(transactional_id).transactions.get(transactional_id)
        if meta is None:
            raise error("TRANSACTIONAL_ID_NOT_FOUND", f"transactional id {transactional_id!r} is unknown")
        return meta

    async def owner_address(self, transactional_id: str) -> tuple[int, str, int, int]:
        """(node id, address, partition, coordinator epoch) of the id's coordinator."""
        index = self.partition_of(transactional_id)
        current = await self.owners.get(index)
        if current is None:
            raise error("COORDINATOR_NOT_AVAILABLE", f"transaction log partition {index} has no owner yet; retry")
        live = await asyncio.to_thread(self.registry.live, coordinators.COORDINATOR_KIND)
        address = live.get(current[0].node_id)
        if address is None:
            raise error("COORDINATOR_NOT_AVAILABLE", f"coordinator {current[0].node_id} is not live; retry")
        return current[0].node_id, address, index, current[0].coordinator_epoch
