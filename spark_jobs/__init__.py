"""txlog for Spark: the ``txlog`` data source and exactly-once jobs.

    import spark_jobs
    spark_jobs.register(spark)
    df = (spark.read.format("txlog")
          .option("bootstrap", "127.0.0.1:7300").option("topic", "events")
          .option("startingOffsets", "committed:my-group")   # or earliest, latest, JSON
          .load())
    (df.select("key", "value").write.format("txlog")
       .option("bootstrap", "127.0.0.1:7300").option("topic", "copy")
       .option("transactionalIdPrefix", "copy-job").mode("append").save())

Read options: ``bootstrap`` and ``topic`` (comma-separated topics) are
required; ``startingOffsets`` (``earliest`` default, ``latest``,
``committed:<group>``, or JSON ``{"topic": {"0": 42}}`` with -2 = earliest,
-1 = latest); ``endingOffsets`` (``latest`` default: the last stable offset at
planning time under read_committed, the high watermark under
read_uncommitted; or JSON); ``isolation`` (``read_committed`` default or
``read_uncommitted``); ``maxRecordsPerSplit`` (split a partition's range into
tasks of at most this many offsets); ``failOnDataLoss`` (``true`` default:
fail when planned offsets were removed by retention); ``pollTimeoutMs``
(a task fails after this long without progress, 120000 default).

Write options: ``bootstrap``, ``topic``, ``transactionalIdPrefix`` (the whole
write commits atomically: each task attempt prepares its own transaction and
the driver commits them in one group commit; without it, an idempotent
producer), ``transactionTimeoutMs`` (60000 default), ``preparedTimeoutMs``
(0: the coordinators' default), ``groupCommitWith`` (JSON handles of more
prepared transactions of the prefix's group to commit with the write). Columns: ``value`` and optionally
``key``, ``partition``, ``headers``, ``timestamp``. What a write guarantees:
``spark_jobs.writing``.

Streaming: ``spark.readStream.format("txlog")`` takes the read options but
``endingOffsets``, plus ``maxRecordsPerTrigger``; ``df.writeStream.format("txlog")``
(outputMode append, with ``checkpointLocation``) commits every micro-batch
exactly once, and ``streaming_sink.write_batch_exactly_once`` does the same from
``foreachBatch`` (docs/guides/spark.md, "Structured Streaming").

Both: ``tlsCa``, ``tlsCert``, ``tlsKey`` (PEM files, at the same paths on the
driver and every executor) for a cluster that runs TLS (mutual TLS: all three),
or ``tlsCa`` and ``tokenFile`` (a bearer token) for one that authenticates by token.

spark-sql-kafka's names for the same settings are accepted: ``kafka.bootstrap.servers``
(``bootstrap``, reads and writes), ``subscribe`` (``topic``, comma-separated, reads) and
``kafka.isolation.level`` (``isolation``, reads); one given with txlog's name as well must
have the same value. Any other option fails the read or write on the driver, naming the
txlog option to use instead where there is one (``options.KAFKA_OPTIONS``) or the closest
known name. Spark passes option names case-insensitively.

Modules: ``options`` (parsing and checking the options), ``planning`` (offset
ranges, on the driver), ``reading`` (one range, on an executor), ``source``
(the data source), ``writing`` (the writer), ``streaming_source`` and
``streaming_sink`` (their streaming forms), ``batch_commit`` (the sink's
commit of a micro-batch, step by step), ``batch_ledger`` (which micro-batches
of a query committed), ``eos`` (exactly-once
consume-process-produce runs, per partition or as one), ``key_counts`` (a
transform with a shuffle), ``windowed_counts`` (the shipped job),
``schedule`` (running a job once or every N seconds), ``sample_events``
(sample input for the job).
"""

from __future__ import annotations


def register(spark) -> None:
    """Registers the ``txlog`` format on ``spark`` (a SparkSession)."""
    from spark_jobs.source import TxlogDataSource

    spark.dataSource.register(TxlogDataSource)
