"""Per-partition sequence numbers, in-flight window and retry order of one
producer: the pure state machine behind the sender (no I/O, no clock: time is
passed in).

Guarantees (idempotent mode)
----------------------------
* Sequence numbers are assigned in drain order, contiguously per partition, as
  int32 wrapping to 0 after 2^31-1; at most ``max_in_flight`` batches of a
  partition are in flight.
* A batch is only ever re-sent with the producer id, epoch and sequence it was
  first sent with, so a re-send of an appended batch is answered as a duplicate
  (its original offsets, or DUPLICATE_SEQUENCE) and never appended twice.
* Re-sends go out in sequence order, one at a time: a batch waiting for a retry
  is sent only when it holds the lowest unresolved sequence of its partition.
  New batches wait while any batch of the partition waits for a retry. So
  every record is appended exactly once and in ``send()`` order.
* A batch the leader rejected with OUT_OF_ORDER_SEQUENCE / UNKNOWN_PRODUCER_ID
  while an earlier batch of the partition is unresolved is retried (the earlier
  one may fill the gap). Rejected with no earlier batch unresolved, the gap is
  real (an earlier batch failed): the batch is HELD -- the leader never appended
  it (a leader appends only the next sequence, and the sequences below it will
  never be sent again) -- and the partition is *broken*. Once every partition is
  quiescent the sender bumps the producer epoch (or takes a new producer id)
  and :meth:`PartitionSequences.reset` gives the held batches new sequences
  from 0, in their old order (KIP-360).

State Transitions (of a batch; ``BatchState`` in accumulator.py)
------------------------------------------------------------------
* QUEUED -> IN_FLIGHT: ``assign`` (a new batch drained from the accumulator).
* IN_FLIGHT -> DONE: ``on_acked`` (success or duplicate) or ``on_failed``.
* IN_FLIGHT -> AWAITING_RETRY: ``on_retriable``; ``on_rejected`` with an earlier
  batch unresolved.
* IN_FLIGHT | AWAITING_RETRY -> HELD: ``on_rejected`` with no earlier batch
  unresolved; any failure of a batch behind a HELD or failed-unappended one.
* AWAITING_RETRY -> IN_FLIGHT: ``mark_resent`` (head of the partition, back-off over).
* HELD -> AWAITING_RETRY: ``reset`` (new producer id, new sequence).
* AWAITING_RETRY | HELD -> DONE: ``expire`` (delivery timeout); ``abort_unsent``
  (the transaction aborts).

In non-idempotent mode there are no sequences: retries are re-sent as soon as
their back-off passes and may be reordered or duplicated (Kafka's behaviour
without idempotence).
"""

from __future__ import annotations

from txlog.accumulator import BatchState, ProducerBatch
from txlog.protocol import next_sequence
from txlog.structs import TopicPartition


class IllegalStateError(RuntimeError):
    """A transition the state machine forbids: a bug in the sender, never an outcome."""


_LEGAL_PREVIOUS: dict[BatchState, frozenset[BatchState]] = {
    BatchState.QUEUED: frozenset(),
    BatchState.IN_FLIGHT: frozenset({BatchState.QUEUED, BatchState.AWAITING_RETRY}),
    BatchState.AWAITING_RETRY: frozenset({BatchState.IN_FLIGHT, BatchState.HELD}),
    BatchState.HELD: frozenset({BatchState.IN_FLIGHT, BatchState.AWAITING_RETRY}),
    BatchState.DONE: frozenset({BatchState.IN_FLIGHT, BatchState.AWAITING_RETRY, BatchState.HELD}),
}


