"""The log start of one partition against a small model (issue 17: DeleteRecords).

The REAL partition core runs (:class:`partition_svc.partition.Partition`, a sole
replica, on a real RocksDB store with the server's GroupCommitWriter), driven
through its doors: plain and transactional appends, COMMIT/ABORT markers,
DeleteRecords at any offset (-1, below, at and past the last stable offset,
negative), retention (retention.bytes=0: every whole batch below the LSO) and
restarts (the store reopened). Beside it, :class:`Model` knows only the batches
written (base, last offset, values, producer), the open transactions, the
aborted spans and the log start, written from the DeleteRecords contract in
protos/txlog/v1/partition.proto and the module docstring of partition.py.

Compaction (cleanup.policy=compact, each record keyed by its unique value, so it
removes only aborted transactions' batches below the LSO) moves the log start
past the batches it removed up to the first kept one, and forgets those
transactions' aborted spans. It also marks the markers of transactions none of
whose batches is left (here: aborted ones) emptied, and removes them in a pass
delete.retention.ms later on the model's clock, which the machine moves forward.

Checked after every step:
- the log start never moves backward, never past the LSO, and is what the
  model says (a refused DeleteRecords changes nothing stored);
- nothing at or above the log start is lost: read_uncommitted from the log
  start returns exactly the model's records there, read_committed those below
  the LSO not aborted; no batch wholly below the log start stays on disk;
- the aborted index holds exactly the spans not wholly below the log start and
  not of a transaction compaction removed.

CI runs a fixed, short search (derandomized, 60 examples of up to 40 steps).
Put back by hand, each of these fails it: DeleteRecords past the LSO, a
straddling batch deleted, the aborted index not trimmed, retention ignoring a
log start inside a batch, compaction keeping the spans of what it removed,
compaction removing a marker whose transaction has a batch left or one emptied
less than delete.retention.ms ago, and compaction keeping every marker.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from partition_svc import validation
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition, RecordsDeleted
from partition_svc.producer_state import Reject
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000
PIDS = (1, 2)
DELETE_RETENTION_MS = 60_000


@dataclass
class Batch:
    base: int
    last: int
    values: tuple[str, ...]  # empty for a marker
    pid: int = -1
    txn: int = -1  # the transaction a transactional batch or a marker belongs to
    written_ms: int = NOW
    emptied_ms: int | None = None  # a marker: when a compaction found its transaction without a batch


@dataclass
class Model:
    batches: list[Batch] = field(default_factory=list)
    log_start: int = 0
    next_offset: int = 0
    open_first: dict[int, int] = field(default_factory=dict)  # producer id -> first offset of its open transaction
    epochs: dict[int, int] = field(default_factory=lambda: dict.fromkeys(PIDS, 0))
    sequences: dict[int, int] = field(default_factory=lambda: dict.fromkeys(PIDS, 0))
    aborted: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    now: int = NOW
    open_txn: dict[int, int] = field(default_factory=dict)  # producer id -> its open transaction
    txns: int = 0

    @property
    def lso(self) -> int:
        return min([self.next_offset, *self.open_first.values()])

    def append(self, values: tuple[str, ...], pid: int = -1, txn: int = -1) -> None:
        count = max(len(values), 1)
        self.batches.append(Batch(self.next_offset, self.next_offset + count - 1, values, pid, txn, self.now))
        self.next_offset += count

    def move_log_start(self, offset: int) -> None:
        self.log_start = offset
        self.batches = [b for b in self.batches if b.last >= offset]
        self.aborted = {pid: kept for pid, spans in self.aborted.items() if (kept := [s for s in spans if s[1] >= offset])}

    def records(self, committed: bool) -> list[tuple[int, str]]:
        upper = self.lso if committed else self.next_offset
        return [(b.base + i, v) for b in self.batches for i, v in enumerate(b.values)
                if self.log_start <= b.base + i < upper
                and not (committed and any(first <= b.base <= last for first, last in self.aborted.get(b.pid, [])))]


def records_of(values: tuple[str, ...]) -> list[common_pb2.Record]:
    """Each record keyed by its (unique) value: compaction supersedes none, so what it removes is the aborted batches."""
    return [common_pb2.Record(key=v.encode(), value=v.encode()) for v in values]


class LogStartMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="log-start-model-")
        self.loop = asyncio.new_event_loop()
        self.model = Model()
        self.counter = 0
        self.log_start_seen = 0
        self.partition = self._open()

    def _open(self) -> Partition:
        store = LogStore(self.dir)
        return Partition("t", 0, dict(CONFIGS), store, GroupCommitWriter(store))

    def _run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def _door(self, call):
        """A door of the partition called on the loop, as the server calls it (its futures belong there)."""
        async def called():
            return call()
        return self._run(called())

    def _durable(self, future) -> None:
        if future is not None:
            self._run(asyncio.wait_for(asyncio.shield(future), 10))

    def _values(self, count: int) -> tuple[str, ...]:
        self.counter += count
        return tuple(f"r{self.counter - count + i}" for i in range(count))

    def teardown(self):
        self._run(self.partition.queue.writer.drain())
        self.partition.store.close()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- appends ------------------------------------------------------------------------

    @rule(count=st.integers(1, 3))
    def append_plain(self, count):
        values = self._values(count)
        batch = common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                       records=records_of(values))
        produced = self._door(lambda: self.partition.produce(batch, self.model.now, LIMITS))
        assert not isinstance(produced, Reject), produced
        self._durable(produced.durable)
        self.model.append(values)

    @rule(pid=st.sampled_from(PIDS), count=st.integers(1, 3))
    def append_transactional(self, pid, count):
        values = self._values(count)
        batch = common_pb2.RecordBatch(producer_id=pid, producer_epoch=self.model.epochs[pid], base_sequence=self.model.sequences[pid],
                                       is_transactional=True, records=records_of(values))
        produced = self._door(lambda: self.partition.produce(batch, self.model.now, LIMITS))
        assert not isinstance(produced, Reject), produced
        self._durable(produced.durable)
        self.model.open_first.setdefault(pid, self.model.next_offset)
        if pid not in self.model.open_txn:
            self.model.txns += 1
            self.model.open_txn[pid] = self.model.txns
        self.model.sequences[pid] += count
        self.model.append(values, pid, self.model.open_txn[pid])

    @precondition(lambda self: self.model.open_first)
    @rule(data=st.data(), commit=st.booleans())
    def end_transaction(self, data, commit):
        pid = data.draw(st.sampled_from(sorted(self.model.open_first)))
        self.model.epochs[pid] += 1  # Transactions V2: the marker carries the bumped epoch
        self._durable(self._door(lambda: self.partition.write_marker(pid, self.model.epochs[pid], 0, commit, self.model.now)))
        first = self.model.open_first.pop(pid)
        if not commit:
            self.model.aborted.setdefault(pid, []).append((first, self.model.next_offset))
        self.model.sequences[pid] = 0
        self.model.append((), pid, self.model.open_txn.pop(pid))


    # --- moving the log start -------------------------------------------------------------

    @rule(data=st.data())
    def delete_records(self, data):
        model = self.model
        offset = data.draw(st.one_of(st.just(-1), st.integers(-3, model.next_offset + 2),
                                     st.integers(max(model.log_start - 1, 0), model.lso + 1)), label="offset")
        before = list(self.partition.store.items(b""))
        outcome = self._door(lambda: self.partition.delete_records(offset))
        target = model.lso if offset == -1 else offset
        if not 0 <= target <= model.lso:
            assert isinstance(outcome, Reject) and outcome.code == ErrorCode.Value("OFFSET_OUT_OF_RANGE"), outcome
            self._run(self.partition.queue.writer.drain())
            assert list(self.partition.store.items(b"")) == before, "a refused DeleteRecords changed what is stored"
            return
        assert isinstance(outcome, RecordsDeleted), outcome
        assert self._run(asyncio.wait_for(self.partition.wait_log_start_followed(outcome), 10))
        if target > model.log_start:
            model.move_log_start(target)
        assert outcome.log_start_offset == model.log_start

    @rule()
    def retention(self):
        self.partition.configs = dict(CONFIGS, **{"retention.bytes": "0"})
        self._durable(self._door(lambda: self.partition.enforce_retention(self.model.now)))
        self.partition.configs = dict(CONFIGS)
        lso, start = self.model.lso, self.model.log_start
        for batch in self.model.batches:  # every whole batch below the LSO, from the log start
            if batch.last >= lso:
                break
            start = batch.last + 1
        if start > self.model.log_start:
            self.model.move_log_start(start)

    @rule(elapsed_ms=st.sampled_from([DELETE_RETENTION_MS // 2, DELETE_RETENTION_MS]))
    def time_passes(self, elapsed_ms):
        """Time passes with no compaction: a transaction is found empty later than its marker was written."""
        self.model.now += elapsed_ms

    @rule(elapsed_ms=st.sampled_from([0, DELETE_RETENTION_MS // 2, DELETE_RETENTION_MS]))
    def compaction(self, elapsed_ms):
        """Two passes, the clock moved on between them by up to delete.retention.ms (a marker the
        first marks emptied may go in the second)."""
        self._compaction_pass()
        self.model.now += elapsed_ms
        self._compaction_pass()

    def _compaction_pass(self):
        self.partition.configs = dict(CONFIGS, **{"cleanup.policy": "compact"})
        self._durable(self._door(lambda: self.partition.enforce_retention(self.model.now, DELETE_RETENTION_MS)))
        self.partition.configs = dict(CONFIGS)
        model = self.model
        lso = model.lso
        below = [b for b in model.batches if b.last < lso]
        doomed = {b.base for b in below if b.values and b.pid >= 0 and any(first <= b.base <= last for first, last in model.aborted.get(b.pid, []))}
        # the pass that finds a transaction without a batch marks its marker emptied; a pass delete.retention.ms
        # later removes it (the sole replica's high watermark is the log end: every marker is below it)
        left = {b.txn for b in model.batches if b.values and b.base not in doomed}
        for b in below:
            if b.values or b.pid < 0 or b.txn in left:
                continue
            if b.emptied_ms is None:
                b.emptied_ms = model.now
            elif b.emptied_ms + DELETE_RETENTION_MS <= model.now:
                doomed.add(b.base)
        start = model.log_start
        for batch in model.batches:  # the log starts at the first batch kept
            if batch.last >= lso or batch.base not in doomed:
                break
            start = batch.last + 1
        model.batches = [b for b in model.batches if b.base not in doomed]
        model.log_start = start
        # every aborted transaction's batches below the LSO are gone, and so are their spans
        model.aborted = {pid: kept for pid, spans in model.aborted.items() if (kept := [s for s in spans if s[1] >= lso])}

    @rule()
    def restart(self):
        self._run(self.partition.queue.writer.drain())
        self.partition.store.close()
        self.partition = self._open()

    # --- what must hold -------------------------------------------------------------------

    @invariant()
    def log_start_moves_forward_only_and_never_past_the_lso(self):
        p = self.partition
        assert p.log_start_offset >= self.log_start_seen, f"the log start moved back from {self.log_start_seen} to {p.log_start_offset}"
        self.log_start_seen = p.log_start_offset
        assert p.log_start_offset == self.model.log_start
        assert p.last_stable_offset == self.model.lso and p.log_start_offset <= p.last_stable_offset

    @invariant()
    def nothing_at_or_above_the_log_start_is_lost(self):
        p = self.partition
        for committed in (False, True):
            upper = p.last_stable_offset if committed else p.high_watermark
            payloads, _, _ = p.read(p.log_start_offset, upper, 1 << 30, 1 << 30, take_first=True, committed=committed)
            read = [(r.offset, r.value.decode()) for payload in payloads for r in common_pb2.RecordBatch.FromString(payload).records]
            assert read == self.model.records(committed), ("read_committed" if committed else "read_uncommitted")
        on_disk = [base for base, _ in p.store.batches(p.pkey, 0)]
        assert on_disk == [b.base for b in self.model.batches], "a batch wholly below the log start stayed, or one above it went"
        assert p.aborted == self.model.aborted


def test_the_log_start_moves_forward_within_the_lso_and_loses_nothing_above_it():
    run_state_machine_as_test(LogStartMachine, settings=settings(max_examples=60, stateful_step_count=40, derandomize=True,
                                                                 deadline=None))
