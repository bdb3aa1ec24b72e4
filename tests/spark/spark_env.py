"""The environment Spark's Python workers need in the tests."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess

HERE = pathlib.Path(__file__).resolve().parent


def worker_pythonpath() -> str:
    """PYTHONPATH with this folder first, so workers import spark_transforms."""
    return os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)


def job_report(process: subprocess.Popen, timeout_s: float) -> dict:
    """The report a ``python -m spark_jobs.windowed_counts`` process prints (its '{"run"' line), once it
    ended well within ``timeout_s``; else it is killed (its process group) and the assertion shows its stderr."""
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        raise AssertionError(f"the job did not end within {timeout_s:.0f} s; its stderr ends:\n{stderr[-5000:]}") from None
    assert process.returncode == 0, stderr[-5000:]
    (report,) = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"run"')]
    return report
