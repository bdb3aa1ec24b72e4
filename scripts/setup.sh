#!/usr/bin/env bash
# Installs everything txlog needs on a fresh Debian machine: Java, ZooKeeper,
# Node.js, promtool, podman, mmdebstrap and Chromium from Debian (apt-get, when missing), the Python packages into .venv,
# and the Node client's packages into clients/node/node_modules.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)  # promtool checks the chart's alert rules
# podman builds and runs the images (make image, make deploy-smoke, tests/deploy); mmdebstrap makes
# their base from Debian's packages where no registry is reachable
command -v podman >/dev/null 2>&1 || need_apt+=(podman runc uidmap slirp4netns fuse-overlayfs)
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
# headless Chromium and its WebDriver: tests/integ/test_console_browser.py drives the web console in it
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
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
  .venv/bin/python -c "import grpc, kazoo, rocksdict, pyspark, opentelemetry.sdk, zstandard, lz4.frame, crc32c"
  touch "$stamp"
fi

# The Node client (clients/node, run by tests/integ/test_node_client.py) and
# buf (its dev dependency; tests/unit/test_proto_contract.py lints protos/ and
# checks them against the last release): exactly as package-lock.json pins them, again whenever the lock file
# (or package.json) is newer than the last install. None needs an install script.
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "setup: $tool is missing (on Debian: apt-get install nodejs npm); the Node client needs it" >&2
    exit 1
  fi
done
node_stamp=clients/node/node_modules/.txlog-installed
if [ ! -f "$node_stamp" ] || [ clients/node/package-lock.json -nt "$node_stamp" ] || [ clients/node/package.json -nt "$node_stamp" ]; then
  echo "setup: installing the Node client's packages (npm install in clients/node)" >&2
  # `npm install --no-save` with the lock file, not `npm ci`: buf's npm package
  # names a binary package per platform, and a registry that serves only some
  # platforms (the one here 404s the darwin and win32 ones) leaves those out of
  # the lock, which `npm ci` refuses; `install` takes the lock's versions and
  # skips the optional packages it cannot fetch, and --no-save leaves the lock as is.
  if ! (cd clients/node && npm install --no-save --ignore-scripts --no-audit --no-fund) >.venv/npm.log 2>&1; then
    tail -n 30 .venv/npm.log >&2
    echo "setup: npm install failed; the whole log is .venv/npm.log" >&2
    exit 1
  fi
  (cd clients/node && node -e "require('@grpc/grpc-js'); require('@grpc/proto-loader'); require('protobufjs')")
  clients/node/node_modules/.bin/buf --version >/dev/null
  touch "$node_stamp"
fi
