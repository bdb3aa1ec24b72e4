"""Benchmark: what the seal of a prepared transaction costs PrepareTransaction.

Since the protocol-defects fix, PrepareTransaction tells every partition leader
of the transaction to take nothing more of it (a WriteTxnMarkers with
``seal_prepared``, one per leader, in parallel) before it answers; without that
a zombie of the preparing process could append to what the handle's holder
commits. This measures the price, on a local cluster started for the run
(ZooKeeper, producer_id_svc, two partition_svc, two coordinator_svc as real
processes):

* baseline: a raw unary gRPC call to the same coordinator (DescribeTransactions
  of one id), sequential: the floor of any coordinator round trip here;
* PrepareTransaction of a transaction with 1 and with 8 partitions (spread over
  both leaders), each holding one record, sequential: p50/p99 ms;
* EndTxn(commit) of the same shapes, until it answers (the markers are written
  after it answers): the call PrepareTransaction is compared with.

Ratios to the baseline are reported beside the milliseconds, since this
machine's speed moves from run to run. Run it on a tree before the seal existed
to see the difference (the seal's cost is the prepare ratio now minus then).

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.prepare [--transactions N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.measure import latency_summary, progress
from services.tooling.cluster import LocalCluster
from tests.integ.raw import Raw
from tests.integ.txn_raw import TxnProducer, retrying
from txlog.v1 import coordinator_pb2

TOPIC = "prepare-bench"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=150, help="transactions measured per shape")
    return parser.parse_args(argv)


def timed_s(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def one_shape(raw: Raw, partitions: int, transactions: int) -> dict:
    producer = TxnProducer(raw, f"bench/p{partitions}").init()
    coordinator = producer.coordinator()
    prepares, ends = [], []
    for i in range(transactions):
        producer.add(*[(TOPIC, p) for p in range(partitions)])
        for p in range(partitions):
            assert producer.send(TOPIC, p, f"r{i}").error.code == 0
        prepare = coordinator_pb2.PrepareTransactionRequest(
            transactional_id=producer.transactional_id, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch)
        prepares.append(timed_s(lambda request=prepare: retrying(lambda: coordinator.PrepareTransaction(request, timeout=30))))
        ends.append(timed_s(lambda: producer.end(committed=True)))
    return {"prepare_ms": latency_summary(prepares), "end_txn_ms": latency_summary(ends)}


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txlog-bench-prepare-") as directory:
        cluster = LocalCluster(Path(directory) / "cluster")
        cluster.up()
        try:
            cluster.wait_until_coordinators_settle()
            raw = Raw(cluster)
            raw.create_topic(TOPIC, 8)
            baseline_id = TxnProducer(raw, "bench/baseline").init()
            stub = baseline_id.coordinator()
            describe = coordinator_pb2.DescribeTransactionsRequest(transactional_ids=["bench/baseline"])
            for _ in range(50):
                stub.DescribeTransactions(describe, timeout=10)
            progress("baseline: raw unary calls")
            baseline = latency_summary([timed_s(lambda: stub.DescribeTransactions(describe, timeout=10)) for _ in range(args.transactions * 4)])
            shapes = {}
            for partitions in (1, 8):
                progress(f"{partitions} partition(s): {args.transactions} prepared transactions")
                one_shape(raw, partitions, 10)  # warm-up
                shapes[f"partitions_{partitions}"] = one_shape(raw, partitions, args.transactions)
            raw.close()
        except grpc.RpcError as exc:
            progress(f"failed: {exc}")
            raise
        finally:
            cluster.down()
    for shape in shapes.values():
        shape["prepare_p50_vs_raw_call"] = round(shape["prepare_ms"]["p50"] / baseline["p50"], 2)
        shape["prepare_p50_vs_end_txn"] = round(shape["prepare_ms"]["p50"] / shape["end_txn_ms"]["p50"], 2)
    print(json.dumps({"benchmark": "prepare", "transactions": args.transactions, "raw_call_ms": baseline, **shapes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
