"""Benchmark: consumer groups (issue 16).

On one local cluster (ZooKeeper, producer_id_svc, one partition_svc, which
coordinates every group), three measurements:

1. **Rebalance time**: ten SDK consumers subscribed to a 30-partition topic;
   one leaves (``close``) or a new one joins, and the time until the group is
   Stable again with every partition assigned (DescribeGroups, polled every
   10 ms) is taken, ``--rounds`` times each; p50 and p99. The members
   heartbeat every ``--heartbeat-interval-ms`` (the coordinator's setting):
   a rebalance takes a few heartbeats (revoke, then assign).
2. **Heartbeat cost**: N members (raw gRPC, asyncio), each heartbeating once
   per second for ``--seconds``, against the partition_svc's CPU time: CPU ms
   per member per second, and per heartbeat against a baseline measured in the
   same run, the same number of Metadata calls (a raw gRPC call that reads
   little) at the same rate.
3. **Capacity**: the largest member count (from ``--members``) whose
   heartbeats, once per second, keep the coordinator under half a core.

Prints one JSON object to stdout; progress goes to stderr.

    python -m bench.groups [--rounds R] [--members 100,200,400,800] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import grpc

from bench.measure import cpu_seconds, latency_summary, progress
from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer
from txlog.v1 import partition_pb2, partition_pb2_grpc

TOPIC, PARTITIONS, MEMBERS = "bench-groups", 30, 10
CORE_SHARE_MAX = 0.5
SESSION_TIMEOUT_MS = 300_000  # the load's members join first, then heartbeat: none may time out meanwhile
JOINS_AT_ONCE = 50


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="leaves and joins timed, each (default: %(default)s)")
    parser.add_argument("--members", default="100,200,400,800", help="member counts for the heartbeat cost (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="heartbeating time per member count (default: %(default)s)")
    parser.add_argument("--heartbeat-interval-ms", type=int, default=200, help="for the rebalances (default: %(default)s)")
    args = parser.parse_args(argv)
    args.member_counts = [int(m) for m in args.members.split(",") if m]
    if args.rounds < 1 or not args.member_counts or min(args.member_counts) < 1 or args.seconds <= 0:
        parser.error("--rounds, --members and --seconds must be positive")
    return args


def settled(admin: Admin, group: str, members: int) -> bool:
    described = admin.describe_group(group)
    assigned = [tp for m in described.members for tp in m.assigned]
    return (described.state == "Stable" and len(described.members) == members and len(assigned) == PARTITIONS
            and len(set(assigned)) == PARTITIONS)


def wait_settled(admin: Admin, group: str, members: int, timeout_s: float = 60) -> float:
    started = time.perf_counter()
    while not settled(admin, group, members):
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"group {group} not settled with {members} members within {timeout_s} s: "
                               f"{admin.describe_group(group)}")
        time.sleep(0.01)
    return time.perf_counter() - started


class Member:
    """A subscribed consumer polled in its own thread, as an application
    would: revocations complete in poll()."""

    def __init__(self, bootstrap: str, group: str):
        self.consumer = Consumer(bootstrap, group_id=group, session_timeout_ms=30_000)
        self.consumer.subscribe([TOPIC])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(timeout_s=0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.consumer.close()


def rebalances(bootstrap: str, rounds: int) -> dict:
    group = "bench-rebalance"
    members = [Member(bootstrap, group) for _ in range(MEMBERS)]
    leaves, joins = [], []
    try:
        with Admin(bootstrap) as admin:
            wait_settled(admin, group, MEMBERS)
            for index in range(rounds):
                progress(f"rebalance round {index + 1}/{rounds}")
                members.pop(0).close()
                leaves.append(wait_settled(admin, group, MEMBERS - 1))
                members.append(Member(bootstrap, group))
                joins.append(wait_settled(admin, group, MEMBERS))
    finally:
        for member in members:
            member.close()
    return {"leave": latency_summary(leaves), "join": latency_summary(joins)}


async def heartbeat_load(address: str, members: int, seconds: float, pid: int) -> dict:
    """``members`` members join, then heartbeat once per second each for
    ``seconds``; the partition_svc's CPU over that time."""
    group = f"bench-load-{members}-{uuid.uuid4().hex[:6]}"
    async with grpc.aio.insecure_channel(address) as channel:
        stub = partition_pb2_grpc.PartitionServiceStub(channel)
        async def join() -> list:
            member_id = uuid.uuid4().hex
            answer = await stub.ConsumerGroupHeartbeat(partition_pb2.ConsumerGroupHeartbeatRequest(
                group_id=group, member_id=member_id, member_epoch=0, subscribed_topics=partition_pb2.TopicNames(names=[TOPIC]),
                session_timeout_ms=SESSION_TIMEOUT_MS))
            return [member_id, answer.member_epoch, answer.assignment]

        started = time.perf_counter()
        state = []
        for first in range(0, members, JOINS_AT_ONCE):
            state += await asyncio.gather(*(join() for _ in range(first, min(first + JOINS_AT_ONCE, members))))
        join_seconds = time.perf_counter() - started
        sent = 0

        async def beat(index: int) -> None:
            nonlocal sent
            member = state[index]
            await asyncio.sleep(index / members)  # spread over the second
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                answer = await stub.ConsumerGroupHeartbeat(partition_pb2.ConsumerGroupHeartbeatRequest(
                    group_id=group, member_id=member[0], member_epoch=member[1], owned_partitions=member[2]))
                member[1], member[2] = answer.member_epoch, answer.assignment
                sent += 1
                await asyncio.sleep(1.0)

        before = cpu_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(*(beat(i) for i in range(members)))
        wall = time.perf_counter() - started
        spent = cpu_seconds(pid) - before
        for member_id, _, _ in state:
            await stub.ConsumerGroupHeartbeat(partition_pb2.ConsumerGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=-1))
    return {"members": members, "join_seconds": round(join_seconds, 2), "heartbeats": sent, "seconds": round(wall, 2),
            "coordinator_cores": round(spent / wall, 3),
            "cpu_ms_per_heartbeat": round(spent / sent * 1000, 3), "cpu_ms_per_member_per_s": round(spent * 1000 / members / wall, 3)}


