"""The ``txlog`` command line.

    txlog cluster up --dir DIR [--tls [--tokens]]
                                         start ZooKeeper and the services locally (--tls: mutual
                                         TLS with a throwaway CA under DIR/tls and the ACL
                                         authorizer; --tokens: callers use bearer tokens instead)
    txlog tls issue --dir DIR NAME       a client certificate for User:NAME (DIR/tls/NAME.pem)
    txlog tls token --dir DIR NAME       a bearer token for User:NAME (DIR/tls/NAME.token; clusters up
                                         with --tls --tokens)
    txlog cluster down --dir DIR         stop them (SIGTERM, then SIGKILL)
    txlog cluster kill --dir DIR NAME    SIGKILL one process (NAME as in cluster.json)
    txlog cluster start --dir DIR NAME   start it again, same data and address
    txlog cluster status --dir DIR       what runs, as JSON
    txlog producer-ids allocate (--dir DIR | --address HOST:PORT) [--requester-id N] [--count K]
    txlog chaos run --minutes N [--seed S] [--dir DIR] [--keep] [--fault-interval-s S] [--faults K,K...]
                    [--silent-owners N]
                                         a workload under faults, checked; prints one JSON line,
                                         exits 1 when the checker found an anomaly

Client commands (each takes --bootstrap HOST:PORT[,...], or --dir DIR, which reads
the bootstrap addresses from DIR/cluster.json, or --command-config FILE, a client
properties file (bootstrap.servers=..., tls.ca=..., tls.cert=, tls.key=,
token.file=), or else $TXLOG_BOOTSTRAP; --tls-ca/--tls-cert/--tls-key PEM files
and --token-file, a bearer token; with --dir of a TLS cluster they default to
its admin's):

    txlog cluster describe               instances, what each leads and holds, partitions' health (JSON)

    txlog topics create NAME --partitions N [--replication-factor R] [--config k=v ...]
    txlog topics list
    txlog topics describe NAME
    txlog topics alter-configs NAME [--set KEY=VALUE ...] [--delete KEY ...] [--dry-run]
    txlog topics delete NAME [NAME ...]      waits until every replica and group offset of each is gone
    txlog offsets TOPIC [--time earliest|latest|last_stable|MS|ISO-8601] [--partition P]
    txlog delete-records (--topic T --partition P --offset N | --from-file F)   move log starts (N -1: the
                                         last stable offset); prints each partition's low watermark
    txlog partitions add TOPIC --partitions N [--dry-run]          grow TOPIC to N partitions
    txlog partitions under-replicated | reassign (--file F | --topic T --partition P --replicas N,N) [--wait] | rebalance [--execute]
    txlog produce TOPIC [--key-separator SEP] [--partition P] [--compression-type none|gzip|zstd|lz4]
                                                                     lines from stdin
    txlog consume TOPIC [--from-beginning] [--group G] [--max-records N] [--to-end]
                        [--timeout-ms MS] [--isolation read_committed|read_uncommitted]
                        [--partition P] [--print-key] [--key-separator SEP]
                        [--print-timestamp] [--print-partition] [--print-offset] [--print-headers]
                        [--print-outcome] [--format plain|json]
    txlog producers describe TOPIC [--partition P]
    txlog transactions list [--state S ...] [--producer-id P ...] [--min-duration-ms N] [--prefix P]
    txlog transactions describe TID [TID ...]
    txlog transactions complete commit|abort --transactional-id TID --producer-id PID --producer-epoch E
    txlog transactions abort --topic T --partition P --producer-id PID --producer-epoch E
                             --coordinator-epoch C
    txlog transactions find-hanging [--topic T ...] [--max-transaction-timeout-ms N]
    txlog transactions group-config G [--set KEY=VALUE ...] [--delete KEY ...]
                                         a transaction group's check-back settings and checkers (JSON)
    txlog groups list | describe G | delete G | reset-offsets G --topic T (--to-earliest | --to-latest |
                         --to-offset N | --shift-by N | --to-timestamp-ms T | --to-datetime D) [--execute]
    txlog groups reset-offsets G --from-file F [--execute]
    txlog groups delete-offsets G --topic T[:P,P...] [--topic ...]
    txlog quotas alter [--user U | --user-default] [--client-id C | --client-id-default]
                       [--add KEY=VALUE[,KEY=VALUE]] [--delete KEY[,KEY]] [--dry-run]
                          the entity: a user, a client id, or both (at least one)
                          KEY is producer_byte_rate or consumer_byte_rate (bytes per second),
                          or request_percentage (percent of an instance's handler thread);
                          prints the entity's quotas after (JSON)
    txlog quotas describe              every client quota set (JSON)
    txlog console [--listen HOST:PORT] [--read-only]
                          a web console: the cluster, topics, transactions and groups
                          (http://127.0.0.1:8080/ by default)
    txlog acls add (--allow P | --deny P)... --operation OP... RESOURCE [--prefixed] [--host IP]
    txlog acls list [RESOURCE [--prefixed]] [--allow P | --deny P]... [--operation OP]...
    txlog acls remove RESOURCE [--prefixed] [--allow P | --deny P]... [--operation OP]...
                          RESOURCE is --topic T, --group G, --transactional-id TID or --cluster;
                          P is User:NAME (User:* for everyone); OP is Kafka's (Read, Write,
                          Create, Delete, Alter, Describe, DescribeConfigs, IdempotentWrite,
                          ClusterAction, All); each binding is printed as a JSON line

Errors are printed as one line ``error: CODE: message`` and exit with status 1
(2 for a usage error).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import datetime
import difflib
import importlib
import json
import logging
import os
import sys
from pathlib import Path

import grpc

from txlog.admin import group_config_change
from txlog.cli import commands as console
from txlog.errors import ClientError, LocalSetupError
from txlog.net.channels import open_channel
from txlog.net.tls import ChannelCredentials, TlsFiles
from txlog.protocol import acls, compression, errors
from txlog.structs import TopicPartition
from txlog.transport import tls_files
from txlog.v1 import producer_id_pb2, producer_id_pb2_grpc


def _service_module(name: str):
    """The cluster, TLS and chaos commands drive services on this machine: their
    code ships with the service install, imported only when such a command runs."""
    try:
        return importlib.import_module(f"services.{name}")
    except ModuleNotFoundError as exc:
        raise LocalSetupError(f"this command runs txlog's services on this machine and needs the service install "
                              f"(pip install 'txlog[service]'): {exc}") from None


def _local_cluster(directory):
    return _service_module("tooling.cluster").LocalCluster(directory)


def _cluster(args) -> int:
    if args.action == "describe":
        console.cluster_describe(_bootstrap(args), sys.stdout, timeout_s=args.timeout_s)
        return 0
    cluster = _local_cluster(args.dir)
    if args.action != "up" and cluster.state is None:
        raise LocalSetupError(f"no cluster in {cluster.dir} (no cluster.json); `txlog cluster up --dir {args.dir}` starts one")
    if args.action == "up":
        if args.tokens and not args.tls:
            raise console.invalid("--tokens goes with --tls: a bearer token is sent only over TLS")
        state = cluster.up(partition_svcs=args.partition_svcs, tls=args.tls, tokens=args.tokens)
        if any(p.kind == "coordinator_svc" for p in state.services.values()):
            cluster.wait_until_coordinators_settle()  # so that the first transactions meet no partition moving
        print(json.dumps({"dir": state.dir, "zookeeper": state.zookeeper, "bootstrap": state.bootstrap,
                          "tls": state.tls, "services": cluster.status()}, indent=2))
    elif args.action == "down":
        alive = [name for name, p in cluster.status().items() if p["alive"]]
        cluster.down()
        print(f"stopped the cluster in {cluster.dir}: {', '.join(alive)}" if alive else
              f"the cluster in {cluster.dir} was not running (nothing to stop)")
    elif args.action == "kill":
        cluster.kill(args.name)
        print(f"killed {args.name}")
    elif args.action == "start":
        cluster.start(args.name)
        print(f"started {args.name} at {cluster.address(args.name)}")
    elif args.action == "status":
        print(json.dumps(cluster.status(), indent=2))
    return 0


def _tls(args) -> int:
    cluster = _local_cluster(args.dir)
    if cluster.state is None or not cluster.state.tls:
        raise LocalSetupError(f"the cluster in {cluster.dir} does not run TLS; start it with `txlog cluster up --tls --dir {args.dir}`")
    if args.action == "token":
        if not cluster.state.tls.get("jwks"):
            raise LocalSetupError(f"the cluster in {cluster.dir} does not take tokens; start it with `txlog cluster up --tls --tokens`")
        token = _service_module("security.certs").issue_token(Path(cluster.state.tls["dir"]), args.name, lifetime_s=args.lifetime_s)
        print(json.dumps({"principal": f"User:{args.name}", "tls_ca": cluster.state.tls["ca"], "token_file": str(token)}))
        return 0
    cert, key = _service_module("security.certs").issue(Path(cluster.state.tls["dir"]), args.name)
    print(json.dumps({"principal": f"User:{args.name}", "tls_ca": cluster.state.tls["ca"], "tls_cert": str(cert), "tls_key": str(key)}))
    return 0


def _producer_id_address(args) -> str:
    if args.address:
        return args.address
    cluster = _local_cluster(args.dir)
    names = [n for n, p in (cluster.state.services.items() if cluster.state else []) if p.kind == "producer_id_svc"]
    if not names:
        raise LocalSetupError(f"no producer_id_svc in the cluster of {args.dir}")
    return cluster.address(names[0])


async def _allocate(address: str, requester_id: int, count: int, tls_files: TlsFiles | None) -> list[dict]:
    credentials = ChannelCredentials(tls_files).get() if tls_files is not None else None
    async with open_channel(address, credentials=credentials) as channel:
        stub = producer_id_pb2_grpc.ProducerIdServiceStub(channel)
        blocks = []
        for _ in range(count):
            reply = await stub.AllocateProducerIds(producer_id_pb2.AllocateProducerIdsRequest(requester_id=requester_id))
            blocks.append({"first_producer_id": reply.first_producer_id, "count": reply.count})
        return blocks


def _producer_ids(args) -> int:
    target = _bootstrap(args) if args.dir else console.Target("", args.tls_ca, args.tls_cert, args.tls_key, args.token_file)
    files = tls_files(target.tls_ca, target.tls_cert, target.tls_key, target.token_file)
    blocks = asyncio.run(_allocate(_producer_id_address(args), args.requester_id, args.count, files))
    for block in blocks:
        print(json.dumps(block))
    return 0


def _chaos(args) -> int:
    run = _service_module("tooling.chaos.run")  # the chaos tool ships with the service install

    kinds = tuple(k for k in args.faults.split(",") if k) if args.faults else run.FAULT_KINDS
    unknown = sorted(set(kinds) - set(run.FAULT_KINDS))
    if unknown or not kinds:
        print(f"error: unknown fault kinds {unknown}; known: {','.join(run.FAULT_KINDS)}", file=sys.stderr)
        return 2
    silent_owners = run.SILENT_OWNERS if args.silent_owners is None else args.silent_owners
    if silent_owners < 0:
        print(f"error: --silent-owners must be >= 0, not {silent_owners}", file=sys.stderr)
        return 2
    summary = run.run(args.minutes * 60, seed=args.seed, directory=args.dir, keep=args.keep,
                      fault_interval_s=args.fault_interval_s, kinds=kinds, silent_owners=silent_owners)
    print(json.dumps(summary), flush=True)
    return 1 if summary["anomalies"] else 0


def _bootstrap(args) -> console.Target:
    """Where a client command goes: --bootstrap, or a local cluster's (--dir);
    TLS files from --tls-*, else, with --dir, the cluster's admin's."""
    explicit = {"tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key, "token_file": args.token_file}
    if getattr(args, "bootstrap", None):
        return console.Target(args.bootstrap, **explicit)
    if getattr(args, "command_config", None):
        configured = console.read_client_config(args.command_config)
        return console.Target(configured.bootstrap, **{k: v or getattr(configured, k) for k, v in explicit.items()})
    if not getattr(args, "dir", None):
        if os.environ.get("TXLOG_BOOTSTRAP"):
            return console.Target(os.environ["TXLOG_BOOTSTRAP"], **explicit)
        raise console.invalid("say where the cluster is: --bootstrap HOST:PORT, --dir DIR, --command-config FILE, "
                              "or TXLOG_BOOTSTRAP in the environment")
    cluster = _local_cluster(args.dir)
    if cluster.state is None:
        raise LocalSetupError(f"no cluster in {cluster.dir} (no cluster.json); run `txlog cluster up --dir {args.dir}`")
    if not cluster.state.bootstrap and args.command != "producer-ids":
        raise LocalSetupError(f"the cluster in {cluster.dir} runs no partition_svc (cluster.json has no bootstrap)")
    running = cluster.status()
    if args.command != "producer-ids" and not any(p["alive"] for p in running.values() if p["kind"] == "partition_svc"):
        raise LocalSetupError(f"the cluster in {cluster.dir} is not running: none of its partition_svc processes is alive "
                           f"(`txlog cluster status --dir {args.dir}`); `txlog cluster start --dir {args.dir} NAME` "
                           "starts one again with its data")
    defaults = cluster.client_tls()
    return console.Target(cluster.state.bootstrap, **{k: v or defaults.get(k) for k, v in explicit.items()})


def _topics(args) -> int:
    bootstrap = _bootstrap(args)
    if args.action == "create":
        console.topics_create(bootstrap, args.name, args.partitions, console.parse_configs(args.config), sys.stdout,
                              replication_factor=args.replication_factor, timeout_s=args.timeout_s)
    elif args.action == "list":
        console.topics_list(bootstrap, sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "describe":
        console.topics_describe(bootstrap, args.name, sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "alter-configs":
        if not args.set and not args.delete:
            raise console.invalid("alter-configs takes --set KEY=VALUE or --delete KEY (each repeatable)")
        console.topics_alter_configs(bootstrap, args.name, console.parse_configs(args.set), args.delete or [], args.dry_run,
                                     sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "delete":
        console.topics_delete(bootstrap, args.names, sys.stdout, timeout_s=args.timeout_s)
    return 0


def _produce(args) -> int:
    console.produce(_bootstrap(args), args.topic, args.key_separator, args.partition, sys.stdin.buffer, sys.stderr,
                    timeout_s=args.timeout_s, acks=args.acks, linger_ms=args.linger_ms,
                    enable_idempotence=args.acks == "all", compression_type=args.compression_type)
    return 0


def _consume(args) -> int:
    console.consume(
        _bootstrap(args), args.topic, from_beginning=args.from_beginning, group=args.group,
        max_records=args.max_records, isolation=consume_isolation(args), partition=args.partition, to_end=args.to_end,
        timeout_ms=args.timeout_ms, print_key=args.print_key, key_separator=args.key_separator,
        out=sys.stdout.buffer, err=sys.stderr, timeout_s=args.timeout_s, output_format=args.format,
        print_fields=frozenset(f for f in console.PRINT_FIELDS if getattr(args, f"print_{f}")),
    )
    return 0


def consume_isolation(args) -> str:
    """--isolation, or read_uncommitted for --print-outcome (which sees every transaction's records), else read_committed."""
    return args.isolation or ("read_uncommitted" if args.print_outcome else "read_committed")


def consume_usage_error(args) -> str | None:
    if args.print_outcome and args.isolation == "read_committed":
        return ("--print-outcome reads read_uncommitted (read_committed returns only committed records): "
                "drop --isolation read_committed")
    return None


def _offsets(args) -> int:
    spec: str | int = args.time
    if spec not in ("earliest", "latest", "last_stable"):
        spec = _timestamp_ms(spec, "--time") if not spec.lstrip("-").isdigit() else int(spec)
        if spec < 0:
            raise console.invalid(f"--time takes earliest, latest, last_stable, epoch milliseconds >= 0 or an ISO 8601 time, "
                                  f"not {args.time!r}")
    console.offsets(_bootstrap(args), args.topic, spec, args.partition, sys.stdout, timeout_s=args.timeout_s)
    return 0


def _delete_records(args) -> int:
    if args.from_file:
        if args.topic is not None or args.partition is not None or args.offset is not None:
            raise console.invalid("delete-records takes --from-file F, or --topic T --partition P --offset N, not both")
        offsets = console.read_delete_records_file(args.from_file)
    elif args.topic is not None and args.partition is not None and args.offset is not None:
        offsets = {TopicPartition(args.topic, args.partition): args.offset}
    else:
        raise console.invalid("delete-records needs --topic T --partition P --offset N, or --from-file F "
                              '({"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1})')
    console.delete_records(_bootstrap(args), offsets, sys.stdout, timeout_s=args.timeout_s)
    return 0


def _partitions(args) -> int:
    bootstrap = _bootstrap(args)
    if args.action == "add":
        console.partitions_add(bootstrap, args.topic, args.partitions, args.dry_run, sys.stdout, timeout_s=args.timeout_s)
        return 0
    if args.action == "under-replicated":
        console.partitions_under_replicated(bootstrap, sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "reassign":
        if args.file:
            plan = console.parse_reassignment_file(open(args.file).read())
        elif args.topic is not None and args.partition is not None and args.replicas:
            plan = {TopicPartition(args.topic, args.partition): [int(n) for n in args.replicas.split(",")]}
        else:
            raise console.invalid("reassign needs --file F, or --topic T --partition P --replicas N,N,N")
        console.partitions_reassign(bootstrap, plan, sys.stdout, wait=args.wait, timeout_s=args.timeout_s)
    elif args.action == "rebalance":
        console.partitions_rebalance(bootstrap, args.execute, sys.stdout, timeout_s=args.timeout_s)
    return 0


def _producers(args) -> int:
    console.producers_describe(_bootstrap(args), args.topic, args.partition, sys.stdout, timeout_s=args.timeout_s)
    return 0


def _transactions(args) -> int:
    bootstrap = _bootstrap(args)
    if args.action == "list":
        console.transactions_list(bootstrap, args.state, args.producer_id, args.min_duration_ms, sys.stdout,
                                  prefix=args.prefix, timeout_s=args.timeout_s, output=args.output)
    elif args.action == "describe":
        console.transactions_describe(bootstrap, args.transactional_ids, sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "complete":
        console.transactions_complete(bootstrap, args.transactional_id, args.producer_id, args.producer_epoch,
                                      args.outcome == "commit", sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "abort":
        console.transactions_abort(bootstrap, args.topic, args.partition, args.producer_id, args.producer_epoch,
                                   args.coordinator_epoch, sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "find-hanging":
        console.transactions_find_hanging(bootstrap, args.topic, args.max_transaction_timeout_ms, sys.stdout,
                                          timeout_s=args.timeout_s, output=args.output)
    elif args.action == "group-config":
        console.transactions_group_config(bootstrap, args.group, console.parse_configs(args.set, "--set"),
                                          args.delete or [], sys.stdout, timeout_s=args.timeout_s)
    return 0


def group_config_usage_error(args) -> str | None:
    try:
        configs = console.parse_configs(args.set, "--set")
        if configs or args.delete:  # neither: a description
            group_config_change(configs, args.delete or ())
    except errors.TxlogError as exc:
        return exc.message
    except ValueError as exc:
        return str(exc)
    return None


def _groups(args) -> int:
    bootstrap = _bootstrap(args)
    if args.action == "list":
        console.groups_list(bootstrap, sys.stdout, timeout_s=args.timeout_s, output=args.output)
    elif args.action == "describe":
        console.groups_describe(bootstrap, args.group, sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "delete":
        console.groups_delete(bootstrap, args.group, sys.stdout, timeout_s=args.timeout_s)
    elif args.action == "delete-offsets":
        return 0 if console.groups_delete_offsets(bootstrap, args.group, args.topic, sys.stdout, timeout_s=args.timeout_s) else 1
    elif args.action == "reset-offsets":
        chosen = [(kind, value) for kind, value in (("earliest", args.to_earliest or None), ("latest", args.to_latest or None),
                                                    ("offset", args.to_offset), ("shift", args.shift_by),
                                                    ("timestamp", args.to_timestamp_ms), ("datetime", args.to_datetime),
                                                    ("file", args.from_file)) if value is not None and value is not False]
        if len(chosen) != 1:
            raise console.invalid("reset-offsets takes one of --to-earliest, --to-latest, --to-offset N, --shift-by N, "
                                  "--to-timestamp-ms T, --to-datetime D, --from-file F")
        kind, value = chosen[0]
        if kind == "datetime":
            kind, value = "timestamp", _timestamp_ms(value, "--to-datetime")
        elif kind == "file":
            value = console.read_offsets_file(value)
        elif not args.topic:
            raise console.invalid("reset-offsets names the topics to move: --topic T (repeatable); only --from-file names its own")
        console.groups_reset_offsets(bootstrap, args.group, args.topic or [], (kind, None if kind in ("earliest", "latest") else value),
                                     args.execute, sys.stdout, timeout_s=args.timeout_s)
    return 0


def _timestamp_ms(text: str, flag: str) -> int:
    """An ISO 8601 date and time (UTC unless it names its offset) as epoch milliseconds."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise console.invalid(f"{flag} takes an ISO 8601 date and time such as 2026-11-23T00:00:00 or "
                              f"2026-11-23T09:30:00+01:00, not {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _acl_resource(args) -> tuple[str, str] | None:
    chosen = [(kind, name) for kind, name in ((acls.TOPIC, args.topic), (acls.GROUP, args.group),
                                               (acls.TRANSACTIONAL_ID, args.transactional_id),
                                               (acls.CLUSTER, acls.CLUSTER_NAME if args.cluster else None)) if name is not None]
    if len(chosen) > 1:
        raise console.invalid("name one resource: --topic, --group, --transactional-id or --cluster")
    return chosen[0] if chosen else None


def _acl_principals(args) -> list[tuple[str, str]]:
    return [(acls.ALLOW, p) for p in args.allow or []] + [(acls.DENY, p) for p in args.deny or []]


def _acls(args) -> int:
    bootstrap = _bootstrap(args)
    resource = _acl_resource(args)
    pattern = acls.PREFIXED if args.prefixed else acls.LITERAL
    try:
        if args.action == "add":
            if resource is None:
                raise console.invalid("acls add names a resource: --topic, --group, --transactional-id or --cluster")
            if not _acl_principals(args) or not args.operation:
                raise console.invalid("acls add needs --allow or --deny PRINCIPAL and --operation OP")
            bindings = [acls.AclBinding(resource[0], pattern, resource[1], principal, args.host or acls.WILDCARD, operation, permission).check()
                        for permission, principal in _acl_principals(args) for operation in args.operation]
            console.acls_add(bootstrap, bindings, sys.stdout, timeout_s=args.timeout_s)
            return 0
        if args.action == "remove" and resource is None:
            raise console.invalid("acls remove names a resource: --topic, --group, --transactional-id or --cluster")
        resource_type, name = resource or (None, None)
        filters = [acls.AclFilter(resource_type, pattern if resource else "ANY", name, principal, args.host, operation, permission).check()
                   for permission, principal in (_acl_principals(args) or [(None, None)])
                   for operation in (args.operation or [None])]
    except acls.AclError as exc:
        raise console.invalid(str(exc)) from None
    if args.action == "remove":
        console.acls_remove(bootstrap, filters, sys.stdout, timeout_s=args.timeout_s)
    else:
        for wanted in filters:
            console.acls_list(bootstrap, wanted, sys.stdout, timeout_s=args.timeout_s)
    return 0


def _add_bootstrap(sub: argparse.ArgumentParser) -> None:
    where = sub.add_mutually_exclusive_group()
    where.add_argument("--bootstrap", help="comma-separated partition_svc addresses host:port (default: $TXLOG_BOOTSTRAP)")
    where.add_argument("--dir", help="a local cluster's folder (reads the bootstrap, and with TLS the admin's "
                                     "certificate, from DIR/cluster.json)")
    where.add_argument("--command-config", metavar="FILE",
                       help="a client properties file, as Kafka's tools take: bootstrap.servers=..., and tls.ca, tls.cert, "
                            "tls.key, token.file")
    _add_tls_options(sub)


def _add_output(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--output", choices=console.OUTPUTS, default="auto",
                     help="json (one object per line), table, or auto: a table on a terminal, JSON lines otherwise "
                          "(the default, so scripts keep their JSON)")


def _add_tls_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--tls-ca", help="PEM CA bundle that verifies the servers (turns TLS on)")
    sub.add_argument("--tls-cert", help="PEM client certificate, for servers that require one (mutual TLS)")
    sub.add_argument("--tls-key", help="PEM key of --tls-cert")
    sub.add_argument("--token-file", help="a bearer token (JWT) sent with every call, for servers that authenticate by "
                                          "token (needs --tls-ca)")
    sub.add_argument("--timeout-s", type=float, default=console.TIMEOUT_S_DEFAULT,
                     help="how long to wait for servers that do not answer (default: %(default)s)")


def _add_client_commands(commands) -> None:
    topics = commands.add_parser("topics", help="create, list and describe topics")
    topic_actions = topics.add_subparsers(dest="action", required=True)
    create = topic_actions.add_parser("create", help="create a topic (no error if it exists with the same count)")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, required=True, help="partition count")
    create.add_argument("--replication-factor", type=int, help="instances holding each partition (default: the "
                        "cluster's default.replication.factor, capped at the live instances)")
    create.add_argument("--config", action="append", metavar="KEY=VALUE",
                        help="a topic config (retention.ms, retention.bytes, max.record.bytes, cleanup.policy, "
                             "min.insync.replicas, unclean.leader.election.enable, compression.type, "
                             "delete.retention.ms)")
    describe = topic_actions.add_parser("describe", help="partitions, leaders and configs as JSON")
    describe.add_argument("name")
    alter = topic_actions.add_parser("alter-configs", help="change a topic's configs (every replica takes them within "
                                     "seconds); prints the configs after the change")
    alter.add_argument("name")
    alter.add_argument("--set", action="append", metavar="KEY=VALUE", help="a config to set; repeatable")
    alter.add_argument("--delete", action="append", metavar="KEY", help="a config back to its default; repeatable")
    alter.add_argument("--dry-run", action="store_true", help="check the change and print the result, change nothing")
    delete = topic_actions.add_parser("delete", help="delete topics: their partitions on every replica and the groups' "
                                      "offsets for them; one JSON line per topic once it is gone (internal topics are refused)")
    delete.add_argument("names", nargs="+", metavar="NAME")
    listing = topic_actions.add_parser("list", help="topic names, one per line")
    for sub in (create, describe, listing, alter, delete):
        _add_bootstrap(sub)
    topics.set_defaults(run=_topics)

    produce = commands.add_parser("produce", help="send stdin's lines as records")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", help="each line is KEY<SEP>VALUE")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument("--acks", choices=("all", "1", "0"), default="all",
                         help="all (default: idempotent), 1 or 0 (not idempotent)")
    produce.add_argument("--linger-ms", type=float, default=5.0)
    produce.add_argument("--compression-type", choices=tuple(compression.CODEC_BY_NAME), default="none",
                         help="compress each batch (the topic's compression.type may store it otherwise)")
    _add_bootstrap(produce)
    produce.set_defaults(run=_produce)

    consume = commands.add_parser("consume", help="print records to stdout, one per line")
    consume.add_argument("topic")
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at the log start when there is no committed offset (default: the end)")
    consume.add_argument("--group", help="consumer group: start from its committed offsets, commit on exit")
    consume.add_argument("--max-records", type=int, help="stop after this many records")
    consume.add_argument("--to-end", action="store_true", help="stop at the end offsets seen at start")
    consume.add_argument("--timeout-ms", type=float, help="stop after this long without a new record (as "
                         "kafka-console-consumer's; default: wait for more for ever); --timeout-s is how long one "
                         "call to the cluster may take")
    consume.add_argument("--isolation", choices=("read_committed", "read_uncommitted"),
                         help="default: read_committed, or read_uncommitted with --print-outcome")
    consume.add_argument("--partition", type=int, help="read only this partition")
    consume.add_argument("--print-key", action="store_true", help="print KEY<SEP>VALUE")
    for field, shown in (("timestamp", "CreateTime:MS"), ("partition", "Partition:P"), ("offset", "Offset:O"),
                         ("headers", "NAME:VALUE,... or NO_HEADERS"),
                         ("outcome", "Outcome:committed|aborted|open|none (the record's transaction's; reads "
                                     "read_uncommitted)")):
        consume.add_argument(f"--print-{field}", action="store_true", help=f"print {shown} before the key and value")
    consume.add_argument("--format", choices=console.OUTPUT_FORMATS, default="plain",
                         help="plain (the value, with the --print-* fields before it) or json (one object per record with "
                              "topic, partition, offset, timestamp_ms, key, value, headers, and outcome with --print-outcome; bytes that are not UTF-8 as "
                              "{\"base64\": ...})")
    consume.add_argument("--key-separator", default="\t", help="separator for --print-key (default: tab)")
    _add_bootstrap(consume)
    consume.set_defaults(run=_consume, usage_error=consume_usage_error)

    offsets_command = commands.add_parser("offsets", help="each partition's offset at a time (kafka-get-offsets.sh): JSON lines")
    offsets_command.add_argument("topic")
    offsets_command.add_argument("--time", default="latest",
                                 help="earliest, latest (the high watermark; the default), last_stable, epoch milliseconds, or "
                                      "an ISO 8601 time (UTC unless it names its offset): the first offset at or after it, "
                                      "-1 when every record is older")
    offsets_command.add_argument("--partition", type=int, help="only this partition")
    _add_bootstrap(offsets_command)
    offsets_command.set_defaults(run=_offsets)

    delete_records = commands.add_parser("delete-records", help="delete records below an offset (kafka-delete-records.sh): "
                                         "each partition's low watermark as JSON lines")
    delete_records.add_argument("--topic")
    delete_records.add_argument("--partition", type=int)
    delete_records.add_argument("--offset", type=int, help="the new log start: at most the last stable offset; -1 means it")
    delete_records.add_argument("--from-file", metavar="F", help='Kafka\'s offsets JSON: {"partitions": [{"topic": "t", '
                                "\"partition\": 0, \"offset\": 3}], \"version\": 1}")
    _add_bootstrap(delete_records)
    delete_records.set_defaults(run=_delete_records)

    partitions = commands.add_parser("partitions", help="replicas: under-replicated partitions, reassignment, rebalancing")
    partition_actions = partitions.add_subparsers(dest="action", required=True)
    add = partition_actions.add_parser("add", help="grow a topic to more partitions (placed as a new topic's; keys then "
                                       "map to other partitions, as in Kafka)")
    add.add_argument("topic")
    add.add_argument("--partitions", type=int, required=True, help="the topic's partition count afterwards")
    add.add_argument("--dry-run", action="store_true", help="check only, change nothing")
    _add_bootstrap(add)
    under = partition_actions.add_parser("under-replicated", help="JSON lines: partitions whose ISR is smaller than their replicas")
    reassign = partition_actions.add_parser("reassign", help="move replicas to other instances without downtime")
    reassign.add_argument("--file", help='Kafka\'s reassignment JSON: {"partitions": [{"topic", "partition", "replicas"}]}')
    reassign.add_argument("--topic")
    reassign.add_argument("--partition", type=int)
    reassign.add_argument("--replicas", help="comma-separated node ids, the preferred leader first")
    reassign.add_argument("--wait", action="store_true", help="return once every reassignment is done")
    rebalance = partition_actions.add_parser("rebalance", help="print a plan spreading replicas and preferred leaders evenly "
                                             "over every live instance, moving as few replicas as it can")
    rebalance.add_argument("--execute", action="store_true", help="start the plan's reassignments")
    for sub in (under, reassign, rebalance):
        _add_bootstrap(sub)
    partitions.set_defaults(run=_partitions)

    producers = commands.add_parser("producers", help="producer states of partitions")
    producer_actions = producers.add_subparsers(dest="action", required=True)
    describe_producers = producer_actions.add_parser("describe", help="JSON lines, one per (partition, producer)")
    describe_producers.add_argument("topic")
    describe_producers.add_argument("--partition", type=int)
    _add_bootstrap(describe_producers)
    producers.set_defaults(run=_producers)

    transactions = commands.add_parser("transactions", help="list, describe and abort transactions")
    txn_actions = transactions.add_subparsers(dest="action", required=True)
    listing = txn_actions.add_parser("list", help="one line per transaction the coordinators know (a table on a terminal, "
                                     "JSON lines otherwise)")
    listing.add_argument("--state", action="append",
                         help="only this state (Ongoing, Prepared, PrepareCommit, ...); repeatable")
    listing.add_argument("--prefix", default="", help="only transactional ids starting with this")
    listing.add_argument("--producer-id", type=int, action="append", help="only this producer id; repeatable")
    listing.add_argument("--min-duration-ms", type=int, help="only transactions open longer than this")
    describe_txn = txn_actions.add_parser("describe", help="JSON lines, one per transactional id")
    describe_txn.add_argument("transactional_ids", nargs="+", metavar="TID")
    complete = txn_actions.add_parser("complete", help="commit or abort a prepared transaction by its handle")
    complete.add_argument("outcome", choices=("commit", "abort"))
    complete.add_argument("--transactional-id", required=True)
    complete.add_argument("--producer-id", type=int, required=True)
    complete.add_argument("--producer-epoch", type=int, required=True)
    abort = txn_actions.add_parser("abort", help="abort a hanging transaction on one partition")
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True)
    abort.add_argument("--producer-id", type=int, required=True)
    abort.add_argument("--producer-epoch", type=int, required=True)
    abort.add_argument("--coordinator-epoch", type=int, required=True)
    hanging = txn_actions.add_parser("find-hanging", help="one line per hanging transaction (a table on a terminal, "
                                     "JSON lines otherwise)")
    hanging.add_argument("--topic", action="append", help="only this topic (default: every topic); repeatable")
    hanging.add_argument("--max-transaction-timeout-ms", type=int, default=15 * 60 * 1000,
                         help="the coordinators' maximum transaction timeout (default: %(default)s)")
    group_config = txn_actions.add_parser(
        "group-config", help="a transaction group's check-back settings, the keys set explicitly and the registered "
        "checkers, as JSON (after --set/--delete, if given)")
    group_config.add_argument("group", help="the transaction group (the part of its transactional ids before '/')")
    group_config.add_argument("--set", action="append", metavar="KEY=VALUE",
                              help="transaction.check.interval.ms, transaction.check.max, transaction.check.exhausted "
                                   "(abort|keep) or transaction.check.timeout.ms; repeatable")
    group_config.add_argument("--delete", action="append", metavar="KEY", help="a setting back to its default; repeatable")
    group_config.set_defaults(usage_error=group_config_usage_error)
    for sub in (listing, describe_txn, complete, abort, hanging, group_config):
        _add_bootstrap(sub)
    for sub in (listing, hanging):
        _add_output(sub)
    transactions.set_defaults(run=_transactions)


def _add_group_commands(commands) -> None:
    groups = commands.add_parser("groups", help="consumer groups: list, describe with lag, reset, delete")
    actions = groups.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="one line per group with live members or committed offsets (a table on a "
                                 "terminal, JSON lines otherwise)")
    _add_output(listing)
    describe = actions.add_parser("describe", help="JSON: members, and per partition committed, end, lag and owner")
    describe.add_argument("group")
    reset = actions.add_parser("reset-offsets", help="move a group's committed offsets (a dry run unless --execute)")
    reset.add_argument("group")
    reset.add_argument("--topic", action="append", help="every partition of this topic; repeatable (not with --from-file)")
    reset.add_argument("--to-earliest", action="store_true")
    reset.add_argument("--to-latest", action="store_true", help="the last stable offset")
    reset.add_argument("--to-offset", type=int)
    reset.add_argument("--shift-by", type=int, help="from the committed offset (negative: back)")
    reset.add_argument("--to-timestamp-ms", type=int, help="the first offset at or after this time")
    reset.add_argument("--to-datetime", help="the first offset at or after this ISO 8601 time (UTC unless it names its offset)")
    reset.add_argument("--from-file", help="CSV lines topic,partition,offset: exactly those partitions (--dry-run's output "
                                           "of kafka-consumer-groups.sh, or written by hand)")
    reset.add_argument("--execute", action="store_true", help="apply the plan (refused while the group has live members)")
    delete = actions.add_parser("delete", help="delete a group without live members and its committed offsets")
    delete.add_argument("group")
    delete_offsets = actions.add_parser("delete-offsets", help="delete a group's committed offsets of some topics or "
                                        "partitions, the group staying (refused for a topic a live member subscribes to)")
    delete_offsets.add_argument("group")
    delete_offsets.add_argument("--topic", action="append", required=True,
                                help="T: every partition with a committed offset (the topic may be gone); T:0,2: those; repeatable")
    for sub in (listing, describe, reset, delete, delete_offsets):
        _add_bootstrap(sub)
    groups.set_defaults(run=_groups)


def _quotas(args) -> int:
    bootstrap = _bootstrap(args)
    if args.action == "describe":
        console.quotas_describe(bootstrap, sys.stdout, timeout_s=args.timeout_s)
        return 0
    entity: dict[str, str | None] = {}
    for kind, name, default in (("user", args.user, args.user_default), ("client-id", args.client_id, args.client_id_default)):
        if name is not None and default:
            raise console.invalid(f"--{kind} and --{kind}-default name the same part of the entity: give one")
        if name is not None or default:
            entity[kind] = name
    if not entity:
        raise console.invalid("quotas alter names an entity: --user, --client-id (or their -default), or both")
    quotas: dict[str, float | None] = {}
    for item in ",".join(args.add or []).split(","):
        if item:
            key, sep, value = item.partition("=")
            try:
                quotas[key] = float(value) if sep and key else float("nan")
            except ValueError:
                quotas[key] = float("nan")
            if quotas[key] != quotas[key]:
                raise console.invalid(f"--add takes KEY=NUMBER, not {item!r}")
    for key in ",".join(args.delete or []).split(","):
        if key:
            quotas[key] = None
    if not quotas:
        raise console.invalid("quotas alter takes --add KEY=VALUE or --delete KEY")
    console.quotas_alter(bootstrap, entity, quotas, sys.stdout, dry_run=args.dry_run, timeout_s=args.timeout_s)
    return 0


def _console(args) -> int:
    """Serves the web console until interrupted (txlog/console)."""
    target = _bootstrap(args)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise console.invalid(f"--listen takes HOST:PORT, not {args.listen!r}")
    if args.hanging_after_ms <= 0:
        raise console.invalid(f"--hanging-after-ms must be positive, not {args.hanging_after_ms}")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1") and not args.read_only:
        print(f"warning: the console on {args.listen} lets anyone who reaches it act as its principal (no login, no "
              "TLS); keep it on loopback, or add --read-only", file=sys.stderr, flush=True)
    import uvicorn  # the console's own dependencies, loaded only for it

    from txlog.console.app import create_app

    with console.admin_for(target, args.timeout_s) as admin:
        app = create_app(admin, read_only=args.read_only, cluster_name=getattr(args, "dir", None) or target.bootstrap,
                         hanging_after_ms=args.hanging_after_ms, metrics_urls=_metrics_urls(args, admin),
                         listen_host=host.strip("[]"))
        audit = logging.getLogger("txlog.console.audit")  # one JSON line per action, on stderr
        audit.addHandler(logging.StreamHandler(sys.stderr))
        audit.setLevel(logging.INFO)
        print(f"txlog console on http://{args.listen}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
        uvicorn.run(app, host=host.strip("[]"), port=int(port), log_level="warning")
    return 0


def _metrics_urls(args, admin) -> list[str]:
    """The services' Prometheus endpoints: --metrics, else a local cluster's (--dir) from its cluster.json, else
    those the instances registered (Admin.describe_cluster; none when the console may not describe the cluster)."""
    if args.metrics:
        return [url if "://" in url else f"http://{url}/metrics" for url in args.metrics.split(",") if url]
    if getattr(args, "dir", None):
        cluster = _local_cluster(args.dir)
        return [f"http://{p.metrics_address}/metrics" for p in cluster.state.services.values() if p.metrics_address]
    try:
        instances = admin.describe_cluster().instances
    except ClientError as exc:
        print(f"warning: no live rates or alerts: the cluster's instances could not be described ({exc}); "
              "name their metrics endpoints with --metrics", file=sys.stderr, flush=True)
        return []
    return [f"http://{i.metrics_address}/metrics" for i in instances if i.metrics_address]


def _add_console_command(commands) -> None:
    web = commands.add_parser("console", help="a web console for operators: the cluster, topics, transactions, groups")
    _add_bootstrap(web)
    web.add_argument("--listen", default="127.0.0.1:8080",
                     help="HOST:PORT the console serves on (default: %(default)s, loopback only)")
    web.add_argument("--read-only", action="store_true", help="no action on any page, whatever the cluster's ACLs allow")
    web.add_argument("--metrics", metavar="HOST:PORT[,...]",
                     help="the services' metrics endpoints (their --metrics-listen), for the overview's live rates "
                          "and alerts (default with --dir: the local cluster's; else those the instances registered)")
    web.add_argument("--hanging-after-ms", type=int, default=900_000,
                     help="an open transaction no coordinator will end counts as hanging once older than this "
                          "(default: %(default)s, the coordinators' largest transaction timeout)")
    web.set_defaults(run=_console)


def _add_quota_commands(commands) -> None:
    quota_command = commands.add_parser("quotas", help="client quotas (Kafka's kafka-configs.sh --entity-type users/clients)")
    quota_actions = quota_command.add_subparsers(dest="action", required=True)
    alter = quota_actions.add_parser("alter", help="set or remove one entity's quotas; prints its quotas after (JSON)")
    alter.add_argument("--user", help="a user principal's name (without User:)")
    alter.add_argument("--user-default", action="store_true", help="the default user")
    alter.add_argument("--client-id", help="a client id (what clients send as client_id)")
    alter.add_argument("--client-id-default", action="store_true", help="the default client id")
    alter.add_argument("--add", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                       help="quotas to set: producer_byte_rate, consumer_byte_rate (bytes per second), request_percentage "
                            "(percent of an instance's handler thread); repeatable")
    alter.add_argument("--delete", action="append", metavar="KEY[,KEY]", help="quotas to remove; repeatable")
    alter.add_argument("--dry-run", action="store_true", help="check only; change nothing")
    _add_bootstrap(alter)
    describe = quota_actions.add_parser("describe", help="every client quota set (JSON)")
    _add_bootstrap(describe)
    quota_command.set_defaults(run=_quotas)


def _add_acl_commands(commands) -> None:
    acl_command = commands.add_parser("acls", help="access control lists (clusters with --authorizer acl)")
    acl_actions = acl_command.add_subparsers(dest="action", required=True)
    for action, help_text in (("add", "add bindings: each principal x each operation on the resource"),
                              ("list", "JSON lines, one per binding that matches"),
                              ("remove", "remove the bindings that match; prints them")):
        sub = acl_actions.add_parser(action, help=help_text)
        sub.add_argument("--allow", action="append", metavar="PRINCIPAL", help="User:NAME allowed (User:* for everyone); repeatable")
        sub.add_argument("--deny", action="append", metavar="PRINCIPAL", help="User:NAME refused; repeatable")
        sub.add_argument("--operation", action="append", choices=acls.OPERATIONS, help="repeatable")
        sub.add_argument("--topic")
        sub.add_argument("--group")
        sub.add_argument("--transactional-id")
        sub.add_argument("--cluster", action="store_true")
        sub.add_argument("--prefixed", action="store_true", help="the name is a prefix (PREFIXED pattern) rather than a name")
        sub.add_argument("--host", help="the client IP address the binding is for (add: default '*', any)")
        _add_bootstrap(sub)
    acl_command.set_defaults(run=_acls)


# The command line being parsed, and every (sub)command parser that took part,
# the deepest last: a usage error is told by the subcommand it belongs to.
_argv: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("txlog_argv", default=())
_parsers: contextvars.ContextVar[list | None] = contextvars.ContextVar("txlog_parsers", default=None)


class CommandParser(argparse.ArgumentParser):
    """argparse, but a mistyped flag is reported by the subcommand it was given
    to, with its usage and the flag it most likely meant."""

    def parse_known_args(self, args=None, namespace=None):
        taking_part = _parsers.get()
        if taking_part is not None:
            taking_part.append(self)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        known = self._option_string_actions
        typo = next((t.split("=", 1)[0] for t in _argv.get() if t.startswith("--") and t.split("=", 1)[0] not in known), None)
        # Only a complaint about an argument is about the typo: "invalid choice" and the like stay as they are.
        if typo is not None and message.startswith("unrecognized argument"):
            message = f"unrecognized argument {typo}"
            close = difflib.get_close_matches(typo, [o for o in known if o.startswith("--")], n=1, cutoff=0.6)
            if close:
                message += f"; did you mean {close[0]}?"
        super().error(message)


def parse(argv: list[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv_token, parsers_token = _argv.set(tuple(argv)), _parsers.set([])
    try:
        args, extras = parser().parse_known_args(argv)
        if extras:
            _parsers.get()[-1].error(f"unrecognized arguments: {' '.join(extras)}")
        problem = args.usage_error(args) if hasattr(args, "usage_error") else None
        if problem:
            _parsers.get()[-1].error(problem)
        return args
    finally:
        _argv.reset(argv_token)
        _parsers.reset(parsers_token)


def parser() -> argparse.ArgumentParser:
    top = CommandParser(prog="txlog", description="txlog: a transactional, partitioned message log")
    commands = top.add_subparsers(dest="command", required=True)

    cluster = commands.add_parser("cluster", help="a local cluster of real processes")
    cluster_actions = cluster.add_subparsers(dest="action", required=True)
    for action, help_text in (("up", "start ZooKeeper and the services"), ("down", "stop everything"),
                              ("status", "show what runs")):
        sub = cluster_actions.add_parser(action, help=help_text)
        sub.add_argument("--dir", required=True, help="folder for data, logs and cluster.json")
        if action == "up":
            sub.add_argument("--partition-svcs", type=int, default=3,
                             help="how many partition_svc instances (default: %(default)s, so topics get 3 replicas)")
            sub.add_argument("--tls", action="store_true",
                             help="mutual TLS on every port, with a throwaway CA and certificates under DIR/tls "
                                  "(clients of the cluster use DIR/tls/admin.pem by default), the ACL authorizer "
                                  "with User:admin as super user, and ZooKeeper authentication")
            sub.add_argument("--tokens", action="store_true",
                             help="with --tls: callers authenticate by bearer token (JWT) instead of certificate "
                                  "(DIR/tls/admin.token; txlog tls token NAME makes more)")
    describe = cluster_actions.add_parser("describe", help="any cluster: its partition_svc instances (what each leads and "
                                          "holds), topics and partitions, under-replicated and offline ones, as JSON")
    _add_bootstrap(describe)
    for action, help_text in (("kill", "SIGKILL one process"), ("start", "start one process again")):
        sub = cluster_actions.add_parser(action, help=help_text)
        sub.add_argument("--dir", required=True, help="the cluster's folder")
        sub.add_argument("name", help="process name as in cluster.json, e.g. producer_id_svc-0")
    cluster.set_defaults(run=_cluster)

    tls_command = commands.add_parser("tls", help="certificates of a local TLS cluster")
    tls_actions = tls_command.add_subparsers(dest="action", required=True)
    issue = tls_actions.add_parser("issue", help="a client certificate for principal User:NAME, signed by the cluster's CA")
    issue.add_argument("--dir", required=True, help="the cluster's folder (started with --tls)")
    issue.add_argument("name", help="the principal's name: the certificate's CN; files DIR/tls/NAME.pem and NAME-key.pem")
    token = tls_actions.add_parser("token", help="a bearer token (JWT) for principal User:NAME, for a cluster started with --tokens")
    token.add_argument("--dir", required=True, help="the cluster's folder (started with --tls --tokens)")
    token.add_argument("--lifetime-s", type=int, default=86_400, help="how long the token is valid (default: %(default)s)")
    token.add_argument("name", help="the principal's name (the sub claim); file DIR/tls/NAME.token")
    tls_command.set_defaults(run=_tls)

    pids = commands.add_parser("producer-ids", help="producer id blocks")
    pid_actions = pids.add_subparsers(dest="action", required=True)
    allocate = pid_actions.add_parser("allocate", help="allocate blocks and print them as JSON lines")
    where = allocate.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="a local cluster's folder")
    where.add_argument("--address", help="host:port of a producer_id_svc")
    allocate.add_argument("--requester-id", type=int, default=0)
    allocate.add_argument("--count", type=int, default=1, help="how many blocks")
    _add_tls_options(allocate)
    pids.set_defaults(run=_producer_ids)

    chaos = commands.add_parser("chaos", help="fault injection with a history checker")
    chaos_actions = chaos.add_subparsers(dest="action", required=True)
    chaos_run = chaos_actions.add_parser("run", help="run the workload under faults, check it, print one JSON line")
    chaos_run.add_argument("--minutes", type=float, required=True, help="how long the workload runs under faults")
    chaos_run.add_argument("--seed", type=int, help="the nemesis' and workers' seed (default: random, printed)")
    chaos_run.add_argument("--dir", help="folder for the cluster, histories and logs (default: a temporary one)")
    chaos_run.add_argument("--keep", action="store_true",
                           help="keep the folder after a clean run (it is always kept when an anomaly is found)")
    chaos_run.add_argument("--fault-interval-s", type=float, default=10.0, help="mean seconds between faults")
    chaos_run.add_argument("--faults", help="comma-separated fault kinds to inject (default: every kind; "
                                            "see services/tooling/chaos/faults.py)")
    chaos_run.add_argument("--silent-owners", type=int,
                           help="workers whose transactions only the check-back decides (default 1; 0: none)")
    chaos.set_defaults(run=_chaos)
    _add_client_commands(commands)
    _add_quota_commands(commands)
    _add_console_command(commands)
    _add_acl_commands(commands)
    _add_group_commands(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return args.run(args)
    except LocalSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        print(f"error: {errors.from_rpc_error(exc)}", file=sys.stderr)
        return 1
    except errors.TxlogError as exc:  # the client SDK's errors: CODE: message
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:  # settings the SDK refused
        print(f"error: INVALID_REQUEST: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (txlog consume ... | head -3): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush of stdout fails no more
        return 0


if __name__ == "__main__":
    sys.exit(main())
