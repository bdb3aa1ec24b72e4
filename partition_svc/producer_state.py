"""Per (producer id, partition) state and the idempotent-append rules: pure, no I/O.

The leader keeps, for each producer that wrote to a partition, its epoch and the
sequence ranges and offsets of its last 5 batches. A batch is checked against it
before it gets offsets; the rules, in order (docs/design.md, "Idempotent produce"):

1. Same epoch and a sequence range equal to one of the 5 cached: a duplicate.
   Answer success with the original offsets; append nothing.
2. Epoch lower than known: PRODUCER_FENCED (transactional) or INVALID_PRODUCER_EPOCH.
3. Epoch higher than known: the sequence must be 0, else OUT_OF_ORDER_SEQUENCE.
   Unknown producer with a sequence other than 0: UNKNOWN_PRODUCER_ID.
4. Same epoch: the sequence must be last + 1 (int32, wrapping to 0 after
   2^31 - 1), else OUT_OF_ORDER_SEQUENCE; a batch whose whole range lies at or
   behind the last sequence and is not cached is a duplicate older than the
   cache: DUPLICATE_SEQUENCE, not appended. A batch that starts behind the last
   sequence and ends past it was never appended whole: OUT_OF_ORDER_SEQUENCE.

Transactions (checked after the duplicate and fencing rules):

5. While the producer has a transaction open on the partition, its batches
   must be transactional and of that transaction's epoch: a plain batch, or one
   of a newer epoch before the open transaction's marker, is INVALID_TXN_STATE.
   (An open transaction is therefore always at the entry's epoch, which is what
   lets a marker compare its epoch with the entry's alone.)
6. Once the transaction is prepared here (the coordinator's seal after
   PrepareTransaction), nothing more of its epoch is taken: INVALID_TXN_STATE.

Outcomes are values (Append, Duplicate, Reject), never exceptions.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field, replace

from txlog.protocol import NO_SEQUENCE, is_behind, last_sequence_of, next_sequence
from txlog.protocol.errors import ErrorCode

DUPLICATE_CACHE_BATCHES = 5
NO_OFFSET = -1


@dataclass(frozen=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass(frozen=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int
    batches: tuple[BatchMetadata, ...] = ()  # oldest first, at most DUPLICATE_CACHE_BATCHES
    last_timestamp_ms: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = NO_OFFSET
    # The transaction at producer_epoch was prepared (sealed by its coordinator): it takes nothing more here.
    txn_prepared: bool = False
    # This replica's clock when it last appended a batch of the producer (-1: never, or before it was kept).
    # Expiry counts from it, not from last_timestamp_ms: that is the producer's clock, and a producer
    # re-publishing old events would otherwise lose its state, and with it its duplicate detection, at once.
    appended_ms: int = field(default=-1, compare=False)  # each replica's own clock: not part of the replicated state

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    @property
    def has_open_transaction(self) -> bool:
        return self.current_txn_first_offset >= 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "pid": self.producer_id,
                "epoch": self.producer_epoch,
                "batches": [[b.first_sequence, b.last_sequence, b.base_offset, b.last_offset, b.timestamp_ms] for b in self.batches],
                "ts": self.last_timestamp_ms,
                "coord_epoch": self.coordinator_epoch,
                "txn_first": self.current_txn_first_offset,
                "prepared": self.txn_prepared,
                "appended": self.appended_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ProducerStateEntry:
        raw = json.loads(data)
        return cls(
            producer_id=raw["pid"],
            producer_epoch=raw["epoch"],
            batches=tuple(BatchMetadata(*b) for b in raw["batches"]),
            last_timestamp_ms=raw["ts"],
            coordinator_epoch=raw["coord_epoch"],
            current_txn_first_offset=raw["txn_first"],
            txn_prepared=raw.get("prepared", False),  # snapshots before the seal existed have none
            appended_ms=raw.get("appended", -1),  # nor before expiry existed
        )

    def expired(self, now_ms: int, expiration_ms: int) -> bool:
        """Whether this replica may forget the producer (Kafka's producer.id.expiration.ms):
        nothing appended for ``expiration_ms`` by this replica's clock or the
        producer's, and no transaction open or prepared (its first offset holds
        the LSO, and its marker needs the entry)."""
        if self.has_open_transaction or self.txn_prepared:
            return False
        return now_ms - max(self.appended_ms, self.last_timestamp_ms) >= expiration_ms


class ProducerStates(dict):
    """A partition's producer entries by producer id, which also keeps the
    first offsets of its open transactions in a heap, so that the oldest one
    (what bounds the last stable offset) is found in O(log n) however many
    producers the partition has seen, instead of by a scan of them all.

    Invariant: ``_open`` maps exactly the producers whose entry has an open
    transaction to its first offset, and every pair of ``_open`` is in
    ``_heap``; the heap may also hold stale pairs (transactions since ended),
    dropped when they reach its top or when they outnumber the live ones.
    Entries change only through item assignment, ``pop`` and ``del``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._open: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []

    def __setitem__(self, producer_id: int, entry: ProducerStateEntry) -> None:
        super().__setitem__(producer_id, entry)
        first = entry.current_txn_first_offset
        if first < 0:
            self._open.pop(producer_id, None)
        elif self._open.get(producer_id) != first:
            self._open[producer_id] = first
            heapq.heappush(self._heap, (first, producer_id))
            if len(self._heap) > 2 * len(self._open) + 64:
                self._heap = [(offset, pid) for pid, offset in self._open.items()]
                heapq.heapify(self._heap)

    def __delitem__(self, producer_id: int) -> None:
        super().__delitem__(producer_id)
        self._open.pop(producer_id, None)

    def pop(self, producer_id: int, *default):
        self._open.pop(producer_id, None)
        return super().pop(producer_id, *default)

    def update(self, *args, **kwargs):
        raise TypeError("ProducerStates changes entry by entry (item assignment keeps the open-transaction index)")

    setdefault = popitem = clear = update

    def first_open_offset(self) -> int | None:
        """The first offset of the oldest open transaction; None when none is open."""
        heap = self._heap
        while heap and self._open.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    @property
    def open_transactions(self) -> dict[int, int]:
        """{producer id: first offset} of the open transactions (read only)."""
        return dict(self._open)


