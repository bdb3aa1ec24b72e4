#!/usr/bin/env bash
# The main job: start a local cluster, load sample page-view events, run the
# exactly-once Spark job (spark_jobs.windowed_counts) on it, print the counts
# read back with read_committed, run the job again to show that a re-run over
# the same input changes nothing, then stop the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${TXLOG_CLUSTER_DIR:-.cluster}
EVENTS=${TXLOG_SAMPLE_EVENTS:-20000}
txlog=.venv/bin/txlog
python=.venv/bin/python

$txlog cluster down --dir "$DIR" >/dev/null 2>&1 || true
rm -rf "$DIR"
trap '$txlog cluster down --dir "$DIR" >/dev/null' EXIT
$txlog cluster up --dir "$DIR" >/dev/null
bootstrap=$($python -c 'import json,sys; print(json.load(open(sys.argv[1]))["bootstrap"])' "$DIR/cluster.json")
echo "cluster up: bootstrap $bootstrap"
$txlog topics create events --partitions 4 --dir "$DIR"
$txlog topics create event-counts --partitions 2 --dir "$DIR"
$python -m spark_jobs.sample_events --bootstrap "$bootstrap" --topic events --count "$EVENTS"

job=($python -m spark_jobs.windowed_counts --once --bootstrap "$bootstrap" --input-topic events
     --output-topic event-counts --group windowed-counts --spark-master "local[2]")
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
