"""Message faults: a request of a producer worker delivered late, or twice.

The nemesis (``faults.py``) orders a replay by writing a file to the target
worker's folder ``DIR/replay/<worker>/<seq>.json`` (kind, delay, where to
deliver it); the producer worker takes it at its next transaction, carries it
out with :class:`Replayer`, records a ``replay`` event in its history and
answers with ``<seq>.done``. Kinds (``REPLAY_KINDS``):

    replay_marker    transaction N's WriteTxnMarkers (COMMIT or ABORT), rebuilt by the worker
                     after N's EndTxn returned, sent again to N's partition leaders while
                     N+1 is open and has written on each of N's partitions
    replay_end_txn   transaction N's EndTxn request, sent again to the coordinator that
                     answered it, while N+1 is open
    replay_produce   a Produce request of transaction N, sent again to the same leader while
                     N is still open (``into: same``: a duplicate) or while N+1 is open and has
                     written on its partitions (``into: next``: a stale epoch)

Capture: the worker's producer uses a :class:`RecordingTransport`, which keeps
copies of its last transactional Produce and EndTxn requests with where they
went and what was answered. Transaction N's marker is rebuilt from them as the
coordinator writes it (Transactions V2): the producer id and the epoch EndTxn
answered (the bumped one; the old id at the top epoch when the epoch was
exhausted), committed or not, N's partitions (those of its Produce requests,
each with the leader address it was sent to), and the coordinator epoch that
FindCoordinator answers right after N ended (the owner of the id's
``__transaction_state`` partition; the epoch N's markers carried, or a newer
one: then the replay stands for a coordinator that took over and re-sends N's
markers).

Delivery: the replay lands "seconds later", while a transaction is open: the
worker sends that transaction's records, flushes them (they are in the log),
waits the order's ``delay_s``, sends the copy on a fresh channel (its own
connection, as a late packet or another process would), then ends the
transaction. For markers and EndTxn, transaction N+1's outcome is the opposite
of N's, so that a replay wrongly ending N+1 shows in the reads: N's COMMIT
making aborted N+1 visible (aborted_reads), or N's ABORT hiding committed N+1
(lost_writes, non_atomic_transactions).

Replays are best-effort: the answers (errors, mostly) are recorded, never
raised; a replay that could not be captured (N failed, the producer was
replaced) is tried again with the next transactions until the worker stops.
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.tooling.chaos.history import REPLAY_KINDS
from txlog.protocol import PRODUCER_EPOCH_MAX, batch_format
from txlog.protocol.errors import ErrorCode, from_rpc_error
from txlog.transport import Transport
from txlog.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_pb2,
    partition_pb2_grpc,
)

ORDERS_DIR = "replay"
REPLAY_CALL_TIMEOUT_S = 3.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
RECORDED_PRODUCE_MAX = 64
RECORDED_END_TXN_MAX = 8
NOT_DELIVERED = frozenset({"UNAVAILABLE"})  # the request never reached a server


# --- orders: nemesis -> worker ------------------------------------------------------------------------


@dataclass(frozen=True)
class Order:
    seq: int
    kind: str
    delay_s: float
    into: str = "next"  # "next": during transaction N+1; "same": during N (replay_produce only)

    def __post_init__(self):
        if self.kind not in REPLAY_KINDS:
            raise ValueError(f"unknown replay kind {self.kind!r}")
        if self.into not in ("next", "same") or (self.into == "same" and self.kind != "replay_produce"):
            raise ValueError(f"{self.kind} cannot be delivered into {self.into!r}")

    def to_json(self) -> str:
        return json.dumps({"seq": self.seq, "kind": self.kind, "delay_s": self.delay_s, "into": self.into})

    @classmethod
    def from_json(cls, text: str) -> Order:
        raw = json.loads(text)
        return cls(int(raw["seq"]), raw["kind"], float(raw["delay_s"]), raw.get("into", "next"))


def orders_dir(directory: str | Path, worker: str) -> Path:
    return Path(directory) / ORDERS_DIR / worker


def write_order(directory: str | Path, worker: str, order: Order) -> Path:
    """Writes the order atomically (a worker never reads half of it)."""
    folder = orders_dir(directory, worker)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{order.seq:05d}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(order.to_json())
    tmp.replace(path)
    return path


def pending_orders(directory: str | Path, worker: str, taken: set[int]) -> list[Order]:
    """The orders not taken yet, oldest first."""
    folder = orders_dir(directory, worker)
    if not folder.is_dir():
        return []
    orders = []
    for path in sorted(folder.glob("*.json")):
        try:
            order = Order.from_json(path.read_text())
        except (OSError, ValueError, KeyError):
            continue
        if order.seq not in taken:
            orders.append(order)
    return orders


def write_done(directory: str | Path, worker: str, seq: int, result: dict) -> None:
    folder = orders_dir(directory, worker)
    tmp = folder / f"{seq:05d}.done.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(folder / f"{seq:05d}.done")


def read_done(directory: str | Path, worker: str, seq: int) -> dict | None:
    try:
        return json.loads((orders_dir(directory, worker) / f"{seq:05d}.done").read_text())
    except (OSError, ValueError):
        return None


# --- capture ------------------------------------------------------------------------------------------


@dataclass
class Sent:
    """One request the producer sent: where, a copy of it, its answer (None: none came)."""

    n: int
    address: str
    rpc: str
    request: object
    response: object = None


class RecordingTransport(Transport):
    """The producer's transport, remembering copies of its last transactional
    Produce and EndTxn requests (bounded). Thread-safe: calls run on the
    producer's I/O thread, the worker reads from its own."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self._count = 0
        self.produced: deque[Sent] = deque(maxlen=RECORDED_PRODUCE_MAX)
        self.ended: deque[Sent] = deque(maxlen=RECORDED_END_TXN_MAX)

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    async def call(self, address: str, rpc: str, request, *, timeout_ms: float | None = None):
        if rpc not in ("Produce", "EndTxn") or (rpc == "Produce" and not request.transactional_id):
            return await super().call(address, rpc, request, timeout_ms=timeout_ms)
        sent = self.remember(address, rpc, request)
        response = await super().call(address, rpc, request, timeout_ms=timeout_ms)
        sent.response = copy_of(response)
        return response

    def remember(self, address: str, rpc: str, request, response=None) -> Sent:
        """Keeps a copy of a Produce or EndTxn request (and of its answer, when given)."""
        with self._lock:
            self._count += 1
            sent = Sent(self._count, address, rpc, copy_of(request), None if response is None else copy_of(response))
            (self.produced if rpc == "Produce" else self.ended).append(sent)
        return sent

    def since(self, n: int) -> tuple[list[Sent], list[Sent]]:
        """The Produce and EndTxn requests sent after the ``n``-th recorded one."""
        with self._lock:
            return [s for s in self.produced if s.n > n], [s for s in self.ended if s.n > n]


