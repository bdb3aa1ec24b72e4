"""The environment Spark's Python workers need in the tests."""

from __future__ import annotations

import os
import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def worker_pythonpath() -> str:
    """PYTHONPATH with this folder first, so workers import spark_transforms."""
    return os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
