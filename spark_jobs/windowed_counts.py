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
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict

from services.runtime import config, logs
from spark_jobs import eos, schedule, session
from spark_jobs.eos import OutputRecord
from spark_jobs.planning import OffsetRange
from txlog.structs import ConsumerRecord

log = logging.getLogger("spark_jobs.windowed_counts")

MALFORMED = "_malformed"
# The enrichment's reference data: a page's first path segment → its site section.
SECTIONS = {"": "home", "docs": "docs", "blog": "blog", "pricing": "sales", "signup": "sales", "account": "account"}
OTHER_SECTION = "other"

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
)


def section_of(page: str) -> str:
    first = page.split("?", 1)[0].strip("/").split("/", 1)[0].lower()
    return SECTIONS.get(first, OTHER_SECTION)


def count_views(records: Iterator[ConsumerRecord], source: OffsetRange, window_ms: int = 60_000
                ) -> Iterable[OutputRecord]:
    """The job's transformation (an ``eos.Transform``)."""
    counts: dict[tuple[str, int], list[int]] = {}
    for record in records:
        try:
            event = json.loads(record.value)
            if isinstance(event["ts"], bool):
                raise TypeError("ts is a boolean")
            section, ts, size = section_of(event["page"]), int(event["ts"]), int(event.get("bytes", 0))
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            section, ts, size = MALFORMED, record.timestamp_ms, 0
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
    spark = session.build(settings.spark_master, f"windowed-counts:{job.name}")
    try:
        if interval_s is None:
            run(spark, job, settings.show_totals)
        else:
            schedule.run_every(interval_s, lambda: run(spark, job, settings.show_totals))
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
