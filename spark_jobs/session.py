"""The SparkSession a job runs in."""

from __future__ import annotations

import os
import sys

import spark_jobs


def build(master: str, app_name: str, conf: dict[str, str] | None = None):
    """A session on ``master`` (``local[2]``, ``local[2,4]`` for task retries,
    ``spark://…`` or ``k8s://…``) with the ``txlog`` format registered. Python
    workers run this interpreter, so they import the same packages as the driver."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "8"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark_jobs.register(spark)
    return spark
