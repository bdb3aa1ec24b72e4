"""The ``txlog`` Spark data source: batch reads of offset ranges and
transactional batch writes (see the package docstring for the options), and
their streaming forms (``streaming_source``, ``streaming_sink``)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_jobs import options, planning, reading, streaming_sink, streaming_source, writing
from txlog.two_phase import new_run_id

SCHEMA = ("topic string, partition int, offset long, key binary, value binary, "
          "headers array<struct<key: string, value: binary>>, timestamp timestamp")


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

    def streamReader(self, schema: StructType) -> streaming_source.TxlogStreamReader:
        return streaming_source.TxlogStreamReader(options.parse_read(self.options, streaming=True))

    def streamWriter(self, schema: StructType, overwrite: bool) -> streaming_sink.TxlogStreamWriter:
        # Spark constructs the writer more than once per query (planning, then each commit), in different
        # processes: nothing here may act on the cluster beyond checking
        if overwrite:
            raise options.OptionError("txlog: a topic is append-only; write a stream with outputMode append (for update, "
                                      "foreachBatch with spark_jobs.streaming_sink.write_batch_exactly_once), not complete")
        parsed = options.parse_write(self.options, streaming=True)
        writing.check_schema(schema)
        writing.check_topic(parsed)
        return streaming_sink.TxlogStreamWriter(parsed)


class TxlogReader(DataSourceReader):
    def __init__(self, read_options: options.ReadOptions):
        self.options = read_options

    def partitions(self) -> list[InputPartition]:
        ranges = planning.plan(self.options)
        # Spark needs at least one partition to run a read; an empty range reads nothing.
        return ranges or [planning.OffsetRange(self.options.topics[0], 0, 0, 0)]

    def read(self, partition: planning.OffsetRange) -> Iterator[pa.RecordBatch]:
        return reading.read_arrow(self.options, partition)
