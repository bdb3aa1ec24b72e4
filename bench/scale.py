"""Benchmark: how partition_svc's costs grow with the producers a partition has seen (issue 18).

On a local cluster of real processes (ZooKeeper, one producer_id_svc, one
partition_svc; services/cluster.py), one topic of one partition, replication
factor 1. For each level of ``--producer-ids`` (cumulative: the partition
keeps every producer of the levels before), it writes one idempotent
one-record batch per new producer id (hand-built ProduceRequests, ``--in-flight``
outstanding), then measures, one call at a time, ``--samples`` calls each:

* Fetch, read_committed, of the partition's last record;
* ListOffsets of the last stable offset, and of the high watermark;

and, after each level, partition_svc's resident memory (VmRSS) and the time a
restart (SIGTERM, start) takes until the partition answers ListOffsets again.

Then, on a second cluster with a coordinator_svc, what ZooKeeper does for the
work (its ``mntr`` counters, the services' own session pings over the same
time subtracted): requests and znodes per ``--transactions`` one-record
transactions through the SDK's transactional Producer, and per
``--producer-ids-allocated`` InitProducerId calls without a transactional id
(target: none per transaction; a block write per 1,000 producer ids).

The baseline is the first level (few producers) of the same run: the target is
latency flat within 20% (p50 at every level at most 1.2 times the first's),
which a last stable offset computed by scanning every producer on every call
cannot meet. Memory is reported per producer id above the first level.

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python bench/scale.py [--producer-ids 10,1000,10000,100000] [--samples 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure import progress  # noqa: E402

from services import cluster as cluster_mod  # noqa: E402
from services.cluster import LocalCluster  # noqa: E402
from services.stubs.txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc  # noqa: E402

TOPIC = "scale"
FIRST_PRODUCER_ID = 1_000_000  # far from what the cluster's producer_id_svc hands out
FLAT_WITHIN = 1.2


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producer-ids", default="10,1000,10000,100000",
                        help="distinct producer ids seen on the partition, per level (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=300, help="calls per latency figure (default: %(default)s)")
    parser.add_argument("--in-flight", type=int, default=64, help="produce requests outstanding while filling (default: %(default)s)")
    parser.add_argument("--transactions", type=int, default=1000, help="transactions in the ZooKeeper figure (default: %(default)s)")
    parser.add_argument("--producer-ids-allocated", type=int, default=1000,
                        help="InitProducerId calls in the ZooKeeper figure (default: %(default)s)")
    return parser.parse_args(argv)


def summary(samples_s: list[float]) -> dict:
    ordered = sorted(samples_s)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3)}


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


class Partition:
    """Hand-built calls to the one partition_svc."""

    def __init__(self, address: str):
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = partition_pb2_grpc.PartitionServiceStub(self.channel)

    async def create(self) -> None:
        reply = await self.stub.CreateTopics(partition_pb2.CreateTopicsRequest(topics=[
            partition_pb2.CreatableTopic(name=TOPIC, partition_count=1, replication_factor=1)]), timeout=30)
        assert reply.results[0].error.code == 0, reply

    async def produce_one(self, producer_id: int) -> None:
        batch = common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=0, base_sequence=0,
                                       records=[common_pb2.Record(key=producer_id.to_bytes(8, "big"), value=b"v" * 100)])
        reply = await self.stub.Produce(partition_pb2.ProduceRequest(
            batches=[partition_pb2.PartitionBatch(topic=TOPIC, partition=0, batch=batch)]), timeout=60)
        assert reply.results[0].error.code == 0, reply.results[0].error

    async def fill(self, producer_ids: range, in_flight: int) -> None:
        pending = iter(producer_ids)

        async def worker() -> None:
            for producer_id in pending:
                await self.produce_one(producer_id)

        await asyncio.gather(*(worker() for _ in range(in_flight)))

    async def offset(self, spec: int) -> int:
        reply = await self.stub.ListOffsets(partition_pb2.ListOffsetsRequest(partitions=[
            partition_pb2.ListOffsetsPartition(topic=TOPIC, partition=0, spec=spec)]), timeout=30)
        result = reply.results[0]
        assert result.error.code == 0, result.error
        return result.offset

    async def fetch_last(self, offset: int) -> None:
        reply = await self.stub.Fetch(partition_pb2.FetchRequest(
            isolation_level=common_pb2.ISOLATION_LEVEL_READ_COMMITTED, max_bytes=1 << 20,
            partitions=[partition_pb2.FetchPartition(topic=TOPIC, partition=0, fetch_offset=offset)]), timeout=30)
        result = reply.results[0]
        assert result.error.code == 0 and result.batches, result

    async def timed(self, call, samples: int) -> dict:
        taken = []
        for _ in range(samples):
            started = time.perf_counter()
            await call()
            taken.append(time.perf_counter() - started)
        return summary(taken)

    async def close(self) -> None:
        await self.channel.close()


async def latencies(partition: Partition, samples: int) -> dict:
    latest = await partition.offset(partition_pb2.OFFSET_SPEC_LATEST)
    return {
        "fetch_read_committed": await partition.timed(lambda: partition.fetch_last(latest - 1), samples),
        "list_offsets_last_stable": await partition.timed(lambda: partition.offset(partition_pb2.OFFSET_SPEC_LAST_STABLE), samples),
        "list_offsets_latest": await partition.timed(lambda: partition.offset(partition_pb2.OFFSET_SPEC_LATEST), samples),
    }


async def answers_again(address: str, timeout_s: float = 120) -> float:
    """Seconds until a restarted partition_svc answers ListOffsets for the partition."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        partition = Partition(address)
        try:
            await partition.offset(partition_pb2.OFFSET_SPEC_LATEST)
            return time.monotonic() - started
        except (grpc.RpcError, AssertionError):
            await asyncio.sleep(0.05)
        finally:
            await partition.close()
    raise RuntimeError("the partition did not answer again after a restart")


