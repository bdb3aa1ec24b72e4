"""The transaction coordinator against a reference model of Kafka's Transactions V2
(KIP-890) and our two-phase extension (Prepared, CompleteTransaction, group commit,
check-back answers).

The REAL :class:`TransactionCoordinator` runs (its ``handle_*`` methods, the
timers, the completion tasks) on one loaded ``__transaction_state`` partition.
Only its I/O collaborators are fakes, and they know nothing of the protocol: an
in-memory transaction log (a record is durable once appended; writes of chosen
Complete* records can be held), a marker sender that records the markers it is
asked for (and can hold their acknowledgement, so "completing" is observable),
a producer-id counter that yields as a real allocation does, a fixed partition
count, a checker that answers as it is told (ScriptedChecker), and a clock the
test moves. A check-back answer about a handle is applied as CheckBack applies one
(``coordinator.carry_out`` with ``check_rules.decide_answer``); the rounds of the
real check-back run in test_check_back_model.py, on this harness and model.

The model (:func:`step`) is a small table of what each request must answer and
what it changes. It is a set of possible worlds: where the rules allow more than
one answer (a retriable CONCURRENT_TRANSACTIONS while a completion is in flight,
Kafka's fence on a late InitProducerId), each is kept, and the worlds that disagree
with what the coordinator then shows are dropped. Requests run one at a time, or
two at once (``asyncio.gather``), which must then be explained by some serial
order of the two, each possibly answered CONCURRENT_TRANSACTIONS with no effect
(a check-back answer: answered, with nothing done, while the other's write is in flight).

Guarantees checked after every step, each failing with the rule's name:
- every record written for an id, in order, is an edge of :data:`TV2_VALID_PREVIOUS_STATES`,
  and memory equals the last durable record (write, then apply); a decision (Prepare*)
  followed straight by Ongoing (its completion carried by the next transaction's add)
  only once the decision's markers were all acknowledged;
- one producer id per transactional id in the log (no orphaned InitProducerId record);
- every decision (Prepare*) bumps the epoch; markers are asked only once it is
  durable, carry its bumped epoch, strictly above the epoch the data was written with
  (PrepareTransaction's seals, if any, only once Prepared is durable, at its epoch);
- a fenced producer's epoch is neither the current nor the last epoch, and no request
  with it is ever answered OK (a check-back's UNKNOWN about its handle is answered
  with nothing done);
- EndTxn, CompleteTransaction and a check-back's decision answer an epoch above the
  one they were sent with;
- every answer and every state change is one the model allows (retries, replays,
  reordering, timeouts, group commits, check-back answers: COMMIT/ABORT as
  CompleteTransaction with the handle, UNKNOWN counted only for the prepared one);
  a prepared transaction's check count and last check time are the model's.

The state machine runs with ``derandomize=True``: a failure replays identically and
hypothesis prints its shrunk steps.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from coordinator_svc import check_rules
from coordinator_svc import coordinator as coordinator_module
from coordinator_svc import transaction_state as ts
from coordinator_svc.check_back import ANSWER_PROTOS
from coordinator_svc.check_rules import CheckAnswer
from coordinator_svc.coordinator import TransactionCoordinator
from coordinator_svc.coordinator_config import CoordinatorConfig
from coordinator_svc.markers import MarkerSet
from coordinator_svc.state_manager import LoadedPartition, idle_since_ms, timeout_due_ms
from coordinator_svc.transaction_state import (
    VALID_PREVIOUS_STATES,
    GroupDecision,
    Handle,
    IllegalStateError,
    TransactionRecord,
    TransactionState,
)
from coordinator_svc.txn_log import DECISION_KEY_PREFIX, FENCE_KEY, GROUP_CONFIG_KEY_PREFIX, decision_key
from services.coordination.coordinators import PartitionOwner
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, OPEN_TRANSACTION_STATES
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.hashing import partition_for_id
from txlog.v1 import transaction_check_pb2

S = TransactionState

# --- the rules ----------------------------------------------------------------------------

# Kafka's table of valid previous states under Transactions V2, with our Prepared
# state: aborting an empty transaction (Empty, Complete*) bumps the epoch, so it
# goes through PrepareAbort; Prepared is decided (PrepareCommit/PrepareAbort) or
# fenced like Ongoing, and a check-back that decided nothing rewrites it with its
# count (Prepared -> Prepared).
TV2_VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    # From Prepare*: the completion carried by the next transaction's first add, only once every marker
    # of the decision was acknowledged (Checker._check_log)
    S.ONGOING: frozenset({S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARE_COMMIT, S.PREPARE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING, S.PREPARED}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARED}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING, S.PREPARED}),
    S.PREPARED: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.PREPARED}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),  # expiration (not exercised here)
}


def tv2_allows(previous: TransactionState | None, state: TransactionState) -> bool:
    """True when ``previous -> state`` is an edge (None: the id's first record, which is Empty)."""
    return state is S.EMPTY if previous is None else previous in TV2_VALID_PREVIOUS_STATES[state]


GROUP = "g"
TIDS = ("g/a", "g/b")  # one transaction group: one log partition, committable together
TOPIC_PARTITIONS = (("events", 0), ("events", 1))
OFFSETS_GROUP = "etl"
OFFSETS_PARTITIONS = 4
OFFSETS_PARTITION = (CONSUMER_OFFSETS_TOPIC, partition_for_id(OFFSETS_GROUP, OFFSETS_PARTITIONS))
TXN_TIMEOUT_MS = 1_000
PREPARED_TIMEOUT_MS = 3_000
START_MS = 1_000_000
NO_EPOCH = -1
BUSY = "CONCURRENT_TRANSACTIONS"
# What a request with an old epoch may be answered (all refusals; which one is the coordinator's choice).
STALE = frozenset({"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING", "INVALID_TXN_STATE"})
# Check-back (check_rules.py): the group's interval, its first maximum (test_check_back_model.py changes it
# and the policy), and the application's checker, registered for the group from the start.
CHECK_INTERVAL_MS = 500
CHECK_MAX = 3
CHECKER = "checker.shop:50051"
ANSWERS = tuple(a.value for a in CheckAnswer)  # COMMIT | ABORT | UNKNOWN


# --- fakes of the coordinator's I/O collaborators (no protocol in them) ---------------------

class InMemoryTransactionLog:
    """Stands in for TransactionLogPartition (same methods). A record is durable
    once it is in ``entries``. Every write suspends its caller once, as a real
    one does; writes of Complete* records of the ids in ``held`` wait for
    :meth:`release`."""

    def __init__(self):
        self.entries: list[tuple[bytes, bytes | None]] = []
        self.begun = 0  # writes begun so far
        self.began: list[int] = []  # for each entry, how many writes had begun before its own
        self.broken: str | None = None
        self.held: set[str] = set()
        self.waiting = 0
        self._released = asyncio.Event()

    async def append(self, key: bytes, value: bytes | None) -> None:
        if self.broken:
            raise TxlogError(ErrorCode.Value("NOT_COORDINATOR"), f"the log is broken: {self.broken}")
        began, self.begun = self.begun, self.begun + 1
        await asyncio.sleep(0)
        while self._is_held(key, value):
            self.waiting += 1
            try:
                await self._released.wait()
            finally:
                self.waiting -= 1
        self.entries.append((key, value))
        self.began.append(began)

    async def write(self, record: TransactionRecord) -> None:
        await self.append(record.transactional_id.encode(), record.encode())

    async def write_decision_then(self, decision: GroupDecision, records: list[TransactionRecord]) -> None:
        await self.append(decision_key(decision.decision_id), decision.encode())
        for record in records:
            await self.write(record)

    async def remove_decision(self, decision_id: str) -> None:
        await self.append(decision_key(decision_id), None)

    async def write_group_config(self, group_id: str, overrides: dict[str, str]) -> None:
        await self.append(GROUP_CONFIG_KEY_PREFIX + group_id.encode(), json.dumps(overrides).encode() if overrides else None)

    async def read_all(self):
        records, decisions, group_configs = {}, {}, {}
        for key, value in self.entries:
            if key == FENCE_KEY:
                continue
            if key.startswith(GROUP_CONFIG_KEY_PREFIX):
                group_configs[key[len(GROUP_CONFIG_KEY_PREFIX):].decode()] = {} if value is None else json.loads(value)
            elif key.startswith(DECISION_KEY_PREFIX):
                decision_id = key[len(DECISION_KEY_PREFIX):].decode()
                decisions[decision_id] = None if value is None else GroupDecision.decode(decision_id, value)
            else:
                records[key.decode()] = None if value is None else TransactionRecord.decode(key.decode(), value)
        return records, decisions, group_configs

    def _is_held(self, key: bytes, value: bytes | None) -> bool:
        """A completion of a held id: Complete*, or Ongoing straight after Prepare* (which carries one)."""
        if value is None or not is_transaction_key(key) or key.decode() not in self.held:
            return False
        state = TransactionRecord.decode(key.decode(), value).state
        last = next((r for _, r in reversed(self.records()) if r.transactional_id == key.decode()), None)
        carried = state is S.ONGOING and last is not None and last.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)
        return state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT) or carried

    def release(self) -> None:
        self.held.clear()
        self._released.set()
        self._released = asyncio.Event()

    def records(self) -> list[tuple[int, TransactionRecord]]:
        """(index in ``entries``, record) of every transaction record, in log order."""
        return [
            (i, TransactionRecord.decode(k.decode(), v))
            for i, (k, v) in enumerate(self.entries)
            if v is not None and is_transaction_key(k)
        ]


def is_transaction_key(key: bytes) -> bool:
    """A transactional id's record (not the fence, a group decision or a group's settings)."""
    return key != FENCE_KEY and not key.startswith(DECISION_KEY_PREFIX) and not key.startswith(GROUP_CONFIG_KEY_PREFIX)


@dataclass(frozen=True)
class AskedMarker:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    partitions: frozenset
    durable_entries: int  # how many log entries were durable when it was asked for


