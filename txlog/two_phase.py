"""The exactly-once protocol of a job whose tasks write in parallel and commit
as one: the Spark data source (spark_jobs/writing.py) and consume-transform-
produce runs (spark_jobs/eos.py) follow it, and so can a client in any language
(docs/guides/other-languages.md, "Writing a client").

A write under transaction group P gets a run id R (:func:`new_run_id`). Each
task attempt writes in its own transaction, transactional id
``P/R.p<task partition>.t<task attempt>`` (:func:`task_transactional_id`;
unique per attempt, so a speculative copy never fences the attempt that wins)
and prepares it. Then :class:`GroupWrite`:

1. ``abort_earlier_runs``: aborts what earlier runs of P left undecided (a
   driver killed between its tasks' prepares and its group commit). The
   coordinator refuses to abort one a group decision committed.
2. ``commit(handles)``: aborts every other undecided transaction of run R
   (failed attempts, losing speculative copies) and waits until none of them
   is open or completing: one still open would hold its partitions' last
   stable offset below the commit's records, so read_committed readers would
   see some of the commit before the rest. Then it commits exactly ``handles``
   in one CommitTransactionGroup of P.
3. ``abort()``: aborts every undecided transaction of run R.

Prepared transactions are aborted by their handle; Ongoing ones by a new
producer with the id (InitProducerId), which fences the attempt still writing.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable

from txlog.admin import Admin
from txlog.errors import InvalidTxnStateError, ProducerFencedError
from txlog.producer import Producer
from txlog.protocol import OPEN_TRANSACTION_STATES, TransactionState
from txlog.protocol.retry import RetryPolicy
from txlog.structs import TransactionHandle, TransactionListing

log = logging.getLogger(__name__)

# What a run leaves undecided: Ongoing (an attempt died while writing) and Prepared
# (nobody committed it). Prepare* and Complete* are decided already.
UNDECIDED = (TransactionState.ONGOING, TransactionState.PREPARED)
SETTLE_TIMEOUT_S = 120.0
# How often the settled state is asked again: soon at first, then every second at most.
SETTLE_POLL = RetryPolicy(attempts_max=1 << 30, backoff_initial_ms=50, backoff_max_ms=1000, jitter=0.1)


def new_run_id() -> str:
    """Unique per write: milliseconds since the epoch (runs sort by age) and randomness."""
    return f"r{int(time.time() * 1000)}-{os.urandom(3).hex()}"


def task_transactional_id(prefix: str, run: str, task_partition: int, task_attempt_id: int) -> str:
    return f"{prefix}/{run}.p{task_partition}.t{task_attempt_id}"


def task_id_pattern(prefix: str) -> re.Pattern:
    """Matches the transactional ids of every run's tasks under ``prefix``; group 1 is the run."""
    return re.compile(re.escape(prefix) + r"/(r\d+-[0-9a-f]+)\.p\d+\.t\d+")


def wait_until(done: Callable[[], bool], timeout_s: float, what: str, policy: RetryPolicy = SETTLE_POLL) -> None:
    """Asks ``done()`` again, backing off as ``policy`` says, until it is true;
    TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while not done():
        attempt += 1
        delay_s = policy.delay_ms(attempt) / 1000
        if time.monotonic() + delay_s > deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f} s")
        time.sleep(delay_s)


class GroupWrite:
    """The task transactions of one run of ``prefix`` (``run`` None: of every
    run, for a writer that commits one run at a time and owns the prefix, as a
    streaming query's sink does)."""

    def __init__(self, admin: Admin, bootstrap: str, prefix: str, run: str | None):
        self.admin = admin
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.run = run
        self.pattern = task_id_pattern(prefix)

    def _of_run(self, states: Iterable[TransactionState], keep: set[str]) -> list[TransactionListing]:
        listed = f"{self.prefix}/{self.run}." if self.run is not None else f"{self.prefix}/"
        return [t for t in self.admin.list_transactions(states=[s.value for s in states], prefix=listed)
                if self.pattern.fullmatch(t.transactional_id) and t.transactional_id not in keep]

    def abort_earlier_runs(self) -> list[str]:
        """Aborts the undecided task transactions of every run of the prefix but this one."""
        if self.run is None:
            raise ValueError("abort_earlier_runs needs the run that is not earlier; abort() takes every run")
        listings = []
        for t in self.admin.list_transactions(states=[s.value for s in UNDECIDED], prefix=f"{self.prefix}/"):
            matched = self.pattern.fullmatch(t.transactional_id)
            if matched and matched.group(1) != self.run:
                listings.append(t)
        aborted = abort_undecided(self.admin, self.bootstrap, listings)
        if aborted:
            log.warning("aborted %d undecided transactions of earlier runs of %s: %s", len(aborted), self.prefix, aborted)
        return aborted

    def abort(self, keep: set[str] = frozenset()) -> list[str]:
        """Aborts every undecided transaction of this run but those in ``keep``."""
        return abort_undecided(self.admin, self.bootstrap, self._of_run(UNDECIDED, keep))

    def abort_others_settled(self, keep: set[str], timeout_s: float = SETTLE_TIMEOUT_S) -> list[str]:
        """Aborts every transaction of this run outside ``keep`` and waits until
        none is open or completing (an abort returns once it is decided; its
        markers follow). One a late attempt opens meanwhile is aborted the next
        time round."""
        aborted: list[str] = []

        def settled() -> bool:  # one listing a round: abort the undecided, and go on while anything is open
            still_open = self._of_run(OPEN_TRANSACTION_STATES, keep)
            aborted.extend(abort_undecided(self.admin, self.bootstrap,
                                           [t for t in still_open if TransactionState(t.state) in UNDECIDED]))
            return not still_open

        whose = f"run {self.run} of {self.prefix!r}" if self.run is not None else f"{self.prefix!r}"
        wait_until(settled, timeout_s, f"transactions of {whose} were still open or completing; the write is not committed")
        return aborted

    def commit(self, handles: list[TransactionHandle], timeout_s: float = SETTLE_TIMEOUT_S) -> list[str]:
        """Commits exactly ``handles`` as one, once every other transaction of
        the run is aborted and settled; returns the ids it aborted. No handle
        (every task of the write was empty): nothing is committed."""
        aborted = self.abort_others_settled({h.transactional_id for h in handles}, timeout_s)
        if handles:
            self.admin.commit_transaction_group(self.prefix, handles)
        return aborted


def abort_undecided(admin: Admin, bootstrap: str, listings: Iterable[TransactionListing]) -> list[str]:
    """Prepared ones by their handle; Ongoing ones by a new producer with the id,
    which fences the attempt still writing (if any) and aborts its transaction.
    One a group decision committed meanwhile stays committed."""
    aborted = []
    for listing in listings:
        try:
            if TransactionState(listing.state) is TransactionState.PREPARED:
                admin.complete_transaction(listing.handle, False)
            else:
                with Producer(bootstrap, transactional_id=listing.transactional_id, **admin.tls_options) as producer:
                    producer.init_transactions()
            aborted.append(listing.transactional_id)
        except InvalidTxnStateError as exc:  # decided as committed: that is its outcome
            log.info("%s was committed meanwhile: %s", listing.transactional_id, exc)
        except ProducerFencedError:  # someone else ended it already
            pass
    return aborted
