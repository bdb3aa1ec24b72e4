"""One partition's idempotence, transactions, LSO and reads against a reference model.

The REAL partition core runs: :class:`partition_svc.partition.Partition`, driven
through its doors (produce, write_marker, seal_prepared, commit_txn_offsets) as the
server drives it, on a real RocksDB :class:`LogStore` in a temporary directory,
whose writes and acknowledgements a ``ScriptedWriter`` makes when the machine says
(the server's GroupCommitWriter makes them as soon as it can). Beside it, :class:`Model` is a small reference of one
partition written from docs/design.md ("Idempotent produce", "Transactions", "Reading"),
the rule list of ``partition_svc/producer_state.py`` and the docstrings of
``partition.py``; it imports nothing of partition_svc's logic (plain dataclasses,
lists and dicts; ``log_store`` only for the key and flag formats).

A hypothesis ``RuleBasedStateMachine`` interleaves at random:
- produce: idempotent and transactional batches of three producer ids at their
  current, an older (zombie) or a newer epoch, with the next sequence, 0, a gap, a
  batch straddling the last sequence, or one behind it; re-sends of ANY earlier
  batch (a retry of one of the last 5 answers Duplicate, an older one
  DUPLICATE_SEQUENCE); plain batches of a producer with a transaction open;
  batches of producer id -1 (not idempotent);
- WriteTxnMarkers: COMMIT/ABORT at the bumped epoch (TV2: epoch + 1, or + 2 after a
  fence), at the epoch of the open transaction (refused), at an older epoch, from the
  current, an older or a new (failed-over) coordinator epoch; and replays of any
  earlier marker request at any later time;
- seals of prepared transactions (seal_prepared) and their replays;
- TxnOffsetCommit (commit_txn_offsets) and its delayed replays;
- durability as the server does it: each change is applied in memory at once, written
  by the writer later (``write``), and its durable callback run later still (``ack``);
- crashes (``crash``): the store is closed and reopened, so whatever was applied in
  memory but not written (appends, markers, seals, offsets) is gone, and the model
  goes back to what was written.

After every step the test compares the real partition with the model: the answer to
each request (Append with its offsets, Duplicate with the original offsets, the Reject
code, a marker or seal written, re-applied or a no-op), read_uncommitted (every record
below the high watermark, no control batch) and read_committed (records below the LSO,
aborted transactions dropped), the LSO, the high watermark, the next offset, the
aborted spans, what the producers' states show (DescribeProducers' fields), the
batches on disk, the committed and pending group offsets. It also checks, on the real
partition alone:
- the LSO and the high watermark never move backwards, across crashes too, and what
  read_committed / read_uncommitted returned before is a prefix of what they return now;
- nothing written and acknowledged is ever lost; no idempotent record is in the log twice;
- no record of an aborted or still open transaction is ever returned by read_committed;
  a committed transaction is returned exactly up to the LSO (so all at once when no
  other transaction holds the LSO inside it; an open transaction that began in the
  middle of it holds back its later records, as the LSO rule of docs/design.md, and Kafka, say);
- a marker never ends a transaction opened at its own epoch (a late marker of
  transaction N never ends N+1).

CI runs a fixed, short search (``derandomize=True``, 120 examples of up to 50 steps, about
10 s on an idle machine). Each defect fixed in review, put back by hand (a marker ending the
transaction of its own epoch, a re-applied marker keeping the old coordinator epoch, a sealed
transaction taking batches, a plain batch inside a transaction, a straddling batch called a
duplicate, the LSO released before the marker is durable, a late TxnOffsetCommit moving a
pending offset back), makes it fail at these settings, as do a cache of 4 batches, a seal or
the aborted index lost at a restart. For a deeper, random search:

    TXLOG_PARTITION_MODEL_EXAMPLES=5000 TXLOG_PARTITION_MODEL_STEPS=80 \\
        .venv/bin/python -m pytest tests/unit/test_partition_model.py -q -p no:cacheprovider

(either variable switches derandomization off, so each run explores new interleavings,
and lifts the 300 s pytest timeout; a failure prints the shrunk steps, with the resolved
requests as notes, and a blob to reproduce it with ``@reproduce_failure``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)
from scripted_writer import ScriptedWriter

from partition_svc import log_format, validation
from partition_svc.log_store import LogStore
from partition_svc.partition import Partition
from partition_svc.producer_state import Reject
from txlog.protocol import batch_format
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2

CONFIGS = validation.topic_configs({}, 1 << 20)
LIMITS = validation.BatchLimits(10_000, 1 << 24)
NOW = 1_700_000_000_000
PIDS = (1, 2, 3)
GROUP_KEYS = tuple(log_format.group_offset_key("g", "src", i) for i in range(2))
GROUP_PREFIX = log_format.group_prefix("g")
CACHED_BATCHES = 5  # docs/design.md: the leader keeps the last 5 batches of each producer


# --- requests ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProduceReq:
    pid: int
    epoch: int
    seq: int
    values: tuple[bytes, ...]
    transactional: bool

    @property
    def last_seq(self) -> int:
        return self.seq + len(self.values) - 1


@dataclass(frozen=True)
class MarkerReq:
    pid: int
    epoch: int
    coordinator_epoch: int
    commit: bool


@dataclass(frozen=True)
class SealReq:
    pid: int
    epoch: int
    coordinator_epoch: int


@dataclass(frozen=True)
class OffsetsReq:
    pid: int
    epoch: int
    offsets: tuple[tuple[bytes, int], ...]  # (group key, offset)


def offset_value(offset: int) -> bytes:
    return json.dumps({"offset": offset, "metadata": ""}).encode()


# --- the model -----------------------------------------------------------------------------

@dataclass
class MProducer:
    epoch: int
    batches: list = field(default_factory=list)  # (first seq, last seq, base offset, last offset), all of this epoch
    coordinator_epoch: int = -1
    txn_first: int | None = None  # first offset of the open transaction
    prepared: bool = False  # the transaction at `epoch` was sealed
    pending: dict = field(default_factory=dict)  # group key -> (offset, value) of the open transaction

    def is_open(self) -> bool:
        return self.txn_first is not None or bool(self.pending)


@dataclass
class MBatch:
    base: int
    last: int
    pid: int
    epoch: int
    transactional: bool
    control: bool
    commit: bool
    records: list  # [(key, value)]
    txn: tuple | None  # (pid, first offset) of the transaction it belongs to


@dataclass
class MState:
    """Everything a write makes durable (the model's view of the disk, or of memory)."""

    next_offset: int = 0
    log: list = field(default_factory=list)
    producers: dict = field(default_factory=dict)
    aborted: list = field(default_factory=list)  # (pid, first, last) in marker order
    outcome: dict = field(default_factory=dict)  # (pid, first) -> "committed" | "aborted"
    group: dict = field(default_factory=dict)  # committed group offsets: key -> value


def reject(name: str) -> tuple:
    return ("reject", name)


class Model:
    """One partition, per docs/design.md and the rule lists, as plainly as possible."""

    def __init__(self):
        self.live = MState()  # memory
        self.durable = MState()  # what the writer has written
        self.hw = 0
        self.closing: dict[int, int] = {}  # op id -> first offset of a transaction whose marker is not durable
        self.settling: dict[int, set] = {}  # op id -> group keys a marker decided, not durable yet

    # Idempotent produce, rules 1-4, then transactions, rules 5-6 (producer_state.py).
    def check_batch(self, r: ProduceReq) -> tuple:
        if r.pid < 0:
            return ("append",)
        p = self.live.producers.get(r.pid)
        if p is None:
            return ("append",) if r.seq == 0 else reject("UNKNOWN_PRODUCER_ID")
        if r.epoch == p.epoch:
            for first, last, base, last_offset in p.batches[-CACHED_BATCHES:]:
                if (first, last) == (r.seq, r.last_seq):
                    return ("duplicate", base, last_offset)
        if r.epoch < p.epoch:
            return reject("PRODUCER_FENCED" if r.transactional else "INVALID_PRODUCER_EPOCH")
        if p.txn_first is not None and not r.transactional:
            return reject("INVALID_TXN_STATE")
        if p.txn_first is not None and r.epoch > p.epoch:
            return reject("INVALID_TXN_STATE")
        if p.prepared and r.epoch == p.epoch:
            return reject("INVALID_TXN_STATE")
        if r.epoch > p.epoch:
            return ("append",) if r.seq == 0 else reject("OUT_OF_ORDER_SEQUENCE")
        expected = p.batches[-1][1] + 1 if p.batches else 0
        if r.seq == expected:
            return ("append",)
        if p.batches and r.last_seq < expected:  # wholly behind the last sequence, not cached
            return reject("DUPLICATE_SEQUENCE")
        return reject("OUT_OF_ORDER_SEQUENCE")  # a gap, or straddling the last sequence

    def produce(self, r: ProduceReq) -> tuple:
        verdict = self.check_batch(r)
        if verdict[0] != "append":
            return verdict
        s = self.live
        base = s.next_offset
        s.next_offset += len(r.values)
        txn = None
        if r.pid >= 0:
            p = s.producers.get(r.pid)
            if p is None or p.epoch != r.epoch:
                assert p is None or not p.is_open(), "model: a new epoch while a transaction is open"
                p = s.producers[r.pid] = MProducer(r.epoch, coordinator_epoch=p.coordinator_epoch if p else -1)
            p.batches.append((r.seq, r.last_seq, base, s.next_offset - 1))
            if r.transactional:
                if p.txn_first is None:
                    p.txn_first = base
                txn = (r.pid, p.txn_first)
        s.log.append(MBatch(base, s.next_offset - 1, r.pid, r.epoch, r.transactional, False, False,
                            [(b"", v) for v in r.values], txn))
        return ("append", base)

    def marker(self, r: MarkerReq) -> tuple:
        """A marker ends only a transaction opened at a LOWER epoch; with nothing open and the
        producer at the marker's epoch, it is a no-op that still records a higher coordinator epoch."""
        s = self.live
        p = s.producers.get(r.pid)
        if p is not None:
            if r.coordinator_epoch < p.coordinator_epoch:
                return reject("TRANSACTION_COORDINATOR_FENCED")
            if r.epoch < p.epoch:
                return reject("INVALID_PRODUCER_EPOCH")
            if r.epoch == p.epoch and p.is_open():
                return reject("INVALID_TXN_STATE")
            if r.epoch == p.epoch:
                if r.coordinator_epoch <= p.coordinator_epoch:
                    return ("noop",)
                # written again, changing nothing but the coordinator epoch (in the log, so replicas learn it too)
                p.coordinator_epoch = r.coordinator_epoch
                self.append_control(r.pid, r.epoch, r.commit)
                return ("write", "coordinator epoch")
        offset = self.append_control(r.pid, r.epoch, r.commit)
        first = p.txn_first if p is not None else None
        decided = set()
        if first is not None:
            s.outcome[(r.pid, first)] = "committed" if r.commit else "aborted"
            if not r.commit:
                s.aborted.append((r.pid, first, offset))
        if p is not None and p.pending:
            decided = set(p.pending)
            if r.commit:
                s.group.update({key: value for key, (_, value) in p.pending.items()})
        s.producers[r.pid] = MProducer(r.epoch, coordinator_epoch=r.coordinator_epoch)
        return ("write", "control", first, decided)

    def seal(self, r: SealReq) -> tuple:
        p = self.live.producers.get(r.pid)
        if p is not None:
            if r.coordinator_epoch < p.coordinator_epoch:
                return reject("TRANSACTION_COORDINATOR_FENCED")
            if r.epoch < p.epoch:
                return reject("INVALID_PRODUCER_EPOCH")
            if r.epoch == p.epoch and p.prepared and r.coordinator_epoch <= p.coordinator_epoch:
                return ("noop",)
        if p is None:
            p = self.live.producers[r.pid] = MProducer(r.epoch)
        if p.epoch != r.epoch:  # nothing of this transaction written here yet
            # A transaction still open here at a lower epoch is not one the coordinator knows (it starts a
            # transaction only once the previous one's markers are written): a zombie's, which KIP-890's
            # verification keeps out and this core does not see (a seal lost in a crash, re-sent after the
            # zombie wrote). It stays open, now at the sealed epoch: that epoch's marker ends it, as any
            # marker of a higher epoch would, and the zombie's later batches are fenced.
            p.epoch, p.batches = r.epoch, []
        p.prepared = True
        p.coordinator_epoch = max(p.coordinator_epoch, r.coordinator_epoch)
        self.append_control(r.pid, r.epoch, False)  # a PREPARED control batch: the seal is in the log
        return ("write",)

    def append_control(self, pid: int, epoch: int, commit: bool) -> int:
        s = self.live
        offset = s.next_offset
        s.next_offset += 1
        s.log.append(MBatch(offset, offset, pid, epoch, True, True, commit, [], None))
        return offset

    def txn_offsets(self, r: OffsetsReq) -> tuple:
        s = self.live
        p = s.producers.get(r.pid)
        if p is not None and r.epoch < p.epoch:
            return reject("PRODUCER_FENCED")
        if p is not None and r.epoch == p.epoch and p.prepared:
            return reject("INVALID_TXN_STATE")
        if p is not None and r.epoch > p.epoch and p.is_open():
            return reject("INVALID_TXN_STATE")
        pending = p.pending if p is not None and p.epoch == r.epoch else {}
        kept = [(key, offset) for key, offset in r.offsets if key not in pending or offset >= pending[key][0]]
        if not kept:  # a late request: every offset is behind the pending one
            return ("nothing",)
        base = s.next_offset
        s.next_offset += len(kept)
        if p is None:
            p = s.producers[r.pid] = MProducer(r.epoch)
        elif p.epoch != r.epoch:
            p.epoch, p.batches, p.prepared = r.epoch, [], False
        if p.txn_first is None:
            p.txn_first = base
        p.pending.update({key: (offset, offset_value(offset)) for key, offset in kept})
        s.log.append(MBatch(base, s.next_offset - 1, r.pid, r.epoch, True, False, False,
                            [(key, offset_value(offset)) for key, offset in kept], (r.pid, p.txn_first)))
        return ("write", base)

    def expire_idle(self) -> list[int]:
        """Producer expiry, once every producer has been idle long enough: all
        without a transaction open (offsets included) or prepared are forgotten."""
        idle = [pid for pid, p in self.live.producers.items() if not p.is_open() and not p.prepared]
        for pid in idle:
            del self.live.producers[pid]
        return idle

    # --- derived views ---

    def lso(self) -> int:
        open_firsts = [p.txn_first for p in self.live.producers.values() if p.txn_first is not None]
        return min([self.hw, *open_firsts, *self.closing.values()])

    def read(self, committed: bool) -> list:
        upper = self.lso() if committed else self.hw
        out = []
        for b in self.live.log:
            if b.control or b.last >= upper:
                continue
            if committed and b.txn is not None and self.live.outcome.get(b.txn) == "aborted":
                continue
            out += [(b.base + i, key, value) for i, (key, value) in enumerate(b.records)]
        return out

    def pending_keys(self) -> set:
        keys = {key for p in self.live.producers.values() for key in p.pending}
        return keys.union(*self.settling.values())

    def restart(self) -> None:
        self.live = copy.deepcopy(self.durable)
        self.hw = self.live.next_offset
        self.closing.clear()
        self.settling.clear()


# --- the real partition, driven as the server drives it --------------------------------------

@dataclass
class Op:
    """A change applied in memory and submitted to the writer, written later,
    acknowledged (the partition's durable callback run) later still."""

    after: MState  # the model's memory once it was applied: what the disk holds once it is written
    end: int  # the model's next offset then: the high watermark once it is durable
    records: list  # (offset, value) it appended, acknowledged with it
    ident: int


class PartitionMachine(RuleBasedStateMachine):
    produced = Bundle("produced")
    markers = Bundle("markers")
    seals = Bundle("seals")
    offset_commits = Bundle("offset_commits")

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="txlog-partition-model-")
        self.loop = asyncio.new_event_loop()
        self.model = Model()
        self.open_store()
        self.unwritten: list[Op] = []
        self.unacked: list[Op] = []
        self.ops = 0
        self.values = 0
        self.sends = self.reads = 0
        self.appended: dict[int, list[ProduceReq]] = {pid: [] for pid in PIDS}  # in order, lost ones too
        self.coordinator_epoch = 0
        self.lso_seen = self.hw_seen = 0
        self.committed_seen: list = []
        self.uncommitted_seen: list = []
        self.acknowledged: dict[int, bytes] = {}  # offset -> value, of appends written and acknowledged
        self.beyond_expiry: set[bytes] = set()  # values sent before their producer expired

    def open_store(self) -> None:
        # sync=False: a crash here is the process dying (close and reopen), which keeps what was written;
        # fsync only matters to a machine crash, which no test can stage, and costs most of the run time.
        self.store = LogStore(os.path.join(self.dir, "db"), sync=False)
        self.writer = ScriptedWriter(self.store)
        self.partition = Partition("t", 0, CONFIGS, self.store, self.writer)

    def teardown(self):
        if self.store.db is not None:
            self.store.close()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, fn, *args):
        """Runs ``fn`` inside the event loop (the partition makes futures for its durable callbacks)."""
        async def inside():
            return fn(*args)
        return self.loop.run_until_complete(inside())

    # --- durability: apply now, write later, acknowledge later still ---

    def track(self, records=()) -> Op:
        """The submission the partition just made, with what the model expects of it."""
        assert len(self.writer.unwritten) == len(self.unwritten) + 1, "a door that changed something submits it once"
        self.ops += 1
        op = Op(copy.deepcopy(self.model.live), self.model.live.next_offset, list(records), self.ops)
        self.unwritten.append(op)
        return op

    def settle_if(self, durable: bool) -> None:
        if durable:
            self.write(len(self.unwritten))
            self.ack(len(self.unacked))

    @precondition(lambda self: self.unwritten)
    @rule(k=st.integers(1, 4))
    def write(self, k):
        ops, self.unwritten = self.unwritten[:k], self.unwritten[k:]
        if not ops:
            return
        self.writer.write(len(ops))  # one group commit
        self.unacked += ops
        self.model.durable = copy.deepcopy(ops[-1].after)

    @precondition(lambda self: self.unacked)
    @rule(k=st.integers(1, 4))
    def ack(self, k):
        ops, self.unacked = self.unacked[:k], self.unacked[k:]
        self.writer.acknowledge(len(ops))  # in submission order, as the writer completes its futures
        self.loop.run_until_complete(asyncio.sleep(0))  # the partition's durable callbacks run
        for op in ops:
            self.model.hw = op.end
            self.model.closing.pop(op.ident, None)
            self.model.settling.pop(op.ident, None)
            self.acknowledged.update(op.records)

    @rule()
    def crash(self):
        """kill -9 and restart: what was applied in memory but not written is gone."""
        self.say(f"crash: {len(self.unwritten)} change(s) never written, {len(self.unacked)} written but not acknowledged")
        self.store.close()
        self.store.db = None
        self.unwritten.clear()
        self.unacked.clear()
        self.open_store()
        self.model.restart()

    @rule(durable=st.booleans())
    def expire_idle_producers(self, durable):
        """Time passes past producer.id.expiration.ms: the retries, replays and
        zombies that come after meet producers the partition no longer knows."""
        written = self.call(self.partition.expire_producers, 2 ** 62, 1)
        expired = self.model.expire_idle()
        self.say(f"expire idle producers -> {'some' if written else 'none'}, model {expired}")
        assert (written is not None) == bool(expired), f"expiry wrote {written is not None}, model expired {expired}"
        # Past the window a retry is a new producer's batch (Kafka's too): only these may be appended twice.
        self.beyond_expiry |= {v for pid in expired for r in self.appended[pid] for v in r.values}
        if written is not None:
            self.track()
            self.settle_if(durable)

    # --- produce ---

    def epoch_of(self, pid: int) -> int:
        p = self.model.live.producers.get(pid)
        return p.epoch if p is not None else 0

    def next_value(self) -> bytes:
        self.values += 1
        return f"v{self.values}".encode()

    def say(self, text: str) -> None:
        """Notes a resolved request and its answer (printed with a failing example's steps)."""
        try:
            note(text)
        except InvalidArgument:  # driven by hand, outside hypothesis
            pass

    def send(self, r: ProduceReq) -> tuple:
        """Every other batch goes in the encoded form (so a retry may come in the other form than its original)."""
        b = common_pb2.RecordBatch(producer_id=r.pid, producer_epoch=r.epoch, base_sequence=r.seq,
                                   is_transactional=r.transactional, records=[common_pb2.Record(value=v) for v in r.values])
        self.sends += 1
        if self.sends % 2:
            b = validation.check_encoded(batch_format.encode(common_pb2.RecordBatch(records=b.records).SerializeToString(),
                                                             len(r.values), producer_id=r.pid, producer_epoch=r.epoch,
                                                             base_sequence=r.seq, transactional=r.transactional, untimed=True),
                                         LIMITS, "t")
        real = self.call(self.partition.produce, b, NOW, LIMITS)
        if isinstance(real, Reject):
            got = reject(ErrorCode.Name(real.code))
        elif real.duplicate:
            got = ("duplicate", real.base_offset, real.last_offset)
        else:
            got = ("append", real.base_offset)
        expected = self.model.produce(r)
        self.say(f"{r} -> {got}")
        assert got == expected, f"{r}: the partition answered {got}, the model {expected}"
        if got[0] == "append":
            self.track([(got[1] + i, v) for i, v in enumerate(r.values)])
            if r.pid >= 0:
                self.appended[r.pid].append(r)
        return got

    def expected_seq(self, pid: int, epoch: int) -> int:
        p = self.model.live.producers.get(pid)
        return p.batches[-1][1] + 1 if p is not None and p.epoch == epoch and p.batches else 0

    @rule(target=produced, pid=st.sampled_from(PIDS),
          epoch=st.sampled_from(["current", "current", "current", "older", "newer"]),
          seq=st.sampled_from(["next", "next", "zero", "gap", "straddle", "behind"]),
          count=st.integers(1, 3), kind=st.sampled_from(["usual", "usual", "other"]), behind=st.integers(1, 8),
          more=st.integers(0, 4), durable=st.booleans())
    def produce(self, pid, epoch, seq, count, kind, behind, more, durable):
        """A batch (producers 1 and 2 usually transactional, 3 usually idempotent only), then ``more``
        batches continuing its sequence, as a producer with several batches in flight sends them."""
        current = self.epoch_of(pid)
        e = {"current": current, "older": max(current - 1, 0), "newer": current + 1}[epoch]
        expected = self.expected_seq(pid, e)
        if seq == "straddle":
            count = max(count, 2)
        s = {"next": expected, "zero": 0, "gap": expected + behind, "straddle": max(expected - 1, 0),
             "behind": max(expected - behind, 0)}[seq]
        transactional = (pid != 3) == (kind == "usual")
        sent = [ProduceReq(pid, e, s, tuple(self.next_value() for _ in range(count)), transactional)]
        self.send(sent[0])
        for _ in range(more):
            sent.append(ProduceReq(pid, e, self.expected_seq(pid, e), (self.next_value(),), transactional))
            self.send(sent[-1])
        self.settle_if(durable)
        return multiple(*sent)

    @rule(r=produced, durable=st.booleans())
    def retry(self, r, durable):
        """The same batch again: a retry, late or reordered, from the producer or a zombie of it."""
        self.send(r)
        self.settle_if(durable)

    @rule(pid=st.sampled_from(PIDS), back=st.integers(1, CACHED_BATCHES + 2), durable=st.booleans())
    def retry_recent(self, pid, back, durable):
        """A retry of the back-th last batch the producer appended at its current epoch: around the edge
        of the cache (the last 5 answer Duplicate, older ones DUPLICATE_SEQUENCE)."""
        recent = [r for r in self.appended[pid] if r.epoch == self.epoch_of(pid)]
        if recent:
            self.send(recent[-min(back, len(recent))])
            self.settle_if(durable)

    @rule(count=st.integers(1, 2), durable=st.booleans())
    def produce_without_idempotence(self, count, durable):
        self.send(ProduceReq(-1, -1, -1, tuple(self.next_value() for _ in range(count)), False))
        self.settle_if(durable)

    # --- markers, seals, offsets ---

    def coordinator(self, which: str) -> int:
        if which == "failover":
            self.coordinator_epoch += 1
        return {"current": self.coordinator_epoch, "failover": self.coordinator_epoch,
                "old": max(self.coordinator_epoch - 1, 0)}[which]

    def send_marker(self, r: MarkerReq) -> tuple:
        before = self.partition.producers.get(r.pid)
        closed_before = (before is not None and before.producer_epoch == r.epoch and before.current_txn_first_offset < 0
                         and not self.partition.pending_offsets.get(r.pid))
        written = self.call(self.partition.write_marker, r.pid, r.epoch, r.coordinator_epoch, r.commit, NOW)
        if isinstance(written, Reject):
            got = reject(ErrorCode.Name(written.code))
        elif written is None:
            got = ("noop",)
        else:
            got = ("write", "coordinator epoch" if closed_before else "control")
        expected = self.model.marker(r)
        self.say(f"{r} -> {got}")
        assert got == expected[:2], f"{r}: the partition answered {got}, the model {expected}"
        if got == ("write", "control") and before is not None and before.current_txn_first_offset >= 0:
            assert before.producer_epoch < r.epoch, (
                f"{r} ended the transaction open since {before.current_txn_first_offset} at epoch {before.producer_epoch}: "
                "a marker ends only a transaction of a lower epoch")
        if got[0] == "write":
            op = self.track()
            if got[1] == "control":
                first, decided = expected[2], expected[3]
                if first is not None:
                    self.model.closing[op.ident] = first
                if decided:
                    self.model.settling[op.ident] = decided
        return got

    @rule(target=markers, pid=st.sampled_from(PIDS), epoch=st.sampled_from(["bump", "bump", "bump2", "equal", "older"]),
          commit=st.booleans(), coordinator=st.sampled_from(["current", "current", "failover", "old"]), durable=st.booleans())
    def marker(self, pid, epoch, commit, coordinator, durable):
        current = self.epoch_of(pid)
        e = {"bump": current + 1, "bump2": current + 2, "equal": current, "older": max(current - 1, 0)}[epoch]
        r = MarkerReq(pid, e, self.coordinator(coordinator), commit)
        self.send_marker(r)
        self.settle_if(durable)
        return r

    @rule(r=markers, durable=st.booleans())
    def replay_marker(self, r, durable):
        """A marker request sent again, at any later time (a coordinator retrying, or a paused old one)."""
        self.send_marker(r)
        self.settle_if(durable)

    def send_seal(self, r: SealReq) -> tuple:
        written = self.call(self.partition.seal_prepared, r.pid, r.epoch, r.coordinator_epoch, NOW)
        if isinstance(written, Reject):
            got = reject(ErrorCode.Name(written.code))
        else:
            got = ("noop",) if written is None else ("write",)
        expected = self.model.seal(r)
        self.say(f"{r} -> {got}")
        assert got == expected, f"{r}: the partition answered {got}, the model {expected}"
        if got == ("write",):
            self.track()
        return got

    @rule(target=seals, pid=st.sampled_from(PIDS), epoch=st.sampled_from(["current", "current", "next", "older"]),
          coordinator=st.sampled_from(["current", "current", "failover", "old"]), durable=st.booleans())
    def seal(self, pid, epoch, coordinator, durable):
        """PrepareTransaction seals the transaction at its own epoch: the one open here, or a transaction
        that wrote nothing here yet (the next epoch only when none is open: the coordinator starts a
        transaction only once the previous one's markers are written)."""
        current = self.epoch_of(pid)
        p = self.model.live.producers.get(pid)
        if epoch == "next" and p is not None and p.is_open():
            epoch = "current"
        e = {"current": current, "next": current + 1, "older": max(current - 1, 0)}[epoch]
        r = SealReq(pid, e, self.coordinator(coordinator))
        self.send_seal(r)
        self.settle_if(durable)
        return r

    @rule(r=seals, durable=st.booleans())
    def replay_seal(self, r, durable):
        self.send_seal(r)
        self.settle_if(durable)

    def send_offsets(self, r: OffsetsReq) -> tuple:
        end_before = self.partition.next_offset
        records = [(key, offset_value(offset)) for key, offset in r.offsets]
        real = self.call(self.partition.commit_txn_offsets, r.pid, r.epoch, records, NOW)
        if isinstance(real, Reject):
            got = reject(ErrorCode.Name(real.code))
        elif real is None:
            got = ("nothing",)
        else:
            got = ("write", end_before)
        expected = self.model.txn_offsets(r)
        self.say(f"{r} -> {got}")
        assert got == expected, f"{r}: the partition answered {got}, the model {expected}"
        if got[0] == "write":
            kept = self.model.live.log[-1].records
            self.track([(end_before + i, value) for i, (_, value) in enumerate(kept)])
        return got

    @rule(target=offset_commits, pid=st.sampled_from(PIDS), epoch=st.sampled_from(["current", "current", "older", "newer"]),
          partitions=st.lists(st.sampled_from(range(len(GROUP_KEYS))), min_size=1, max_size=2, unique=True),
          offset=st.integers(0, 20), durable=st.booleans())
    def txn_offset_commit(self, pid, epoch, partitions, offset, durable):
        current = self.epoch_of(pid)
        e = {"current": current, "older": max(current - 1, 0), "newer": current + 1}[epoch]
        r = OffsetsReq(pid, e, tuple((GROUP_KEYS[i], offset + i) for i in partitions))
        self.send_offsets(r)
        self.settle_if(durable)
        return r

    @rule(r=offset_commits, durable=st.booleans())
    def replay_txn_offset_commit(self, r, durable):
        """A TxnOffsetCommit delivered late (it has no sequence)."""
        self.send_offsets(r)
        self.settle_if(durable)

    # --- after every step ---

    def real_read(self, committed: bool, records_max: int = 1 << 30) -> list:
        """Everything a consumer reads from offset 0, fetching at most ``records_max`` records at a time."""
        p = self.partition
        upper = p.last_stable_offset if committed else p.high_watermark
        records, fetch = [], 0
        self.reads += 1
        encoded = self.reads % 2 == 0  # every other read in the encoded form, which a reader decodes and skips itself
        while fetch < upper:
            payloads, fetch_next, _ = p.read(fetch, upper, 1 << 30, records_max, take_first=True, committed=committed,
                                             encoded=encoded)
            assert fetch_next > fetch, f"a fetch from {fetch} below {upper} made no progress"
            for payload in payloads:
                batch = (batch_format.to_message(payload, batch_format.verified_header(payload), from_offset=fetch) if encoded
                         else common_pb2.RecordBatch.FromString(payload))
                records += [(r.offset, r.key, r.value) for r in batch.records]
            fetch = fetch_next
        return records

    @invariant()
    def the_partition_agrees_with_the_model(self):
        p, m = self.partition, self.model
        assert p.next_offset == m.live.next_offset, "next offset"
        assert p.high_watermark <= p.durable_end <= p.written_end <= p.next_offset, (
            f"high watermark {p.high_watermark}, durable {p.durable_end}, written {p.written_end}, next {p.next_offset}")
        assert p.high_watermark == m.hw, f"high watermark {p.high_watermark}, model {m.hw}"
        lso = p.last_stable_offset
        assert lso == m.lso(), f"LSO {lso}, model {m.lso()}"
        aborted: dict = {}
        for pid, first, last in m.live.aborted:
            aborted.setdefault(pid, []).append((first, last))
        assert p.aborted == aborted, f"aborted spans {p.aborted}, model {aborted}"
        shown = {pid: (e.producer_epoch, e.last_sequence, e.coordinator_epoch, e.current_txn_first_offset)
                 for pid, e in p.producers.items()}
        modelled = {pid: (q.epoch, q.batches[-1][1] if q.batches else -1, q.coordinator_epoch,
                          -1 if q.txn_first is None else q.txn_first) for pid, q in m.live.producers.items()}
        assert shown == modelled, f"producers (epoch, last seq, coordinator epoch, txn first): {shown}, model {modelled}"
        uncommitted, committed = self.real_read(False), self.real_read(True)
        assert uncommitted == m.read(False), f"read_uncommitted {uncommitted}, model {m.read(False)}"
        assert committed == m.read(True), f"read_committed {committed}, model {m.read(True)}"
        assert self.real_read(False, 2) == uncommitted and self.real_read(True, 2) == committed, "fetched 2 at a time"
        on_disk = [(h.base_offset, h.last_offset, h.producer_id, h.producer_epoch, h.is_transactional, h.is_control,
                    bool(h.flags & log_format.FLAG_COMMIT)) for h in p.headers()]
        durable = [(b.base, b.last, b.pid, b.epoch, b.transactional, b.control, b.commit) for b in m.durable.log]
        assert on_disk == durable, f"batches on disk {on_disk}, model {durable}"
        for key in GROUP_KEYS:
            assert self.store.get(key) == m.durable.group.get(key), f"committed offset of {key!r}"
            assert p.has_pending_offsets(GROUP_PREFIX, [key]) == (key in m.pending_keys()), f"pending offset of {key!r}"

        # On the partition alone, across steps and crashes.
        assert lso >= self.lso_seen, f"the LSO moved back from {self.lso_seen} to {lso}"
        assert p.high_watermark >= self.hw_seen, f"the high watermark moved back from {self.hw_seen} to {p.high_watermark}"
        assert committed[:len(self.committed_seen)] == self.committed_seen, "read_committed took back records it returned"
        assert uncommitted[:len(self.uncommitted_seen)] == self.uncommitted_seen, "read_uncommitted took back records"
        self.lso_seen, self.hw_seen = lso, p.high_watermark
        self.committed_seen, self.uncommitted_seen = committed, uncommitted
        present = {offset: value for offset, _, value in uncommitted}
        lost = {o: v for o, v in self.acknowledged.items() if present.get(o) != v}
        assert not lost, f"acknowledged records lost: {lost}"
        values = [value for _, key, value in uncommitted if not key and value not in self.beyond_expiry]
        assert len(values) == len(set(values)), "a record was appended twice"
        visible = {offset for offset, _, _ in committed}
        members: dict = {}
        for b in m.live.log:
            if b.txn is not None:
                members.setdefault(b.txn, set()).update(range(b.base, b.last + 1))
        for txn, offsets in members.items():
            shown_now = offsets & visible
            if m.live.outcome.get(txn) != "committed":
                assert not shown_now, f"read_committed returned {sorted(shown_now)} of transaction {txn}, " \
                                      f"{m.live.outcome.get(txn, 'open')}"
            else:
                assert shown_now == {o for o in offsets if o < lso}, f"committed transaction {txn} shown in part: " \
                                                                      f"{sorted(shown_now)} of {sorted(offsets)}, LSO {lso}"


