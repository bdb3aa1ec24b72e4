#!/usr/bin/env bash
# The whole test suite, after installing what it needs. .ci/run calls this.
# The tests run on TXLOG_TEST_WORKERS pytest-xdist workers (default 6): most
# wait on ZooKeeper, service processes and gRPC, so more workers than cores pay
# off. --dist loadgroup keeps the Spark tests on one worker (tests/conftest.py
# groups them), so one JVM runs them, and hands the longest groups out first
# (tests/conftest.py orders them; --no-loadscope-reorder keeps that order). Arguments go to pytest as they are
# (e.g. `scripts/test.sh tests/unit -x`, or `-n 0` to run in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -n "${TXLOG_TEST_WORKERS:-6}" --dist loadgroup --no-loadscope-reorder "$@"
