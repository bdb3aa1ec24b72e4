"""Benchmark: how the services' costs grow with the work (issue 18): producers a
partition has seen, partitions, log length, transactional ids.

Sections ``producers`` and ``zookeeper``, here. On a local cluster of real
processes (ZooKeeper, one producer_id_svc, one partition_svc;
services/tooling/cluster.py), one topic of one partition, replication
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

Sections of bench/scale_footprint.py, each on a cluster of its own, each
figure with its target and ``meets_target``:

* ``memory``: partition_svc's resident memory per idle partition at 100,
  1,000 and 10,000 partitions (``--partitions``, capped by
  ``--partitions-max``; target at most 100 KB each), with its idle CPU and
  ZooKeeper's requests, znodes and watches per partition, and what a second
  partition_svc that holds none of them pays for them;
* ``recovery``: partition_svc's restart (SIGTERM, start) until every
  partition answers, at each of those partition counts, and for one
  partition with a 10 MB and a 200 MB log (``--log-mb``; target: the long
  log's restart within 1.25 times the short one's);
* ``coordinator``: coordinator_svc's resident memory per transactional id at
  1,000, 10,000 and 100,000 ids (``--transactional-ids``; target at most
  1 KB each), its idle CPU per 100,000 ids (its timers, which take only the
  ids whose time came) and DescribeTransactions latency meanwhile,
  and, after a restart at each level, the load time of its transaction log
  per 100,000 records (target at most 1 s); 1,000,000 ids are extrapolated
  from the largest level unless ``--transactional-ids`` lists them
  (``--only coordinator --transactional-ids 1000000``: 16 minutes here).

``--only memory,recovery`` runs some sections (default: all of
producers, zookeeper, memory, recovery, coordinator); a section that fails
is named in ``failed_sections`` (exit status 1) and the others still run.
The default run takes 5-6 minutes on a 2-core machine (5.0 and 5.5 measured):
producers and zookeeper about 1, memory and recovery about 2 (the restart
with 10,000 partitions alone takes 30 s to 100 s from run to run),
coordinator about 2.5 (InitProducerId for 100,000 ids, at ~1,300/s).

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.scale [--producer-ids 10,1000,10000,100000] [--samples 300]
[--only SECTIONS] [--partitions-max N] [--transactional-ids 1000,10000,100000]``.
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

from bench.measure import progress
from bench.scale_footprint import measure_coordinator, measure_log_length, measure_partitions, rss_kb
from services.tooling import cluster as cluster_mod
from services.tooling.cluster import LocalCluster
from txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc

TOPIC = "scale"
FIRST_PRODUCER_ID = 1_000_000  # far from what the cluster's producer_id_svc hands out
FLAT_WITHIN = 1.2
SECTIONS = ("producers", "zookeeper", "memory", "recovery", "coordinator")
PAPER_IDS = 1_000_000  # the coordinator's figures are extrapolated to this many ids when not measured


def numbers(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def sections(text: str) -> set[str]:
    chosen = {s.strip() for s in text.split(",") if s.strip()}
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    return chosen


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producer-ids", default="10,1000,10000,100000",
                        help="distinct producer ids seen on the partition, per level (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=300, help="calls per latency figure (default: %(default)s)")
    parser.add_argument("--in-flight", type=int, default=64, help="produce requests outstanding while filling (default: %(default)s)")
    parser.add_argument("--transactions", type=int, default=1000, help="transactions in the ZooKeeper figure (default: %(default)s)")
    parser.add_argument("--producer-ids-allocated", type=int, default=20000,
                        help="InitProducerId calls in the ZooKeeper figure; enough that the cluster's periodic reads "
                             "(a burst every few seconds) average out of a figure of about one (default: %(default)s)")
    parser.add_argument("--only", type=sections, default=set(SECTIONS),
                        help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--partitions", type=numbers, default=[100, 1000, 10000],
                        help="idle partitions on the one partition_svc, per level (default: 100,1000,10000)")
    parser.add_argument("--partitions-max", type=int, default=10_000,
                        help="levels of --partitions above this are left out (default: %(default)s)")
    parser.add_argument("--log-mb", type=numbers, default=[10, 200],
                        help="log of the one partition restarted, MB of record values, short then long (default: 10,200)")
    parser.add_argument("--restarts", type=int, default=5,
                        help="restarts per log length, taken in turn with the other length's; the median counts (default: %(default)s)")
    parser.add_argument("--transactional-ids", type=numbers, default=[1000, 10000, 100000],
                        help="transactional ids on the one coordinator, per level; add 1000000 to measure what is "
                             "otherwise extrapolated (default: 1000,10000,100000)")
    parser.add_argument("--init-concurrency", type=int, default=64,
                        help="InitProducerId calls outstanding while adding ids (default: %(default)s)")
    parser.add_argument("--idle-seconds", type=float, default=10.0,
                        help="idle window after each level: CPU, ZooKeeper requests, then memory (default: %(default)s)")
    args = parser.parse_args(argv)
    args.partitions = [n for n in args.partitions if n <= args.partitions_max] or [args.partitions_max]
    return args


def summary(samples_s: list[float]) -> dict:
    ordered = sorted(samples_s)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3)}


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
    from txlog import Producer
    from txlog.v1 import coordinator_pb2, coordinator_pb2_grpc

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


def measure_producers(workdir: str, args: argparse.Namespace) -> dict:
    cluster = LocalCluster(Path(workdir) / "cluster")
    cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=0)
    try:
        return measure(cluster, args)
    finally:
        cluster.down(grace_s=5)


def measure_footprint(workdir: str, args: argparse.Namespace) -> dict:
    """The memory and recovery sections: one run of partition levels serves both."""
    partitions = measure_partitions(Path(workdir), args.partitions, args.idle_seconds, "recovery" in args.only)
    figures = {}
    if "memory" in args.only:
        figures["partition_memory"] = partitions["memory"]
    if "recovery" in args.only:
        figures["partition_recovery"] = {"against_partitions": partitions["restart_against_partitions"],
                                         "against_log_length": measure_log_length(Path(workdir), args.log_mb, args.restarts)}
    return figures


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    runs = [
        ({"producers"}, lambda workdir: measure_producers(workdir, args)),
        ({"zookeeper"}, lambda workdir: {"zookeeper": measure_zookeeper(workdir, args)}),
        ({"memory", "recovery"}, lambda workdir: measure_footprint(workdir, args)),
        ({"coordinator"}, lambda workdir: {"coordinator": measure_coordinator(
            Path(workdir), args.transactional_ids, args.init_concurrency, args.idle_seconds, PAPER_IDS)}),
    ]
    figures: dict = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="txlog-bench-scale-") as workdir:
        for names, run in runs:
            if not names & args.only:
                continue
            try:
                figures.update(run(workdir))
            except Exception as exc:  # the other sections still run and print; the exit status says one failed
                progress(f"{'/'.join(sorted(names & args.only))} failed: {exc!r}")
                failed["/".join(sorted(names & args.only))] = repr(exc)
    print(json.dumps({
        "benchmark": "scale: partition_svc and coordinator_svc latency, memory, restart and load time against "
                     "producer ids, partitions, log length and transactional ids",
        "parameters": {"sections": [s for s in SECTIONS if s in args.only], "samples": args.samples, "in_flight": args.in_flight,
                       "partitions": args.partitions, "log_mb": args.log_mb, "transactional_ids": args.transactional_ids,
                       "init_concurrency": args.init_concurrency, "idle_seconds": args.idle_seconds},
        # the machine is shared: a load average well above the cpus means the timings were taken in a crowd
        "machine": {"cpus": os.cpu_count(), "load_average_1min_at_start": round(load_before[0], 2),
                    "load_average_1min_at_end": round(os.getloadavg()[0], 2)},
        **figures,
        **({"failed_sections": failed} if failed else {}),
    }, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
