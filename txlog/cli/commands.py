"""What the ``txlog`` CLI's client commands do (``topics``, ``produce``,
``consume``, ``producers``, ``transactions``): Kafka's console tools on top of
the SDK.

* ``produce`` reads records from stdin, one per line (the newline is not part
  of the value); with ``--key-separator SEP`` each line is ``KEY SEP VALUE``
  and a line without SEP is an error, as in Kafka's console producer. It
  returns once every record is acknowledged, and fails on the first record
  that could not be.
* ``consume`` writes one record per line to stdout (``--print-key`` prefixes
  the key and the separator; a null value prints as ``null``). It stops after
  ``--max-records``, at the end offsets seen at start (``--to-end``), after
  ``--timeout-ms`` without records, or on Ctrl-C. When it reads a known range
  (``--max-records`` or ``--to-end``) and stderr is a terminal, a progress bar
  is drawn on stderr. With ``--group`` it starts from the group's committed
  offsets and commits its positions when it stops.
* ``transactions list|describe|abort|find-hanging`` (Kafka's
  ``kafka-transactions.sh``) print JSON lines: one per transaction, per
  described id, or per hanging transaction; ``abort`` prints one line saying
  what it aborted. A ``find-hanging`` line holds every field ``abort`` needs.
  ``describe`` shows ``prepare_metadata`` as consume's JSON shows bytes: text
  when it is UTF-8, else ``{"base64": ...}``.
* ``transactions group-config G`` prints a transaction group's check-back
  settings and checkers as one JSON object, after ``--set``/``--delete``.
* Every command waits at most ``--timeout-s`` (default 30 s) for servers that
  do not answer, then fails with the last error.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from typing import BinaryIO, TextIO

from txlog.admin import Admin
from txlog.consumer import Consumer
from txlog.errors import ClientError
from txlog.producer import Producer
from txlog.protocol import acls
from txlog.protocol.acls import AclBinding, AclFilter
from txlog.protocol.errors import ErrorCode
from txlog.rebalance import rebalance
from txlog.structs import TopicPartition, TransactionHandle

LINE_BYTES_MAX = 16 * 1024 * 1024
TIMEOUT_S_DEFAULT = 30.0  # how long a command waits for unreachable servers
PROGRESS_WIDTH_CHARS = 40
PROGRESS_INTERVAL_S = 0.1


def invalid(message: str) -> ClientError:
    return ClientError(ErrorCode.Value("INVALID_REQUEST"), message)


def parse_configs(items: list[str] | None, flag: str = "--config") -> dict[str, str]:
    configs = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise invalid(f"{flag} takes key=value, not {item!r}")
        configs[key] = value
    return configs


# --- topics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a command goes: the bootstrap addresses and the TLS files to
    connect with (the SDK's tls_ca= / tls_cert= / tls_key= / token_file=; none: plaintext)."""

    bootstrap: str
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None

    def client_options(self) -> dict:
        return {"tls_ca": self.tls_ca, "tls_cert": self.tls_cert, "tls_key": self.tls_key, "token_file": self.token_file}


CLIENT_CONFIG_KEYS = {"bootstrap.servers": "bootstrap", "tls.ca": "tls_ca", "tls.cert": "tls_cert", "tls.key": "tls_key",
                      "token.file": "token_file"}


def read_client_config(path: str) -> Target:
    """A client properties file (``--command-config``): ``key=value`` lines,
    ``#`` comments; bootstrap.servers is required, tls.ca, tls.cert, tls.key
    and token.file are optional (relative paths are relative to the file)."""
    lines = _read_lines(path, "client config")
    found: dict[str, str] = {}
    folder = os.path.dirname(os.path.abspath(path))
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, equals, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or key not in CLIENT_CONFIG_KEYS:
            raise invalid(f"{path} line {number}: expected KEY=VALUE with KEY one of {', '.join(CLIENT_CONFIG_KEYS)}, got {line[:80]!r}")
        found[CLIENT_CONFIG_KEYS[key]] = value if key == "bootstrap.servers" else os.path.join(folder, value)
    if not found.get("bootstrap"):
        raise invalid(f"{path} names no bootstrap.servers")
    return Target(**found)


def _target(bootstrap: str | Target) -> Target:
    return bootstrap if isinstance(bootstrap, Target) else Target(bootstrap)


def _admin(bootstrap: str | Target, timeout_s: float) -> Admin:
    target = _target(bootstrap)
    return Admin(target.bootstrap, default_api_timeout_ms=timeout_s * 1000, **target.client_options())


admin_for = _admin  # for commands that keep an Admin open (txlog console); the caller closes it


