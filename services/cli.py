"""The ``txlog`` command line.

    txlog cluster up --dir DIR           start ZooKeeper and the services locally
    txlog cluster down --dir DIR         stop them (SIGTERM, then SIGKILL)
    txlog cluster kill --dir DIR NAME    SIGKILL one process (NAME as in cluster.json)
    txlog cluster start --dir DIR NAME   start it again, same data and address
    txlog cluster status --dir DIR       what runs, as JSON
    txlog producer-ids allocate (--dir DIR | --address HOST:PORT) [--requester-id N] [--count K]

Errors are printed as one line ``error: CODE: message`` and exit with status 1
(2 for a usage error).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc

from services import errors
from services.channels import open_channel
from services.cluster import ClusterError, LocalCluster
from services.stubs.txlog.v1 import producer_id_pb2, producer_id_pb2_grpc


def _cluster(args) -> int:
    cluster = LocalCluster(args.dir)
    if args.action == "up":
        state = cluster.up()
        print(json.dumps({"dir": state.dir, "zookeeper": state.zookeeper, "bootstrap": state.bootstrap,
                          "services": cluster.status()}, indent=2))
    elif args.action == "down":
        cluster.down()
        print(f"stopped the cluster in {cluster.dir}")
    elif args.action == "kill":
        cluster.kill(args.name)
        print(f"killed {args.name}")
    elif args.action == "start":
        cluster.start(args.name)
        print(f"started {args.name} at {cluster.address(args.name)}")
    elif args.action == "status":
        print(json.dumps(cluster.status(), indent=2))
    return 0


def _producer_id_address(args) -> str:
    if args.address:
        return args.address
    cluster = LocalCluster(args.dir)
    names = [n for n, p in (cluster.state.services.items() if cluster.state else []) if p.kind == "producer_id_svc"]
    if not names:
        raise ClusterError(f"no producer_id_svc in the cluster of {args.dir}")
    return cluster.address(names[0])


async def _allocate(address: str, requester_id: int, count: int) -> list[dict]:
    async with open_channel(address) as channel:
        stub = producer_id_pb2_grpc.ProducerIdServiceStub(channel)
        blocks = []
        for _ in range(count):
            reply = await stub.AllocateProducerIds(producer_id_pb2.AllocateProducerIdsRequest(requester_id=requester_id))
            blocks.append({"first_producer_id": reply.first_producer_id, "count": reply.count})
        return blocks


def _producer_ids(args) -> int:
    blocks = asyncio.run(_allocate(_producer_id_address(args), args.requester_id, args.count))
    for block in blocks:
        print(json.dumps(block))
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="txlog", description="txlog: a transactional, partitioned message log")
    commands = top.add_subparsers(dest="command", required=True)

    cluster = commands.add_parser("cluster", help="a local cluster of real processes")
    cluster_actions = cluster.add_subparsers(dest="action", required=True)
    for action, help_text in (("up", "start ZooKeeper and the services"), ("down", "stop everything"),
                              ("status", "show what runs")):
        sub = cluster_actions.add_parser(action, help=help_text)
        sub.add_argument("--dir", required=True, help="folder for data, logs and cluster.json")
    for action, help_text in (("kill", "SIGKILL one process"), ("start", "start one process again")):
        sub = cluster_actions.add_parser(action, help=help_text)
        sub.add_argument("--dir", required=True, help="the cluster's folder")
        sub.add_argument("name", help="process name as in cluster.json, e.g. producer_id_svc-0")
    cluster.set_defaults(run=_cluster)

    pids = commands.add_parser("producer-ids", help="producer id blocks")
    pid_actions = pids.add_subparsers(dest="action", required=True)
    allocate = pid_actions.add_parser("allocate", help="allocate blocks and print them as JSON lines")
    where = allocate.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="a local cluster's folder")
    where.add_argument("--address", help="host:port of a producer_id_svc")
    allocate.add_argument("--requester-id", type=int, default=0)
    allocate.add_argument("--count", type=int, default=1, help="how many blocks")
    pids.set_defaults(run=_producer_ids)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        print(f"error: {errors.from_rpc_error(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