# --- pure helpers ---------------------------------------------------------------------------------------


def copy_of(message):
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def marker_producer(end_request, end_response) -> tuple[int, int]:
    """The producer id and epoch of the markers of the transaction this EndTxn
    ended (Transactions V2): the id and bumped epoch EndTxn answered; when the
    epoch was exhausted and the answer is a new id, the old id at the top epoch."""
    if end_response.producer_id != end_request.producer_id:
        return end_request.producer_id, PRODUCER_EPOCH_MAX
    return end_response.producer_id, end_response.producer_epoch


def partitions_by_leader(produced: list[Sent], producer_id: int, producer_epoch: int) -> dict[str, list[tuple[str, int]]]:
    """The partitions of the Produce requests carrying (producer_id,
    producer_epoch), by the address each was sent to, sorted."""
    found: dict[str, set[tuple[str, int]]] = {}
    for sent in produced:
        for item in sent.request.batches:
            batch = batch_format.summary_of(item)
            if batch.producer_id == producer_id and batch.producer_epoch == producer_epoch:
                found.setdefault(sent.address, set()).add((item.topic, item.partition))
    return {address: sorted(tps) for address, tps in sorted(found.items())}


def marker_request(transactional_id: str, producer_id: int, producer_epoch: int, committed: bool,
                   coordinator_epoch: int, partitions: list[tuple[str, int]]) -> partition_pb2.WriteTxnMarkersRequest:
    """One leader's WriteTxnMarkers for one transaction, as a coordinator sends it."""
    return partition_pb2.WriteTxnMarkersRequest(markers=[partition_pb2.TxnMarker(
        producer_id=producer_id, producer_epoch=producer_epoch, committed=committed,
        coordinator_epoch=coordinator_epoch, transactional_id=transactional_id,
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions])])


def answers_of(rpc: str, response) -> list[dict]:
    """What a server answered to a replayed request: one entry per partition
    (``error`` is the code's name, NONE when it was accepted)."""
    name = ErrorCode.Name
    if rpc == "WriteTxnMarkers":
        return [{"partition": f"{r.partition.topic}/{r.partition.partition}", "error": name(r.error.code)}
                for m in response.markers for r in m.results]
    if rpc == "Produce":
        return [{"partition": f"{r.topic}/{r.partition}", "error": name(r.error.code), "base_offset": r.base_offset}
                for r in response.results]
    if rpc == "EndTxn":
        return [{"error": "NONE", "producer_id": response.producer_id, "producer_epoch": response.producer_epoch}]
    raise ValueError(f"no replay of {rpc}")