def topics_create(bootstrap: str | Target, name: str, partitions: int, configs: dict[str, str], out: TextIO, *,
                  replication_factor: int | None = None, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        wanted = (name, partitions) if replication_factor is None else (name, partitions, replication_factor)
        created = admin.create_topics([wanted], configs)
    out.write(f"topic {name} has {created[name]} partition(s)\n")


def topics_list(bootstrap: str | Target, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        for name in admin.list_topics():
            out.write(name + "\n")


def topics_describe(bootstrap: str | Target, name: str, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        (topic,) = admin.describe_topics([name])
    out.write(json.dumps({
        "name": topic.name,
        "is_internal": topic.is_internal,
        "configs": topic.configs,
        "partitions": [
            {"partition": p.partition, "leader": p.leader_id, "leader_id": p.leader_id, "leader_address": p.leader_address,
             "leader_epoch": p.leader_epoch, "replicas": list(p.replicas), "isr": list(p.isr), "error": p.error}
            for p in topic.partitions
        ],
    }, indent=2) + "\n")


def topics_alter_configs(bootstrap: str | Target, name: str, configs: dict[str, str], deleted: list[str], validate_only: bool,
                         out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        after = admin.alter_topic_configs(name, configs, deleted, validate_only=validate_only)
    out.write(json.dumps({"topic": name, "configs": after, "applied": not validate_only}, sort_keys=True) + "\n")


def topics_delete(bootstrap: str | Target, names: list[str], out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Deletes the topics, one JSON line each once it is gone (a topic's
    error, the first, raises: the others were still deleted)."""
    with _admin(bootstrap, timeout_s) as admin:
        admin.delete_topics(names, timeout_s=timeout_s)
    for name in dict.fromkeys(names):
        out.write(json.dumps({"topic": name, "deleted": True}) + "\n")


def partitions_add(bootstrap: str | Target, topic: str, total: int, validate_only: bool, out: TextIO, *,
                   timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        counts = admin.create_partitions({topic: total}, validate_only=validate_only)
    out.write(json.dumps({"topic": topic, "partitions": counts[topic], "applied": not validate_only}) + "\n")


def cluster_describe(bootstrap: str | Target, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """The controller, every live instance of every service with its version,
    the partition_svc instances with what each leads and holds, and the
    partitions' health, as one JSON object. Describing the controller and the
    instances needs Describe on the Cluster: without it (or from a server
    older than describe_cluster) they are null, ``cluster_error`` says why,
    and the rest is printed as before."""
    with _admin(bootstrap, timeout_s) as admin:
        try:
            cluster, cluster_error = admin.describe_cluster(), None
        except ClientError as exc:
            cluster, cluster_error = None, str(exc)
        live = admin.live_partition_nodes() if cluster is None else None
        topics = admin.describe_topics(None)
    partitions = [p for t in topics for p in t.partitions]
    if cluster is not None:
        nodes = {i.node_id: i.address for i in cluster.instances if i.kind == "partition_svc"}
    else:
        leaders = {p.leader_id: p.leader_address for p in partitions if p.leader_address}
        nodes = {n: leaders.get(n) for n in live}
    out.write(json.dumps({
        "controller_id": cluster.controller_id if cluster else None,
        "controller_epoch": cluster.controller_epoch if cluster else None,
        "instances": [i._asdict() for i in cluster.instances] if cluster else None,
        **({"cluster_error": cluster_error} if cluster_error else {}),
        "partition_svcs": [{"node_id": n, "address": address, "leaders": sum(p.leader_id == n for p in partitions),
                            "replicas": sum(n in p.replicas for p in partitions)} for n, address in sorted(nodes.items())],
        "topics": len(topics),
        "internal_topics": sum(t.is_internal for t in topics),
        "partitions": len(partitions),
        "under_replicated": sum(len(p.isr) < len(p.replicas) for p in partitions),
        "offline": sum(p.leader_id not in nodes for p in partitions),
    }, indent=2) + "\n")


def offsets(bootstrap: str | Target, topic: str, spec: str | int, partition: int | None, out: TextIO, *,
            timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Each partition's offset for ``spec`` (kafka-get-offsets.sh): "earliest",
    "latest" (the high watermark), "last_stable", or a timestamp in ms (the
    first offset at or after it; -1 when every record is older). JSON lines."""
    with _admin(bootstrap, timeout_s) as admin:
        (described,) = admin.describe_topics([topic])
        numbers = [p.partition for p in described.partitions]
        if partition is not None:
            if partition not in numbers:
                raise invalid(f"topic {topic!r} has no partition {partition}")
            numbers = [partition]
        found = admin.list_offsets({TopicPartition(topic, p): spec for p in numbers})
    for tp, answer in sorted(found.items()):
        line = {"topic": tp.topic, "partition": tp.partition, "offset": answer.offset}
        if isinstance(spec, int):
            line["timestamp_ms"] = answer.timestamp_ms
        out.write(json.dumps(line) + "\n")


def read_delete_records_file(path: str) -> dict[TopicPartition, int]:
    """kafka-delete-records.sh's offsets JSON file:
    {"partitions": [{"topic": "t", "partition": 0, "offset": 3}, ...], "version": 1}."""
    shape = '{"partitions": [{"topic": "t", "partition": 0, "offset": 3}, ...], "version": 1}'
    text = "\n".join(_read_lines(path, "offsets file"))
    try:
        document = json.loads(text)
        if document.get("version", 1) != 1:
            raise ValueError(f"version {document['version']!r} is not supported (1 is)")
        plan: dict[TopicPartition, int] = {}
        for entry in document["partitions"]:
            topic, partition, offset = entry["topic"], entry["partition"], entry["offset"]
            if not isinstance(topic, str) or not all(isinstance(n, int) and not isinstance(n, bool) for n in (partition, offset)):
                raise ValueError(f"topic is a string, partition and offset are integers: {json.dumps(entry)[:200]}")
            if partition < 0 or offset < -1:
                raise ValueError(f"partition >= 0 and offset >= 0 (or -1, the last stable offset): {json.dumps(entry)[:200]}")
            tp = TopicPartition(topic, partition)
            if tp in plan:
                raise ValueError(f"{topic}-{partition} is named twice")
            plan[tp] = offset
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise invalid(f"{path}: a delete-records offsets file is {shape}: {exc}") from None
    if not plan:
        raise invalid(f"{path} names no partition")
    return plan


def delete_records(bootstrap: str | Target, offsets: dict[TopicPartition, int], out: TextIO, *,
                   timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Moves each partition's log start to its offset (kafka-delete-records.sh):
    one JSON line per partition with its low watermark once every in-sync
    replica has followed."""
    with _admin(bootstrap, timeout_s) as admin:
        low_watermarks = admin.delete_records(offsets, timeout_s=timeout_s)
    for tp, low_watermark in sorted(low_watermarks.items()):
        out.write(json.dumps({"topic": tp.topic, "partition": tp.partition, "low_watermark": low_watermark}) + "\n")


def partitions_under_replicated(bootstrap: str | Target, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> int:
    """JSON lines, one per partition whose ISR is smaller than its replicas (or without a leader); the count."""
    with _admin(bootstrap, timeout_s) as admin:
        found = admin.under_replicated_partitions()
    for tp, p in found:
        out.write(json.dumps({"topic": tp.topic, "partition": tp.partition, "leader": p.leader_id,
                              "leader_epoch": p.leader_epoch, "replicas": list(p.replicas), "isr": list(p.isr)}) + "\n")
    return len(found)


def parse_reassignment_file(text: str) -> dict[TopicPartition, list[int]]:
    """Kafka's reassignment JSON: {"partitions": [{"topic", "partition", "replicas"}, ...]}."""
    try:
        entries = json.loads(text)["partitions"]
        return {TopicPartition(e["topic"], int(e["partition"])): [int(n) for n in e["replicas"]] for e in entries}
    except (ValueError, KeyError, TypeError) as exc:
        raise invalid(f'a reassignment file is {{"partitions": [{{"topic", "partition", "replicas"}}, ...]}}: {exc}') from None


def partitions_reassign(bootstrap: str | Target, plan: dict[TopicPartition, list[int]], out: TextIO, *, wait: bool = False,
                        timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Starts the reassignments (and with ``wait``, returns once they are done)."""
    with _admin(bootstrap, timeout_s) as admin:
        admin.alter_partition_reassignments(plan)
        out.write(f"reassigning {len(plan)} partition(s)\n")
        deadline = time.monotonic() + timeout_s
        while wait and set(admin.list_partition_reassignments()) & set(plan):
            if time.monotonic() > deadline:
                raise ClientError(ErrorCode.Value("REQUEST_TIMED_OUT"), f"reassignments still under way after {timeout_s} s")
            time.sleep(0.2)
        if wait:
            out.write("done\n")


def rebalance_plan(topics, nodes: list[int]) -> dict[TopicPartition, list[int]]:
    """Each topic's replicas and preferred leaders spread evenly over
    ``nodes``, moving as few replicas as it can (txlog/rebalance.py):
    per topic, so a busy topic's load lands on every instance, not only the
    cluster's totals. Only partitions whose replicas change are in the plan."""
    plan = {}
    for topic in topics:
        plan.update(rebalance({TopicPartition(topic.name, p.partition): list(p.replicas) for p in topic.partitions}, nodes))
    return plan


def partitions_rebalance(bootstrap: str | Target, execute: bool, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Prints a plan spreading every topic's replicas over all live instances
    (Kafka's reassignment JSON); with ``execute``, starts it."""
    with _admin(bootstrap, timeout_s) as admin:
        topics = admin.describe_topics(None)
        nodes = admin.live_partition_nodes()
        plan = rebalance_plan(topics, nodes)
        out.write(json.dumps({"version": 1, "partitions": [
            {"topic": tp.topic, "partition": tp.partition, "replicas": replicas} for tp, replicas in sorted(plan.items())]},
            indent=2) + "\n")
        if execute and plan:
            admin.alter_partition_reassignments(plan)
            out.write(f"reassigning {len(plan)} partition(s)\n")


def producers_describe(bootstrap: str | Target, topic: str, partition: int | None, out: TextIO, *,
                       timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        (info,) = admin.describe_topics([topic])
        tps = [TopicPartition(topic, p.partition) for p in info.partitions
               if partition is None or p.partition == partition]
        if not tps:
            raise ClientError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"),
                              f"topic {topic!r} has no partition {partition}")
        states = admin.describe_producers(tps)
    for tp in tps:
        for producer in states[tp]:
            out.write(json.dumps({"topic": tp.topic, "partition": tp.partition, **producer._asdict()}) + "\n")


# --- transactions --------------------------------------------------------------------------


def transactions_list(bootstrap: str | Target, states: list[str] | None, producer_ids: list[int] | None,
                      min_duration_ms: int | None, out: TextIO, *, prefix: str = "",
                      timeout_s: float = TIMEOUT_S_DEFAULT, output: str = "json") -> None:
    with _admin(bootstrap, timeout_s) as admin:
        listings = admin.list_transactions(states=states, producer_ids=producer_ids, duration_ms=min_duration_ms,
                                           prefix=prefix)
    write_rows(out, [listing._asdict() for listing in listings], output, "no transactions match")


def transactions_describe(bootstrap: str | Target, transactional_ids: list[str], out: TextIO, *,
                          timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        descriptions = admin.describe_transactions(transactional_ids)
    for description in descriptions:
        fields = description._asdict()
        fields["partitions"] = [{"topic": tp.topic, "partition": tp.partition} for tp in description.partitions]
        fields["prepare_metadata"] = _json_bytes(description.prepare_metadata)
        out.write(json.dumps(fields) + "\n")


def transactions_group_config(bootstrap: str | Target, group_id: str, configs: dict[str, str], deleted: list[str],
                              out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """A transaction group's check-back settings, after setting ``configs`` and
    putting ``deleted`` back to their defaults (with neither: only described),
    as one JSON object: group_id, configs (every key), overridden (the keys set
    explicitly), checkers (address, lease_remaining_ms)."""
    with _admin(bootstrap, timeout_s) as admin:
        if configs or deleted:
            admin.alter_transaction_group_config(group_id, configs, deleted)
        described = admin.describe_transaction_group_config(group_id)
    out.write(json.dumps({
        "group_id": described.group_id, "configs": described.configs, "overridden": list(described.overridden),
        "checkers": [checker._asdict() for checker in described.checkers],
    }, indent=2) + "\n")


def transactions_complete(bootstrap: str | Target, transactional_id: str, producer_id: int, producer_epoch: int,
                          commit: bool, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    handle = TransactionHandle(transactional_id, producer_id, producer_epoch)
    with _admin(bootstrap, timeout_s) as admin:
        admin.complete_transaction(handle, commit)
    out.write(json.dumps({"completed": True, "committed": commit, **handle._asdict()}) + "\n")


def transactions_abort(bootstrap: str | Target, topic: str, partition: int, producer_id: int, producer_epoch: int,
                       coordinator_epoch: int, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        admin.abort_transaction((topic, partition), producer_id, producer_epoch, coordinator_epoch)
    out.write(json.dumps({"aborted": True, "topic": topic, "partition": partition, "producer_id": producer_id,
                          "producer_epoch": producer_epoch, "coordinator_epoch": coordinator_epoch}) + "\n")


def transactions_find_hanging(bootstrap: str | Target, topics: list[str] | None, max_transaction_timeout_ms: int,
                              out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT, output: str = "json") -> None:
    with _admin(bootstrap, timeout_s) as admin:
        hanging = admin.find_hanging(topics, max_transaction_timeout_ms)
    write_rows(out, [item._asdict() for item in hanging], output, "no hanging transactions")


OUTPUTS = ("auto", "json", "table")


def write_rows(out: TextIO, rows: list[dict], output: str, empty: str) -> None:
    """A listing: JSON lines, or (``table``, and ``auto`` on a terminal) a
    table with a header row; an empty one is said on a terminal."""
    if output == "auto":
        output = "table" if out.isatty() else "json"
    if not rows:
        say_none(out, empty)
    elif output == "json":
        for row in rows:
            out.write(json.dumps(row) + "\n")
    else:
        columns = list(rows[0])
        cells = [[_cell(row[c]) for c in columns] for row in rows]
        widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
        for line in [[c.upper() for c in columns], *cells]:
            out.write("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip() + "\n")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def say_none(out: TextIO, message: str) -> None:
    """An empty answer, said on a terminal; a pipe gets nothing (no line a script would have to skip)."""
    if out.isatty():
        out.write(f"({message})\n")


# --- produce ------------------------------------------------------------------------------------


def produce(bootstrap: str | Target, topic: str, key_separator: str | None, partition: int | None,
            stdin: BinaryIO, err: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT, **producer_options) -> int:
    separator = key_separator.encode() if key_separator is not None else None
    sent = 0
    with _admin(bootstrap, timeout_s) as admin:  # fail at once on a missing topic (a Producer would wait for it)
        admin.describe_topics([topic])
    target = _target(bootstrap)
    # --timeout-s bounds each record's delivery too (the SDK's default is 2 minutes): a partition without a
    # leader fails its records with the SDK's reason after timeout_s instead of keeping the command silent
    timeout_ms = timeout_s * 1000
    linger_ms = producer_options.pop("linger_ms", 5)
    with Producer(target.bootstrap, max_block_ms=timeout_ms, delivery_timeout_ms=timeout_ms, linger_ms=min(linger_ms, timeout_ms / 4),
                  request_timeout_ms=min(30_000, timeout_ms / 2), **target.client_options(), **producer_options) as producer:
        futures = []
        progress = Progress(err, 0, counting=True, what="lines sent")
        number = 0
        for number, line in enumerate(iter(lambda: stdin.readline(LINE_BYTES_MAX + 1), b""), start=1):
            progress.update(number)
            if len(line) > LINE_BYTES_MAX:
                raise invalid(f"line {number} is longer than {LINE_BYTES_MAX} bytes")
            line = line[:-1] if line.endswith(b"\n") else line
            key = None
            if separator is not None:
                key, found, line = line.partition(separator)
                if not found:
                    raise invalid(f"line {number} has no key separator {key_separator!r}")
            futures.append(producer.send(topic, value=line, key=key, partition=partition))
            if len(futures) >= 10_000:  # bound memory: settle what is out
                sent += _settle(futures)
        producer.flush()
        sent += _settle(futures)
        progress.finish(number)
    err.write(f"produced {sent} record(s) to {topic}\n")
    return sent


def _settle(futures: list) -> int:
    count = len(futures)
    for future in futures:
        future.result()  # raises the first failure
    futures.clear()
    return count


# --- consume --------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a terminal (nothing when not a terminal);
    with ``counting`` and no total, a running count of ``what``."""

    def __init__(self, stream: TextIO, total: int, *, counting: bool = False, what: str = "records"):
        self.stream = stream
        self.total = max(total, 0)
        self.what = what
        self.enabled = (self.total > 0 or counting) and hasattr(stream, "isatty") and stream.isatty()
        self._last_draw_s = 0.0

    def update(self, done: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw_s < PROGRESS_INTERVAL_S:
            return
        self._last_draw_s = now
        if not self.total:
            self.stream.write(f"\r{done} {self.what}")
            self.stream.flush()
            return
        fraction = min(done / self.total, 1.0)
        filled = int(fraction * PROGRESS_WIDTH_CHARS)
        bar = "#" * filled + "." * (PROGRESS_WIDTH_CHARS - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} records {fraction:6.1%}")
        self.stream.flush()

    def finish(self, done: int) -> None:
        if self.enabled:
            self.update(done, force=True)
            self.stream.write("\n")
            self.stream.flush()


def consume(
    bootstrap: str | Target,
    topic: str,
    *,
    from_beginning: bool,
    group: str | None,
    max_records: int | None,
    isolation: str,
    partition: int | None,
    to_end: bool,
    timeout_ms: float | None,
    print_key: bool,
    key_separator: str,
    out: BinaryIO,
    err: TextIO,
    timeout_s: float = TIMEOUT_S_DEFAULT,
    output_format: str = "plain",
    print_fields: frozenset[str] = frozenset(),
) -> int:
    if output_format not in OUTPUT_FORMATS:
        raise invalid(f"--format must be one of {', '.join(OUTPUT_FORMATS)}, not {output_format!r}")
    unknown = set(print_fields) - set(PRINT_FIELDS)
    if unknown:
        raise invalid(f"unknown fields to print {sorted(unknown)}; known: {', '.join(PRINT_FIELDS)}")
    if max_records is not None and max_records < 0:
        raise invalid(f"--max-records must be >= 0, not {max_records}")
    if "outcome" in print_fields and isolation != "read_uncommitted":
        raise invalid(f"--print-outcome reads read_uncommitted, not {isolation}: read_committed returns only committed records")
    reset = "earliest" if from_beginning else "latest"
    consumed = 0
    target = _target(bootstrap)
    with Consumer(target.bootstrap, **target.client_options(), group_id=group, isolation_level=isolation, auto_offset_reset=reset,
                  max_poll_records=min(500, max_records or 500), default_api_timeout_ms=timeout_s * 1000,
                  include_transaction_outcomes="outcome" in print_fields) as consumer:
        partitions = consumer.partitions_for(topic)
        if partition is not None:
            if partition not in partitions:
                raise ClientError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"),
                                  f"topic {topic!r} has no partition {partition}")
            partitions = [partition]
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        if from_beginning and group is None:
            consumer.seek_to_beginning()
        remaining: dict[TopicPartition, int] = {}
        total = max_records or 0
        if to_end:
            ends = consumer.end_offsets(tps)
            remaining = {tp: ends[tp] for tp in tps if consumer.position(tp) < ends[tp]}
            span = sum(ends[tp] - consumer.position(tp) for tp in remaining)
            total = min(total, span) if max_records is not None else span
        progress = Progress(err, total if (max_records is not None or to_end) else 0)
        separator = key_separator.encode()
        last_record_s = time.monotonic()
        try:
            while True:
                if max_records is not None and consumed >= max_records:
                    break
                if to_end and not remaining:
                    break
                records = consumer.poll(timeout_s=0.5)
                if not records:
                    if timeout_ms is not None and (time.monotonic() - last_record_s) * 1000 >= timeout_ms:
                        break
                    continue
                last_record_s = time.monotonic()
                for index, record in enumerate(records):
                    if max_records is not None and consumed >= max_records:
                        _rewind(consumer, records[index:])  # positions (and the commit) stop at what was printed
                        break
                    out.write(format_record(record, output_format, print_key, separator, print_fields))
                    consumed += 1
                    tp = TopicPartition(record.topic, record.partition)
                    if tp in remaining and record.offset + 1 >= remaining[tp]:
                        del remaining[tp]
                if to_end:
                    for tp in list(remaining):  # markers or aborted records at the end move the position
                        if consumer.position(tp) >= remaining[tp]:
                            del remaining[tp]
                out.flush()
                progress.update(consumed)
        except KeyboardInterrupt:
            pass
        finally:
            progress.finish(consumed)
        if group is not None:
            consumer.commit()
    return consumed


OUTPUT_FORMATS = ("plain", "json")
PRINT_FIELDS = ("timestamp", "partition", "offset", "headers", "outcome")  # in the order plain output prints them


def format_record(record, output_format: str, print_key: bool, separator: bytes, print_fields: frozenset[str]) -> bytes:
    """One record as ``consume`` prints it. plain: the chosen fields as
    kafka-console-consumer prints them (CreateTime:ms, Partition:p, Offset:o,
    headers k:v,... or NO_HEADERS), then the key and the value, separated by
    ``separator``. json: one object with every field (``outcome`` only when
    asked); a key, value or header value that is not UTF-8 is {"base64": ...}.
    The outcome (Outcome:committed, aborted, open or none) is the record's
    transaction's, as the leader knew it when it was read."""
    if output_format == "json":
        shown_json = {
            "topic": record.topic, "partition": record.partition, "offset": record.offset,
            "timestamp_ms": record.timestamp_ms, "key": _json_bytes(record.key), "value": _json_bytes(record.value),
            "headers": [[name, _json_bytes(value)] for name, value in record.headers],
        }
        if "outcome" in print_fields:
            shown_json["outcome"] = record.transaction_outcome
        return json.dumps(shown_json).encode() + b"\n"
    shown = {
        "timestamp": b"CreateTime:%d" % record.timestamp_ms,
        "partition": b"Partition:%d" % record.partition,
        "offset": b"Offset:%d" % record.offset,
        "headers": b",".join(name.encode() + b":" + (b"null" if value is None else value) for name, value in record.headers)
        or b"NO_HEADERS",
        "outcome": b"Outcome:%s" % (record.transaction_outcome or "").encode(),
    }
    parts = [shown[name] for name in PRINT_FIELDS if name in print_fields]
    if print_key:
        parts.append(b"null" if record.key is None else record.key)
    parts.append(b"null" if record.value is None else record.value)
    return separator.join(parts) + b"\n"


def _json_bytes(data: bytes | None):
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _rewind(consumer: Consumer, unprinted: list) -> None:
    first: dict[TopicPartition, int] = {}
    for record in unprinted:
        tp = TopicPartition(record.topic, record.partition)
        first[tp] = min(first.get(tp, record.offset), record.offset)
    for tp, offset in first.items():
        consumer.seek(tp, offset)


def quotas_alter(bootstrap: str | Target, entity: dict[str, str | None], quotas: dict[str, float | None], out: TextIO, *,
                 dry_run: bool = False, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Sets or removes one entity's quotas; prints the entity's quotas after (JSON)."""
    with _admin(bootstrap, timeout_s) as admin:
        admin.alter_client_quotas(entity, quotas, validate_only=dry_run)
        after = next((e["quotas"] for e in admin.describe_client_quotas() if e["entity"] == entity), {})
    if dry_run:
        after = {k: v for k, v in {**after, **quotas}.items() if v is not None}
    out.write(json.dumps({"entity": entity, "quotas": after, "dry_run": dry_run}) + "\n")


def quotas_describe(bootstrap: str | Target, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        out.write(json.dumps(admin.describe_client_quotas(), indent=2) + "\n")


def acls_add(bootstrap: str | Target, bindings: list[AclBinding], out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        admin.create_acls(bindings)
    for binding in bindings:
        out.write(acls.describe(binding) + "\n")


def acls_list(bootstrap: str | Target, wanted: AclFilter, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        for binding in admin.describe_acls(wanted):
            out.write(acls.describe(binding) + "\n")


def acls_remove(bootstrap: str | Target, filters: list[AclFilter], out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        for binding in admin.delete_acls(filters):
            out.write(acls.describe(binding) + "\n")


def groups_list(bootstrap: str | Target, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT, output: str = "json") -> None:
    with _admin(bootstrap, timeout_s) as admin:
        groups = admin.list_groups()
    write_rows(out, [g._asdict() for g in groups], output, "no consumer groups")


def groups_describe(bootstrap: str | Target, group_id: str, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """The members, and per partition (of the members' topics and of the
    committed offsets) its committed offset, the end a read_committed reader
    reaches (the last stable offset), the lag between them and its owner."""
    with _admin(bootstrap, timeout_s) as admin:
        group = admin.describe_group(group_id)
        committed = admin.list_group_offsets(group_id)
        topics = {t for m in group.members for t in m.subscribed_topics} | {tp.topic for tp in committed}
        described = {t.name: t for t in admin.describe_topics(sorted(topics))} if topics else {}
        partitions = sorted({TopicPartition(name, p.partition) for name, t in described.items() for p in t.partitions} | set(committed))
        ends = admin.list_offsets({tp: "last_stable" for tp in partitions}) if partitions else {}
    rows = []
    for tp in partitions:
        offset, end = committed.get(tp), ends[tp].offset if tp in ends else None
        rows.append({"topic": tp.topic, "partition": tp.partition, "committed": offset, "end": end,
                     "lag": None if offset is None or end is None else max(end - offset, 0), "owner": group.owner(tp)})
    out.write(json.dumps({
        "group": group.group_id, "state": group.state, "group_epoch": group.group_epoch, "assignor": group.assignor,
        "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "member_epoch": m.member_epoch, "state": m.state,
                     "subscribed_topics": list(m.subscribed_topics),
                     "assigned": [[tp.topic, tp.partition] for tp in sorted(m.assigned)],
                     "revoking": [[tp.topic, tp.partition] for tp in sorted(m.revoking)]} for m in group.members],
        "partitions": rows,
    }, indent=2) + "\n")


def groups_delete(bootstrap: str | Target, group_id: str, out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    with _admin(bootstrap, timeout_s) as admin:
        deleted = admin.delete_group(group_id)
    out.write(json.dumps({"group": group_id, "offsets_deleted": deleted}) + "\n")


def groups_delete_offsets(bootstrap: str | Target, group_id: str, topics: list[str], out: TextIO, *,
                          timeout_s: float = TIMEOUT_S_DEFAULT) -> bool:
    """Deletes the group's committed offsets of ``topics``: ``T`` for every
    partition with a committed offset (the topic itself may be gone), ``T:0,2``
    for those partitions. One JSON line per partition; False when any stayed."""
    wanted: list[TopicPartition] = []
    whole: list[str] = []
    for spec in topics:
        topic, _, numbers = spec.partition(":")
        if not numbers:
            whole.append(topic)
            continue
        try:
            wanted.extend(TopicPartition(topic, int(n)) for n in numbers.split(","))
        except ValueError:
            raise invalid(f"--topic {spec!r}: partitions are numbers separated by commas, as in {topic}:0,2") from None
    with _admin(bootstrap, timeout_s) as admin:
        if whole:
            wanted.extend(tp for tp in admin.list_group_offsets(group_id) if tp.topic in whole)
        if not wanted:
            out.write(json.dumps({"group": group_id, "deleted": 0, "reason": "no committed offsets for " + ", ".join(topics)}) + "\n")
            return True
        results = admin.delete_group_offsets(group_id, wanted)
    for tp, error in sorted(results.items()):
        line = {"topic": tp.topic, "partition": tp.partition, "deleted": error is None}
        if error is not None:
            line["error"] = str(error)
        out.write(json.dumps(line) + "\n")
    return all(error is None for error in results.values())


def _read_lines(path: str, what: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as source:
            return source.read().splitlines()
    except OSError as exc:
        raise invalid(f"cannot read {what} {path}: {exc.strerror}") from None


def read_offsets_file(path: str) -> dict[TopicPartition, int]:
    """A reset plan as kafka-consumer-groups.sh writes and reads it: CSV lines
    ``topic,partition,offset`` (blank lines and ``#`` comments skipped)."""
    lines = _read_lines(path, "offsets file")
    plan: dict[TopicPartition, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        try:
            topic, partition, offset = fields[0], int(fields[1]), int(fields[2])
            if len(fields) != 3 or not topic or partition < 0 or offset < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise invalid(f"{path} line {number}: expected topic,partition,offset (offset >= 0), got {line[:200]!r}") from None
        tp = TopicPartition(topic, partition)
        if tp in plan:
            raise invalid(f"{path} line {number}: {topic}-{partition} is named twice")
        plan[tp] = offset
    if not plan:
        raise invalid(f"{path} names no partition")
    return plan


def groups_reset_offsets(bootstrap: str | Target, group_id: str, topics: list[str], target: tuple[str, object], execute: bool,
                         out: TextIO, *, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Moves the group's committed offsets of ``topics`` (every partition) to
    ``target``: ("earliest"|"latest", None), ("offset", N), ("shift", N),
    ("timestamp", ms), or ("file", {TopicPartition: offset}) for exactly the
    partitions a file names (``topics`` then unused). Offsets are kept within
    each partition's log start and last stable offset. Prints the plan as JSON
    lines; applies it only with ``execute`` (kafka-consumer-groups.sh's dry run
    by default)."""
    kind, value = target
    with _admin(bootstrap, timeout_s) as admin:
        if kind == "file":
            tps = sorted(value)
            described = {t.name: len(t.partitions) for t in admin.describe_topics(sorted({tp.topic for tp in tps}))}
            missing = [f"{tp.topic}-{tp.partition}" for tp in tps if tp.partition >= described[tp.topic]]
            if missing:
                raise invalid(f"the offsets file names partitions that do not exist: {missing[:10]}")
        else:
            tps = [TopicPartition(t.name, p.partition) for t in admin.describe_topics(topics) for p in t.partitions]
        current = admin.list_group_offsets(group_id)
        earliest = admin.list_offsets(dict.fromkeys(tps, "earliest"))
        latest = admin.list_offsets(dict.fromkeys(tps, "last_stable"))
        by_time = admin.list_offsets(dict.fromkeys(tps, value)) if kind == "timestamp" else {}
        plan = {}
        for tp in tps:
            low, high = earliest[tp].offset, latest[tp].offset
            if kind == "earliest":
                wanted = low
            elif kind == "latest":
                wanted = high
            elif kind == "offset":
                wanted = value
            elif kind == "shift":
                wanted = (current.get(tp, low)) + value
            elif kind == "file":
                wanted = value[tp]
            else:
                wanted = by_time[tp].offset if by_time[tp].offset >= 0 else high
            plan[tp] = min(max(wanted, low), high)
        for tp, offset in sorted(plan.items()):
            out.write(json.dumps({"topic": tp.topic, "partition": tp.partition, "current": current.get(tp), "new": offset,
                                  "applied": execute}) + "\n")
        if execute:
            admin.alter_group_offsets(group_id, plan)
