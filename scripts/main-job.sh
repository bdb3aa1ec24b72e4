#!/usr/bin/env bash
# The main job: start a local cluster, use it, print what it did, stop it.
# (For now: a topic, keyed records produced by the idempotent producer, read
# back with read_committed; the Spark issue turns this into the exactly-once job.)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${TXLOG_CLUSTER_DIR:-.cluster}
txlog=.venv/bin/txlog

$txlog cluster down --dir "$DIR" >/dev/null 2>&1 || true
rm -rf "$DIR"
trap '$txlog cluster down --dir "$DIR" >/dev/null' EXIT
$txlog cluster up --dir "$DIR" >/dev/null
echo "cluster up: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bootstrap"])' "$DIR/cluster.json")"
$txlog topics create events --partitions 4 --dir "$DIR"
for i in $(seq 1 20); do printf 'user-%d\t{"event": %d}\n' $((i % 5)) "$i"; done \
  | $txlog produce events --key-separator $'\t' --dir "$DIR"
echo "read back (read_committed), key and value:"
$txlog consume events --from-beginning --to-end --print-key --group main-job --dir "$DIR"
$txlog producers describe events --dir "$DIR"