class RecordingMarkers:
    """Stands in for MarkerSender: records every marker it is asked to write;
    acknowledges at once, or, while held, once released."""

    def __init__(self, log: InMemoryTransactionLog):
        self.log = log
        self.asked: list[AskedMarker] = []
        self.acknowledged: list[tuple[AskedMarker, int]] = []  # each with the log writes begun when it came
        self.seals: list[AskedMarker] = []
        self.held = False
        self.waiting = 0
        self._released = asyncio.Event()

    async def write(self, transactional_id, producer_id, producer_epoch, committed, coordinator_epoch, partitions) -> None:
        await self.write_all([MarkerSet(transactional_id, producer_id, producer_epoch, frozenset(partitions))], committed, coordinator_epoch)

    async def write_all(self, transactions: list[MarkerSet], committed: bool, coordinator_epoch: int, *, seal_prepared: bool = False) -> None:
        if seal_prepared:  # a prepared transaction's seal (its own epoch, no outcome): recorded, acknowledged at once
            self.seals += [AskedMarker(t.transactional_id, t.producer_id, t.producer_epoch, committed, frozenset(t.partitions), len(self.log.entries))
                           for t in transactions]
            await asyncio.sleep(0)
            return
        for txn in transactions:
            self.asked.append(AskedMarker(txn.transactional_id, txn.producer_id, txn.producer_epoch, committed,
                                          frozenset(txn.partitions), len(self.log.entries)))
        await asyncio.sleep(0)
        while self.held:
            self.waiting += 1
            try:
                await self._released.wait()
            finally:
                self.waiting -= 1
        self.acknowledged += [(AskedMarker(t.transactional_id, t.producer_id, t.producer_epoch, committed, frozenset(t.partitions),
                                           len(self.log.entries)), self.log.begun) for t in transactions]

    def release(self) -> None:
        self.held = False
        self._released.set()
        self._released = asyncio.Event()


class CountingProducerIds:
    """Stands in for ProducerIdSource: consecutive ids; each call yields, as a real allocation may."""

    def __init__(self, first: int = 1000):
        self.next = first
        self.issued = 0

    async def next_id(self) -> int:
        await asyncio.sleep(0)
        producer_id, self.next = self.next, self.next + 1
        self.issued += 1
        return producer_id


class FixedPartitionClient:
    """Stands in for PartitionClient: the partition counts of the topics that exist,
    and the channel to the application's checker (ScriptedChecker)."""

    COUNTS = {"events": len(TOPIC_PARTITIONS), CONSUMER_OFFSETS_TOPIC: OFFSETS_PARTITIONS}

    def __init__(self, checker: ScriptedChecker):
        self.checker = checker

    async def partition_count(self, topic: str) -> int | None:
        return self.COUNTS.get(topic)

    async def refresh(self, topics) -> None:
        return None

    def application_channel(self, address: str) -> ScriptedChecker:
        assert address == CHECKER, address
        return self.checker


class ScriptedChecker:
    """Stands in for a channel to the application's TransactionCheckService:
    answers every CheckTransaction with ``answer``, yielding once as a call
    does, and keeps the requests."""

    def __init__(self):
        self.answer = CheckAnswer.UNKNOWN.value
        self.asked: list[transaction_check_pb2.CheckTransactionRequest] = []

    def unary_unary(self, method, request_serializer=None, response_deserializer=None, **_):
        assert method.endswith("/CheckTransaction"), method

        async def call(request, timeout=None):
            self.asked.append(request)
            await asyncio.sleep(0)
            return transaction_check_pb2.CheckTransactionResponse(answer=ANSWER_PROTOS[CheckAnswer(self.answer)])
        return call


# --- requests and the harness that sends them to the real coordinator ---------------------

@dataclass(frozen=True)
class Req:
    kind: str  # init | add | offsets | verify | end | prepare | complete | group | timeouts | check | checks_due | settings | (un)register
    tid: str = ""
    pid: int = -1
    epoch: int = -1
    committed: bool = False
    parts: frozenset = frozenset()
    handles: tuple = ()
    answer: str = ""  # check: the checker's answer about the handle; checks_due: what the checker answers each check
    check_max: int = CHECK_MAX  # settings: the group's transaction.check.max
    keep: bool = False  # settings: its transaction.check.exhausted is "keep"

    def __repr__(self) -> str:
        if self.kind == "group":
            return "CommitGroup(" + ", ".join(f"{h.transactional_id}@{h.producer_id}/{h.producer_epoch}" for h in self.handles) + ")"
        if self.kind == "timeouts":
            return "AbortTimedOut()"
        if self.kind == "check":
            return f"CheckAnswered({self.tid} {self.pid}/{self.epoch} {self.answer})"
        if self.kind == "checks_due":
            return f"ChecksDue(checker answers {self.answer})"
        if self.kind in ("register", "unregister"):
            return f"{self.kind.capitalize()}TransactionChecker({CHECKER})"
        if self.kind == "settings":
            return f"AlterGroupConfig(check.max={self.check_max}, exhausted={'keep' if self.keep else 'abort'})"
        name = {"init": "InitProducerId", "add": "AddPartitions", "offsets": "AddOffsets", "verify": "VerifyPartitions",
                "end": "EndTxn", "prepare": "Prepare", "complete": "CompleteTransaction"}[self.kind]
        extra = ""
        if self.kind in ("end", "complete"):
            extra = " commit" if self.committed else " abort"
        if self.kind in ("add", "verify"):
            extra = " " + ",".join(f"{t}-{p}" for t, p in sorted(self.parts))
        return f"{name}({self.tid} {self.pid}/{self.epoch}{extra})"


def init(tid, pid=-1, epoch=-1):
    return Req("init", tid, pid, epoch)


def add(tid, pid, epoch, *parts):
    return Req("add", tid, pid, epoch, parts=frozenset(parts or TOPIC_PARTITIONS[:1]))


def end(tid, pid, epoch, committed):
    return Req("end", tid, pid, epoch, committed=committed)


def prepare(tid, pid, epoch):
    return Req("prepare", tid, pid, epoch)


def complete(handle: Handle, committed):
    return Req("complete", handle.transactional_id, handle.producer_id, handle.producer_epoch, committed=committed)


def group(*handles: Handle):
    return Req("group", handles=tuple(handles))


def check(handle: Handle, answer: str):
    """A checker's answer about ``handle``, applied as CheckBack applies one."""
    return Req("check", handle.transactional_id, handle.producer_id, handle.producer_epoch, answer=answer)


Outcome = tuple  # ("ok", value) | ("err", code name) | ("bug", message)


def _first_error(results: dict):
    for outcome in results.values():
        if outcome is not None:
            raise outcome
    return None


