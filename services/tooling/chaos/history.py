"""The client-side history of a chaos run: what every worker process asked for and
what it was answered, as JSON lines, one file per worker (``DIR/history/<worker>.jsonl``).

Guarantees
----------
* A line is written (and flushed) before the call it describes is made
  (``send``, ``commit_start``, ``abort_start``) or right after its answer came
  (``ack``, ``send_failed``, ``end``, ``poll``), so a worker killed at any point
  leaves a history the checker can read: a transaction without ``end`` is
  indefinite. A torn last line (the process died mid-write) is skipped.
* Every record value names its transaction: ``{"w": worker, "t": txn number,
  "i": index in the transaction, "u": unique id}`` (a consume-transform-produce
  record adds ``"src"``, the unique id of the input record it came from).

Events (``type``; every event also has ``worker`` and ``t``, the wall clock in
seconds, shared by the processes of one machine):

    begin          txn, instance (the producer object's number), intent: commit|abort [, transactional_id]
    send           txn, idx, uid, topic, partition [, src, src_topic, src_partition, src_offset]
    ack            txn, idx, uid, topic, partition, offset
    send_failed    txn, idx, uid, error
    offsets        txn, offsets {"topic/partition": next offset}
    commit_start   txn
    abort_start    txn
    end            txn, outcome: committed|aborted|indefinite, error [, via: check-back]
    decide         txn, key, transactional_id, decision: commit|abort (a silent owner's local transaction,
                   on disk in its decision store before the prepare; silent.py)
    prepared       txn, producer_id, producer_epoch (a silent owner's prepare_transaction() returned)
    check          transactional_id, key (the prepare_metadata), answer: COMMIT|ABORT|UNKNOWN, received,
                   found (the checker's decision store had the key); written before the answer goes out
    checker_started / checker_start_failed / checker_stats   the silent owners' TransactionChecker
    poll           isolation, session, t0, records [[topic, partition, offset, uid], ...]
    stats          requests_dropped, responses_dropped (connection cuts so far)
    replay_order   seq, kind, delay_s, into (a producer worker took the nemesis's order)
    replay         kind (REPLAY_KINDS), seq, of_txn (whose request), into_txn (the transaction open
                   when the copy was delivered), delay_s, into: same|next, request (what was
                   replayed), answers [{address, error (code name, NONE: accepted), ...}], delivered
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

HISTORY_DIR = "history"
REPLAY_KINDS = ("replay_marker", "replay_end_txn", "replay_produce")  # see replay.py


def encode_value(worker: str, txn: int, idx: int, uid: str, src: str | None = None) -> bytes:
    value = {"w": worker, "t": txn, "i": idx, "u": uid}
    if src is not None:
        value["src"] = src
    return json.dumps(value, separators=(",", ":")).encode()


def decode_uid(value: bytes | None) -> str | None:
    """The unique id a record value carries; None for a value no worker wrote."""
    try:
        return json.loads(value)["u"]
    except (TypeError, ValueError, KeyError):
        return None


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


class JsonLinesFile:
    """One worker's file of JSON lines, appended to; thread-safe. ``durable``:
    a line is on disk (fsynced) when append() returns."""

    def __init__(self, folder: Path, worker: str, durable: bool = False):
        folder.mkdir(parents=True, exist_ok=True)
        self._file = open(folder / f"{worker}.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._durable = durable
        self._lock = threading.Lock()

    def append(self, value: dict) -> None:
        line = json.dumps(value, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            if self._durable:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()


class History:
    """Appends one worker's events to its file; thread-safe (a producer's
    delivery callbacks run on its I/O thread)."""

    def __init__(self, directory: str | Path, worker: str):
        self.worker = worker
        self._lines = JsonLinesFile(Path(directory) / HISTORY_DIR, worker)

    def record(self, event_type: str, **fields) -> None:
        self._lines.append({"type": event_type, "worker": self.worker, "t": time.time(), **fields})

    def close(self) -> None:
        self._lines.close()


def read_events(directory: str | Path) -> list[dict]:
    """Every worker's events, file by file, in the order each worker wrote them."""
    events = []
    for path in sorted((Path(directory) / HISTORY_DIR).glob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:  # the last line of a process that died mid-write
                    continue
    return events
