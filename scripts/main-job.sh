#!/usr/bin/env bash
# The main job: start a local cluster, load sample page-view events, run the
# exactly-once Spark job (spark_jobs.windowed_counts) on it, print the counts
# read back with read_committed, run the job again to show that a re-run over
# the same input changes nothing, then stop the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${TXLOG_CLUSTER_DIR:-.cluster}
EVENTS=${TXLOG_SAMPLE_EVENTS:-20000}
# TXLOG_MAIN_TLS=1: the cluster runs mutual TLS (a throwaway CA under $DIR/tls) and every client uses its admin certificate.
TLS=${TXLOG_MAIN_TLS:-0}
txlog=.venv/bin/txlog
python=.venv/bin/python

$txlog cluster down --dir "$DIR" >/dev/null 2>&1 || true
rm -rf "$DIR"
trap '$txlog cluster down --dir "$DIR" >/dev/null' EXIT
tls_up=() tls_client=()
if [ "$TLS" = 1 ]; then
  tls_up=(--tls)
  tls_client=(--tls-ca "$DIR/tls/ca.pem" --tls-cert "$DIR/tls/admin.pem" --tls-key "$DIR/tls/admin-key.pem")
fi
$txlog cluster up --dir "$DIR" "${tls_up[@]}" >/dev/null
bootstrap=$($python -c 'import json,sys; print(json.load(open(sys.argv[1]))["bootstrap"])' "$DIR/cluster.json")
echo "cluster up: bootstrap $bootstrap$([ "$TLS" = 1 ] && echo ", mutual TLS")"
$txlog topics create events --partitions 4 --dir "$DIR"
$txlog topics create event-counts --partitions 2 --dir "$DIR"
$python -m spark_jobs.sample_events --bootstrap "$bootstrap" --topic events --count "$EVENTS" "${tls_client[@]}"

job=($python -m spark_jobs.windowed_counts --once --bootstrap "$bootstrap" --input-topic events
     --output-topic event-counts --group windowed-counts --spark-master "local[2]" "${tls_client[@]}")
summary() { $python -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{\"run\""):
        run = json.loads(line)["run"]
        print("%s: %d input ranges, %d events consumed, %d counts produced"
              % (sys.argv[1], run["ranges"], run["records_in"], run["records_out"]))
    else:
        print(line, end="")' "$1"; }

echo "running the exactly-once job (Spark local mode; the log is in $DIR/job.log)"
"${job[@]}" --show-totals 2>"$DIR/job.log" | summary "first run"
echo "running it again over the same input"
"${job[@]}" 2>>"$DIR/job.log" | summary "second run"
$txlog transactions list --dir "$DIR"