class Harness:
    """A real TransactionCoordinator owning one loaded partition, on its own event loop."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.now_ms = START_MS
        self.log = InMemoryTransactionLog()
        self.markers = RecordingMarkers(self.log)
        self.ids = CountingProducerIds()
        self.checker = ScriptedChecker()
        config = CoordinatorConfig(
            node_id=1, zookeeper_root="/txlog", transaction_state_partitions=1, transaction_timeout_ms_max=60_000,
            transactional_id_expiration_ms=10**12, ownership_lease_ms=10**9, prepared_transaction_timeout_ms=10_000,
        )
        self.coordinator = TransactionCoordinator(config, None, None, FixedPartitionClient(self.checker), self.ids, clock_ms=lambda: self.now_ms,
                                                  monotonic=lambda: self.now_ms / 1000, markers=self.markers)
        self.coordinator.state.partition_count = 1
        owner = PartitionOwner(node_id=1, coordinator_epoch=3, log_producer_id=900)
        self.loaded = LoadedPartition(0, owner, self.log, loaded=True, confirmed_s=self.now_ms / 1000)
        self.coordinator.state.partitions[0] = self.loaded
        for setup in (Req("register"), Req("settings")):
            assert self.loop.run_until_complete(self.call(setup))[0] == "ok", setup

    def close(self) -> None:
        tasks = list(self.loaded.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    # holds
    @property
    def holding(self) -> bool:
        return self.markers.held or bool(self.log.held)

    def release(self) -> None:
        self.markers.release()
        self.log.release()

    # requests
    async def call(self, r: Req) -> Outcome:
        c = self.coordinator
        try:
            if r.kind == "init":
                value = await c.handle_init_producer_id(r.tid, TXN_TIMEOUT_MS, r.pid, r.epoch)
            elif r.kind == "add":
                value = _first_error(await c.handle_add_partitions(r.tid, r.pid, r.epoch, sorted(r.parts), False))
            elif r.kind == "verify":
                value = _first_error(await c.handle_add_partitions(r.tid, r.pid, r.epoch, sorted(r.parts), True))
            elif r.kind == "offsets":
                value = await c.handle_add_offsets(r.tid, r.pid, r.epoch, OFFSETS_GROUP)
            elif r.kind == "end":
                value = await c.handle_end_txn(r.tid, r.pid, r.epoch, r.committed)
            elif r.kind == "prepare":
                value = await c.handle_prepare(r.tid, r.pid, r.epoch, PREPARED_TIMEOUT_MS)
            elif r.kind == "complete":
                value = await c.handle_complete(Handle(r.tid, r.pid, r.epoch), r.committed)
            elif r.kind == "group":
                value = await c.handle_commit_group(GROUP, list(r.handles))
            elif r.kind == "timeouts":
                value = await c.abort_timed_out()
            elif r.kind == "check":  # as CheckBack._check applies an answer, with the answer seen
                handle, answer = Handle(r.tid, r.pid, r.epoch), CheckAnswer(r.answer)
                config, now = c.state.group_config(self.loaded, GROUP), c.clock_ms()
                value = await c.carry_out(self.loaded, r.tid, lambda m, spare: check_rules.decide_answer(m, handle, answer, config, now, spare))
            elif r.kind == "checks_due":  # one round of the real check-back, the checker answering r.answer
                self.checker.answer = r.answer
                value = await c.check_back.check_due()
            elif r.kind == "register":
                value = c.check_back.register(GROUP, CHECKER, check_rules.LEASE_MS_MAX)  # no run lasts that long
            elif r.kind == "unregister":
                value = c.check_back.unregister(GROUP, CHECKER)
            elif r.kind == "settings":
                value = await c.alter_group_config(GROUP, {
                    check_rules.CHECK_INTERVAL_MS: str(CHECK_INTERVAL_MS), check_rules.CHECK_MAX: str(r.check_max),
                    check_rules.CHECK_EXHAUSTED: "keep" if r.keep else "abort"}, [])
            else:
                raise ValueError(r.kind)
        except TxlogError as exc:
            return ("err", exc.name)
        except IllegalStateError as exc:
            return ("bug", f"IllegalStateError: {exc}")
        return ("ok", tuple(value) if isinstance(value, list) else value)

    async def settle(self) -> None:
        """Runs the loop until nothing moves: the completions have finished or wait on a hold."""
        quiet, last = 0, None
        for _ in range(5_000):
            await asyncio.sleep(0)
            now = (len(self.log.entries), len(self.markers.asked), self.ids.issued, len(self.loaded.tasks),
                   self.log.waiting, self.markers.waiting, len(self.checker.asked))
            quiet, last = (quiet + 1, last) if now == last else (0, now)
            if quiet >= 10:
                return
        raise AssertionError("the coordinator did not settle")

    def send(self, r: Req, release_first: bool = False) -> Outcome:
        """One request; with ``release_first``, the held completions are released
        while it runs (an AddPartitions waits for the completion of its id)."""
        async def go():
            task = asyncio.ensure_future(self.call(r))
            if release_first:
                for _ in range(5):
                    await asyncio.sleep(0)
                self.release()
            outcome = await task
            await self.settle()
            return outcome
        return self.loop.run_until_complete(go())

    def send_together(self, requests: list[Req]) -> list[Outcome]:
        async def go():
            outcomes = await asyncio.gather(*(self.call(r) for r in requests))
            await self.settle()
            return list(outcomes)
        return self.loop.run_until_complete(go())

    def do(self, fn) -> None:
        async def go():
            fn()
            await self.settle()
        self.loop.run_until_complete(go())

    def tick(self, ms: int) -> None:
        self.now_ms += ms

    def meta(self, tid):
        return self.loaded.transactions.get(tid)


# --- the reference model -------------------------------------------------------------------

@dataclass(frozen=True)
class Txn:
    """What the model knows of one transactional id."""

    pid: int
    epoch: int
    last: int  # Kafka's lastProducerEpoch: the epoch a retry may still carry (NO_EPOCH: none)
    state: TransactionState
    parts: frozenset = frozenset()
    decided: tuple[int, bool] | None = None  # (epoch the decision was asked with, committed) until the id moves on
    start_ms: int = -1
    prepared_ms: int = -1
    checks: int = 0  # while Prepared: check-backs answered without a decision
    last_check_ms: int = -1  # and when the last of them was


@dataclass(frozen=True)
class World:
    txns: tuple = ()  # ((tid, Txn), ...) sorted
    markers_held: bool = False
    held_complete: frozenset = frozenset()
    check_max: int = CHECK_MAX  # the group's check-back settings
    keep: bool = False
    checker: bool = True  # a checker is registered for the group

    def get(self, tid) -> Txn | None:
        return dict(self.txns).get(tid)

    def put(self, tid, txn: Txn) -> World:
        txns = dict(self.txns)
        txns[tid] = txn
        return replace(self, txns=tuple(sorted(txns.items())))


FRESH = -2  # a producer id the model does not know yet: the answer names it
NO_ANSWER = object()
ANY_ERROR = None


@dataclass(frozen=True)
class Alt:
    """One answer the rules allow and the world after it."""

    why: str
    world: World
    ok: object = NO_ANSWER  # the OK answer expected; NO_ANSWER: an error is
    errors: frozenset | None = frozenset()  # the error codes allowed (ANY_ERROR: any)
    markers: tuple = ()  # (tid, pid, epoch, committed, partitions) asked for
    checked: tuple = ()  # (tid, pid, epoch, attempt, prepared ms) the checker was asked about

    def expected(self) -> str:
        if self.ok is not NO_ANSWER:
            return f"OK {self.ok!r}".replace(str(FRESH), "<new pid>")
        return "any error" if self.errors is ANY_ERROR else " or ".join(sorted(self.errors))

    def matches(self, outcome: Outcome) -> bool:
        kind, value = outcome
        if kind == "ok" and self.ok is not NO_ANSWER:
            if isinstance(self.ok, tuple) and self.ok and self.ok[0] == FRESH:
                return isinstance(value, tuple) and value[1] == self.ok[1] and value[0] >= 0
            return self.ok == value
        if kind == "err" and self.ok is NO_ANSWER:
            return self.errors is ANY_ERROR or value in self.errors
        return False

    def resolve(self, outcome: Outcome) -> World:
        world = self.world
        for tid, txn in world.txns:
            if txn.pid == FRESH:
                world = world.put(tid, replace(txn, pid=outcome[1][0]))
        return world


def refused(world: World, why: str, errors) -> Alt:
    return Alt(why, world, errors=frozenset(errors))


def completing(txn: Txn) -> bool:
    """Decided, with its markers or its Complete* record held."""
    return txn.state.is_preparing


def decide(world: World, tid: str, txn: Txn, committed: bool, new_epoch: int, asked_epoch: int) -> tuple[World, tuple]:
    """The transaction of ``tid`` is decided: Prepare* with ``new_epoch``, then, unless held, Complete*."""
    held = world.markers_held or tid in world.held_complete
    if held:
        state, parts = (S.PREPARE_COMMIT if committed else S.PREPARE_ABORT), txn.parts
    else:
        state, parts = (S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT), frozenset()
    decided = replace(txn, epoch=new_epoch, last=new_epoch - 1, state=state, parts=parts,
                      decided=(asked_epoch, committed), start_ms=-1, prepared_ms=-1, checks=0, last_check_ms=-1)
    markers = ((tid, txn.pid, new_epoch, committed, txn.parts),) if txn.parts else ()
    return world.put(tid, decided), markers


def release(world: World) -> World:
    for tid, txn in world.txns:
        if completing(txn):
            done = S.COMPLETE_COMMIT if txn.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
            world = world.put(tid, replace(txn, state=done, parts=frozenset()))
    return replace(world, markers_held=False, held_complete=frozenset())


def fence(world: World, tid: str, txn: Txn, why: str) -> Alt:
    """InitProducerId of a new producer while a transaction is open or prepared:
    PrepareEpochFence bumps (epoch+1, given to no one), the abort bumps again (epoch+2)."""
    fenced, markers = decide(world, tid, txn, False, txn.epoch + 2, txn.epoch + 1)
    return Alt(why, fenced, errors=frozenset({BUSY}), markers=markers)


def retried_end(world: World, txn: Txn, committed: bool, what: str) -> list[Alt]:
    busy = {BUSY} if completing(txn) else set()
    if txn.decided[1] == committed:
        alts = [Alt(f"a retried {what} answers the same outcome and epoch", world, ok=(txn.pid, txn.epoch))]
        if busy:
            alts.append(refused(world, f"a retried {what} while its markers are written may be answered CONCURRENT_TRANSACTIONS", busy))
        return alts
    if committed:
        return [refused(world, f"a retried {what}(commit) of an aborted transaction is refused", {"PRODUCER_FENCED", "INVALID_TXN_STATE"} | busy)]
    return [refused(world, f"a retried {what}(abort) of a committed transaction is refused", {"INVALID_TXN_STATE"} | busy)]


def step(world: World, r: Req, now_ms: int) -> list[Alt]:
    """Every answer the rules allow to ``r`` in ``world``, with the world after it."""
    if r.kind == "timeouts":
        return [step_timeouts(world, now_ms)]
    if r.kind == "group":
        return step_group(world, r)
    if r.kind == "check":
        return step_check(world, r, now_ms)
    if r.kind == "checks_due":
        return step_checks_due(world, r.answer, now_ms)
    if r.kind in ("register", "unregister"):
        registered = r.kind == "register"
        return [Alt("a checker registers (or unregisters) for the group at once", replace(world, checker=registered),
                    ok=check_rules.LEASE_MS_MAX if registered else None)]
    if r.kind == "settings":
        return [Alt("a group's check-back settings change at once", replace(world, check_max=r.check_max, keep=r.keep), ok={
            check_rules.CHECK_INTERVAL_MS: str(CHECK_INTERVAL_MS), check_rules.CHECK_MAX: str(r.check_max),
            check_rules.CHECK_EXHAUSTED: "keep" if r.keep else "abort", check_rules.CHECK_TIMEOUT_MS: "5000"})]
    txn = world.get(r.tid)
    if r.kind == "init":
        return step_init(world, r, txn)
    if txn is None or r.pid != txn.pid:
        return [refused(world, "a producer id that is not the id's is refused", {"INVALID_PRODUCER_ID_MAPPING"})]
    busy = {BUSY} if completing(txn) else set()
    if r.kind == "verify":
        if r.epoch == txn.epoch and txn.state is S.ONGOING and r.parts <= txn.parts:
            return [Alt("a partition of the open transaction verifies at its epoch", world, ok=None)]
        return [Alt("only a partition of the open transaction, at its epoch, verifies (never for an old epoch)", world, errors=ANY_ERROR)]
    if r.kind in ("end", "complete") and txn.decided is not None and txn.decided[0] == r.epoch:
        return retried_end(world, txn, r.committed, "EndTxn" if r.kind == "end" else "CompleteTransaction")
    if r.kind == "prepare" and txn.state is S.PREPARED and r.epoch == txn.epoch:
        return [Alt("a retried PrepareTransaction answers its handle", world, ok=Handle(r.tid, r.pid, r.epoch))]
    if r.epoch < txn.epoch:
        return [refused(world, f"a {r!r} with an old epoch never opens, joins, commits or aborts a later transaction", STALE | busy)]
    if r.epoch > txn.epoch:
        return [refused(world, "an epoch above the current one is refused", {"INVALID_PRODUCER_EPOCH"})]
    if busy:  # retried; or refused at once with what it would get once the completion is over
        later = {e for a in step(release(world), r, now_ms) if a.ok is NO_ANSWER and a.errors is not ANY_ERROR for e in a.errors}
        return [refused(world, "while the last transaction completes, the next request is retried (or refused as it would be after)", busy | later)]
    if r.kind in ("add", "offsets"):
        parts = r.parts if r.kind == "add" else frozenset({OFFSETS_PARTITION})
        if txn.state is S.PREPARED:
            return [refused(world, "a prepared transaction takes no more partitions", {"INVALID_TXN_STATE"})]
        if txn.state is S.ONGOING and parts <= txn.parts:
            return [Alt("adding partitions already in the transaction changes nothing", world, ok=None)]
        start = txn.start_ms if txn.state is S.ONGOING else now_ms
        grown = replace(txn, state=S.ONGOING, parts=txn.parts | parts, start_ms=start, decided=None)
        return [Alt("AddPartitions opens or grows the transaction at the current epoch", world.put(r.tid, grown), ok=None)]
    if r.kind == "prepare":
        start = txn.start_ms if txn.state is S.ONGOING else now_ms
        prepared = replace(txn, state=S.PREPARED, start_ms=start, prepared_ms=now_ms, decided=None, checks=0, last_check_ms=-1)
        return [Alt("PrepareTransaction makes the transaction Prepared and answers its handle", world.put(r.tid, prepared),
                    ok=Handle(r.tid, r.pid, r.epoch))]
    if r.kind == "complete":
        if txn.state is not S.PREPARED:
            return [refused(world, "CompleteTransaction needs a Prepared transaction", {"INVALID_TXN_STATE"})]
        decided, markers = decide(world, r.tid, txn, r.committed, txn.epoch + 1, r.epoch)
        return [Alt("CompleteTransaction decides with the epoch bumped and answers it", decided, ok=(txn.pid, txn.epoch + 1), markers=markers)]
    assert r.kind == "end", r
    if txn.state in (S.ONGOING, S.PREPARED):
        decided, markers = decide(world, r.tid, txn, r.committed, txn.epoch + 1, r.epoch)
        return [Alt("EndTxn bumps the epoch and answers the new one; markers carry it", decided, ok=(txn.pid, txn.epoch + 1), markers=markers)]
    if r.committed:
        return [refused(world, "EndTxn(commit) without an open transaction is refused", {"INVALID_TXN_STATE"})]
    decided, markers = decide(world, r.tid, txn, False, txn.epoch + 1, r.epoch)
    return [Alt("EndTxn(abort) of an empty transaction bumps the epoch too (TV2)", decided, ok=(txn.pid, txn.epoch + 1), markers=markers)]


def step_init(world: World, r: Req, txn: Txn | None) -> list[Alt]:
    if txn is None:
        if r.pid >= 0:
            return [refused(world, "KIP-360 InitProducerId for an unknown id is refused", {"INVALID_PRODUCER_ID_MAPPING", "PRODUCER_FENCED"})]
        created = Txn(FRESH, 0, NO_EPOCH, S.EMPTY)
        return [Alt("a new transactional id gets a new producer id at epoch 0", world.put(r.tid, created), ok=(FRESH, 0))]
    if r.pid >= 0 and not (r.pid == txn.pid and (r.epoch == txn.epoch or (r.epoch == txn.last != NO_EPOCH))):
        return [refused(world, "KIP-360 InitProducerId with a fenced epoch is refused",
                        {"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING"} | ({BUSY} if completing(txn) else set()))]
    if completing(txn):  # retried; or refused at once with what it would get once the completion is over
        later = {e for a in step_init(release(world), r, release(world).get(r.tid)) if a.ok is NO_ANSWER and a.errors is not ANY_ERROR
                 for e in a.errors}
        return [refused(world, "InitProducerId while the last transaction completes is retried (or refused as it would be after)", {BUSY} | later)]
    if txn.state in (S.ONGOING, S.PREPARED):
        fenced = fence(world, r.tid, txn, "InitProducerId while a transaction is open fences it: PrepareEpochFence bumps, the abort bumps "
                                          "again (markers carry epoch+2), answered CONCURRENT_TRANSACTIONS")
        if r.pid < 0:
            return [fenced]
        if r.epoch != txn.epoch:  # a late retry of an earlier bump: Kafka fences, refusing is as safe
            return [fenced, refused(world, "a late KIP-360 InitProducerId of the last epoch", STALE)]
        # The current producer asks: fencing it (Kafka) or aborting its transaction as its own EndTxn(abort) would.
        aborted, markers = decide(world, r.tid, txn, False, txn.epoch + 1, txn.epoch)
        return [fenced, Alt("KIP-360 InitProducerId of the current producer aborts its open transaction with an epoch bump, "
                            "answered CONCURRENT_TRANSACTIONS", aborted, errors=frozenset({BUSY}), markers=markers)]
    if r.pid < 0:
        bumped = replace(txn, epoch=txn.epoch + 1, last=NO_EPOCH, state=S.EMPTY, parts=frozenset(), decided=None, start_ms=-1, prepared_ms=-1)
        return [Alt("InitProducerId of a new producer bumps the epoch", world.put(r.tid, bumped), ok=(txn.pid, txn.epoch + 1))]
    if r.epoch == txn.epoch:
        bumped = replace(txn, epoch=txn.epoch + 1, last=txn.epoch, state=S.EMPTY, parts=frozenset(), decided=None, start_ms=-1, prepared_ms=-1)
        return [Alt("KIP-360 InitProducerId with the current epoch bumps it", world.put(r.tid, bumped), ok=(txn.pid, txn.epoch + 1))]
    retried = Alt("a retried KIP-360 InitProducerId whose answer was lost answers the current epoch again, with no second bump",
                  world, ok=(txn.pid, txn.epoch))
    if txn.state is S.EMPTY:  # the last epoch is the one that init bumped
        return [retried]
    # Complete*: the last epoch is the one an EndTxn (or an abort) bumped. Kafka answers the current
    # epoch; refusing is as safe (the producer should have retried its EndTxn).
    return [retried, refused(world, "a KIP-360 InitProducerId with the epoch an EndTxn bumped", STALE)]


def step_timeouts(world: World, now_ms: int) -> Alt:
    markers = ()
    for tid, txn in world.txns:
        expired = (txn.state is S.ONGOING and txn.start_ms + TXN_TIMEOUT_MS < now_ms) or (
            txn.state is S.PREPARED and txn.prepared_ms + PREPARED_TIMEOUT_MS < now_ms)
        if expired:
            world, asked = decide(world, tid, txn, False, txn.epoch + 1, txn.epoch)
            markers += asked
    return Alt("a transaction past its timeout is aborted with an epoch bump", world, ok=None, markers=markers)


def step_check(world: World, r: Req, now_ms: int) -> list[Alt]:
    """A checker's answer about the handle (tid, pid, epoch): COMMIT and ABORT are
    CompleteTransaction with that handle, refusals and repeats included; UNKNOWN
    about the prepared transaction counts one attempt, and the attempt reaching
    the group's maximum aborts under the abort policy; UNKNOWN about anything
    else (a late or duplicated answer, a fenced handle) changes nothing."""
    if r.answer != CheckAnswer.UNKNOWN.value:
        return step(world, replace(r, kind="complete", committed=r.answer == CheckAnswer.COMMIT.value), now_ms)
    txn = world.get(r.tid)
    if txn is None or txn.state is not S.PREPARED or (txn.pid, txn.epoch) != (r.pid, r.epoch):
        return [Alt("UNKNOWN about anything but the prepared transaction changes nothing", world, ok=None)]
    if txn.checks + 1 >= world.check_max and not world.keep:
        aborted, markers = decide(world, r.tid, txn, False, txn.epoch + 1, r.epoch)
        return [Alt("the UNKNOWN reaching the group's maximum aborts (abort policy), as CompleteTransaction(abort) would",
                    aborted, ok=(txn.pid, txn.epoch + 1), markers=markers)]
    counted = replace(txn, checks=txn.checks + 1, last_check_ms=now_ms)
    return [Alt("UNKNOWN about the prepared transaction counts one attempt (Prepared -> Prepared)", world.put(r.tid, counted), ok=None)]


def step_checks_due(world: World, answer: str, now_ms: int) -> list[Alt]:
    """A round of the check-back: every prepared transaction one interval (plus a
    jitter of up to a tenth) after its prepare or its last check is checked, if
    a checker is registered, and the answer applied (step_check); one whose
    checks are exhausted under the abort policy is aborted at once, checker or
    not. Where the jitter leaves it open whether a check is due, both worlds."""
    paths = [(world, (), ())]  # (world, markers, checked)
    for tid, txn in world.txns:
        if txn.state is not S.PREPARED:
            continue
        if txn.checks >= world.check_max:  # the maximum lowered (or the policy changed) since its last check
            if not world.keep:
                paths = [(w2, m + m2, c) for w, m, c in paths for w2, m2 in [decide(w, tid, txn, False, txn.epoch + 1, txn.epoch)]]
            continue
        due_from = (txn.last_check_ms if txn.checks else txn.prepared_ms) + CHECK_INTERVAL_MS
        if not world.checker or now_ms < due_from:
            continue
        asked = (tid, txn.pid, txn.epoch, txn.checks + 1, txn.prepared_ms)
        checked = [(a.world, m + a.markers, c + (asked,)) for w, m, c in paths
                   for a in step_check(w, check(Handle(tid, txn.pid, txn.epoch), answer), now_ms)]
        maybe = now_ms < due_from + CHECK_INTERVAL_MS // check_rules.JITTER_FRACTION
        paths = checked + (paths if maybe else [])
    return [Alt("the prepared transactions due a check are checked, each once, at their next attempt", w, ok=None, markers=m, checked=c)
            for w, m, c in paths]


def step_group(world: World, r: Req) -> list[Alt]:
    members = [(h, world.get(h.transactional_id)) for h in r.handles]
    done = [t is not None and t.pid == h.producer_id and t.decided == (h.producer_epoch, True) for h, t in members]
    if all(done):
        return [Alt("a repeated group commit answers OK, also while its members' CompleteCommit records are being written", world, ok=None)]
    errors = {"INVALID_TXN_STATE"} if any(done) else set()
    for (h, t), was_done in zip(members, done, strict=True):
        if was_done:
            continue
        if t is None or t.pid != h.producer_id:
            errors.add("INVALID_PRODUCER_ID_MAPPING")
        elif t.decided is not None and t.decided[0] == h.producer_epoch:
            errors |= {"PRODUCER_FENCED", "INVALID_TXN_STATE"}  # aborted: it cannot commit
        elif h.producer_epoch < t.epoch:
            errors |= STALE | ({BUSY} if completing(t) else set())
        elif h.producer_epoch > t.epoch:
            errors.add("INVALID_PRODUCER_EPOCH")
        elif completing(t):
            errors.add(BUSY)
        elif t.state is not S.PREPARED:
            errors.add("INVALID_TXN_STATE")
    if errors:
        return [refused(world, "a group commits only if every member is Prepared with its handle's epoch; otherwise nothing is decided", errors)]
    markers = ()
    for h, t in members:
        world, asked = decide(world, h.transactional_id, t, True, t.epoch + 1, h.producer_epoch)
        markers += asked
    return [Alt("a group commit decides every member with its epoch bumped", world, ok=None, markers=markers)]


# --- checking the coordinator against the rules -----------------------------------------------

class RuleViolation(AssertionError):
    pass


class Checker:
    """Keeps the model's possible worlds and what was seen of the log and the
    markers; ``check`` runs every guarantee after a step."""

    def __init__(self, harness: Harness):
        self.h = harness
        self.worlds: set[World] = {World()}
        self.seen_entries = 0
        self.seen_markers = 0
        self.seen_seals = 0
        self.fenced_upto: dict[str, int] = {}  # every epoch <= this belongs to a fenced producer

    # the state machine's holds, in the model too
    def hold(self, markers: bool = False, complete_of: str | None = None) -> None:
        if markers:
            self.h.markers.held = True
            self.worlds = {replace(w, markers_held=True) for w in self.worlds}
        if complete_of is not None:
            self.h.log.held.add(complete_of)
            self.worlds = {replace(w, held_complete=w.held_complete | {complete_of}) for w in self.worlds}

    def release(self) -> None:
        self._markers_before = len(self.h.markers.asked)
        self.h.do(self.h.release)
        self.worlds = {release(w) for w in self.worlds}
        self.check([], [])

    def send(self, r: Req) -> Outcome:
        release_first = r.kind in ("add", "offsets") and self.h.holding
        if release_first:  # an AddPartitions waits for its id's completion: it is released meanwhile
            self.worlds = {release(w) for w in self.worlds}
        self._markers_before = len(self.h.markers.asked)
        self._checked_before = len(self.h.checker.asked)
        before = self._fencing([r])
        outcome = self.h.send(r, release_first=release_first)
        self.check([r], [outcome], before)
        return outcome

    def send_together(self, requests: list[Req]) -> list[Outcome]:
        assert not self.h.holding
        self._markers_before = len(self.h.markers.asked)
        self._checked_before = len(self.h.checker.asked)
        before = self._fencing(requests)
        outcomes = self.h.send_together(requests)
        self.check(requests, outcomes, before, together=True)
        return outcomes

    def _fencing(self, requests):
        """Ids whose open transaction a new producer's InitProducerId is about to fence."""
        fencing = {}
        for r in requests:
            meta = self.h.meta(r.tid) if r.kind == "init" and r.pid < 0 else None
            if meta is not None and meta.state in (S.ONGOING, S.PREPARED) and meta.pending_state is None and len(requests) == 1:
                fencing[r.tid] = meta.producer_epoch
        return fencing

    def check(self, requests, outcomes, fencing=None, together=False) -> None:
        for o in outcomes:
            if o[0] == "bug":
                raise RuleViolation(f"the coordinator hit a transition its own table lacks: {o[1]} (requests {requests})")
        if self.h.log.broken:
            raise RuleViolation(f"a completion failed and broke the log: {self.h.log.broken}")
        self._check_zombie_answers(requests, outcomes)
        for tid, epoch in (fencing or {}).items():
            self.fenced_upto[tid] = max(self.fenced_upto.get(tid, -1), epoch)
        for r, o in zip(requests, outcomes, strict=True):
            if r.kind == "init" and r.pid < 0 and o[0] == "ok":
                self.fenced_upto[r.tid] = max(self.fenced_upto.get(r.tid, -1), o[1][1] - 1)
        self._check_log()
        self._check_markers()
        self._check_zombies_stay_fenced()
        self._check_bumped_answers(requests, outcomes)
        self._check_due_times()
        self._check_model(requests, outcomes, together)

    def _check_due_times(self) -> None:
        """The partition's indexes of due times hold every id at the time the rules
        give its state (state_manager.timeout_due_ms, idle_since_ms,
        check_rules.check_due_ms), whatever transitions and passes came between:
        a timer or check-back pass looks only at what they hold, so an id missing
        or late there would be aborted, checked or expired late, or never. A check
        that came due while its group had no checker waits in ``unchecked``."""
        loaded, check_back = self.h.loaded, self.h.coordinator.check_back
        for name, index in (("timeouts", loaded.timeouts), ("idle", loaded.idle), ("checks", loaded.checks)):
            strays = sorted(set(index.ids()) - set(loaded.transactions))
            if strays:
                raise RuleViolation(f"the {name} index holds ids the partition does not: {strays}")
        for tid, meta in loaded.transactions.items():
            config = loaded.group_configs.get(GROUP, check_rules.DEFAULT_CONFIG)
            wanted = {"timeouts": timeout_due_ms(meta), "idle": idle_since_ms(meta), "checks": check_rules.check_due_ms(meta, config)}
            held = {"timeouts": loaded.timeouts.get(tid), "idle": loaded.idle.get(tid), "checks": loaded.checks.get(tid)}
            waiting = tid in loaded.unchecked.get(GROUP, ())
            if waiting and wanted["checks"] is not None and wanted["checks"] <= self.h.now_ms and not check_back.registrations.live(GROUP, self.h.now_ms / 1000):
                held["checks"] = wanted["checks"]  # due while no checker is registered: waits for one, unscheduled
            elif waiting != (meta.state is S.PREPARED and wanted["checks"] is None):
                raise RuleViolation(f"{tid} ({meta.state.value}, checks {meta.checks_done}) is {'' if waiting else 'not '}among the unchecked")
            if held != wanted:
                raise RuleViolation(f"{tid} ({meta.state.value}, pending {meta.pending_state}): the indexes hold {held}, its state says {wanted}")
        open_ids = {tid for tid, meta in loaded.transactions.items() if meta.state in OPEN_TRANSACTION_STATES}
        if loaded.open_ids != open_ids:  # what the metrics' open-transaction gauges read
            raise RuleViolation(f"open ids {sorted(loaded.open_ids)}, the states say {sorted(open_ids)}")

    def _check_zombie_answers(self, requests, outcomes) -> None:
        for r, o in zip(requests, outcomes, strict=True):
            if r.kind == "check" and o == ("ok", None):
                continue  # an UNKNOWN answered about a fenced handle is no request of the zombie's: nothing is done
            epochs = [(h.transactional_id, h.producer_epoch) for h in r.handles] if r.kind == "group" else [(r.tid, r.epoch)]
            for tid, epoch in epochs:
                if 0 <= epoch <= self.fenced_upto.get(tid, -1) and o[0] == "ok":
                    raise RuleViolation(f"a fenced producer's request {r!r} was answered OK ({o[1]!r}); epochs <= "
                                        f"{self.fenced_upto[tid]} of {tid} are fenced")

    def _check_log(self) -> None:
        records = self.h.log.records()
        by_tid: dict[str, list[TransactionRecord]] = {}
        decided_at: dict[str, int] = {}  # an id's last record's index in the log
        for index, record in records:
            history = by_tid.setdefault(record.transactional_id, [])
            if index >= self.seen_entries:
                previous = history[-1] if history else None
                if not tv2_allows(previous.state if previous else None, record.state):
                    raise RuleViolation(f"{record.transactional_id}: the log records {previous.state.value if previous else 'nothing'} -> "
                                        f"{record.state.value}, not an edge of the TV2 table (log: {[r.state.value for r in history + [record]]})")
                if previous is not None and record.producer_id != previous.producer_id:
                    raise RuleViolation(f"{record.transactional_id}: two producer ids in the log ({previous.producer_id}, then {record.producer_id}): "
                                        f"an orphaned InitProducerId record (log: {[(r.state.value, r.producer_id, r.producer_epoch) for r in history + [record]]})")
                if record.state is S.ONGOING and previous.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                    self._check_carried_completion(previous, decided_at[record.transactional_id], record, index)
                if record.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT) and record.producer_epoch <= previous.producer_epoch:
                    raise RuleViolation(f"{record.transactional_id}: {record.state.value} at epoch {record.producer_epoch} does not bump "
                                        f"the epoch {previous.producer_epoch} of {previous.state.value}")
            history.append(record)
            decided_at[record.transactional_id] = index
        self.seen_entries = len(self.h.log.entries)
        for tid in TIDS:
            meta, logged = self.h.meta(tid), by_tid.get(tid)
            if meta is None:
                continue
            if not logged:
                raise RuleViolation(f"{tid}: in memory as {meta.state.value} with nothing in the log (write, then apply)")
            last = logged[-1]
            if (meta.state, meta.producer_id, meta.producer_epoch, meta.partitions, meta.checks_done, meta.last_check_ms) != (
                    last.state, last.producer_id, last.producer_epoch, last.partitions, last.checks_done, last.last_check_ms):
                raise RuleViolation(f"{tid}: memory ({meta.state.value}, {meta.producer_id}/{meta.producer_epoch}) differs from the last "
                                    f"durable record ({last.state.value}, {last.producer_id}/{last.producer_epoch}): write, then apply")

    def _check_carried_completion(self, decision: TransactionRecord, decision_index: int, record: TransactionRecord, index: int) -> None:
        """Ongoing straight after Prepare*: every marker of that decision (its
        partitions, at ts.marker_producer's id and epoch) was asked for after the
        decision was durable and acknowledged before this record's write began."""
        committed = decision.state is S.PREPARE_COMMIT
        producer = ts.marker_producer(decision)
        acknowledged = [m for m, begun in self.h.markers.acknowledged
                        if m.transactional_id == decision.transactional_id and m.committed == committed and m.partitions == decision.partitions
                        and (m.producer_id, m.producer_epoch) == producer and decision_index < m.durable_entries
                        and begun <= self.h.log.began[index]]
        if not acknowledged:
            raise RuleViolation(f"{record.transactional_id}: Ongoing at epoch {record.producer_epoch} written straight after "
                                f"{decision.state.value} without that decision's markers acknowledged first")

    def _check_markers(self) -> None:
        records = self.h.log.records()
        for marker in self.h.markers.asked[self.seen_markers:]:
            if not marker.partitions:
                continue
            durable = [rec for i, rec in records if i < marker.durable_entries and rec.transactional_id == marker.transactional_id]
            wanted = S.PREPARE_COMMIT if marker.committed else S.PREPARE_ABORT
            decision = durable[-1] if durable else None
            if decision is None or (decision.state, decision.producer_epoch, decision.partitions) != (wanted, marker.producer_epoch, marker.partitions):
                raise RuleViolation(f"marker {marker} asked for before a durable {wanted.value} with its epoch and partitions "
                                    f"(last durable record: {decision})")
            data = [rec for rec in durable if rec.state in (S.ONGOING, S.PREPARED)]
            if not data or marker.producer_epoch <= data[-1].producer_epoch:
                raise RuleViolation(f"marker epoch {marker.producer_epoch} of {marker.transactional_id} is not above the epoch "
                                    f"{data[-1].producer_epoch if data else '?'} its data was written with")
        self.seen_markers = len(self.h.markers.asked)
        for seal in self.h.markers.seals[self.seen_seals:]:  # PrepareTransaction's seals: the prepared transaction's own epoch
            durable = [rec for i, rec in records if i < seal.durable_entries and rec.transactional_id == seal.transactional_id]
            if not durable or (durable[-1].state, durable[-1].producer_epoch, durable[-1].partitions) != (S.PREPARED, seal.producer_epoch, seal.partitions):
                raise RuleViolation(f"seal {seal} asked for without a durable Prepared record at its epoch (last: {durable[-1] if durable else None})")
        self.seen_seals = len(self.h.markers.seals)

    def _check_zombies_stay_fenced(self) -> None:
        for tid, fenced in self.fenced_upto.items():
            meta = self.h.meta(tid)
            if meta is None:
                continue
            if meta.producer_epoch <= fenced:
                raise RuleViolation(f"{tid}: the fenced epoch {fenced} is still current ({meta.producer_epoch})")
            if 0 <= meta.last_producer_epoch <= fenced:
                raise RuleViolation(f"{tid}: a fenced epoch is the 'last' epoch ({meta.last_producer_epoch}, fenced up to {fenced}): "
                                    f"PrepareEpochFence must bump, and the abort bump again")

    @staticmethod
    def _check_bumped_answers(requests, outcomes) -> None:
        for r, o in zip(requests, outcomes, strict=True):
            decision = r.kind in ("end", "complete") or (r.kind == "check" and isinstance(o[1], tuple))
            if decision and o[0] == "ok" and o[1][1] <= r.epoch:
                raise RuleViolation(f"{r!r} was answered epoch {o[1][1]}: every EndTxn (and a decision by a check) bumps the epoch and answers the new one")

    def _real_state(self):
        out = []
        for tid in TIDS:
            meta = self.h.meta(tid)
            checks = (meta.checks_done, meta.last_check_ms) if meta is not None and meta.state is S.PREPARED else (0, -1)
            out.append((tid, None if meta is None else (meta.producer_id, meta.producer_epoch, meta.state, meta.partitions, *checks)))
        return tuple(out)

    @staticmethod
    def _model_state(world: World):
        def of(t: Txn):
            checks = (t.checks, t.last_check_ms) if t.state is S.PREPARED else (0, -1)
            return (t.pid, t.epoch, t.state, t.parts, *checks)
        return tuple((tid, None if (t := world.get(tid)) is None else of(t)) for tid in TIDS)

    def _check_model(self, requests, outcomes, together) -> None:
        if not requests:  # a release: the worlds moved already
            candidates = [(w, (), ()) for w in self.worlds]
        else:
            candidates = []
            for world in self.worlds:
                orders = itertools.permutations(range(len(requests))) if together else [range(len(requests))]
                for order in orders:
                    paths = [(world, (), ())]  # (world, markers, checks asked)
                    for i in order:
                        nxt = []
                        for w, markers, checked in paths:
                            nxt += [(alt.resolve(outcomes[i]), markers + alt.markers, checked + alt.checked)
                                    for alt in step(w, requests[i], self.h.now_ms) if alt.matches(outcomes[i])]
                            if together and outcomes[i] == ("err", BUSY):
                                nxt.append((w, markers, checked))  # retried later, no effect
                            if together and requests[i].kind == "check" and outcomes[i] == ("ok", None):
                                nxt.append((w, markers, checked))  # the other request's transition was in flight: no longer counts
                        paths = nxt
                    candidates += paths
            if not candidates:
                world = next(iter(self.worlds))
                expected = "; ".join(f"{r!r}: " + " | ".join(f"{a.expected()} ({a.why})" for a in step(world, r, self.h.now_ms))
                                     for r in requests)
                answered = ", ".join(f"{r!r} -> {o[0]} {o[1]!r}" for r, o in zip(requests, outcomes, strict=True))
                raise RuleViolation(f"answered {answered}; the TV2 rules allow {expected}")
        asked = sorted((m.transactional_id, m.producer_id, m.producer_epoch, m.committed, m.partitions)
                       for m in self.h.markers.asked[self._markers_before:] if m.partitions) if requests else []
        with_markers = [(w, checked) for w, markers, checked in candidates if not requests or sorted(markers) == asked]
        if not with_markers:
            raise RuleViolation(f"{requests}: markers asked {asked}, the rules expect one of {[sorted(m) for _, m, _ in candidates]}")
        checks = sorted((q.transactional_id, q.producer_id, q.producer_epoch, q.attempt, q.prepared_time_ms)
                        for q in self.h.checker.asked[self._checked_before:]) if requests else []
        with_checks = [w for w, checked in with_markers if not requests or sorted(checked) == checks]
        if not with_checks:
            raise RuleViolation(f"{requests}: the checker was asked about {checks} (id, producer, epoch, attempt, prepared ms); "
                                f"the rules expect one of {sorted({tuple(sorted(c)) for _, c in with_markers})}")
        for q in self.h.checker.asked[self._checked_before:]:
            if (q.group_id, q.prepare_metadata) != (GROUP, b""):
                raise RuleViolation(f"a check named group {q.group_id!r} and metadata {q.prepare_metadata!r}, not its own")
        real = self._real_state()
        survivors = {w for w in with_checks if self._model_state(w) == real}
        if not survivors:
            raise RuleViolation(f"after {requests} answered {outcomes}: the coordinator holds {real}; the TV2 rules expect one of "
                                f"{sorted({self._model_state(w) for w in with_checks}, key=repr)}")
        self.worlds = survivors

    _markers_before = 0  # where this step's markers begin in the recorder
    _checked_before = 0  # and its checks in the scripted checker's