def delivered(answers: list[dict]) -> bool:
    """True when some server received the replayed request (accepted or not)."""
    return any(a["error"] not in NOT_DELIVERED | {"REPLAY_FAILED"} for a in answers)


def opposite(outcome: str) -> str:
    """The intent of transaction N+1 given N's outcome (committed|aborted)."""
    return {"committed": "abort", "aborted": "commit"}[outcome]


def check_local(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    if host not in LOCAL_HOSTS:
        raise ValueError(f"replays go to 127.0.0.1 only, not to {address}")
    return address


# --- sending --------------------------------------------------------------------------------------------


def send(address: str, rpc: str, request, timeout_s: float = REPLAY_CALL_TIMEOUT_S) -> list[dict]:
    """Sends one request on a fresh channel; its answers (answers_of), or one
    entry with the error the call failed with. Never raises for the server's sake."""
    check_local(address)
    with grpc.insecure_channel(address) as channel:
        stub = (coordinator_pb2_grpc.CoordinatorServiceStub(channel) if rpc in ("EndTxn", "FindCoordinator")
                else partition_pb2_grpc.PartitionServiceStub(channel))
        try:
            response = getattr(stub, rpc)(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            status = exc.code().name if exc.code() is not None else "UNKNOWN"
            if status in NOT_DELIVERED:
                return [{"error": status, "status": status}]
            return [{"error": ErrorCode.Name(from_rpc_error(exc).code), "status": status,
                     "message": (exc.details() or "")[:200]}]
    return answers_of(rpc, response) if rpc != "FindCoordinator" else [{"error": "NONE", "response": response}]


def coordinator_epoch(address: str, transactional_id: str) -> int | None:
    """The coordinator epoch of the id's __transaction_state partition, from
    FindCoordinator; None when it could not be learned."""
    try:
        answer = send(address, "FindCoordinator", coordinator_pb2.FindCoordinatorRequest(
            key=transactional_id, key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION))[0]
    except Exception:  # noqa: BLE001 - best-effort: the replay is captured again with another transaction
        return None
    return answer["response"].coordinator_epoch if "response" in answer else None


# --- the worker's side ----------------------------------------------------------------------------------


@dataclass
class Plan:
    """What the worker does differently in one transaction for a replay."""

    intent: str | None = None  # forced intent (commit|abort)
    partitions: list[tuple[str, int]] = field(default_factory=list)  # write one record on each
    deliver: bool = False  # flush, wait delay_s, then Replayer.deliver()
    delay_s: float = 0.0


@dataclass
class Captured:
    of_txn: int
    outcome: str
    targets: list[tuple[str, str, object]]  # (address, rpc, request)
    partitions: list[tuple[str, int]]
    summary: dict


class Replayer:
    """Carries out a producer worker's replay orders, one at a time: captures
    a request of transaction N, delivers its copy in N (replay_produce into
    same) or N+1, records a ``replay`` event, answers the order."""

    def __init__(self, directory: str | Path, worker: str, transactional_id: str, history):
        self.directory, self.worker, self.transactional_id, self.history = directory, worker, transactional_id, history
        self.transport: RecordingTransport | None = None
        self.taken: set[int] = set()
        self.order: Order | None = None
        self.capture_txn: int | None = None
        self.since = 0
        self.captured: Captured | None = None
        self.deliver_txn: int | None = None

    def producer_replaced(self, transport: RecordingTransport) -> None:
        """A new producer: what was captured belongs to the old one; capture again."""
        self.transport = transport
        self.capture_txn, self.captured, self.deliver_txn = None, None, None

    def plan(self, txn: int) -> Plan:
        if self.order is None:
            orders = pending_orders(self.directory, self.worker, self.taken)
            if not orders:
                return Plan()
            self.order = orders[0]
            self.taken.add(self.order.seq)
            self.history.record("replay_order", seq=self.order.seq, kind=self.order.kind, delay_s=self.order.delay_s,
                                into=self.order.into)
        if self.transport is None:
            return Plan()
        if self.captured is not None and self.deliver_txn == txn:
            intent = None if self.order.kind == "replay_produce" else opposite(self.captured.outcome)
            return Plan(intent=intent, partitions=self.captured.partitions, deliver=True, delay_s=self.order.delay_s)
        self.captured, self.deliver_txn = None, None
        self.capture_txn, self.since = txn, self.transport.count
        if self.order.into == "same":
            return Plan(deliver=True, delay_s=self.order.delay_s)
        return Plan()

    def ended(self, txn: int, ok: bool, outcome: str) -> None:
        """After transaction ``txn`` ended (``ok``: its commit or abort returned)."""
        if self.order is None or txn != self.capture_txn or self.captured is not None:
            return
        if self.order.into == "same":  # ended before its replay was delivered: capture again
            self.capture_txn = None
            return
        self.capture_txn = None
        if not ok or self.transport is None:
            return
        produced, ended = self.transport.since(self.since)
        answered = [s for s in ended if s.response is not None]
        if not answered:
            return
        end = answered[-1]
        kind = self.order.kind
        if kind == "replay_marker":
            producer_id, producer_epoch = marker_producer(end.request, end.response)
            if (producer_id, producer_epoch) == (end.request.producer_id, end.request.producer_epoch):
                return  # no epoch bump: nothing was ended
            leaders = partitions_by_leader(produced, end.request.producer_id, end.request.producer_epoch)
            epoch = coordinator_epoch(end.address, self.transactional_id)
            if not leaders or epoch is None:
                return
            targets = [(address, "WriteTxnMarkers", marker_request(self.transactional_id, producer_id, producer_epoch,
                                                                    end.request.committed, epoch, tps))
                       for address, tps in leaders.items()]
            summary = {"producer_id": producer_id, "producer_epoch": producer_epoch, "committed": end.request.committed,
                       "coordinator_epoch": epoch}
        elif kind == "replay_end_txn":
            leaders = partitions_by_leader(produced, end.request.producer_id, end.request.producer_epoch)
            targets = [(end.address, "EndTxn", end.request)]
            summary = {"producer_id": end.request.producer_id, "producer_epoch": end.request.producer_epoch,
                       "committed": end.request.committed}
        else:
            if not produced:
                return
            first = next((s for s in produced if s.response is not None), produced[0])  # one the leader had
            leaders = {first.address: sorted((b.topic, b.partition) for b in first.request.batches)}
            targets = [(first.address, "Produce", first.request)]
            summary = produce_summary(first.request)
        partitions = sorted({tp for tps in leaders.values() for tp in tps})
        self.captured = Captured(txn, outcome, targets, partitions, {**summary, "partitions": partitions_text(partitions)})
        self.deliver_txn = txn + 1

    def deliver(self, txn: int) -> None:
        """Sends the captured copy (or, into the same transaction, its first
        Produce), records the replay, answers the order."""
        if self.order is None:
            return
        if self.captured is None:  # replay_produce into the same transaction
            produced, _ = self.transport.since(self.since) if self.transport is not None else ([], [])
            if not produced:
                return  # nothing was sent yet: capture again with the next transaction
            first = next((s for s in produced if s.response is not None), produced[0])
            self.captured = Captured(txn, "", [(first.address, "Produce", first.request)], [],
                                     produce_summary(first.request))
        answers = []
        for address, rpc, request in self.captured.targets:
            try:
                answers += [{"address": address, **a} for a in send(address, rpc, request)]
            except Exception as exc:  # noqa: BLE001 - a replay is best-effort; recorded, never raised
                answers.append({"address": address, "error": "REPLAY_FAILED", "message": repr(exc)[:200]})
        result = {"kind": self.order.kind, "seq": self.order.seq, "of_txn": self.captured.of_txn, "into_txn": txn,
                  "delay_s": self.order.delay_s, "into": self.order.into, "request": self.captured.summary,
                  "answers": answers, "delivered": delivered(answers)}
        self.history.record("replay", **result)
        write_done(self.directory, self.worker, self.order.seq, result)
        self.order, self.captured, self.capture_txn, self.deliver_txn = None, None, None, None


def produce_summary(request) -> dict:
    return {"batches": [{"partition": f"{b.topic}/{b.partition}", "producer_id": s.producer_id,
                         "producer_epoch": s.producer_epoch, "base_sequence": s.base_sequence, "records": s.record_count}
                        for b, s in ((b, batch_format.summary_of(b)) for b in request.batches)]}


def partitions_text(partitions: list[tuple[str, int]]) -> list[str]:
    return [f"{t}/{p}" for t, p in partitions]


def wait_done(directory: str | Path, worker: str, seq: int, timeout_s: float, stop: threading.Event) -> dict | None:
    """The worker's answer to an order, waiting up to ``timeout_s`` (or until ``stop``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = read_done(directory, worker, seq)
        if done is not None or time.monotonic() >= deadline or stop.wait(0.1):
            return done
