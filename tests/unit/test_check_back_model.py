"""Transaction check-back (issue 19) against the reference model: rounds of the
REAL check-back (``CheckBack.check_due``: which prepared transactions are due,
asking the group's checker, applying its answer) among late, duplicated and
reordered answers, the owner completing meanwhile, a new producer fencing the
prepared transaction, the group's settings changing and its checker coming and
going.

The harness (the real TransactionCoordinator with fakes of its I/O), the model
of Transactions V2 and the checker of its guarantees are test_coordinator_model.py's;
this machine only chooses steps that reach the check-back (prepared
transactions, time moving in steps around the check interval, rounds of checks),
which that machine's many other rules seldom line up.

Guarantees checked after every step, besides the coordinator model's (every
durable transition an edge of the TV2 table, a decided outcome never flips,
nothing fenced answered OK or committed):
- a prepared transaction is checked one interval (plus a jitter of at most a
  tenth) after its prepare or its last check, the checker asked about its
  current handle and prepare time with the next attempt number (1, 2, ...);
  never without a registered checker, never once its checks are exhausted under
  the keep policy;
- COMMIT and ABORT act exactly as CompleteTransaction with that handle; UNKNOWN
  counts one attempt durably (Prepared -> Prepared) only about the prepared
  handle, and the attempt reaching the group's maximum aborts under the abort
  policy; checks exhausted by a lowered maximum are aborted at the next round,
  checker or not.

Runs with ``derandomize=True``: a failure replays identically.
"""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule, run_state_machine_as_test
from test_coordinator_model import (
    CHECK_INTERVAL_MS,
    MODEL_SETTINGS,
    TIDS,
    Clients,
    Harness,
    Req,
    S,
    add,
    check,
    complete,
    init,
    prepare,
)

from coordinator_svc.check_rules import JITTER_FRACTION

