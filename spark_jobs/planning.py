"""Offset ranges, planned on the driver: one or more per (topic, partition),
each read by one task.

The end of a range is fixed at planning time (``latest`` is the last stable
offset then, under read_committed), so a task reads a closed range whatever is
written while it runs, and a retried task reads the same records again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from spark_jobs.options import EARLIEST, LATEST, OptionError, ReadOptions
from txlog import Consumer
from txlog.errors import ClientError


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Records ``start`` (inclusive) to ``end`` (exclusive) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> tuple[str, int]:
        return self.topic, self.partition

    def split(self, records_max: int | None) -> list[OffsetRange]:
        if records_max is None or self.end - self.start <= records_max:
            return [self]
        return [OffsetRange(self.topic, self.partition, s, min(s + records_max, self.end))
                for s in range(self.start, self.end, records_max)]


def partitions_of(consumer: Consumer, topics: tuple[str, ...]) -> list[tuple[str, int]]:
    tps = []
    for topic in topics:
        try:
            tps.extend((topic, p) for p in consumer.partitions_for(topic))
        except ClientError as exc:
            raise OptionError(f"txlog: cannot read topic {topic!r}: {exc}") from None
    return tps


def plan(options: ReadOptions) -> list[OffsetRange]:
    """The ranges to read, in (topic, partition, start) order; empty ranges are left out."""
    with Consumer(options.bootstrap, group_id=options.starting.group, isolation_level=options.isolation,
                  **options.client_tls) as consumer:
        tps = partitions_of(consumer, options.topics)
        for given in (options.starting.per_partition or {}, options.ending.per_partition or {}):
            unknown = sorted(set(given) - set(tps))
            if unknown:
                raise OptionError(f"txlog: offsets given for partitions that do not exist: {unknown}")
        earliest = consumer.beginning_offsets(tps)
        latest = consumer.end_offsets(tps)  # the LSO under read_committed
        committed = {tp: consumer.committed(tp) for tp in tps} if options.starting.group else {}

        def resolve(offset: int, tp) -> int:
            return earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset

        ranges = []
        for tp in tps:
            start = (options.starting.per_partition or {}).get(tp)
            if start is None:
                start = committed.get(tp)
            start = resolve(options.starting.default if start is None else start, tp)
            end = resolve((options.ending.per_partition or {}).get(tp, options.ending.default), tp)
            if end > latest[tp]:
                raise OptionError(
                    f"txlog: endingOffsets {end} of {tp[0]}-{tp[1]} is past the end of the partition ({latest[tp]}, "
                    f"the {'last stable offset' if options.isolation == 'read_committed' else 'high watermark'})")
            if start > end and tp in (options.starting.per_partition or {}):
                raise OptionError(f"txlog: the starting offset {start} of {tp[0]}-{tp[1]} is after its ending offset {end}")
            if start < end:
                ranges.extend(OffsetRange(tp[0], tp[1], start, end).split(options.max_records_per_split))
        return ranges
