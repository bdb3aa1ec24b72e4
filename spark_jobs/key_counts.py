"""A job with a shuffle: records per key over every input partition of a run,
committed as one (``EosJob(commit_scope="job")``).

Each output record is keyed by the input key and holds JSON ``{"key": k,
"count": n}``: how many input records with that key the run read. Summed over
every run, the counts per key equal the input's, exactly once, whatever fails:

    job = EosJob(name="key-counts", bootstrap=..., input_topics=("events",),
                 output_topic="key-counts", group="key-counts",
                 transform="spark_jobs.key_counts:count_per_key", commit_scope="job")
    eos.run_once(spark, job)
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812 -- Spark's own convention


def count_per_key(records: DataFrame, output_partitions: int | None = None) -> DataFrame:
    """(key, value) per key of ``records``; ``output_partitions`` sets the
    shuffle's partition count (one writing task each)."""
    counts = records.groupBy("key").agg(F.count(F.lit(1)).alias("count"))
    if output_partitions:
        counts = counts.repartition(output_partitions, "key")
    return counts.select(
        F.col("key"),
        F.to_json(F.struct(F.col("key").cast("string").alias("key"), F.col("count"))).cast("binary").alias("value"),
    )
