"""The shipped exactly-once job: page views per site section per time window.

Input: JSON page-view events, ``{"user": "u17", "page": "/docs/intro",
"ts": 1732300000123, "bytes": 512}`` (``ts`` in ms since the epoch). Each
event is enriched with its site section (from the page's first path segment)
and counted in its tumbling window. The output topic gets, per input range,
one record per (section, window) with the views and bytes counted in that
range, keyed ``<section>/<window start ms>``; summing the records of a key gives
the window's totals (``totals``). Events that do not parse are counted under
the section ``_malformed``, in the window of the record's timestamp.

    python -m spark_jobs.windowed_counts --once --bootstrap 127.0.0.1:7300
    python -m spark_jobs.windowed_counts --every 60s          # until SIGTERM

Every run logs (JSON lines on stderr) the ranges it planned and, per range,
what it consumed and produced; ``--show-totals`` prints the totals read back
with read_committed after each run.

``--streaming`` runs the same counting as a Structured Streaming query from
the ``txlog`` source to the exactly-once ``txlog`` sink, its progress kept in
``--checkpoint``: a windowed aggregation on the events' time with a watermark
``--watermark-ms`` behind the latest event seen (events later than that are
dropped, as Spark drops them). With ``--output-mode update`` (the default)
every micro-batch writes the windows it changed, with their totals so far (the
last record of a key holds them), through ``foreachBatch`` and
``streaming_sink.write_batch_exactly_once``. With ``append`` a window's record
is written once, with its totals, by the ``txlog`` sink in the first
micro-batch after the watermark passed the window's end (under ``--once``,
availableNow, the run's last micro-batch, which reads nothing, writes what the
run's events closed). The query starts where the group's committed offsets
are (earliest without them).

    python -m spark_jobs.windowed_counts --streaming --once --checkpoint /data/ckpt   # availableNow: what is there, then exit
    python -m spark_jobs.windowed_counts --streaming --every 1s --checkpoint /data/ckpt  # a micro-batch a second until SIGTERM

``--streaming --once`` is the way to run the pipeline from a scheduler (cron,
a Kubernetes CronJob): each run processes what arrived since the last one.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict

import pyarrow as pa

from services.runtime import config, logs
from spark_jobs import eos, schedule, session, streaming_sink
from spark_jobs.eos import OutputRecord
from spark_jobs.planning import OffsetRange
from txlog.structs import ConsumerRecord

log = logging.getLogger("spark_jobs.windowed_counts")

MALFORMED = "_malformed"
# The enrichment's reference data: a page's first path segment → its site section.
SECTIONS = {"": "home", "docs": "docs", "blog": "blog", "pricing": "sales", "signup": "sales", "account": "account"}
OTHER_SECTION = "other"
# What the streaming mode's arithmetic holds (Spark's ANSI mode fails a query on an overflow): event times in years
# 1 to 9999, sizes below 1 TiB. Both modes count an event outside them as malformed.
TS_MS_MIN, TS_MS_MAX = -62_135_596_800_000, 253_402_300_799_999
BYTES_MAX = (1 << 40) - 1

SETTINGS = (
    config.Setting("bootstrap", "127.0.0.1:7300", "partition_svc addresses (host:port[,host:port...])"),
    config.Setting("tls_ca", "", "PEM CA bundle that verifies the partition_svc (turns TLS on; empty: plaintext)"),
    config.Setting("tls_cert", "", "PEM client certificate of the job, for a cluster that requires one (mutual TLS)"),
    config.Setting("tls_key", "", "PEM key of tls_cert"),
    config.Setting("token_file", "", "bearer token of the job, for a cluster that authenticates by token (with tls_ca)"),
    config.Setting("input_topic", "events", "topic(s) of page-view events to read (comma-separated)"),
    config.Setting("output_topic", "event-counts", "topic the counts are written to"),
    config.Setting("group", "windowed-counts", "consumer group whose committed offsets say what was consumed"),
    config.Setting("job_name", "", "prefix of the job's transactional ids (default: the group)"),
    config.Setting("window_ms", 60_000, "tumbling window length, ms", config.positive_int),
    config.Setting("transform", "spark_jobs.windowed_counts:count_views",
                   "the transformation, module:function (see spark_jobs.eos.Transform)"),
    config.Setting("delivery", "exactly-once", "exactly-once (transactions) or at-least-once (idempotent producer, "
                   "offsets committed after the output)", str, eos.DELIVERY_MODES),
    config.Setting("transaction_timeout_ms", 60_000, "a task's transaction is aborted by the coordinator after "
                   "this long, ms", config.positive_int),
    config.Setting("spark_master", "local[2]", "Spark master: local[N], local[N,maxFailures], spark://..., k8s://..."),
    config.Setting("once", False, "run once and exit (exit status 1 if the run failed)", config.boolean, switch=True),
    config.Setting("every", "", "run every DURATION (60s, 5m, 1h) until SIGTERM; the default is --once"),
    config.Setting("show_totals", False, "after each run, print the totals read back with read_committed (under the ACL "
                   "authorizer the job's principal then needs Read on the output topic too)",
                   config.boolean, switch=True),
    config.Setting("log_level", "INFO", "log level", str, ("DEBUG", "INFO", "WARNING", "ERROR")),
    config.Setting("streaming", False, "run as a Structured Streaming query (--once: trigger availableNow; --every: a "
                   "micro-batch every DURATION)", config.boolean, switch=True),
    config.Setting("checkpoint", "", "--streaming: the query's checkpoint directory (required; the same one on every run)"),
    config.Setting("output_mode", "update", "--streaming: update (changed windows, with their totals so far, every "
                   "micro-batch) or append (a window once, after it closed)", str, ("update", "append")),
    config.Setting("watermark_ms", 600_000, "--streaming: how far behind the latest event time a window still takes "
                   "events, ms", config.positive_int),
)


def section_of(page: str) -> str:
    first = page.split("?", 1)[0].strip("/").split("/", 1)[0].lower()
    return SECTIONS.get(first, OTHER_SECTION)


def classify(value: bytes | str | None, timestamp_ms: int) -> tuple[str, int, int]:
    """An event's (section, time ms, bytes); a value that does not parse is
    (MALFORMED, the record's timestamp, 0)."""
    try:
        event = json.loads(value)
        if isinstance(event["ts"], bool):
            raise TypeError("ts is a boolean")
        section, ts, size = section_of(event["page"]), int(event["ts"]), int(event.get("bytes", 0))
        if not (TS_MS_MIN <= ts <= TS_MS_MAX and 0 <= size <= BYTES_MAX):
            raise OverflowError("ts or bytes out of range")
        return section, ts, size
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return MALFORMED, timestamp_ms, 0


def count_views(records: Iterator[ConsumerRecord], source: OffsetRange, window_ms: int = 60_000
                ) -> Iterable[OutputRecord]:
    """The job's transformation (an ``eos.Transform``)."""
    counts: dict[tuple[str, int], list[int]] = {}
    for record in records:
        section, ts, size = classify(record.value, record.timestamp_ms)
        window_start = ts - ts % window_ms
        entry = counts.setdefault((section, window_start), [0, 0])
        entry[0] += 1
        entry[1] += size
    for (section, window_start), (views, size) in sorted(counts.items()):
        value = {"section": section, "window_start_ms": window_start, "window_end_ms": window_start + window_ms,
                 "views": views, "bytes": size,
                 "source": {"topic": source.topic, "partition": source.partition, "from": source.start,
                            "to": source.end}}
        yield OutputRecord(f"{section}/{window_start}", json.dumps(value, sort_keys=True))


def totals(spark, job: eos.EosJob, topic: str) -> list[dict]:
    """Views and bytes per (section, window), summed over the output's committed records."""
    from pyspark.sql import functions as F

    value_schema = "section string, window_start_ms long, window_end_ms long, views long, bytes long"
    counts = (spark.read.format("txlog").option("bootstrap", job.bootstrap).options(**job.spark_tls_options).option("topic", topic).load()
              .select(F.from_json(F.col("value").cast("string"), value_schema).alias("v")).select("v.*"))
    rows = (counts.groupBy("section", "window_start_ms", "window_end_ms")
            .agg(F.sum("views").alias("views"), F.sum("bytes").alias("bytes"))
            .orderBy("window_start_ms", "section").collect())
    return [row.asDict() for row in rows]


def job_from(settings) -> eos.EosJob:
    return eos.EosJob(
        name=settings.job_name or settings.group, bootstrap=settings.bootstrap,
        input_topics=tuple(t.strip() for t in settings.input_topic.split(",")), output_topic=settings.output_topic,
        group=settings.group, transform=settings.transform, transform_args={"window_ms": settings.window_ms},
        delivery=settings.delivery, transaction_timeout_ms=settings.transaction_timeout_ms,
        client_tls={k: getattr(settings, k) for k in ("tls_ca", "tls_cert", "tls_key", "token_file") if getattr(settings, k)})


def run(spark, job: eos.EosJob, show_totals: bool) -> list[eos.RangeResult]:
    results = eos.run_once(spark, job)
    summary = {"ranges": len(results), "committed": sum(r.status == "committed" for r in results),
               "records_in": sum(r.records_in for r in results), "records_out": sum(r.records_out for r in results)}
    log.info("run done: consumed %d records, produced %d", summary["records_in"], summary["records_out"],
             extra=logs.fields(job=job.name, **summary))
    print(json.dumps({"run": summary, "ranges": [asdict(r) for r in results]}), flush=True)
    if show_totals:
        print_totals(totals(spark, job, job.output_topic))
    return results


def print_totals(rows: list[dict]) -> None:
    print(f"{'window start (UTC)':<20}  {'section':<12} {'views':>8} {'bytes':>12}")
    for row in rows:
        start = datetime.datetime.fromtimestamp(row["window_start_ms"] / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{start:<20}  {row['section']:<12} {row['views']:>8} {row['bytes']:>12}")
    print(f"{'total':<20}  {'':<12} {sum(r['views'] for r in rows):>8} {sum(r['bytes'] for r in rows):>12}",
          flush=True)


def classify_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``classify`` over Arrow batches of the source's ``value`` and ``timestamp``
    (a whole batch a call: a row-at-a-time UDF costs several times more)."""
    for batch in batches:
        times_us = batch.column("timestamp").cast(pa.int64()).to_pylist()
        sections, times, sizes = [], [], []
        for value, time_us in zip(batch.column("value").to_pylist(), times_us, strict=True):
            section, ts, size = classify(value, time_us // 1000)
            sections.append(section)
            times.append(ts)
            sizes.append(size)
        yield pa.RecordBatch.from_arrays([pa.array(sections, pa.string()), pa.array(times, pa.int64()),
                                          pa.array(sizes, pa.int64())], names=["section", "ts", "bytes"])


def streaming_counts(events, window_ms: int, watermark_ms: int):
    """The ``txlog`` source's stream of events as a stream of window records
    (the ``txlog`` sink's ``key`` and ``value`` columns)."""
    from pyspark.sql import functions as F

    times = (events.select("value", "timestamp").mapInArrow(classify_batches, "section string, ts long, bytes long")
             .withColumn("event_time", F.timestamp_millis("ts")).withWatermark("event_time", f"{watermark_ms} milliseconds"))
    counted = times.groupBy(F.window("event_time", f"{window_ms} milliseconds").alias("w"), "section").agg(
        F.count(F.lit(1)).alias("views"), F.sum("bytes").alias("bytes"))
    start, end = F.unix_millis("w.start"), F.unix_millis("w.end")
    return counted.select(
        F.concat_ws("/", "section", start.cast("string")).alias("key"),
        F.to_json(F.struct("section", start.alias("window_start_ms"), end.alias("window_end_ms"), "views", "bytes")).alias("value"))


def run_streaming(spark, job: eos.EosJob, settings, interval_s: float | None) -> dict:
    """One streaming query: availableNow (``interval_s`` None) until it has read
    what was there when it started, else a micro-batch every ``interval_s``
    until SIGTERM/SIGINT (then the query stops after its current micro-batch)."""
    events = (spark.readStream.format("txlog").option("bootstrap", job.bootstrap).options(**job.spark_tls_options)
              .option("topic", ",".join(job.input_topics)).option("startingOffsets", f"committed:{job.group}").load())
    counted = streaming_counts(events, settings.window_ms, settings.watermark_ms)
    sink_options = {**job.spark_tls_options, "transactionTimeoutMs": str(job.transaction_timeout_ms)}
    if settings.output_mode == "append":
        writer = (counted.writeStream.format("txlog").option("bootstrap", job.bootstrap).option("topic", job.output_topic)
                  .options(**sink_options))
    else:  # Spark's Python sinks take append only; foreachBatch takes every mode, with the same exactly-once commit
        writer = counted.writeStream.foreachBatch(lambda batch, batch_id: streaming_sink.write_batch_exactly_once(
            batch, batch_id, bootstrap=job.bootstrap, topic=job.output_topic, **sink_options))
    writer = (writer.option("checkpointLocation", settings.checkpoint).outputMode(settings.output_mode)
              .queryName(f"windowed-counts-{job.name}"))
    writer = writer.trigger(availableNow=True) if interval_s is None else writer.trigger(processingTime=f"{interval_s} seconds")
    query = writer.start()
    if interval_s is not None:
        schedule.stop_on_signal(query.stop)
    query.awaitTermination()
    batches = [{"batch": p["batchId"], "records_in": p["numInputRows"], "duration_ms": p["durationMs"].get("triggerExecution")}
               for p in query.recentProgress]
    summary = {"mode": "streaming", "query_id": str(query.id), "batches": len(batches),
               "records_in": sum(b["records_in"] for b in batches)}
    log.info("streaming query ended: %d micro-batches, %d records", summary["batches"], summary["records_in"],
             extra=logs.fields(job=job.name, **summary))
    print(json.dumps({"run": summary, "batches": batches}), flush=True)
    if settings.show_totals:
        print_totals(totals(spark, job, job.output_topic))
    return summary


def main(argv: list[str] | None = None) -> int:
    settings = config.load(__doc__.splitlines()[0], SETTINGS, argv)
    logs.configure("windowed_counts", settings.log_level)
    try:
        job = job_from(settings)
        interval_s = schedule.parse_duration(settings.every) if settings.every else None
    except ValueError as exc:
        print(f"windowed_counts: {exc}", file=sys.stderr)
        return 2
    if settings.once and interval_s is not None:
        print("windowed_counts: give --once or --every, not both", file=sys.stderr)
        return 2
    if settings.streaming and not settings.checkpoint:
        print("windowed_counts: --streaming needs --checkpoint DIR (the same directory on every run)", file=sys.stderr)
        return 2
    if settings.checkpoint and not settings.streaming:
        print("windowed_counts: --checkpoint is for --streaming; a batch run keeps its progress in --group's offsets",
              file=sys.stderr)
        return 2
    spark = session.build(settings.spark_master, f"windowed-counts:{job.name}")
    try:
        if settings.streaming:
            run_streaming(spark, job, settings, interval_s)
        elif interval_s is None:
            run(spark, job, settings.show_totals)
        else:
            schedule.run_every(interval_s, lambda: run(spark, job, settings.show_totals))
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
