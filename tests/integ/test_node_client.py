"""A second-language client: clients/node/demo.js (grpc-js, the repository's
protos/ loaded at run time, nothing generated or hand-written) against the full
cluster. It produces a plain and an idempotent batch, runs three transactions
(commit, abort, commit) over two partitions led by different partition_svc
instances, and reads them back with read_committed; here everything it reports
is read again from Python, batch by batch."""

import json
import os
import shutil
import subprocess
from pathlib import Path

from support.waiting import wait_until

from tests.integ.txn_raw import TxnProducer
from txlog.protocol.errors import RETRY_DELAY_MS_DEFAULT
from txlog.v1 import common_pb2, coordinator_pb2, partition_pb2

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node"
NODE_TIMEOUT_S = 120
TOPIC = "node-client"
TRANSACTIONAL_ID = "node-client-test"


def run_node(bootstrap: str, topic: str, **env) -> tuple[int, dict, str]:
    node = shutil.which("node")
    assert node, "node is not installed: scripts/setup.sh installs it (apt-get install nodejs npm)"
    assert (CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir(), \
        "clients/node/node_modules is missing: run scripts/setup.sh (npm install in clients/node)"
    done = subprocess.run([node, str(CLIENT / "demo.js"), bootstrap, topic], capture_output=True, text=True,
                          timeout=NODE_TIMEOUT_S, env={**os.environ, **env})
    lines = done.stdout.strip().splitlines()
    assert lines, f"the Node client printed nothing (exit {done.returncode}); stderr:\n{done.stderr}"
    return done.returncode, json.loads(lines[-1]), done.stderr


def read(raw, partition, isolation) -> list[tuple[int, str, common_pb2.RecordBatch]]:
    """(offset, value, its batch) of every record the partition gives at this isolation."""
    records, offset = [], 0
    while True:
        result = raw.fetch(TOPIC, partition, offset, isolation=isolation)
        assert result.error.code == 0, result.error
        got = [(r.offset, r.value.decode(), b) for b in result.batches for r in b.records]
        records += got
        if result.next_fetch_offset >= result.high_watermark or (not got and result.next_fetch_offset <= offset):
            return records
        offset = result.next_fetch_offset


def no_transaction_open(raw, partition) -> bool:
    result = raw.fetch(TOPIC, partition, 0, isolation=common_pb2.ISOLATION_LEVEL_READ_COMMITTED)
    return result.error.code == 0 and result.last_stable_offset == result.high_watermark


def test_node_client_produces_commits_aborts_and_reads_committed(raw):
    bootstrap = raw.cluster.state.bootstrap

    # No topic yet: UNKNOWN_TOPIC_OR_PARTITION is retriable, retried until the
    # client's deadline, then a clear failure (exit 2, the code in the JSON).
    # 5 s: a loaded machine's first call alone (Node starting, loading protos, connecting) can take a second
    status, out, _ = run_node(bootstrap, TOPIC, TXLOG_RETRY_DEADLINE_MS="5000")
    assert status == 2 and out["ok"] is False, out
    assert out["error_code"] == "UNKNOWN_TOPIC_OR_PARTITION" and out["retries"]["UNKNOWN_TOPIC_OR_PARTITION"] >= 1, out

    raw.create_topic(TOPIC, 2)
    leaders = raw.leaders(TOPIC)
    assert leaders[0] != leaders[1]  # each transaction spans both partition_svc instances

    # An older producer with the same transactional id, its transaction left
    # open on both partitions: the client's InitProducerId fences it and must
    # retry CONCURRENT_TRANSACTIONS while the coordinator aborts it.
    zombie = TxnProducer(raw, TRANSACTIONAL_ID).init()
    zombie.add((TOPIC, 0), (TOPIC, 1))
    for p in (0, 1):
        assert zombie.send(TOPIC, p, f"zombie-{p}").error.code == 0

    status, out, stderr = run_node(bootstrap, TOPIC, TXLOG_TRANSACTIONAL_ID=TRANSACTIONAL_ID)
    assert status == 0 and out["ok"] is True and out["mismatches"] == [], (out, stderr)
    assert out["retries"].get("CONCURRENT_TRANSACTIONS", 0) >= 1, out["retries"]
    # read from the call's google.rpc.Status details (ErrorInfo, RetryInfo),
    # decoded with the google/rpc protos that ship in protos/
    assert out["retried_errors"]["CONCURRENT_TRANSACTIONS"] == \
        {"class": "retriable", "retry_delay_ms": RETRY_DELAY_MS_DEFAULT}, out["retried_errors"]
    assert out["init"]["producer_id"] == zombie.producer_id and out["init"]["producer_epoch"] > zombie.producer_epoch
    found = raw.metadata(partition_pb2.MetadataRequest(transactional_ids=[TRANSACTIONAL_ID])).transaction_coordinators[0]
    assert out["coordinator"] == found.address  # what FindCoordinator told it

    run = out["run"]
    a, b = sorted(int(p) for p in out["partitions"])
    assert out["partitions"][str(a)]["leader_id"] != out["partitions"][str(b)]["leader_id"]
    txns = out["transactions"]
    assert [(t["name"], t["committed"]) for t in txns] == [("t1", True), ("t2", False), ("t3", True)]
    epoch = out["init"]["producer_epoch"]
    for t in txns:  # each transaction at the epoch the one before it was answered, on both leaders
        assert t["epoch_used"] == epoch and t["epoch_after"] > epoch and t["producer_id"] == out["init"]["producer_id"]
        assert {int(p) for p in t["partitions"]} == {a, b}
        assert t["partitions"][str(a)]["leader_id"] != t["partitions"][str(b)]["leader_id"]
        epoch = t["epoch_after"]
    idem = out["idempotent"]
    assert idem["batches"][0]["resent_base_offset"] == idem["batches"][0]["base_offset"]

    # Read again from Python once no transaction is open (the last EndTxn
    # answered before its markers were written).
    wait_until(lambda: no_transaction_open(raw, a) and no_transaction_open(raw, b), message="both partitions settled")
    committed = {p: read(raw, p, common_pb2.ISOLATION_LEVEL_READ_COMMITTED) for p in (a, b)}
    everything = {p: read(raw, p, common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED) for p in (a, b)}

    wanted = {
        a: [f"{run}:plain-0", f"{run}:idem-0", f"{run}:idem-1", f"{run}:idem-2"]
        + [v for t in txns if t["committed"] for v in t["partitions"][str(a)]["values"]],
        b: [v for t in txns if t["committed"] for v in t["partitions"][str(b)]["values"]],
    }
    assert wanted[a][-2:] == [f"{run}:t1-a", f"{run}:t3-a"] and len(wanted[b]) == 4
    for p in (a, b):
        # exactly the committed records (the topic is this test's alone), in order,
        # where the client saw them; no aborted record and nothing of the zombie
        assert [value for _, value, _ in committed[p]] == wanted[p]
        assert [(offset, value) for offset, value, _ in committed[p]] == \
            [(r["offset"], r["value"]) for r in out["read_committed"][str(p)]["records"]]
        # the aborted records and the zombie's were written: the server dropped them
        written = [value for _, value, _ in everything[p]]
        aborted = [v for t in txns if not t["committed"] for v in t["partitions"][str(p)]["values"]]
        assert aborted and set(aborted) <= set(written) and f"zombie-{p}" in written
        assert len(written) == len(set(written))  # the resent idempotent batch was not appended again

    batches = {value: batch for p in (a, b) for _, value, batch in everything[p]}
    plain = batches[f"{run}:plain-0"]  # left without producer fields: stored as a non-idempotent batch
    assert (plain.producer_id, plain.producer_epoch, plain.base_sequence, plain.is_transactional) == (-1, -1, -1, False)
    for value, sequence in ((f"{run}:idem-0", 0), (f"{run}:idem-2", 2)):
        got = batches[value]
        assert (got.producer_id, got.producer_epoch, got.base_sequence, got.is_transactional) == (idem["producer_id"], 0, sequence, False)
    for t in txns:  # every epoch starts each partition's sequence at 0; records sit where Produce said
        for p in (a, b):
            first = t["partitions"][str(p)]["values"][0]
            got = batches[first]
            assert (got.producer_id, got.producer_epoch, got.base_sequence, got.is_transactional) == \
                (out["init"]["producer_id"], t["epoch_used"], 0, True)
            assert offset_of(everything[p], first) == t["partitions"][str(p)]["base_offset"]

    # The coordinator's view: the last transaction committed, at the epoch the client ended with.
    complete = coordinator_pb2.TRANSACTION_STATE_COMPLETE_COMMIT
    wait_until(lambda: zombie.describe().state == complete, message="CompleteCommit")
    assert zombie.describe().producer_epoch == txns[-1]["epoch_after"]


def offset_of(records, value) -> int:
    return next(offset for offset, v, _ in records if v == value)
