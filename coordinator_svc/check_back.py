"""The check-back, carried out: which prepared transactions are due a check
(check_rules.py decides), asking a registered checker of the group
(TransactionCheckService, served by the application), and applying its answer
through the coordinator like any request (write, then apply; the same fencing
as CompleteTransaction).

Bounds
------
- At most ``checks_in_flight_max`` checks at once per coordinator; the due ones
  beyond it wait for a later round, oldest due first. With the jitter of the
  due times, thousands of transactions stuck at once reach the application at
  that rate, not as a storm.
- One check per transactional id at a time.
- A check tries the group's registered checkers in a random order until one
  answers (an instance that is gone fails fast and the next is asked); only
  when none answers does it count as an attempt. An instance that refuses
  because it is at its own bound of concurrent checks (RESOURCE_EXHAUSTED)
  was reachable and decided nothing: if no other answered either, the check
  is not counted and goes again in a later round, so a busy application
  never sees its transactions' checks used up.
- A round costs what is due, not what is held: the prepared transactions come
  out of their partition's index of check times (LoadedPartition.checks) when
  their time comes; one not asked for a passing reason (a check of it in
  flight, its prepare still sealing, a transition in flight) goes back to be
  found again by a later round; one whose group has no checker waits
  unscheduled until a checker registers (LoadedPartition.unchecked).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import time
from collections.abc import Callable

import grpc

from coordinator_svc import check_rules as rules
from coordinator_svc.check_rules import CheckAnswer, GroupCheckConfig
from coordinator_svc.transaction_state import Handle, TransactionMetadata
from services.runtime.logs import fields
from txlog.protocol import names
from txlog.protocol.errors import TxlogError
from txlog.v1 import transaction_check_pb2, transaction_check_pb2_grpc

log = logging.getLogger(__name__)
ANSWERS = {
    transaction_check_pb2.TRANSACTION_CHECK_ANSWER_COMMIT: CheckAnswer.COMMIT,
    transaction_check_pb2.TRANSACTION_CHECK_ANSWER_ABORT: CheckAnswer.ABORT,
}  # anything else (UNKNOWN, UNSPECIFIED, a value this version does not know) is UNKNOWN
ANSWER_PROTOS = {
    CheckAnswer.COMMIT: transaction_check_pb2.TRANSACTION_CHECK_ANSWER_COMMIT,
    CheckAnswer.ABORT: transaction_check_pb2.TRANSACTION_CHECK_ANSWER_ABORT,
    CheckAnswer.UNKNOWN: transaction_check_pb2.TRANSACTION_CHECK_ANSWER_UNKNOWN,
}


class CheckBack:
    def __init__(self, coordinator, checks_in_flight_max: int, monotonic: Callable[[], float] = time.monotonic):
        self.coordinator = coordinator
        self.state = coordinator.state
        self.checks_in_flight_max = checks_in_flight_max
        self.monotonic = monotonic
        self.registrations = rules.CheckerRegistrations(shuffle=random.shuffle)  # spreads checks over a group's checkers
        self.in_flight: set[str] = set()
        # transactional id -> PrepareTransaction seals in progress: not checked meanwhile (its owner is not silent,
        # and what the check would complete must be sealed first)
        self.sealing: collections.Counter[str] = collections.Counter()
        self._queue: collections.deque = collections.deque()  # the last round's due checks not started yet
        self._groups_with_checkers: dict[str, bool] = {}

    # --- registrations ----------------------------------------------------------------------

    def register(self, group_id: str, address: str, lease_ms: int) -> int:
        names.check_transaction_group(group_id)
        rules.check_checker_address(address)
        lease_ms = rules.lease_of(lease_ms)
        loaded = self.state.loaded_partition(group_id)  # the group's coordinator only (NOT_COORDINATOR elsewhere)
        self.registrations.register(group_id, address, lease_ms, self.monotonic())
        self._groups_with_checkers.pop(group_id, None)
        loaded.schedule_unchecked(group_id)  # its checks that came due without a checker
        return lease_ms

    def unregister(self, group_id: str, address: str) -> None:
        names.check_transaction_group(group_id)
        rules.check_checker_address(address)
        self.state.loaded_partition(group_id)
        self.registrations.unregister(group_id, address)

    def checkers(self, group_id: str) -> list[tuple[str, int]]:
        return self.registrations.leases(group_id, self.monotonic())

    @contextlib.contextmanager
    def held_while_sealing(self, transactional_id: str):
        self.sealing[transactional_id] += 1
        try:
            yield
        finally:
            self.sealing[transactional_id] -= 1
            if not self.sealing[transactional_id]:
                del self.sealing[transactional_id]

    # --- the rounds -------------------------------------------------------------------------

    def describe(self, loaded, meta: TransactionMetadata) -> tuple[int, int, int]:
        """(checks done, last answer as TransactionCheckAnswer, next check time or -1) of a PREPARED transaction."""
        when = rules.shown_next_check_ms(meta, self.state.group_config(loaded, names.transaction_group(meta.transactional_id)))
        last = ANSWER_PROTOS[CheckAnswer.UNKNOWN] if meta.checks_done else transaction_check_pb2.TRANSACTION_CHECK_ANSWER_UNSPECIFIED
        return meta.checks_done, last, when

    async def check_due(self) -> None:
        """One round: takes the prepared transactions due a check (or an
        exhausted abort) out of the partitions' indexes, adds them to the ones
        the last round left waiting, oldest due first, and starts as many as
        the bound allows; the rest wait in the queue, and each check that ends
        starts the next, so the rate is the checks' own, not one bound's worth
        per round."""
        now = self.coordinator.clock_ms()
        due, next_round = [], []
        for loaded in list(self.state.partitions.values()):
            if not loaded.loaded or loaded.log.broken:
                continue
            # not stopped if the log breaks during the pass: the checks taken are skipped when started (_start_queued)
            async for meta in self.state.take_due(loaded, loaded.checks, now, stop_if_broken=False):
                tid = meta.transactional_id
                if meta.pending_state is not None:
                    next_round.append((loaded, meta))  # written or abandoned by then
                    continue
                group_id = names.transaction_group(tid)
                # read for each id, never kept across the pass's yields: a group's settings may change while others
                # run, and an id rescheduled by the new settings and judged by the old would come back due in this
                # round again, and again
                config = self.state.group_config(loaded, group_id)
                try:
                    when = rules.next_check_ms(meta, config)
                except Exception:  # a bug: the id must not leave the index with it
                    log.exception("working out a check time failed", extra=fields(transactional_id=tid))
                    next_round.append((loaded, meta))
                    continue
                if when is not None and when <= now:
                    due.append((when, tid, loaded, meta, group_id))
                else:
                    loaded.schedule(meta)  # moved on since
        for loaded, meta in next_round:
            self.state.reschedule(loaded, meta)
        waiting = {(d[2].index, d[1]): d for d in self._queue}
        waiting.update(((d[2].index, d[1]), d) for d in due)
        self._queue = collections.deque(sorted(waiting.values(), key=lambda d: d[:2]))
        self._groups_with_checkers = {}
        self._start_queued()

    def _start_queued(self) -> None:
        """Starts queued checks until the bound is reached; each is looked at
        again first (it may have been decided, moved or sealed since)."""
        now = self.coordinator.clock_ms()
        while self._queue and len(self.in_flight) < self.checks_in_flight_max:
            _, tid, loaded, meta, group_id = self._queue.popleft()
            if tid in self.in_flight or self.state.partitions.get(loaded.index) is not loaded \
                    or loaded.log.broken or loaded.transactions.get(tid) is not meta:
                continue  # in flight: rescheduled when it ends; unloaded or moved on: its index knows
            if self.sealing[tid] or meta.pending_state is not None:
                loaded.schedule(meta)  # a PrepareTransaction still sealing is not the owner's silence: a later round
                continue
            config = self.state.group_config(loaded, group_id)
            when = rules.next_check_ms(meta, config)
            if when is None or when > now:
                loaded.schedule(meta)  # moved on, or its settings changed, since it was queued
                continue
            handle = Handle(tid, meta.producer_id, meta.producer_epoch)
            if rules.exhausted(meta, config):
                work = self._carry_out(loaded, handle, lambda m, spare, h=handle, c=config: rules.decide_exhausted(m, h, c, spare), "exhausted")
            elif self._has_checkers(group_id):
                work = self._check(loaded, meta, handle, group_id, config)
            else:
                loaded.wait_for_checker(meta)  # no checker registered: nothing asked, nothing counted
                continue
            self.in_flight.add(tid)
            self.state.spawn(loaded, self._finally_done(loaded, meta, work))

    def _has_checkers(self, group_id: str) -> bool:
        """Whether the group has a live checker, asked once a round."""
        known = self._groups_with_checkers.get(group_id)
        if known is None:
            known = self._groups_with_checkers[group_id] = bool(self.registrations.live(group_id, self.monotonic()))
        return known

    async def _finally_done(self, loaded, meta: TransactionMetadata, work) -> None:
        try:
            await work
        finally:
            self.in_flight.discard(meta.transactional_id)
            self.state.reschedule(loaded, meta)  # a check that changed nothing (busy, refused) goes again in a later round
            self._start_queued()

    async def _check(self, loaded, meta: TransactionMetadata, handle: Handle, group_id: str, config: GroupCheckConfig) -> None:
        request = transaction_check_pb2.CheckTransactionRequest(
            transactional_id=handle.transactional_id, producer_id=handle.producer_id, producer_epoch=handle.producer_epoch,
            prepare_metadata=meta.prepare_metadata, group_id=group_id, attempt=meta.checks_done + 1,
            prepared_time_ms=meta.prepared_ms,
        )
        answer, asked, busy = CheckAnswer.UNKNOWN, None, False
        for address in self.registrations.live(group_id, self.monotonic()):
            stub = transaction_check_pb2_grpc.TransactionCheckServiceStub(self.coordinator.client.application_channel(address))
            try:
                reply = await stub.CheckTransaction(request, timeout=config.timeout_ms / 1000)
            except grpc.RpcError as exc:
                busy = busy or exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                log.info("a transaction checker did not answer", extra=fields(
                    group_id=group_id, address=address, transactional_id=handle.transactional_id, error=f"{exc.code().name}: {exc.details()}"))
                continue
            answer, asked = ANSWERS.get(reply.answer, CheckAnswer.UNKNOWN), address
            break
        if asked is None and busy:
            return  # not counted: asked again in a later round
        log.info("transaction checked back", extra=fields(
            transactional_id=handle.transactional_id, producer_id=handle.producer_id, producer_epoch=handle.producer_epoch,
            attempt=request.attempt, answer=answer.value, checker=asked or "none answered"))
        now = self.coordinator.clock_ms()
        await self._carry_out(loaded, handle, lambda m, spare: rules.decide_answer(m, handle, answer, config, now, spare), answer.value)

    async def _carry_out(self, loaded, handle: Handle, decide, what: str) -> None:
        try:
            await self.coordinator.carry_out(loaded, handle.transactional_id, decide)
        except TxlogError as exc:  # fenced, completed otherwise, the partition moved: the answer changes nothing
            log.info("a check-back answer changed nothing", extra=fields(
                transactional_id=handle.transactional_id, producer_epoch=handle.producer_epoch, answer=what, reason=str(exc)))

