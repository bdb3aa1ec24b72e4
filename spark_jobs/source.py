"""The ``txlog`` Spark data source: batch reads of offset ranges and
transactional batch writes (see the package docstring for the options)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_jobs import options, planning, reading, writing
from txlog.two_phase import new_run_id

SCHEMA = ("topic string, partition int, offset long, key binary, value binary, "
          "headers array<struct<key: string, value: binary>>, timestamp timestamp")
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()),
    ("value", pa.binary()), ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("timestamp", pa.timestamp("us", tz="UTC")),
])
ARROW_BATCH_RECORDS = 10_000


class TxlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "txlog"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> TxlogReader:
        return TxlogReader(options.parse_read(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> writing.TxlogWriter:
        if overwrite:
            raise options.OptionError("txlog: a topic is append-only; write with mode('append'), not overwrite")
        parsed = options.parse_write(self.options)
        writing.check_schema(schema)
        writing.check_topic(parsed)
        run = new_run_id()
        if parsed.transactional_id_prefix:
            writing.abort_earlier_runs(parsed.bootstrap, parsed.transactional_id_prefix, run, parsed.client_tls)
        return writing.TxlogWriter(parsed, run, writing.begin_write_span(parsed, run))


class TxlogReader(DataSourceReader):
    def __init__(self, read_options: options.ReadOptions):
        self.options = read_options

    def partitions(self) -> list[InputPartition]:
        ranges = planning.plan(self.options)
        # Spark needs at least one partition to run a read; an empty range reads nothing.
        return ranges or [planning.OffsetRange(self.options.topics[0], 0, 0, 0)]

    def read(self, partition: planning.OffsetRange) -> Iterator[pa.RecordBatch]:
        if partition.start >= partition.end:
            return
        records = reading.read_range(self.options.bootstrap, partition, isolation=self.options.isolation,
                                     fail_on_data_loss=self.options.fail_on_data_loss,
                                     poll_timeout_s=self.options.poll_timeout_s, client_tls=self.options.client_tls)
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

