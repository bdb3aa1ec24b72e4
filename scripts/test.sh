#!/usr/bin/env bash
# The whole test suite, after installing what it needs. .ci/run calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