# --- the state machine -------------------------------------------------------------------------

class Clients(RuleBasedStateMachine):
    """What the producers (and checkers) of a state machine know: the live producer
    of each id, the zombies, the requests sent and the handles prepared. No rules."""

    def __init__(self):
        super().__init__()
        self.h = Harness()
        self.checker = Checker(self.h)
        self.clients: dict[str, tuple[int, int]] = {}  # the live producer of each id: (pid, epoch) as it knows them
        self.zombies: list[tuple[str, int, int]] = []  # producers replaced, fenced or aborted under
        self.history: list[Req] = []
        self.handles: list[Handle] = []

    def teardown(self):
        self.h.close()

    def _send(self, r: Req, lose_answer: bool = False, replayed: bool = False) -> Outcome:
        """Sends ``r``; unless it is a replay, its producer learns the answer (unless lost)."""
        outcome = self.checker.send(r)
        if not replayed:
            self._remember(r)
            self._learn(r, outcome, lose_answer)
        return outcome

    def _remember(self, r: Req) -> None:
        if r.kind not in ("timeouts", "checks_due", "settings", "register", "unregister"):  # requests of an id, to replay
            self.history = (self.history + [r])[-40:]

    def _learn(self, r: Req, outcome: Outcome, lose_answer: bool) -> None:
        if r.kind == "check":
            return  # the checker's, not the producer's: a producer whose transaction a check decided learns it when fenced
        if r.kind == "prepare" and outcome[0] == "ok":
            self.handles = (self.handles + [outcome[1]])[-10:]
        current = self.clients.get(r.tid)
        is_current = current == (r.pid, r.epoch)
        if outcome[0] == "err" and outcome[1] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH") and is_current:
            self._retire(r.tid)  # fatal for that producer: a new one takes over the id
        if lose_answer or outcome[0] != "ok":
            return
        if r.kind == "init" and (r.pid < 0 or is_current):
            if r.pid < 0:
                self._retire(r.tid)
            self.clients[r.tid] = outcome[1]
        elif r.kind in ("end", "complete") and is_current:
            self.clients[r.tid] = outcome[1]

    def _retire(self, tid: str) -> None:
        old = self.clients.pop(tid, None)
        if old is not None:
            self.zombies = (self.zombies + [(tid, *old)])[-10:]

    def _client(self, data) -> tuple[str, int, int]:
        tid = data.draw(st.sampled_from(sorted(self.clients)), label="transactional id")
        return (tid, *self.clients[tid])

    def _handle(self, data) -> Handle:
        """A handle some prepare answered (the latest, or an old one: late and duplicated requests) or a live producer's."""
        current = [Handle(tid, pid, epoch) for tid, (pid, epoch) in sorted(self.clients.items())]
        return data.draw(st.sampled_from(self.handles[::-1] + current), label="handle")


