#!/usr/bin/env bash
# The main job: start a local cluster, use it, print what it did, stop it.
# (For now the cluster holds ZooKeeper and producer_id_svc, and the job
# allocates producer-id blocks through the service.)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${TXLOG_CLUSTER_DIR:-.cluster}
txlog=.venv/bin/txlog

$txlog cluster down --dir "$DIR" >/dev/null 2>&1 || true
rm -rf "$DIR"
trap '$txlog cluster down --dir "$DIR" >/dev/null' EXIT
$txlog cluster up --dir "$DIR"
echo "allocating 3 producer-id blocks through producer_id_svc:"
$txlog producer-ids allocate --dir "$DIR" --requester-id 1 --count 3
