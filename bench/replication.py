"""Benchmark: what replication costs and how fast it recovers (issue 14).

On one local cluster of real processes (ZooKeeper, producer_id_svc, three
partition_svc, one coordinator_svc; services/tooling/cluster.py), with 1 KB records:

* throughput: one producer (batches without a producer id), hand-built batches of
  ``--batch-records`` records in the encoded batch format (``throughput``) and,
  first, in the list-of-records message form (``throughput_message_form``, the
  form before: the same run's "before"), ``--in-flight`` requests outstanding, to one
  partition with replication factor 1 (acks=all is then the leader's synced
  write) and to one with replication factor 3 (acks=all waits for both
  followers to fetch and sync). The baseline is the RF1 figure of the same run
  on the same cluster; target RF3 >= 60% of RF1 (Kafka publishes about half
  for three synchronous replicas). Beside each figure, the CPU seconds each
  process spent per 100 MB (leader, followers, this client), from /proc: on a
  machine with fewer cores than processes, RF3's ratio is bounded by the sum;
* latency: one-record produces, one at a time, p50/p99, RF1 and RF3;
* failover: ``--failovers`` times, kill -9 of an RF3 partition's leader
  while a loop produces one-record batches with acks=all to whoever the
  metadata names as leader; the time from the kill to the metadata naming a
  new leader and to the first acknowledgement by it, beside the ZooKeeper
  session timeout the cluster runs with (target: every run <= session timeout
  + 2 s); the killed leader is restarted and back in the ISR before the next;
* rejoin: a follower killed, its data directory wiped and started again after
  ``--rejoin-mb`` MB were written: the time until it is back in the ISR, and
  that time scaled to a GB;
* transactions: ``--commits`` transactions of one record to each of 8 RF3
  partitions through the SDK's transactional Producer: the whole
  transaction's latency from the sends to commit_transaction()'s return
  (target p99 <= 30 ms), and, in alternate transactions, commit_transaction()
  alone once the records are acknowledged.

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.replication [--records N] [--session-timeout-s S] [--only PART ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from services.tooling.cluster import LocalCluster
from txlog import Producer
from txlog.protocol import batch_format
from txlog.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_pb2,
    partition_pb2_grpc,
)

VALUE = b"v" * 1024
KEY_BYTES = 8
RECORD_BYTES = KEY_BYTES + len(VALUE)
PARTS = ("throughput", "latency", "transactions", "failover", "rejoin")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per throughput run (default: %(default)s)")
    parser.add_argument("--batch-records", type=int, default=500, help="records per produced batch (default: %(default)s)")
    parser.add_argument("--in-flight", type=int, default=4, help="produce requests outstanding (default: %(default)s)")
    parser.add_argument("--latency-samples", type=int, default=300, help="one-record produces per latency run")
    parser.add_argument("--session-timeout-s", type=float, default=6.0, help="the services' ZooKeeper session timeout")
    parser.add_argument("--failovers", type=int, default=10, help="leader kills in the failover part (default: %(default)s)")
    parser.add_argument("--rejoin-mb", type=int, default=200, help="MB written before a follower is wiped")
    parser.add_argument("--commits", type=int, default=200, help="transactions in the commit-latency run")
    parser.add_argument("--only", choices=PARTS, action="append",
                        help="run only this part (repeatable; default: every part)")
    args = parser.parse_args(argv)
    args.only = set(args.only or PARTS)
    return args


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentiles(samples_ms: list[float]) -> dict:
    ordered = sorted(samples_ms)
    return {"p50": round(statistics.median(ordered), 2), "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
            "samples": len(ordered)}


class Client:
    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> partition_pb2_grpc.PartitionServiceStub:
        if address not in self.channels:
            self.channels[address] = grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20),
                                                                                  ("grpc.max_send_message_length", 64 << 20)])
        return partition_pb2_grpc.PartitionServiceStub(self.channels[address])

    def live_addresses(self) -> list[str]:
        return [p.address for name, p in self.cluster.state.services.items() if name.startswith("partition_svc")]

    async def metadata(self, topic: str) -> partition_pb2.PartitionMetadata:
        for address in self.live_addresses():
            try:
                reply = await self.stub(address).Metadata(partition_pb2.MetadataRequest(topics=[topic]), timeout=5)
                return reply.topics[0].partitions[0]
            except grpc.RpcError:
                continue
        raise RuntimeError("no partition_svc answers Metadata")

    async def create(self, topic: str, partitions: int, replication_factor: int) -> None:
        reply = await self.stub(self.live_addresses()[0]).CreateTopics(partition_pb2.CreateTopicsRequest(topics=[
            partition_pb2.CreatableTopic(name=topic, partition_count=partitions, replication_factor=replication_factor,
                                         configs={"min.insync.replicas": str(min(2, replication_factor))})]), timeout=30)
        assert reply.results[0].error.code == 0, reply
        for p in range(partitions):
            await self.wait(lambda p=p: self.in_sync(topic, p, replication_factor), 60, f"{topic}-{p} in sync")

    async def in_sync(self, topic: str, partition: int, replicas: int) -> bool:
        for address in self.live_addresses():
            try:
                reply = await self.stub(address).Metadata(partition_pb2.MetadataRequest(topics=[topic]), timeout=5)
            except grpc.RpcError:
                continue
            meta = reply.topics[0].partitions[partition]
            return meta.error.code == 0 and len(meta.isr) == replicas
        return False

    @staticmethod
    async def wait(probe, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not await probe():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    async def producer_id(self) -> int:
        channel = self.channels.get(self.live_addresses()[0]) or grpc.aio.insecure_channel(self.live_addresses()[0])
        reply = await coordinator_pb2_grpc.CoordinatorServiceStub(channel).InitProducerId(
            coordinator_pb2.InitProducerIdRequest(), timeout=30)
        return reply.producer_id


def batch(producer_id: int, sequence: int, count: int, start: int) -> common_pb2.RecordBatch:
    """Records of 1 KB; producer_id -1: no producer (not idempotent)."""
    return common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1, base_sequence=sequence, records=[
        common_pb2.Record(key=(start + i).to_bytes(KEY_BYTES, "big"), value=VALUE) for i in range(count)])


def encoded_batch(count: int, start: int) -> bytes:
    """The same records as ``batch(-1, -1, count, start)``, in the encoded batch format (what the SDK sends)."""
    records = common_pb2.RecordBatch(records=batch(-1, -1, count, start).records).SerializeToString()
    return batch_format.encode(records, count, untimed=True)


def check_produced(reply: partition_pb2.ProduceResponse) -> None:
    assert reply.results[0].error.code == 0, reply.results[0].error


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(client: Client, topic: str, args: argparse.Namespace, form: str = "encoded") -> dict:
    """Batches without a producer id: several requests in flight may reach the
    leader out of order, which an idempotent producer's sequences would refuse
    (the SDK retries those; a raw pipeline does not). The replication work per
    byte is the same. ``form``: "encoded" (PartitionBatch.encoded_batch, what
    the SDK sends) or "message" (PartitionBatch.batch, the form before)."""
    meta = await client.metadata(topic)
    leader = meta.leader_address
    stub = client.stub(leader)
    pids = {"client": os.getpid(), "leader": next(p.pid for p in client.cluster.state.services.values() if p.address == leader),
            **{f"follower_{n}": client.cluster.state.services[f"partition_svc-{n}"].pid for n in meta.replicas if n != meta.leader_id}}
    cpu_before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    def item(i: int) -> partition_pb2.PartitionBatch:
        if form == "encoded":
            return partition_pb2.PartitionBatch(topic=topic, partition=0, encoded_batch=encoded_batch(args.batch_records, i * args.batch_records))
        return partition_pb2.PartitionBatch(topic=topic, partition=0, batch=batch(-1, -1, args.batch_records, i * args.batch_records))

    requests = [partition_pb2.ProduceRequest(acks=-1, batches=[item(i)]) for i in range(args.records // args.batch_records)]
    started = time.perf_counter()
    in_flight: collections.deque = collections.deque()
    for request in requests:  # issued in order (sequences never arrive ahead), at most --in-flight outstanding
        if len(in_flight) >= args.in_flight:
            check_produced(await in_flight.popleft())
        in_flight.append(stub.Produce(request, timeout=120))
    while in_flight:
        check_produced(await in_flight.popleft())
    seconds = time.perf_counter() - started
    records = len(requests) * args.batch_records
    per_100_mb = 100e6 / (records * RECORD_BYTES)
    cpu = {role: round((cpu_seconds(pid) - cpu_before[role]) * per_100_mb, 3) for role, pid in pids.items()}
    return {"batch_format": form, "records": records, "seconds": round(seconds, 3), "records_per_s": round(records / seconds),
            "mb_per_s": round(records * RECORD_BYTES / seconds / 1e6, 2), "cpu_seconds_per_100_mb": cpu,
            "cores_busy": round(sum(cpu.values()) / per_100_mb / seconds, 2)}


def cpu_bound_ceiling(rf1: dict, rf3: dict) -> float:
    """The RF3/RF1 ratio this machine allows when both runs are CPU-bound on the
    same cores: RF1's CPU per MB (client + leader) over RF3's (client + leader +
    followers). Kafka's published RF3 figure has each replica on its own
    machine; here the three replicas share the machine's cores, so every byte
    is received, written and synced three times on the same cores."""
    return round(sum(rf1["cpu_seconds_per_100_mb"].values()) / sum(rf3["cpu_seconds_per_100_mb"].values()), 3)


async def latency(client: Client, topic: str, samples: int) -> dict:
    stub = client.stub((await client.metadata(topic)).leader_address)
    times = []
    for i in range(samples):
        request = partition_pb2.ProduceRequest(acks=-1, batches=[partition_pb2.PartitionBatch(
            topic=topic, partition=0, batch=common_pb2.RecordBatch(records=[common_pb2.Record(value=VALUE)]))])
        started = time.perf_counter()
        reply = await stub.Produce(request, timeout=30)
        times.append((time.perf_counter() - started) * 1000)
        assert reply.results[0].error.code == 0 or i > 0, reply
    return percentiles(times)


async def failover(client: Client, cluster: LocalCluster, topic: str) -> dict:
    """One kill -9 of the partition's leader: seconds until the metadata names
    another leader (``elected_s``) and until it acknowledges an acks=all write."""
    leader = await client.metadata(topic)
    name = next(n for n, p in cluster.state.services.items() if p.address == leader.leader_address)
    was_controller = await asyncio.to_thread(controller_of, cluster) == name
    request = partition_pb2.ProduceRequest(acks=-1, batches=[partition_pb2.PartitionBatch(
        topic=topic, partition=0, batch=common_pb2.RecordBatch(records=[common_pb2.Record(value=b"after")]))])
    cluster.kill(name)
    killed = time.perf_counter()
    attempts, elected = 0, None
    while True:
        attempts += 1
        try:
            meta = await client.metadata(topic)
            if meta.error.code == 0 and meta.leader_address != leader.leader_address:
                elected = elected or time.perf_counter() - killed
                reply = await client.stub(meta.leader_address).Produce(request, timeout=5)
                if reply.results[0].error.code == 0:
                    break
        except grpc.RpcError:
            pass
        await asyncio.sleep(0.02)
    seconds = time.perf_counter() - killed
    cluster.start(name)
    await client.wait(lambda: client.in_sync(topic, 0, 3), 120, "the killed leader back in sync")
    return {"seconds_to_first_ack": round(seconds, 3), "elected_s": round(elected, 3), "attempts": attempts,
            "killed": name, "killed_the_controller": was_controller}


def controller_of(cluster: LocalCluster) -> str | None:
    """The service name of the partition_svc that is the controller now."""
    zookeeper = KazooClient(hosts=cluster.state.zookeeper)
    zookeeper.start(timeout=30)
    try:
        data, _ = zookeeper.get("/txlog/controller")
        return f"partition_svc-{json.loads(data)['node_id']}"
    except NoNodeError:
        return None
    finally:
        zookeeper.stop()
        zookeeper.close()


async def failovers(client: Client, cluster: LocalCluster, topic: str, runs: int, bound_s: float) -> dict:
    """``runs`` failovers, one after another (the killed leader back in the ISR
    before the next), and their distribution against ``bound_s``."""
    each = []
    for run in range(runs):
        say(f"failover {run + 1} of {runs}")
        each.append(await failover(client, cluster, topic))
    seconds = sorted(r["seconds_to_first_ack"] for r in each)
    return {"runs": each, "seconds_to_first_ack": {"min": seconds[0], "median": statistics.median(seconds),
                                                   "max": seconds[-1]},
            "within_bound": sum(1 for s in seconds if s <= bound_s), "of": runs}


async def rejoin(client: Client, cluster: LocalCluster, topic: str, args: argparse.Namespace) -> dict:
    meta = await client.metadata(topic)
    stub = client.stub(meta.leader_address)
    producer_id = await client.producer_id()
    count = args.rejoin_mb * 1_000_000 // RECORD_BYTES // args.batch_records
    for i in range(count):
        reply = await stub.Produce(partition_pb2.ProduceRequest(acks=1, batches=[partition_pb2.PartitionBatch(
            topic=topic, partition=0, batch=batch(producer_id, i * args.batch_records, args.batch_records, i))]), timeout=120)
        assert reply.results[0].error.code == 0, reply
    await client.wait(lambda: client.in_sync(topic, 0, 3), 300, "every replica caught up")
    follower = next(n for n in meta.replicas if n != meta.leader_id)
    name = f"partition_svc-{follower}"
    cluster.kill(name)
    shutil.rmtree(Path(cluster.dir) / name)
    cluster.start(name)
    started = time.perf_counter()
    zookeeper = KazooClient(hosts=cluster.state.zookeeper)
    zookeeper.start(timeout=30)
    try:
        def rejoined() -> bool:
            """In the ISR as a state written after it registered again: it caught up, the leader took it back."""
            registration = zookeeper.exists(f"/txlog/services/partition_svc/{follower}")
            data, stat = zookeeper.get(f"/txlog/topics/{topic}/partitions/0/state")
            return registration is not None and stat.mzxid > registration.czxid and follower in json.loads(data)["isr"]

        async def probe() -> bool:
            return await asyncio.to_thread(rejoined)

        await client.wait(probe, 600, "the wiped follower back in the ISR")
    finally:
        zookeeper.stop()
        zookeeper.close()
    seconds = time.perf_counter() - started
    mb = count * args.batch_records * RECORD_BYTES / 1e6
    return {"mb": round(mb, 1), "seconds": round(seconds, 3), "seconds_per_gb": round(seconds / mb * 1000, 2)}


def commit_latency(bootstrap: str, topic: str, commits: int) -> dict:
    """Per transaction of one record on each of 8 partitions: ``transaction``,
    from the sends to commit_transaction()'s return (the records' produce,
    with the partitions' AddPartitionsToTxn before it, then EndTxn), and
    ``commit_after_acks``, commit_transaction() alone once every record is
    acknowledged (EndTxn: the PrepareCommit write to the replicated
    transaction log)."""
    whole, commit_only = [], []
    with Producer(bootstrap, transactional_id=f"bench-{topic}", linger_ms=0) as producer:
        producer.init_transactions()
        for i in range(commits + 10):
            acked = i % 2 == 1  # alternate, so the two kinds see the same cluster
            producer.begin_transaction()
            for p in range(8):
                producer.send(topic, value=b"x", partition=p)
            started = time.perf_counter()
            if acked:
                producer.flush()
                started = time.perf_counter()
            producer.commit_transaction()
            if i >= 10:  # the first ones pay for connections and metadata
                (commit_only if acked else whole).append((time.perf_counter() - started) * 1000)
    return {"transaction": percentiles(whole), "commit_after_acks": percentiles(commit_only)}


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    client = Client(cluster)
    figures = {}
    if args.only & {"throughput", "latency"}:
        say("creating topics")
        await client.create("rf1", 1, 1)
        await client.create("rf3", 1, 3)
        await client.create("rf1-message", 1, 1)
        await client.create("rf3-message", 1, 3)
    if "throughput" in args.only:
        for form, key, suffix in (("message", "throughput_message_form", "-message"), ("encoded", "throughput", "")):
            say(f"throughput, {form} batches")  # the message form first: the form before, in the same run
            rf1 = await throughput(client, f"rf1{suffix}", args, form)
            rf3 = await throughput(client, f"rf3{suffix}", args, form)
            ratio = round(rf3["mb_per_s"] / rf1["mb_per_s"], 3)
            ceiling = cpu_bound_ceiling(rf1, rf3)
            figures[key] = {"rf1_acks_all": rf1, "rf3_acks_all": rf3, "rf3_vs_rf1": ratio, "target_rf3_vs_rf1": 0.6,
                            "meets_target": ratio >= 0.6, "cpu_bound_ceiling": ceiling,
                            "rf3_vs_rf1_of_ceiling": round(ratio / ceiling, 3),
                            # the ceiling holds only if both runs kept the machine's cores (nearly) busy
                            "both_runs_cpu_bound": min(rf1["cores_busy"], rf3["cores_busy"]) >= 0.75 * (os.cpu_count() or 1)}
    if "latency" in args.only:
        say("latency")
        figures["produce_latency_ms"] = {"rf1_acks_all": await latency(client, "rf1", args.latency_samples),
                                         "rf3_acks_all": await latency(client, "rf3", args.latency_samples)}
    if "transactions" in args.only:
        say("transactions")
        await client.create("txn8-rf1", 8, 1)
        commits_rf1 = await asyncio.to_thread(commit_latency, cluster.state.bootstrap, "txn8-rf1", args.commits)
        await client.create("txn8", 8, 3)
        commits = await asyncio.to_thread(commit_latency, cluster.state.bootstrap, "txn8", args.commits)
        figures["transaction_commit_ms_8_partitions_rf3"] = {**commits, "target_p99": 30,
                                                             "meets_target": commits["transaction"]["p99"] <= 30}
        # the same transactions on 8 partitions of one replica (the transaction log still has three)
        figures["transaction_commit_ms_8_partitions_rf1"] = commits_rf1
    if "failover" in args.only:
        say("failover")
        await client.create("failover", 1, 3)
        bound_s = args.session_timeout_s + 2
        failed_over = await failovers(client, cluster, "failover", args.failovers, bound_s)
        figures["failover"] = {**failed_over, "zookeeper_session_timeout_s": args.session_timeout_s,
                               "target_s": bound_s, "meets_target": failed_over["within_bound"] == args.failovers}
    if "rejoin" in args.only:
        say("rejoin")
        await client.create("rejoin", 1, 3)
        figures["wiped_follower_rejoin"] = await rejoin(client, cluster, "rejoin", args)
    return figures


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txlog-bench-replication-") as workdir:
        cluster = LocalCluster(Path(workdir) / "cluster")
        session = ["--zookeeper-session-timeout-s", str(args.session_timeout_s)]
        cluster.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=1,
                   service_args={"partition_svc": session, "coordinator_svc": session})
        try:
            figures = asyncio.run(measure(cluster, args))
        finally:
            for name in cluster.state.services:
                cluster.kill(name, signal.SIGCONT)
            cluster.down(grace_s=5)
    print(json.dumps({
        "benchmark": "replication: RF3 acks=all against RF1 on the same cluster, failover, rejoin, transactions",
        "parameters": {"records": args.records, "records_per_batch": args.batch_records, "in_flight": args.in_flight,
                       "record_bytes": RECORD_BYTES, "fsync": True, "mb": "10^6 bytes of payload",
                       "parts": [part for part in PARTS if part in args.only]},
        "machine": {"cpus": os.cpu_count()},
        **figures,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