class CoordinatorMachine(Clients):
    """Producers, zombies, late and duplicated requests, timeouts, group commits and
    check-back answers against the real coordinator, checked against the model
    after every step."""

    def _fresh(self, tid) -> list[Req]:
        pid, epoch = self.clients[tid]
        return [end(tid, pid, epoch, True), end(tid, pid, epoch, False), add(tid, pid, epoch), init(tid),
                init(tid, pid, epoch), prepare(tid, pid, epoch), Req("verify", tid, pid, epoch, parts=frozenset(TOPIC_PARTITIONS[:1])),
                complete(Handle(tid, pid, epoch), True), check(Handle(tid, pid, epoch), "UNKNOWN"), check(Handle(tid, pid, epoch), "COMMIT")]

    # producers
    @rule(tid=st.sampled_from(TIDS), lose_answer=st.booleans())
    def init_producer(self, tid, lose_answer):
        """A new producer for the id (a zombie of the previous one remains)."""
        self._send(init(tid), lose_answer)

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), lose_answer=st.booleans())
    def bump_epoch_kip360(self, data, lose_answer):
        tid, pid, epoch = self._client(data)
        self._send(init(tid, pid, epoch), lose_answer)

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), parts=st.sets(st.sampled_from(TOPIC_PARTITIONS + (OFFSETS_PARTITION,)), min_size=1))
    def add_partitions(self, data, parts):
        tid, pid, epoch = self._client(data)
        if OFFSETS_PARTITION in parts:
            self._send(Req("offsets", tid, pid, epoch))
            parts = parts - {OFFSETS_PARTITION}
        if parts and tid in self.clients:
            self._send(add(tid, *self.clients[tid], *sorted(parts)))

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), finish=st.sampled_from(["commit", "abort", "prepare"]), lose_answer=st.booleans())
    def transaction(self, data, finish, lose_answer):
        """A whole transaction of the live producer: add, then commit, abort or prepare."""
        tid, pid, epoch = self._client(data)
        self._send(add(tid, pid, epoch))
        if tid in self.clients:
            pid, epoch = self.clients[tid]
            self._send(prepare(tid, pid, epoch) if finish == "prepare" else end(tid, pid, epoch, finish == "commit"), lose_answer)

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), committed=st.booleans(), lose_answer=st.booleans())
    def end_txn(self, data, committed, lose_answer):
        tid, pid, epoch = self._client(data)
        self._send(end(tid, pid, epoch, committed), lose_answer)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def prepare_txn(self, data):
        tid, pid, epoch = self._client(data)
        self._send(prepare(tid, pid, epoch))

    @precondition(lambda self: self.handles or self.clients)
    @rule(data=st.data(), committed=st.booleans())
    def complete_by_handle(self, data, committed):
        self._send(complete(self._handle(data), committed))

    @precondition(lambda self: self.handles or self.clients)
    @rule(data=st.data(), answer=st.sampled_from(ANSWERS))
    def check_answered(self, data, answer):
        """A checker's answer about a handle (rounds of the check-back, the group's
        settings and its registrations: test_check_back_model.py)."""
        self._send(check(self._handle(data), answer))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def commit_group(self, data):
        choices = {}
        for h in self.handles[::-1]:
            choices.setdefault(h.transactional_id, []).append(h)
        members = data.draw(st.lists(st.sampled_from(sorted(choices)), min_size=1, max_size=2, unique=True), label="members")
        handles = [data.draw(st.sampled_from(choices[tid]), label=f"handle of {tid}") for tid in members]
        self._send(group(*handles))

    # late, duplicated, reordered requests and zombies
    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def replay_earlier_request(self, data):
        r = data.draw(st.sampled_from(self.history[::-1]), label="replayed")
        self._send(r, replayed=True)

    @precondition(lambda self: self.zombies)
    @rule(data=st.data(), kind=st.sampled_from(["end-commit", "end-abort", "add", "prepare", "kip360", "verify", "complete",
                                                 "check-commit", "check-unknown"]))
    def zombie_request(self, data, kind):
        tid, pid, epoch = data.draw(st.sampled_from(self.zombies[::-1]), label="zombie")
        r = {
            "end-commit": end(tid, pid, epoch, True), "end-abort": end(tid, pid, epoch, False), "add": add(tid, pid, epoch),
            "prepare": prepare(tid, pid, epoch), "kip360": init(tid, pid, epoch),
            "verify": Req("verify", tid, pid, epoch, parts=frozenset(TOPIC_PARTITIONS[:1])),
            "complete": complete(Handle(tid, pid, epoch), False),
            "check-commit": check(Handle(tid, pid, epoch), "COMMIT"), "check-unknown": check(Handle(tid, pid, epoch), "UNKNOWN"),
        }[kind]
        self._send(r, replayed=True)

    # concurrency
    @precondition(lambda self: not self.h.holding and (self.clients or self.history))
    @rule(data=st.data())
    def two_requests_at_once(self, data):
        candidates = [r for tid in sorted(self.clients) for r in self._fresh(tid)] + self.history[::-1]
        first = data.draw(st.sampled_from(candidates), label="first")
        second = data.draw(st.sampled_from(candidates), label="second")
        outcomes = self.checker.send_together([first, second])
        for r, o in zip((first, second), outcomes, strict=True):
            self._remember(r)
            if r.kind == "init" and r.pid < 0 and o[0] == "ok" and o[1][1] > self.clients.get(r.tid, (0, -1))[1]:
                self._learn(r, o, False)

    @precondition(lambda self: not self.h.holding)
    @rule(tid=st.sampled_from(TIDS))
    def two_inits_at_once(self, tid):
        outcomes = self.checker.send_together([init(tid), init(tid)])
        for o in sorted((o for o in outcomes if o[0] == "ok"), key=lambda o: o[1][1]):
            self._learn(init(tid), o, False)

    # time and completions
    @rule(ms=st.sampled_from([400, 1_100, 3_500]))
    def time_passes(self, ms):
        self.h.tick(ms)
        self._send(Req("timeouts"))

    @rule(what=st.sampled_from(["markers"] + [f"complete record of {tid}" for tid in TIDS]))
    def hold(self, what):
        """Holds the acknowledgement of markers, or the Complete* record of one id, so completing is observable."""
        if what == "markers":
            self.checker.hold(markers=True)
        else:
            self.checker.hold(complete_of=what.rsplit(" ", 1)[1])

    @precondition(lambda self: self.h.holding)
    @rule()
    def release_completions(self):
        self.checker.release()


