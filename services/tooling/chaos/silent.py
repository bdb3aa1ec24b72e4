"""Silent owners: chaos transactions decided ONLY by transaction check-back
(issue 19, as RocketMQ checks back half messages).

A silent owner (``worker.py silent``) writes a transaction's records, then runs
its "local transaction": the decision (commit or abort, drawn at random before
the prepare) goes to its local store, ``DecisionLog`` (a JSON line, flushed and
fsynced), and only then does it prepare, with ``prepare_metadata`` naming the
decision's key. It never completes the transaction: each transaction has its
own transactional id (``transactional_id_of``), and the owner goes on with the
next one. The group's application (``worker.py checker``, a
``TransactionChecker``) answers the coordinator's checks from the store
(``Answers``): COMMIT or ABORT as recorded, UNKNOWN when it finds no record or
the record names another transactional id.

Guarantees
----------
* A decision is on disk before its transaction can be prepared, so every check
  of a prepared transaction finds it: an UNKNOWN answer means the store lost
  it, a check the store cannot place names a transaction no owner prepared
  (checker.py counts both).
* Answers come from durable state only: the same transaction checked again (a
  coordinator failover, a zombie coordinator) is answered the same way.
* Every check is a ``check`` history event, written before its answer goes out
  (``t`` is then a lower bound of when the coordinator can apply it).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from services.tooling.chaos.history import History, JsonLinesFile

GROUP = "chaos-silent"
DECISIONS_DIR = "decisions"
DECISIONS = ("commit", "abort")


def key_of(worker: str, txn: int) -> str:
    """The decision's key, which the prepare_metadata carries."""
    return f"{worker}/{txn}"


def transactional_id_of(worker: str, txn: int) -> str:
    """One transactional id per transaction: a new producer for the same id would abort the prepared one."""
    return f"{GROUP}/{worker}-{txn}"


class DecisionLog:
    """One owner's local store of decisions, written ahead of its prepares."""

    def __init__(self, directory: str | Path, worker: str):
        self._lines = JsonLinesFile(Path(directory) / DECISIONS_DIR, worker, durable=True)

    def record(self, key: str, transactional_id: str, decision: str) -> None:
        """Returns once the decision is on disk."""
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}, not {decision!r}")
        self._lines.append({"key": key, "transactional_id": transactional_id, "decision": decision})

    def close(self) -> None:
        self._lines.close()


class Decisions:
    """Every owner's decisions, read from their stores; a key not known yet
    makes it read what the stores gained since (thread-safe)."""

    def __init__(self, directory: str | Path):
        self.folder = Path(directory) / DECISIONS_DIR
        self._known: dict[str, dict] = {}
        self._read_to: dict[Path, int] = {}  # store -> bytes of whole lines read
        self._lock = threading.Lock()

    def lookup(self, key: str) -> dict | None:
        with self._lock:
            if key not in self._known:
                self._read_new()
            return self._known.get(key)

    def _read_new(self) -> None:
        for path in sorted(self.folder.glob("*.jsonl")):
            with open(path, "rb") as store:
                store.seek(self._read_to.get(path, 0))
                data = store.read()
            whole = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
            self._read_to[path] = self._read_to.get(path, 0) + len(whole)
            for line in whole.splitlines():
                record = json.loads(line)
                self._known[record["key"]] = record


class Answers:
    """The TransactionChecker's ``check`` for the silent owners' group."""

    def __init__(self, decisions: Decisions, history: History):
        self.decisions = decisions
        self.history = history

    def __call__(self, transactional_id: str, metadata: bytes) -> str:
        received_s = time.time()
        key = metadata.decode(errors="replace")
        record = self.decisions.lookup(key)
        if record is None or record["transactional_id"] != transactional_id:
            answer = "UNKNOWN"
        else:
            answer = record["decision"].upper()
        self.history.record("check", transactional_id=transactional_id, key=key, answer=answer, received=received_s,
                            found=record is not None)
        return answer