def restart(cluster: LocalCluster, name: str) -> float:
    started = time.monotonic()
    cluster.stop(name)
    cluster.start(name)
    address = cluster.state.services[name].address
    return time.monotonic() - started + asyncio.run(answers_again(address))


def measure(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    name = next(n for n in cluster.state.services if n.startswith("partition_svc"))
    levels = [int(level) for level in args.producer_ids.split(",")]
    rows, seen = [], 0

    async def level_figures(level: int) -> dict:
        partition = Partition(cluster.state.services[name].address)
        try:
            if seen == 0:
                await partition.create()
            progress(f"producers {seen} -> {level}")
            started = time.monotonic()
            await partition.fill(range(FIRST_PRODUCER_ID + seen, FIRST_PRODUCER_ID + level), args.in_flight)
            filled_s = time.monotonic() - started
            progress(f"latencies at {level} producers")
            return {"producer_ids": level, "fill_seconds": round(filled_s, 2), **await latencies(partition, args.samples)}
        finally:
            await partition.close()

    for level in levels:
        row = asyncio.run(level_figures(level))
        seen = level
        row["partition_svc_rss_kb"] = rss_kb(cluster.state.services[name].pid)
        progress(f"restart at {level} producers")
        row["restart_until_answering_s"] = round(restart(cluster, name), 2)
        rows.append(row)

    first = rows[0]
    growth = {key: [round(row[key]["p50_ms"] / first[key]["p50_ms"], 2) for row in rows]
              for key in ("fetch_read_committed", "list_offsets_last_stable", "list_offsets_latest")}
    memory_per_producer = None
    if len(rows) > 1 and rows[-1]["producer_ids"] > first["producer_ids"]:
        memory_per_producer = round((rows[-1]["partition_svc_rss_kb"] - first["partition_svc_rss_kb"]) * 1024
                                    / (rows[-1]["producer_ids"] - first["producer_ids"]), 1)
    return {
        "levels": rows,
        "p50_vs_first_level": growth,
        "target_p50_vs_first_level_at_most": FLAT_WITHIN,
        "meets_target": all(ratio <= FLAT_WITHIN for ratios in growth.values() for ratio in ratios),
        "rss_bytes_per_producer_id": memory_per_producer,
    }


def zookeeper_counters(connection: str) -> dict[str, int]:
    """ZooKeeper's packets received and znodes (its ``mntr`` counters)."""
    counters = cluster_mod.zookeeper_counters(connection)
    return {"packets_received": counters["zk_packets_received"], "znodes": counters["zk_znode_count"]}


def zookeeper_per_work(cluster: LocalCluster, work, count: int) -> dict:
    """ZooKeeper requests and new znodes while ``work()`` runs, less what the
    cluster asks of ZooKeeper idle over as long (session pings, refreshes)."""
    before = zookeeper_counters(cluster.state.zookeeper)
    started = time.monotonic()
    work()
    seconds = time.monotonic() - started
    after = zookeeper_counters(cluster.state.zookeeper)
    idle_before = after
    time.sleep(seconds)  # a baseline of the same length, nothing running
    idle_after = zookeeper_counters(cluster.state.zookeeper)
    busy = after["packets_received"] - before["packets_received"]
    idle = idle_after["packets_received"] - idle_before["packets_received"]
    return {"operations": count, "seconds": round(seconds, 2), "requests": busy, "idle_requests_same_time": idle,
            "requests_per_1000": round(max(busy - idle, 0) * 1000 / count, 1),  # below the idle noise: 0
            "new_znodes_per_1000": round((after["znodes"] - before["znodes"]) * 1000 / count, 1)}


def measure_zookeeper(workdir: str, args: argparse.Namespace) -> dict:
    from services.client import Producer
    from services.stubs.txlog.v1 import coordinator_pb2, coordinator_pb2_grpc

    cluster = LocalCluster(Path(workdir) / "zookeeper-cluster")
    cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=1)
    try:
        cluster.wait_until_coordinators_settle()
        bootstrap = cluster.state.bootstrap
        with grpc.insecure_channel(bootstrap.split(",")[0]) as channel:
            partition_pb2_grpc.PartitionServiceStub(channel).CreateTopics(partition_pb2.CreateTopicsRequest(topics=[
                partition_pb2.CreatableTopic(name="zk-txn", partition_count=1, replication_factor=1)]), timeout=30)
            init = coordinator_pb2_grpc.CoordinatorServiceStub(channel).InitProducerId

            def allocate() -> None:
                for _ in range(args.producer_ids_allocated):
                    init(coordinator_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=30)

            progress(f"ZooKeeper per {args.producer_ids_allocated} producer ids")
            producer_ids = zookeeper_per_work(cluster, allocate, args.producer_ids_allocated)
        with Producer(bootstrap, transactional_id="zk-txn") as producer:
            producer.init_transactions()

            def transact() -> None:
                for i in range(args.transactions):
                    producer.begin_transaction()
                    producer.send("zk-txn", f"{i}", partition=0)
                    producer.commit_transaction()

            transact()  # warm: coordinators found, metadata cached
            progress(f"ZooKeeper per {args.transactions} transactions")
            transactions = zookeeper_per_work(cluster, transact, args.transactions)
        return {"transactions": transactions, "producer_ids": producer_ids}
    finally:
        cluster.down(grace_s=5)


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txlog-bench-scale-") as workdir:
        cluster = LocalCluster(Path(workdir) / "cluster")
        cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=0)
        try:
            figures = measure(cluster, args)
        finally:
            cluster.down(grace_s=5)
        figures["zookeeper"] = measure_zookeeper(workdir, args)
    print(json.dumps({
        "benchmark": "scale: partition_svc latency, memory and restart against the producer ids a partition has seen",
        "parameters": {"samples": args.samples, "in_flight": args.in_flight},
        "machine": {"cpus": os.cpu_count()},
        **figures,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