MODEL_SETTINGS = settings(
    max_examples=200, stateful_step_count=40, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def test_the_coordinator_follows_the_tv2_model_under_retries_replays_zombies_and_concurrency():
    run_state_machine_as_test(CoordinatorMachine, settings=MODEL_SETTINGS)


# --- examples: each rule, stated plainly -------------------------------------------------------

@pytest.fixture
def checked():
    """A coordinator with its checker (every guarantee checked after each request)."""
    harness = Harness()
    yield Checker(harness)
    harness.close()


def ok(checker: Checker, r: Req):
    outcome = checker.send(r)
    assert outcome[0] == "ok", f"{r!r} -> {outcome}"
    return outcome[1]


def refused_with(checker: Checker, r: Req) -> str:
    outcome = checker.send(r)
    assert outcome[0] == "err", f"{r!r} was answered {outcome}, expected a refusal"
    return outcome[1]


def test_the_coordinators_table_of_previous_states_is_the_tv2_table():
    for state, previous in TV2_VALID_PREVIOUS_STATES.items():
        assert VALID_PREVIOUS_STATES[state] == previous, (
            f"{state.value}: the coordinator allows {sorted(s.value for s in VALID_PREVIOUS_STATES[state])}, "
            f"TV2 needs {sorted(s.value for s in previous)}")


def test_every_end_txn_bumps_the_epoch_and_its_markers_carry_it(checked):
    pid, epoch = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, epoch, *TOPIC_PARTITIONS))
    assert ok(checked, end("g/a", pid, epoch, True)) == (pid, epoch + 1)
    ok(checked, add("g/a", pid, epoch + 1))
    assert ok(checked, end("g/a", pid, epoch + 1, False)) == (pid, epoch + 2)
    asked = [(m.producer_epoch, m.committed) for m in checked.h.markers.asked if m.partitions]
    assert asked == [(epoch + 1, True), (epoch + 2, False)]  # each above the epoch its data was written with