EXAMPLES = os.environ.get("TXLOG_PARTITION_MODEL_EXAMPLES")
STEPS = os.environ.get("TXLOG_PARTITION_MODEL_STEPS")
DEEP = EXAMPLES is not None or STEPS is not None


def model_settings() -> settings:
    return settings(
        max_examples=int(EXAMPLES or 120), stateful_step_count=int(STEPS or 50), derandomize=not DEEP,
        database=None, deadline=None, print_blob=DEEP,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


@pytest.mark.timeout(0 if DEEP else 300)  # a deep search runs as long as it is told
def test_one_partition_follows_the_reference_model_under_retries_replays_zombies_and_crashes():
    run_state_machine_as_test(PartitionMachine, settings=model_settings())


def test_the_model_and_the_partition_by_hand_through_a_late_marker_a_seal_and_a_crash():
    """The machine driven by hand, each answer spelled out, so the model itself is checked against
    docs/design.md and not only against the partition."""
    m = PartitionMachine()
    agree = m.the_partition_agrees_with_the_model
    try:
        assert m.send(ProduceReq(1, 0, 0, (b"a1", b"a2"), True)) == ("append", 0)
        assert m.send(ProduceReq(2, 0, 0, (b"b",), True)) == ("append", 2)
        m.settle_if(True)
        agree()
        assert (m.partition.last_stable_offset, m.partition.high_watermark) == (0, 3)
        assert m.send_marker(MarkerReq(2, 1, 0, True)) == ("write", "control")  # offset 3, applied, not written
        assert m.send_marker(MarkerReq(1, 1, 0, True)) == ("write", "control")  # offset 4
        agree()
        assert m.partition.last_stable_offset == 0 and m.real_read(True) == []
        m.write(1)
        m.ack(1)  # B's marker is durable, A's is not: A holds the LSO
        agree()
        assert m.partition.last_stable_offset == 0
        m.settle_if(True)
        agree()
        assert m.partition.last_stable_offset == 5
        assert [v for _, _, v in m.real_read(True)] == [b"a1", b"a2", b"b"]

        assert m.send(ProduceReq(1, 1, 0, (b"n",), True)) == ("append", 5)  # transaction N+1, at the bumped epoch
        assert m.send_marker(MarkerReq(1, 1, 0, True)) == reject("INVALID_TXN_STATE")  # N's late marker
        assert m.send(ProduceReq(1, 1, 1, (b"plain",), False)) == reject("INVALID_TXN_STATE")
        assert m.send_seal(SealReq(1, 1, 0)) == ("write",)
        assert m.send_seal(SealReq(1, 1, 0)) == ("noop",)
        assert m.send(ProduceReq(1, 1, 0, (b"n",), True)) == ("duplicate", 5, 5)  # a retry from before the seal
        assert m.send(ProduceReq(1, 1, 1, (b"z",), True)) == reject("INVALID_TXN_STATE")  # a zombie, after it
        assert m.send_offsets(OffsetsReq(1, 1, ((GROUP_KEYS[0], 7),))) == reject("INVALID_TXN_STATE")
        m.settle_if(True)
        agree()
        assert m.send_marker(MarkerReq(1, 2, 0, False)) == ("write", "control")  # offset 7 (the seal is 6), never written:
        m.crash()
        agree()
        assert m.partition.last_stable_offset == 5 and m.partition.high_watermark == 7  # N+1 is open again
        assert m.send_marker(MarkerReq(1, 2, 1, False)) == ("write", "control")  # re-sent by a new coordinator
        m.settle_if(True)
        agree()
        assert m.partition.aborted == {1: [(5, 7)]} and m.partition.last_stable_offset == 8
        assert [v for _, _, v in m.real_read(True)] == [b"a1", b"a2", b"b"]
        assert m.send_marker(MarkerReq(1, 2, 0, False)) == reject("TRANSACTION_COORDINATOR_FENCED")
        # nothing open: a control batch that only records the higher coordinator epoch (offset 8)
        assert m.send_marker(MarkerReq(1, 2, 2, False)) == ("write", "coordinator epoch")
        assert m.send(ProduceReq(1, 1, 0, (b"n",), True)) == reject("PRODUCER_FENCED")
        assert m.send(ProduceReq(1, 2, 0, (b"m",), True)) == ("append", 9)
        m.settle_if(True)
        agree()
    finally:
        m.teardown()
