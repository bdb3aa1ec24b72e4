"""Reading one planned offset range on an executor, as records or as the
Arrow batches of the ``txlog`` source's columns."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import pyarrow as pa

from spark_jobs.planning import OffsetRange
from txlog import Consumer
from txlog.errors import NoOffsetForPartitionError
from txlog.structs import ConsumerRecord

POLL_RECORDS_MAX = 10_000
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()),
    ("value", pa.binary()), ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("timestamp", pa.timestamp("us", tz="UTC")),
])
ARROW_BATCH_RECORDS = 10_000


class DataLossError(RuntimeError):
    """Records of a planned range are gone (retention or compaction removed them)."""


def read_range(bootstrap: str, offsets: OffsetRange, *, isolation: str = "read_committed",
               fail_on_data_loss: bool = True, poll_timeout_s: float = 120.0,
               client_tls: Mapping[str, str] | None = None) -> Iterator[ConsumerRecord]:
    """The records of ``offsets`` in offset order. Under read_committed the
    leader leaves out aborted records and control batches, so offsets may skip;
    the range is done when the position reaches its end, which it always does,
    because the end was at most the last stable offset when it was planned."""
    with Consumer(bootstrap, isolation_level=isolation, auto_offset_reset="none", **(client_tls or {}),
                  max_poll_records=POLL_RECORDS_MAX, fetch_max_wait_ms=100) as consumer:
        tp = offsets.tp
        consumer.assign([tp])
        consumer.seek(tp, offsets.start)
        last_progress_s = time.monotonic()
        position = offsets.start
        while position < offsets.end:
            try:
                records = consumer.poll(timeout_s=1.0)
            except NoOffsetForPartitionError as exc:
                earliest = consumer.beginning_offsets([tp])[tp]
                if fail_on_data_loss or earliest <= position:
                    raise DataLossError(
                        f"{offsets.topic}-{offsets.partition}: offsets from {position} are no longer in the log "
                        f"(it now starts at {earliest}); set failOnDataLoss=false to skip them ({exc})") from None
                consumer.seek(tp, earliest)
                continue
            for record in records:
                if record.offset >= offsets.end:
                    return
                yield record
            new_position = consumer.position(tp)
            if new_position > position:
                position, last_progress_s = new_position, time.monotonic()
            elif time.monotonic() - last_progress_s > poll_timeout_s:
                raise TimeoutError(
                    f"{offsets.topic}-{offsets.partition}: no progress past offset {position} for {poll_timeout_s:.0f} s "
                    f"while reading up to {offsets.end}")


def read_arrow(options, offsets: OffsetRange) -> Iterator[pa.RecordBatch]:
    """``read_range`` with a read's ``options`` (spark_jobs.options.ReadOptions), in Arrow batches."""
    if offsets.start >= offsets.end:
        return
    records = read_range(options.bootstrap, offsets, isolation=options.isolation, fail_on_data_loss=options.fail_on_data_loss,
                         poll_timeout_s=options.poll_timeout_s, client_tls=options.client_tls)
    batch = []
    for record in records:
        batch.append(record)
        if len(batch) >= ARROW_BATCH_RECORDS:
            yield to_arrow(batch)
            batch = []
    if batch:
        yield to_arrow(batch)


def to_arrow(records: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records], ARROW_SCHEMA.field("headers").type),
        pa.array([r.timestamp_ms * 1000 for r in records], pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA)

