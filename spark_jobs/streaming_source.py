"""The streaming source of the ``txlog`` data source (``spark.readStream.format("txlog")``).

An offset is the JSON form the batch source takes, ``{"topic": {"0": 42}}``:
per partition, where the next micro-batch starts. Each micro-batch ends at
what is readable when Spark plans it (the last stable offset under
read_committed, the high watermark under read_uncommitted), so its tasks read
closed ranges and a re-run reads the same records.

- ``startingOffsets`` (earliest, latest, ``committed:<group>`` or JSON) only
  sets where a new query starts; a query restarted from its checkpoint goes on
  from there.
- Partitions added to a topic while the query runs are read from their
  earliest offset.
- ``maxRecordsPerTrigger`` (alias ``maxOffsetsPerTrigger``) bounds a
  micro-batch to that many offsets over all partitions, shared in proportion
  to what each has waiting.
- ``trigger(availableNow=True)``: when the query starts, the source fixes
  what is readable then as its target, and the query runs micro-batches
  (within ``maxRecordsPerTrigger``) until it has read up to the target, then
  stops; what arrives meanwhile is for the next run.
- ``failOnDataLoss`` (true by default): a micro-batch that would start below a
  partition's first offset (retention or DeleteRecords removed what the query
  still needed), a partition that is gone (its topic deleted), or one whose
  log is shorter than what the query read of it (its topic deleted and
  created again) fails the query; false skips to what is there (a recreated
  partition is read from its earliest offset, a gone one no more).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from spark_jobs import planning, reading
from spark_jobs.options import EARLIEST, LATEST, OptionError, ReadOptions
from spark_jobs.reading import DataLossError
from txlog import Consumer
from txlog.errors import ClientError

log = logging.getLogger("spark_jobs.streaming_source")

Offsets = dict[tuple[str, int], int]


def to_json(offsets: Offsets) -> dict:
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, {})[str(partition)] = offset
    return by_topic


def from_json(offsets: Mapping) -> Offsets:
    return {(topic, int(partition)): int(offset) for topic, partitions in offsets.items() for partition, offset in partitions.items()}


def share(start: Offsets, end: Offsets, records_max: int) -> Offsets:
    """``end`` moved back so that at most ``records_max`` offsets lie between
    ``start`` and it, shared in proportion to each partition's backlog (every
    partition with a backlog moves on by one at least, while the budget lasts)."""
    backlog = {tp: end[tp] - start.get(tp, end[tp]) for tp in end}
    total = sum(b for b in backlog.values() if b > 0)
    if total <= records_max:
        return dict(end)
    bounded = dict(end)
    budget = records_max
    for tp in sorted(backlog, key=lambda tp: (-backlog[tp], tp)):
        if backlog[tp] <= 0:
            continue
        take = min(backlog[tp], max(1, backlog[tp] * records_max // total), budget)
        bounded[tp] = start[tp] + take
        budget -= take
    return bounded


def held_to(target: Offsets, start: Offsets, end: Offsets) -> Offsets:
    """``end`` kept within an availableNow run's ``target``: no partition past
    its target offset; one the target does not know (added since the run
    began) stays at its start, and one ``start`` lacks too is left out; never
    behind ``start``."""
    held = {}
    for tp, offset in end.items():
        first = start.get(tp, offset)
        if tp in target:
            held[tp] = max(first, min(offset, target[tp]))
        elif tp in start:
            held[tp] = first
    return held


class TxlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, read_options: ReadOptions):
        self.options = read_options
        self.target: Offsets | None = None  # availableNow: what was readable when the query started

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._readable()[1]

    def _consumer(self, **extra) -> Consumer:
        return Consumer(self.options.bootstrap, isolation_level=self.options.isolation, **self.options.client_tls, **extra)

    def initialOffset(self) -> dict:
        starting = self.options.starting
        with self._consumer(group_id=starting.group) as consumer:
            tps = planning.partitions_of(consumer, self.options.topics)
            unknown = sorted(set(starting.per_partition or {}) - set(tps))
            if unknown:
                raise OptionError(f"txlog: offsets given for partitions that do not exist: {unknown}")
            earliest, latest = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            committed = {tp: consumer.committed(tp) for tp in tps} if starting.group else {}
        offsets = {}
        for tp in tps:
            start = (starting.per_partition or {}).get(tp)
            if start is None:
                start = committed.get(tp)
            if start is None:
                start = starting.default
            offsets[tp] = earliest[tp] if start == EARLIEST else latest[tp] if start == LATEST else start
        return to_json(offsets)

    def _readable(self) -> tuple[Offsets, Offsets]:
        """Every partition's first offset and readable end, now; a topic that is
        gone (deleted since the query started) has no partitions."""
        with self._consumer() as consumer:
            tps = []
            for topic in self.options.topics:
                try:
                    tps.extend((topic, p) for p in consumer.partitions_for(topic))
                except ClientError:
                    pass
            return consumer.beginning_offsets(tps), consumer.end_offsets(tps)

    def _log_ends(self, tps: list[tuple[str, int]]) -> Offsets:
        """The high watermarks of ``tps``: where their logs end, whatever the isolation level."""
        with Consumer(self.options.bootstrap, isolation_level="read_uncommitted", **self.options.client_tls) as consumer:
            return consumer.end_offsets(tps)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begun = from_json(start)
        earliest, readable = self._readable()
        for tp in sorted(set(begun) - set(readable)):
            self._lost(f"{tp[0]}-{tp[1]} is gone (its topic was deleted)")  # failOnDataLoss=false: left out from now on
        ahead = [tp for tp in readable if begun.get(tp, 0) > readable[tp]]
        for tp, log_end in self._log_ends(ahead).items() if ahead else ():
            if begun[tp] > log_end:  # a log shorter than what was read of it: the topic was deleted and created again
                self._lost(f"{tp[0]}-{tp[1]}: its log ends at {log_end}, before offset {begun[tp]} the query reached "
                           "(the topic was created again); reading it from its earliest offset")
                begun[tp] = earliest[tp]
        # a new partition starts at its earliest offset; one below the start (retention moved past it: partitions()
        # fails or skips) does not move the end back
        froms = {tp: begun.get(tp, earliest[tp]) for tp in readable}
        end = {tp: max(readable[tp], froms[tp]) for tp in readable}
        if self.target is not None:
            end = held_to(self.target, froms, end)
        if isinstance(limit, ReadMaxRows):
            end = share(froms, end, limit.max_rows)
        return to_json(end)

    def getDefaultReadLimit(self) -> ReadLimit:
        records_max = self.options.max_records_per_trigger
        return ReadMaxRows(records_max) if records_max else ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return to_json(self._readable()[1])

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begun, ending = from_json(start), from_json(end)
        earliest, readable = self._readable()
        ranges = []
        for tp, stop in sorted(ending.items()):
            first = begun.get(tp, earliest.get(tp, 0))
            if tp not in readable:
                self._lost(f"{tp[0]}-{tp[1]} is gone (its topic was deleted)")
                continue
            if first > stop:  # latestOffset found the log shorter than the query's offset (and did not fail)
                first = earliest[tp]
            if first < earliest[tp]:
                self._lost(f"{tp[0]}-{tp[1]}: offsets {first} to {earliest[tp]} are no longer in the log (retention or "
                           "DeleteRecords removed them)")
                first = earliest[tp]
            if first < stop:
                ranges.extend(planning.OffsetRange(tp[0], tp[1], first, stop).split(self.options.max_records_per_split))
        return ranges

    def _lost(self, what: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(f"txlog: {what}; set failOnDataLoss=false to go on without them")
        log.warning("txlog: %s; skipping them (failOnDataLoss=false)", what)

    def read(self, partition: planning.OffsetRange) -> Iterator[pa.RecordBatch]:
        return reading.read_arrow(self.options, partition)