def test_aborting_an_empty_transaction_bumps_the_epoch(checked):
    pid, epoch = ok(checked, init("g/a"))
    assert ok(checked, end("g/a", pid, epoch, False)) == (pid, epoch + 1)  # Empty
    ok(checked, add("g/a", pid, epoch + 1))
    ok(checked, end("g/a", pid, epoch + 1, True))
    assert ok(checked, end("g/a", pid, epoch + 2, False)) == (pid, epoch + 3)  # CompleteCommit
    states = [r.state for _, r in checked.h.log.records()]
    assert states[-2:] == [S.PREPARE_ABORT, S.COMPLETE_ABORT]


def test_a_timed_out_transaction_is_aborted_with_an_epoch_bump_and_cannot_commit(checked):
    pid, epoch = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, epoch))
    checked.h.tick(TXN_TIMEOUT_MS + 1)
    ok(checked, Req("timeouts"))
    meta = checked.h.meta("g/a")
    assert (meta.state, meta.producer_epoch) == (S.COMPLETE_ABORT, epoch + 1)
    assert [m.producer_epoch for m in checked.h.markers.asked if m.partitions] == [epoch + 1]
    assert refused_with(checked, end("g/a", pid, epoch, True)) in {"PRODUCER_FENCED", "INVALID_TXN_STATE"}
    assert refused_with(checked, add("g/a", pid, epoch)) in STALE


