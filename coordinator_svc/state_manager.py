"""Which ``__transaction_state`` partitions this coordinator serves, and their
state in memory: ownership read and written in ZooKeeper (conditional writes,
a coordinator epoch that grows with every owner), the lease that stops a
paused coordinator answering from state another owner may have changed since
(confirmed against an injected monotonic clock), loading a partition's log
into TransactionMetadata, and finding an id's metadata. What a loaded
partition's decided transactions need next (completion, group decisions,
seals) is the coordinator's, through ``on_loaded``.

Due times
---------
Each loaded partition keeps its ids ordered by when something is due
(:class:`DeadlineIndex`): an open transaction's timeout, a prepared one's
prepared timeout and next check-back, a settled id's last update (it expires
``transactional_id_expiration_ms`` later). The coordinator's timers and the
check-back take only the ids whose time came, so a pass costs what is due, not
what is held. The indexes are built when the partition is loaded and follow
every transition applied to it (:meth:`LoadedPartition.complete_transition`,
the one place a written transition is applied); an id taken from an index is
looked at again with the rules (transaction_core.timed_out / expired,
check_rules.next_check_ms), and put back at its current time when it is not
due after all (moved on since, or a transition still in flight). An index's
time for an id is never later than the rules': nothing is forgotten or late;
a stale entry costs one look.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from kazoo.exceptions import BadVersionError, NodeExistsError

from coordinator_svc import transaction_state as ts
from coordinator_svc.check_rules import DEFAULT_CONFIG, GroupCheckConfig, altered, check_due_ms
from coordinator_svc.coordinator_config import CoordinatorConfig
from coordinator_svc.transaction_core import error
from coordinator_svc.transaction_state import GroupDecision, TransactionMetadata, TransactionRecord, TransactionState
from coordinator_svc.txn_log import FENCE_KEY, TransactionLogPartition
from services.coordination import coordinators, zk
from services.coordination.producer_ids import ProducerIdSource
from services.coordination.rpc import PeerClient
from services.runtime.logs import fields
from txlog.protocol import OPEN_TRANSACTION_STATES, TRANSACTION_STATE_TOPIC, names
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import partition_pb2

log = logging.getLogger(__name__)
# Fatal answers read from an id's state in memory (not from the request alone): given only by a confirmed owner.
ANSWERS_FROM_STATE = frozenset(ErrorCode.Value(c) for c in (
    "INVALID_PRODUCER_ID_MAPPING", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_TXN_STATE", "TRANSACTIONAL_ID_NOT_FOUND"))
S = TransactionState
PASS_IDS_PER_YIELD = 1_000  # a timer or check-back pass lets requests in after this many due ids
SETTLED_STATES = frozenset(state for state in TransactionState if state.is_complete)


def timeout_due_ms(meta: TransactionMetadata) -> int | None:
    """The first time (ms) at which transaction_core.timed_out holds for the
    state ``meta`` is in (its transition in flight aside): an Ongoing
    transaction's timeout or a Prepared one's prepared timeout passed; None in
    any other state."""
    if meta.state is S.ONGOING:
        return meta.txn_start_ms + meta.txn_timeout_ms + 1
    if meta.state is S.PREPARED:
        return meta.prepared_ms + meta.prepared_timeout_ms + 1
    return None


def idle_since_ms(meta: TransactionMetadata) -> int | None:
    """When a settled id (Empty, Complete*) was last updated: transaction_core.expired
    holds once ``now_ms > idle_since_ms + expiration_ms``. None in any other state.
    Kept without the expiration, so the index does not depend on the setting."""
    return meta.last_update_ms if meta.state.is_complete else None


class DeadlineIndex:
    """Transactional ids ordered by a time in ms, each id at most once: a heap of
    (ms, id) with lazy deletion. :meth:`set` moves an id (its old heap entry stays
    and is skipped when it comes up: it no longer matches the id's time);
    :meth:`pop_due` takes the ids whose time is at or before a bound, earliest
    first (ties by id), at O(log n) each. Stale entries are bounded: when they
    outnumber the live ones (beyond ``STALE_MIN``), the heap is rebuilt."""

    STALE_MIN = 1_024

    def __init__(self, entries: Iterable[tuple[str, int]] = ()):
        self._ms: dict[str, int] = dict(entries)  # id -> its time; (ms, id) in the heap is its live entry
        self._heap = [(ms, tid) for tid, ms in self._ms.items()]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._ms)

    def __contains__(self, transactional_id: str) -> bool:
        return transactional_id in self._ms

    def get(self, transactional_id: str) -> int | None:
        return self._ms.get(transactional_id)

    def ids(self) -> list[str]:
        return list(self._ms)

    def heap_entries(self) -> int:
        """Entries in the heap, stale ones included (bounded by about twice the live ones)."""
        return len(self._heap)

    def set(self, transactional_id: str, ms: int | None) -> None:
        """The id's time is ``ms`` from now on (None: it has none)."""
        if ms is None:
            self._ms.pop(transactional_id, None)
            return
        if self._ms.get(transactional_id) == ms:
            return
        self._ms[transactional_id] = ms
        heapq.heappush(self._heap, (ms, transactional_id))
        if len(self._heap) > 2 * len(self._ms) + self.STALE_MIN:
            self._heap = [(t, i) for i, t in self._ms.items()]
            heapq.heapify(self._heap)

    def discard(self, transactional_id: str) -> None:
        self.set(transactional_id, None)

    def next_ms(self) -> int | None:
        """The earliest time held (stale entries on top are dropped on the way)."""
        while self._heap and self._ms.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, up_to_ms: int, limit: int) -> list[tuple[int, str]]:
        """Takes out (ms, id) of at most ``limit`` ids whose time is at or before ``up_to_ms``, earliest first."""
        heap, ms_of, taken = self._heap, self._ms, []
        while heap and heap[0][0] <= up_to_ms and len(taken) < limit:
            ms, tid = heapq.heappop(heap)
            if ms_of.get(tid) == ms:
                del ms_of[tid]
                taken.append((ms, tid))
        return taken


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
    # transactional id -> [(core.NextAdd, asyncio.Future)]: while the markers of its decided transaction are written, the
    # adds of its next one, decided with the completion (Coordinator._complete_inner)
    next_adds: dict = field(default_factory=dict)
    decisions: dict[str, GroupDecision] = field(default_factory=dict)  # group decisions not finished yet
    group_configs: dict[str, GroupCheckConfig] = field(default_factory=dict)  # groups whose check-back settings were changed
    config_changes: asyncio.Lock = field(default_factory=asyncio.Lock)  # one group-config write at a time: no lost update
    confirmed_s: float = 0.0  # monotonic time ZooKeeper last confirmed this owner and epoch
    # Due times (module docstring): each id in an index is looked at when its time comes, not before.
    timeouts: DeadlineIndex = field(default_factory=DeadlineIndex)  # Ongoing/Prepared: timeout_due_ms
    idle: DeadlineIndex = field(default_factory=DeadlineIndex)  # Empty/Complete*: idle_since_ms (expiration)
    checks: DeadlineIndex = field(default_factory=DeadlineIndex)  # Prepared: check_rules.check_due_ms, its next check-back
    # group -> its Prepared ids with no check in ``checks``: exhausted under the keep policy, or due while the
    # group had no checker; scheduled again when the group's settings change or a checker registers
    unchecked: dict[str, set[str]] = field(default_factory=dict)
    open_ids: set[str] = field(default_factory=set)  # ids in OPEN_TRANSACTION_STATES: what a metrics scrape reads

    def complete_transition(self, meta: TransactionMetadata, record: TransactionRecord) -> None:
        """Applies a written transition (transaction_state.complete_transition) and
        moves the id's due times to its new state. Every transition applied to a
        loaded partition's id goes through here, so none leaves a due time behind."""
        ts.complete_transition(meta, record)
        self.schedule(meta)

    def schedule(self, meta: TransactionMetadata) -> None:
        """Sets the id's due times from the state it is in (a transition in flight
        aside: if it is abandoned, they stand). Idempotent: called again whenever
        an id may have been taken out of an index and not dealt with."""
        tid = meta.transactional_id
        self.timeouts.set(tid, timeout_due_ms(meta))
        self.idle.set(tid, idle_since_ms(meta))
        if meta.state in OPEN_TRANSACTION_STATES:
            self.open_ids.add(tid)
        else:
            self.open_ids.discard(tid)
        if meta.state is not S.PREPARED and tid not in self.checks and not self.unchecked:
            return  # the common case, without working out the group
        group_id = names.transaction_group(tid)
        check_ms = check_due_ms(meta, self.group_configs.get(group_id, DEFAULT_CONFIG))
        self.checks.set(tid, check_ms)
        if check_ms is None and meta.state is S.PREPARED:
            self.unchecked.setdefault(group_id, set()).add(tid)
        else:
            self._checked(group_id, tid)

    def schedule_all(self) -> None:
        """Builds the indexes from every id held: at load, before anything is served."""
        timeouts, idle, checks = [], [], []
        self.unchecked = {}
        self.open_ids = set()
        for tid, meta in self.transactions.items():
            if meta.state in SETTLED_STATES:  # most ids: a set lookup, not the enum's property (a load's time counts)
                idle.append((tid, meta.last_update_ms))
                continue
            if meta.state in OPEN_TRANSACTION_STATES:
                self.open_ids.add(tid)
            due_ms = timeout_due_ms(meta)
            if due_ms is not None:
                timeouts.append((tid, due_ms))
            if meta.state is S.PREPARED:
                group_id = names.transaction_group(tid)
                check_ms = check_due_ms(meta, self.group_configs.get(group_id, DEFAULT_CONFIG))
                if check_ms is None:
                    self.unchecked.setdefault(group_id, set()).add(tid)
                else:
                    checks.append((tid, check_ms))
        self.timeouts, self.idle, self.checks = DeadlineIndex(timeouts), DeadlineIndex(idle), DeadlineIndex(checks)

    def drop_due_times(self) -> None:
        """Unloaded: nothing is due here any more (a pass still holding the partition finds nothing)."""
        self.timeouts, self.idle, self.checks, self.unchecked = DeadlineIndex(), DeadlineIndex(), DeadlineIndex(), {}
        self.open_ids = set()

    def wait_for_checker(self, meta: TransactionMetadata) -> None:
        """A check came due while its group had no checker: nothing is asked or
        counted, and the id waits (unscheduled) until one registers."""
        self.checks.discard(meta.transactional_id)
        self.unchecked.setdefault(names.transaction_group(meta.transactional_id), set()).add(meta.transactional_id)

    def reschedule_group(self, group_id: str) -> None:
        """The group's check times again, after its settings changed (a check may
        come due sooner, or an exhausted one be aborted): every check of the partition is looked at."""
        self._schedule_ids(self.unchecked.pop(group_id, set())
                           | {t for t in self.checks.ids() if names.transaction_group(t) == group_id})

    def schedule_unchecked(self, group_id: str) -> None:
        """The group's checks that waited unscheduled, once a checker registered
        (a renewal, every third of a lease: only what waits, not every check)."""
        self._schedule_ids(self.unchecked.pop(group_id, set()))

    def _schedule_ids(self, tids: set[str]) -> None:
        for tid in sorted(tids):
            meta = self.transactions.get(tid)
            if meta is not None:
                self.schedule(meta)

    def _checked(self, group_id: str, tid: str) -> None:
        waiting = self.unchecked.get(group_id)
        if waiting is not None:
            waiting.discard(tid)
            if not waiting:
                del self.unchecked[group_id]


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
        loaded.schedule_all()
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
            loaded.drop_due_times()

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

    async def take_due(self, loaded: LoadedPartition, index: DeadlineIndex, up_to_ms: int, *, stop_if_broken: bool = True):
        """A timer or check-back pass over one of ``loaded``'s indexes: the metadata
        of the ids it holds at or before ``up_to_ms``, taken out of it earliest
        first (an id the partition no longer holds is dropped), each looked up
        when its turn comes. The loop is yielded every PASS_IDS_PER_YIELD ids
        taken, and the pass stops once the partition is no longer served (its
        indexes went with it) or, with ``stop_if_broken``, once its log broke.
        An id taken and not dealt with is the caller's to put back (:meth:`reschedule`)."""
        while self.partitions.get(loaded.index) is loaded and not (stop_if_broken and loaded.log.broken):
            taken = index.pop_due(up_to_ms, PASS_IDS_PER_YIELD)
            for _, transactional_id in taken:
                meta = loaded.transactions.get(transactional_id)
                if meta is not None:
                    yield meta
            if len(taken) < PASS_IDS_PER_YIELD:
                return
            await asyncio.sleep(0)

    def reschedule(self, loaded: LoadedPartition, meta: TransactionMetadata) -> None:
        """Puts an id a pass took out back into its partition's indexes, at its
        current due times, if the partition is still served and ``meta`` still its metadata."""
        if self.partitions.get(loaded.index) is loaded and loaded.transactions.get(meta.transactional_id) is meta:
            loaded.schedule(meta)

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
