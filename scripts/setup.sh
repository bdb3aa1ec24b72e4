#!/usr/bin/env bash
# Installs everything txlog needs on a fresh Debian machine: Java and ZooKeeper
# from Debian (apt-get, when missing), and the Python packages into .venv.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: apt-get install ${need_apt[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing Python packages into .venv" >&2
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[dev]'; } >.venv/pip.log 2>&1; then
    tail -n 30 .venv/pip.log >&2
    echo "setup: pip failed; the whole log is .venv/pip.log" >&2
    exit 1
  fi
  .venv/bin/python -c "import grpc, kazoo, rocksdict, pyspark, opentelemetry.sdk"
  touch "$stamp"
fi