@dataclass(frozen=True)
class Append:
    """The batch is new: append it."""


@dataclass(frozen=True)
class Duplicate:
    """The batch is one of the cached five: answer its original offsets."""

    base_offset: int
    last_offset: int


@dataclass(frozen=True)
class Reject:
    code: int
    message: str = field(default="")


APPEND = Append()


def check_batch(
    entry: ProducerStateEntry | None,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
    is_transactional: bool,
) -> Append | Duplicate | Reject:
    last_sequence = last_sequence_of(base_sequence, record_count)
    if entry is None:
        if base_sequence != 0:
            return Reject(
                ErrorCode.Value("UNKNOWN_PRODUCER_ID"),
                f"producer {producer_id} has no state on this partition and its batch starts at sequence "
                f"{base_sequence}, not 0 (its state expired or was never here)",
            )
        return APPEND
    if producer_epoch == entry.producer_epoch:
        for cached in entry.batches:
            if cached.first_sequence == base_sequence and cached.last_sequence == last_sequence:
                return Duplicate(cached.base_offset, cached.last_offset)
    if producer_epoch < entry.producer_epoch:
        code = "PRODUCER_FENCED" if is_transactional else "INVALID_PRODUCER_EPOCH"
        return Reject(
            ErrorCode.Value(code),
            f"producer {producer_id} epoch {producer_epoch} is older than epoch {entry.producer_epoch} "
            "already seen on this partition",
        )
    if entry.has_open_transaction and not is_transactional:
        return Reject(
            ErrorCode.Value("INVALID_TXN_STATE"),
            f"producer {producer_id} has a transaction open on this partition (since offset "
            f"{entry.current_txn_first_offset}): its batches here must be transactional until the transaction ends",
        )
    if entry.has_open_transaction and producer_epoch > entry.producer_epoch:
        return Reject(
            ErrorCode.Value("INVALID_TXN_STATE"),
            f"producer {producer_id}: the transaction of epoch {entry.producer_epoch} is still open on this partition "
            f"(no marker yet); a batch of epoch {producer_epoch} cannot start before it ends",
        )
    if entry.txn_prepared and producer_epoch == entry.producer_epoch:
        return Reject(
            ErrorCode.Value("INVALID_TXN_STATE"),
            f"the transaction of producer {producer_id} epoch {producer_epoch} is prepared: it takes no more records",
        )
    if producer_epoch > entry.producer_epoch:
        if base_sequence != 0:
            return Reject(
                ErrorCode.Value("OUT_OF_ORDER_SEQUENCE"),
                f"producer {producer_id}: first batch of epoch {producer_epoch} must start at sequence 0, "
                f"not {base_sequence}",
            )
        return APPEND
    expected = next_sequence(entry.last_sequence)
    if base_sequence == expected:
        return APPEND
    if entry.batches and is_behind(base_sequence, expected) and is_behind(last_sequence, expected):
        return Reject(
            ErrorCode.Value("DUPLICATE_SEQUENCE"),
            f"producer {producer_id} epoch {producer_epoch}: sequence {base_sequence} was appended before "
            f"(the last is {entry.last_sequence}) and is older than the {DUPLICATE_CACHE_BATCHES} cached batches",
        )
    return Reject(
        ErrorCode.Value("OUT_OF_ORDER_SEQUENCE"),
        f"producer {producer_id} epoch {producer_epoch}: expected sequence {expected}, got the batch "
        f"{base_sequence}..{last_sequence}",
    )


def after_append(
    entry: ProducerStateEntry | None,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
    base_offset: int,
    timestamp_ms: int,
    is_transactional: bool,
    cache_batches: int = DUPLICATE_CACHE_BATCHES,
    appended_ms: int = -1,
) -> ProducerStateEntry:
    """The state once a batch that passed ``check_batch`` is appended (at
    ``appended_ms`` by this replica's clock); the last ``cache_batches``
    batches are kept to answer duplicates (tests shrink it)."""
    batch = BatchMetadata(
        base_sequence, last_sequence_of(base_sequence, record_count), base_offset, base_offset + record_count - 1, timestamp_ms
    )
    if entry is None or producer_epoch != entry.producer_epoch:
        previous = entry or ProducerStateEntry(producer_id, producer_epoch)
        entry = replace(previous, producer_epoch=producer_epoch, batches=(), txn_prepared=False)
    txn_first = entry.current_txn_first_offset
    if is_transactional and txn_first == NO_OFFSET:
        txn_first = base_offset
    return replace(
        entry,
        batches=(*entry.batches, batch)[-cache_batches:],
        last_timestamp_ms=timestamp_ms,
        current_txn_first_offset=txn_first,
        appended_ms=max(appended_ms, entry.appended_ms),
    )