class PartitionSequences:
    """One partition's sequenced, unresolved batches (in sequence order)."""

    def __init__(self, tp: TopicPartition, *, idempotent: bool, max_in_flight: int):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.tp = tp
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight
        self.next_sequence = 0
        self.broken = False
        self._unresolved: list[ProducerBatch] = []
        self._next_order = 0
        # Order of the first batch known never to be appended under the current
        # producer id (HELD, or failed after a definite rejection): every batch
        # after it can never be appended under this id either.
        self._barrier_order: int | None = None

    # --- queries ---------------------------------------------------------------------

    @property
    def unresolved(self) -> list[ProducerBatch]:
        return list(self._unresolved)

    def in_flight_count(self) -> int:
        return sum(1 for b in self._unresolved if b.state is BatchState.IN_FLIGHT)

    def quiescent(self) -> bool:
        """Nothing in flight and nothing waiting to be re-sent (HELD batches may remain)."""
        return all(b.state is BatchState.HELD for b in self._unresolved)

    def can_send_new(self) -> bool:
        if self.idempotent and self.broken:
            return False
        if any(b.state in (BatchState.AWAITING_RETRY, BatchState.HELD) for b in self._unresolved):
            return False
        return self.in_flight_count() < self.max_in_flight

    def next_resend(self, now_ms: float) -> ProducerBatch | None:
        """The batch to re-send now, if any (idempotent: only the head of the partition)."""
        candidate = self._resend_candidate()
        if candidate is not None and candidate.retry_at_ms <= now_ms:
            return candidate
        return None

    def next_retry_at_ms(self) -> float | None:
        candidate = self._resend_candidate()
        return None if candidate is None else candidate.retry_at_ms

    def _resend_candidate(self) -> ProducerBatch | None:
        if self.idempotent:
            head = self._unresolved[0] if self._unresolved else None
            return head if head is not None and head.state is BatchState.AWAITING_RETRY else None
        waiting = [b for b in self._unresolved if b.state is BatchState.AWAITING_RETRY]
        return min(waiting, key=lambda b: b.retry_at_ms) if waiting else None

    # --- transitions ------------------------------------------------------------------

    def _transition(self, batch: ProducerBatch, state: BatchState) -> None:
        if batch.state not in _LEGAL_PREVIOUS[state]:
            raise IllegalStateError(f"batch of {self.tp} cannot go from {batch.state.name} to {state.name}")
        batch.state = state

    def _index(self, batch: ProducerBatch) -> int:
        for index, candidate in enumerate(self._unresolved):
            if candidate is batch:
                return index
        raise IllegalStateError(f"batch of {self.tp} is not unresolved here")

    def assign(self, batch: ProducerBatch, producer_id: int, producer_epoch: int) -> None:
        """A new batch goes out: it gets the next sequence (idempotent) and counts
        against the in-flight window."""
        if not self.can_send_new():
            raise IllegalStateError(f"{self.tp} cannot take a new batch now")
        if self.idempotent:
            batch.producer_id, batch.producer_epoch = producer_id, producer_epoch
            batch.base_sequence = self.next_sequence
            self.next_sequence = next_sequence(self.next_sequence, batch.record_count)
        batch.order = self._next_order
        self._next_order += 1
        self._transition(batch, BatchState.IN_FLIGHT)
        batch.attempts = 1
        self._unresolved.append(batch)

    def mark_resent(self, batch: ProducerBatch) -> None:
        if batch is not self._resend_candidate():
            raise IllegalStateError(f"batch of {self.tp} is not the next to re-send")
        self._transition(batch, BatchState.IN_FLIGHT)
        batch.attempts += 1

    def on_acked(self, batch: ProducerBatch) -> None:
        """The leader has the batch (appended now or by an earlier attempt)."""
        self._unresolved.pop(self._index(batch))
        self._transition(batch, BatchState.DONE)

    def on_retriable(self, batch: ProducerBatch, now_ms: float, backoff_ms: float) -> None:
        """The attempt failed and may or may not have been appended: re-send later."""
        if self._behind_barrier(batch):
            self._hold(batch)
            return
        self._transition(batch, BatchState.AWAITING_RETRY)
        batch.retry_at_ms = now_ms + backoff_ms

    def on_rejected(self, batch: ProducerBatch, now_ms: float, backoff_ms: float) -> None:
        """OUT_OF_ORDER_SEQUENCE or UNKNOWN_PRODUCER_ID: this attempt was not appended."""
        if not self.idempotent:
            raise IllegalStateError(f"a sequence rejection for {self.tp} without idempotence")
        if self._behind_barrier(batch):
            self._hold(batch)
        elif self._index(batch) > 0:  # an earlier batch is unresolved and may fill the gap
            self._transition(batch, BatchState.AWAITING_RETRY)
            batch.retry_at_ms = now_ms + backoff_ms
        else:
            self._hold(batch)

    def on_failed(self, batch: ProducerBatch, *, maybe_appended: bool) -> None:
        """The batch's futures fail. Its sequence leaves a gap (unless it was
        appended after all): the partition needs a new producer id."""
        self._unresolved.pop(self._index(batch))
        self._transition(batch, BatchState.DONE)
        if not self.idempotent:
            return
        self.broken = True
        if not maybe_appended:
            self._raise_barrier(batch.order)

    def expire(self, now_ms: float, delivery_timeout_ms: float) -> list[tuple[ProducerBatch, bool]]:
        """Removes the batches waiting (to be re-sent, or held) past their delivery
        timeout; returns them with ``maybe_appended``."""
        expired = []
        for batch in list(self._unresolved):
            if batch.state in (BatchState.AWAITING_RETRY, BatchState.HELD) \
                    and now_ms - batch.created_ms >= delivery_timeout_ms:
                maybe_appended = batch.state is BatchState.AWAITING_RETRY
                self.on_failed(batch, maybe_appended=maybe_appended)
                expired.append((batch, maybe_appended))
        return expired

    def reset(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id: the held batches get new sequences from 0, in order."""
        if not self.quiescent():
            raise IllegalStateError(f"{self.tp} cannot reset with batches in flight or awaiting retry")
        self.next_sequence = 0
        for batch in self._unresolved:
            if self.idempotent:
                batch.producer_id, batch.producer_epoch = producer_id, producer_epoch
                batch.base_sequence = self.next_sequence
                self.next_sequence = next_sequence(self.next_sequence, batch.record_count)
            self._transition(batch, BatchState.AWAITING_RETRY)
            batch.retry_at_ms = 0.0
        self.broken = False
        self._barrier_order = None

    def abort_unsent(self) -> list[ProducerBatch]:
        """Removes every unresolved batch that is not in flight (its transaction
        is aborting); the caller fails them. In-flight batches stay until answered."""
        kept, dropped = [], []
        for batch in self._unresolved:
            (kept if batch.state is BatchState.IN_FLIGHT else dropped).append(batch)
        self._unresolved = kept
        for batch in dropped:
            self._transition(batch, BatchState.DONE)
        return dropped

    def abort_all(self) -> list[ProducerBatch]:
        """Removes every unresolved batch (a forced close); the caller fails them."""
        batches, self._unresolved = self._unresolved, []
        for batch in batches:
            if batch.state is not BatchState.DONE:
                batch.state = BatchState.DONE
        return batches

    # --- helpers ------------------------------------------------------------------------

    def _behind_barrier(self, batch: ProducerBatch) -> bool:
        return self._barrier_order is not None and batch.order > self._barrier_order

    def _raise_barrier(self, order: int) -> None:
        self._barrier_order = order if self._barrier_order is None else min(self._barrier_order, order)
        for other in self._unresolved:
            if other.order > order and other.state is BatchState.AWAITING_RETRY:
                self._transition(other, BatchState.HELD)

    def _hold(self, batch: ProducerBatch) -> None:
        self._transition(batch, BatchState.HELD)
        self.broken = True
        self._raise_barrier(batch.order)
