"""Spark in local mode for the Spark tests: one session for the test run,
with task retries (local[2,4]) and this folder importable by the Python
workers (the fault-injecting transformations live in spark_transforms.py)."""

from __future__ import annotations

import os

import pytest
from spark_env import worker_pythonpath


@pytest.fixture(scope="session")
def spark():
    os.environ["PYTHONPATH"] = worker_pythonpath()  # inherited by the JVM, then by its Python workers
    from spark_jobs import session

    spark = session.build("local[2,4]", "txlog-tests")
    yield spark
    spark.stop()