ANSWERS = ("UNKNOWN", "COMMIT", "ABORT")  # the first is drawn most: the one that counts attempts
# Time a round of checks moves first: the interval and its largest jitter (due for sure, and not a ms early),
# none, or half the interval (twice: exactly the interval, where the jitter decides).
CHECK_ROUND_TICKS_MS = (CHECK_INTERVAL_MS + CHECK_INTERVAL_MS // JITTER_FRACTION, 0, CHECK_INTERVAL_MS // 2)


class CheckBackMachine(Clients):
    """Prepared transactions, rounds of the real check-back and stray answers, checked against the model after every step."""

    @initialize()
    def both_ids_prepared(self):
        """Every run starts with a silent owner's prepared transaction on each id."""
        for tid in TIDS:
            self._send(init(tid))
            self._send(add(tid, *self.clients[tid]))
            self._send(prepare(tid, *self.clients[tid]))

    @rule(tid=st.sampled_from(TIDS))
    def new_producer(self, tid):
        """A producer for the id; a new one fences (and aborts) the prepared transaction of the one before."""
        self._send(init(tid))

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def prepare_transaction(self, data):
        """The live producer writes to a partition and prepares; then it goes silent."""
        self._prepare(*self._client(data))

    @rule(tid=st.sampled_from(TIDS))
    def new_incarnation_prepares(self, tid):
        """A new producer fences the prepared transaction (its first init answered CONCURRENT_TRANSACTIONS
        while the abort is decided) and prepares one of its own: the old handle is then stale, not gone."""
        if self._send(init(tid))[0] != "ok":
            self._send(init(tid))
        if tid in self.clients:
            self._prepare(tid, *self.clients[tid])

    def _prepare(self, tid, pid, epoch):
        self._send(add(tid, pid, epoch))
        if self.clients.get(tid) == (pid, epoch):
            self._send(prepare(tid, pid, epoch))

    @rule(answer=st.sampled_from(ANSWERS), ms=st.sampled_from(CHECK_ROUND_TICKS_MS))
    def round_of_checks(self, answer, ms):
        """Time moves ``ms``, then a round of the real check-back; the checker answers ``answer``."""
        self.h.tick(ms)
        self._send(Req("checks_due", answer=answer))

    @rule(ms=st.sampled_from(CHECK_ROUND_TICKS_MS))
    def round_of_undecided_checks(self, ms):
        """As round_of_checks, the checker not knowing: attempts are counted up to the maximum (drawn as often as the others)."""
        self.round_of_checks("UNKNOWN", ms)

    @precondition(lambda self: self.handles or self.clients)
    @rule(data=st.data(), answer=st.sampled_from(ANSWERS))
    def check_answered(self, data, answer):
        """An answer about a handle, the prepared one or an old one (late, duplicated, about a fenced transaction)."""
        self._send(check(self._handle(data), answer))

    @precondition(lambda self: self.handles or self.clients)
    @rule(data=st.data(), committed=st.booleans())
    def owner_completes(self, data, committed):
        """Whoever holds a handle completes it, before, between or after the checks."""
        self._send(complete(self._handle(data), committed))

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def replay_earlier_request(self, data):
        self._send(data.draw(st.sampled_from(self.history[::-1]), label="replayed"), replayed=True)

    @precondition(lambda self: not self.h.holding and (self.handles or self.clients))
    @rule(data=st.data(), answers=st.lists(st.sampled_from(ANSWERS + ("complete",)), min_size=2, max_size=2))
    def two_answers_at_once(self, data, answers):
        """Two answers (or an answer and the owner's commit) about handles of the same ids, in flight together."""
        requests = []
        for answer in answers:
            handle = self._handle(data)
            requests.append(complete(handle, True) if answer == "complete" else check(handle, answer))
        for r in requests:
            self._remember(r)
        self.checker.send_together(requests)

    @rule(ms=st.sampled_from([400, 1_100, 3_500]))
    def time_passes(self, ms):
        """Time moves, and the prepared timeout aborts what is past it."""
        self.h.tick(ms)
        self._send(Req("timeouts"))

    @rule(check_max=st.sampled_from([1, 2, 3, 5]), keep=st.booleans())
    def alter_check_settings(self, check_max, keep):
        self._send(Req("settings", check_max=check_max, keep=keep))

    @precondition(lambda self: self._counts())
    @rule()
    def operator_lowers_the_maximum(self):
        """transaction.check.max lowered to what a prepared transaction was checked already (abort policy):
        its checks are exhausted, and the next round aborts it without asking."""
        self._send(Req("settings", check_max=min(self._counts()), keep=False))

    def _counts(self) -> list[int]:
        """The check counts of the prepared transactions checked at least once."""
        return [meta.checks_done for tid in TIDS if (meta := self.h.meta(tid)) is not None and meta.state is S.PREPARED and meta.checks_done]

    @rule(registered=st.booleans())
    def checker_registration(self, registered):
        self._send(Req("register" if registered else "unregister"))

    @rule()
    def hold_markers(self):
        """Markers wait for their acknowledgement: a decided transaction stays completing meanwhile."""
        self.checker.hold(markers=True)

    @precondition(lambda self: self.h.holding)
    @rule()
    def release_completions(self):
        self.checker.release()


CHECK_BACK_SETTINGS = settings(MODEL_SETTINGS, max_examples=120, stateful_step_count=30)  # derandomized as the coordinator model


def test_the_check_back_follows_the_model_under_late_duplicated_and_reordered_answers():
    run_state_machine_as_test(CheckBackMachine, settings=CHECK_BACK_SETTINGS)


# --- examples -------------------------------------------------------------------------------------


def test_a_prepare_still_sealing_is_not_checked_back():
    """Found by the chaos run's silent owner: a leader paused while PrepareTransaction sealed the
    transaction's partitions kept the seal going past the check interval; the check-back committed
    the transaction (bumping the epoch) before the seal was in place, and the owner's prepare
    answered PRODUCER_FENCED. A prepare still sealing is not its owner's silence."""
    h = Harness()
    try:
        sealing, released = [], asyncio.Event()
        write_all = h.markers.write_all

        async def held_seal(transactions, committed, coordinator_epoch, *, seal_prepared=False):
            if seal_prepared:
                sealing.append(transactions)
                await released.wait()
            await write_all(transactions, committed, coordinator_epoch, seal_prepared=seal_prepared)
        h.markers.write_all = held_seal
        tid = TIDS[0]
        pid, epoch = h.send(init(tid))[1]
        assert h.send(add(tid, pid, epoch))[0] == "ok"
        h.checker.answer = "COMMIT"

        async def go():
            preparing = asyncio.ensure_future(h.call(prepare(tid, pid, epoch)))
            while not sealing:
                await asyncio.sleep(0)
            assert h.meta(tid).state is S.PREPARED  # durable, sealing
            h.tick(10 * CHECK_INTERVAL_MS)
            await h.coordinator.check_back.check_due()
            await h.settle()
            assert h.checker.asked == [] and h.meta(tid).state is S.PREPARED and not preparing.done()
            released.set()
            return await preparing
        assert h.loop.run_until_complete(go())[0] == "ok"  # the owner gets its handle
        h.send(Req("checks_due", answer="COMMIT"))  # silent from now on: checked, and committed
        assert [r.producer_epoch for r in h.checker.asked] == [epoch] and h.meta(tid).state is S.COMPLETE_COMMIT
    finally:
        h.close()