async def metadata_baseline(address: str, calls_per_s: int, seconds: float, pid: int) -> dict:
    """The same rate of Metadata calls (one topic): a plain gRPC call's cost on the same server."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = partition_pb2_grpc.PartitionServiceStub(channel)
        sent = 0

        async def caller(index: int) -> None:
            nonlocal sent
            await asyncio.sleep(index / calls_per_s)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await stub.Metadata(partition_pb2.MetadataRequest(topics=[TOPIC]))
                sent += 1
                await asyncio.sleep(1.0)

        before = cpu_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(calls_per_s)))
        wall = time.perf_counter() - started
        spent = cpu_seconds(pid) - before
    return {"calls": sent, "cpu_ms_per_call": round(spent / sent * 1000, 3), "coordinator_cores": round(spent / wall, 3)}


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txlog-bench-groups-") as workdir:
        cluster = LocalCluster(Path(workdir) / "cluster")
        cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=0,
                   service_args={"partition_svc": ["--group-heartbeat-interval-ms", str(args.heartbeat_interval_ms)]})
        try:
            service = next(p for p in cluster.state.services.values() if p.kind == "partition_svc")
            with Admin(cluster.state.bootstrap) as admin:
                admin.create_topics([(TOPIC, PARTITIONS, 1)])
            progress("rebalances")
            rebalance = rebalances(cluster.state.bootstrap, args.rounds)
            loads, baselines = [], []
            for members in args.member_counts:
                progress(f"heartbeats of {members} members")
                loads.append(asyncio.run(heartbeat_load(service.address, members, args.seconds, service.pid)))
                baselines.append(asyncio.run(metadata_baseline(service.address, members, args.seconds, service.pid)))
            within = [load["members"] for load in loads if load["coordinator_cores"] < CORE_SHARE_MAX]
        finally:
            cluster.down(grace_s=5)
    print(json.dumps({
        "benchmark": "consumer groups: rebalance time, heartbeat cost, members per coordinator",
        "parameters": {"rounds": args.rounds, "members": MEMBERS, "partitions": PARTITIONS,
                       "heartbeat_interval_ms": args.heartbeat_interval_ms, "seconds_per_load": args.seconds},
        "machine": {"cpus": os.cpu_count()},
        "rebalance_ms": rebalance,
        "heartbeat_load": loads,
        "metadata_baseline": baselines,
        "heartbeat_vs_metadata_cpu": [round(load["cpu_ms_per_heartbeat"] / base["cpu_ms_per_call"], 3)
                                      for load, base in zip(loads, baselines, strict=True)],
        "members_within_half_a_core_at_1s_heartbeats": max(within) if within else 0,
        "largest_tried": max(args.member_counts),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