def test_a_fenced_zombie_epoch_is_neither_current_nor_last(checked):
    pid, zombie = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, zombie))
    assert refused_with(checked, init("g/a")) == BUSY  # the new producer fences the open transaction
    meta = checked.h.meta("g/a")
    assert meta.producer_epoch == zombie + 2 and meta.last_producer_epoch == zombie + 1
    assert [m.producer_epoch for m in checked.h.markers.asked if m.partitions] == [zombie + 2]


def test_every_request_of_a_fenced_zombie_is_refused(checked):
    pid, zombie = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, zombie))
    refused_with(checked, init("g/a"))
    for r in (end("g/a", pid, zombie, False), end("g/a", pid, zombie, True), add("g/a", pid, zombie),
              prepare("g/a", pid, zombie), init("g/a", pid, zombie)):
        assert refused_with(checked, r) in STALE, r
    assert ok(checked, init("g/a")) == (pid, zombie + 3)


def test_a_fenced_prepared_transaction_is_aborted_and_its_handle_refused(checked):
    pid, epoch = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, epoch))
    handle = ok(checked, prepare("g/a", pid, epoch))
    assert refused_with(checked, init("g/a")) == BUSY
    assert checked.h.meta("g/a").state is S.COMPLETE_ABORT
    assert refused_with(checked, complete(handle, True)) in STALE
    assert refused_with(checked, complete(handle, False)) in STALE


def test_a_retried_kip360_init_answers_the_same_epoch_without_a_second_bump(checked):
    pid, epoch = ok(checked, init("g/a"))
    assert ok(checked, init("g/a", pid, epoch)) == (pid, epoch + 1)  # the answer is lost...
    assert ok(checked, init("g/a", pid, epoch)) == (pid, epoch + 1)  # ...so the producer asks again
    assert checked.h.meta("g/a").producer_epoch == epoch + 1


def test_a_retried_end_txn_answers_the_same_outcome_and_epoch(checked):
    pid, epoch = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, epoch))
    checked.hold(markers=True)  # the retry comes while the markers are being written...
    assert ok(checked, end("g/a", pid, epoch, True)) == (pid, epoch + 1)
    outcome = checked.send(end("g/a", pid, epoch, True))
    assert outcome in (("ok", (pid, epoch + 1)), ("err", BUSY))
    checked.release()
    assert ok(checked, end("g/a", pid, epoch, True)) == (pid, epoch + 1)  # ...and after
    assert checked.h.meta("g/a").producer_epoch == epoch + 1


def test_a_retried_commit_of_an_aborted_transaction_is_refused(checked):
    pid, epoch = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, epoch))
    ok(checked, end("g/a", pid, epoch, False))
    assert refused_with(checked, end("g/a", pid, epoch, True)) in {"PRODUCER_FENCED", "INVALID_TXN_STATE"}
    assert checked.h.meta("g/a").state is S.COMPLETE_ABORT


def test_late_requests_of_an_old_epoch_never_touch_the_next_transaction(checked):
    pid, epoch = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, epoch))
    ok(checked, end("g/a", pid, epoch, True))
    ok(checked, add("g/a", pid, epoch + 1, TOPIC_PARTITIONS[1]))  # transaction N+1
    for late in (end("g/a", pid, epoch, True), end("g/a", pid, epoch, False), add("g/a", pid, epoch, TOPIC_PARTITIONS[0]),
                 prepare("g/a", pid, epoch), Req("verify", "g/a", pid, epoch, parts=frozenset({TOPIC_PARTITIONS[1]}))):
        refused_with(checked, late)
    meta = checked.h.meta("g/a")
    assert (meta.state, meta.producer_epoch, meta.partitions) == (S.ONGOING, epoch + 1, frozenset({TOPIC_PARTITIONS[1]}))



def states_logged(harness: Harness, tid: str) -> list[S]:
    return [r.state for _, r in harness.log.records() if r.transactional_id == tid]


def committed_with_markers_held(checked) -> tuple[int, int]:
    """g/a's transaction committed (PrepareCommit durable), its markers held: (producer id, the epoch it ended with)."""
    pid, epoch = ok(checked, init("g/a"))
    ok(checked, add("g/a", pid, epoch))
    checked.hold(markers=True)
    assert ok(checked, end("g/a", pid, epoch, True)) == (pid, epoch + 1)
    return pid, epoch


def test_an_add_of_the_next_transaction_while_the_markers_are_written_is_carried_by_one_record(checked):
    pid, epoch = committed_with_markers_held(checked)
    ok(checked, add("g/a", pid, epoch + 1, TOPIC_PARTITIONS[1]))  # released while it waits
    assert states_logged(checked.h, "g/a")[-3:] == [S.ONGOING, S.PREPARE_COMMIT, S.ONGOING]  # no CompleteCommit between
    meta = checked.h.meta("g/a")
    assert (meta.state, meta.producer_epoch, meta.partitions) == (S.ONGOING, epoch + 1, frozenset({TOPIC_PARTITIONS[1]}))


def test_an_add_that_outwaits_the_markers_leaves_and_the_completion_is_written_alone(checked, monkeypatch):
    monkeypatch.setattr(coordinator_module, "ADD_WAIT_S_MAX", 0.01)
    h = checked.h
    pid, epoch = committed_with_markers_held(checked)
    assert h.loop.run_until_complete(h.call(add("g/a", pid, epoch + 1))) == ("err", BUSY)  # the markers are held past its wait
    checked.release()
    assert states_logged(h, "g/a")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
    ok(checked, add("g/a", pid, epoch + 1))  # the retry opens the next transaction with a record of its own
    assert states_logged(h, "g/a")[-3:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT, S.ONGOING]


def test_an_add_taken_with_the_completion_is_answered_once_its_record_is_written_however_long_that_takes(checked, monkeypatch):
    monkeypatch.setattr(coordinator_module, "ADD_WAIT_S_MAX", 0.01)
    h = checked.h
    pid, epoch = committed_with_markers_held(checked)
    h.log.held.add("g/a")  # the record that will carry the completion waits

    async def go():
        adding = asyncio.ensure_future(h.call(add("g/a", pid, epoch + 1)))
        for _ in range(5):
            await asyncio.sleep(0)
        h.markers.release()  # the add is taken with the completion; its record is held
        await asyncio.sleep(0.05)  # asyncio fires timers in order: the add's 0.01 s wait has run out by now
        for _ in range(5):
            await asyncio.sleep(0)
        assert not adding.done() and h.log.waiting == 1
        h.log.release()
        return await adding

    assert h.loop.run_until_complete(go())[0] == "ok"
    assert states_logged(h, "g/a")[-2:] == [S.PREPARE_COMMIT, S.ONGOING]
    assert h.meta("g/a").state is S.ONGOING

def test_two_concurrent_inits_of_a_new_id_log_one_producer_id(checked):
    outcomes = checked.h.send_together([init("g/a"), init("g/a")])  # unchecked: the assertions below say why
    logged = {r.producer_id for _, r in checked.h.log.records()}
    assert len(logged) == 1, f"answers {outcomes}; producer ids in the log {logged}: an orphaned record"
    answered = sorted(o[1] for o in outcomes if o[0] == "ok")
    refusals = [o[1] for o in outcomes if o[0] != "ok"]
    assert refusals in ([], [BUSY]), outcomes
    # as if one after the other: the same producer id, the second at a higher epoch (else two producers share one)
    assert answered == [(min(logged), e) for e in range(len(answered))], outcomes


def test_a_group_commit_retried_while_its_complete_commit_records_are_written_answers_ok(checked):
    handles = []
    for tid in TIDS:
        pid, epoch = ok(checked, init(tid))
        ok(checked, add(tid, pid, epoch))
        handles.append(ok(checked, prepare(tid, pid, epoch)))
    checked.hold(complete_of="g/b")  # g/a's CompleteCommit is durable, g/b's is being written
    assert ok(checked, group(*handles)) is None
    assert (checked.h.meta("g/a").state, checked.h.meta("g/b").pending_state) == (S.COMPLETE_COMMIT, S.COMPLETE_COMMIT)
    assert checked.send(group(*handles)) == ("ok", None)
    checked.release()
    assert ok(checked, group(*handles)) is None


# --- every pair of concurrent requests, exhaustively ------------------------------------------------------

PAIR_REQUESTS = {
    "init": lambda pid, epoch: init("g/a"),
    "kip360": lambda pid, epoch: init("g/a", pid, epoch),
    "add": lambda pid, epoch: add("g/a", pid, epoch, TOPIC_PARTITIONS[1]),
    "end-commit": lambda pid, epoch: end("g/a", pid, epoch, True),
    "end-abort": lambda pid, epoch: end("g/a", pid, epoch, False),
    "prepare": lambda pid, epoch: prepare("g/a", pid, epoch),
    "complete-commit": lambda pid, epoch: complete(Handle("g/a", pid, epoch), True),
    "zombie-end": lambda pid, epoch: end("g/a", pid, epoch - 1, True),
    "check-unknown": lambda pid, epoch: check(Handle("g/a", pid, epoch), "UNKNOWN"),
    "check-commit": lambda pid, epoch: check(Handle("g/a", pid, epoch), "COMMIT"),
}


@pytest.mark.parametrize("start", ["empty", "ongoing", "prepared"])
@pytest.mark.parametrize("first, second", list(itertools.product(PAIR_REQUESTS, repeat=2)))
def test_every_pair_of_concurrent_requests_of_one_id_keeps_every_guarantee(checked, start, first, second):
    """Both requests are in flight together (the first's log write pending while
    the second is decided); the checker compares both answers, the log, the
    markers and the fenced epochs with every order the model allows."""
    pid, epoch = ok(checked, init("g/a"))
    pid, epoch = ok(checked, init("g/a", pid, epoch))  # epoch 1, so a zombie's epoch 0 exists
    if start != "empty":
        ok(checked, add("g/a", pid, epoch))
    if start == "prepared":
        ok(checked, prepare("g/a", pid, epoch))
    outcomes = checked.send_together([PAIR_REQUESTS[first](pid, epoch), PAIR_REQUESTS[second](pid, epoch)])
    assert all(o[0] in ("ok", "err") for o in outcomes), outcomes
