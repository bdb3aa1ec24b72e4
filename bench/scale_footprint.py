"""The sections of bench/scale.py that measure what the services hold and how
long they take to come back, against what they serve (issue 18).

Each section starts its own local cluster of real processes
(services/tooling/cluster.py) in a folder of the caller's and stops it before it
returns; each judged figure carries its target and ``meets_target``.

* :func:`measure_partitions` (sections ``memory`` and ``recovery``): one
  partition_svc and ZooKeeper, nothing else. For each level of idle
  partitions (topics of at most :data:`PARTITIONS_PER_TOPIC` partitions,
  replication factor 1, created on top of the previous level's): the time
  to create them until every one answers ListOffsets, then an idle window:
  partition_svc's CPU, ZooKeeper's requests per second, znodes and watches,
  and at its end partition_svc's resident memory (VmRSS) against the same
  process's before it held any partition (target: at most
  :data:`PARTITION_KB_MAX` KB each). With ``recovery``, at each level a
  restart (SIGTERM, start), timed until health is SERVING and until every
  partition answers ListOffsets (the restarted instance leads again only
  once the controller has elected it again).
  Last, a second partition_svc that holds none of the partitions (started
  after they were placed): its memory, CPU and ZooKeeper requests, what
  every pod pays for the partitions of the others.
* :func:`measure_log_length` (``recovery``): one cluster with one partition
  per log length (short, long), restarted in turn; target: the long log's
  median restart within :data:`LOG_LENGTH_RATIO_MAX` times the short one's
  (recovery reads no log).
* :func:`measure_coordinator` (``coordinator``): ZooKeeper, one
  producer_id_svc, one partition_svc, one coordinator_svc. For each level of
  transactional ids, InitProducerId for the new ones (raw gRPC, asyncio, many
  calls outstanding), then an idle window: the coordinator's CPU (its timers
  take only the ids whose time came, so this stays at the noise floor; it
  walked every id once a second before), its resident memory at the end
  against before the first id (target: at most :data:`ID_BYTES_MAX` bytes
  each), then DescribeTransactions latency for a few seconds (its maximum
  shows how long anything holds the event loop).
  Then, at each level, a restart of the coordinator, timed until
  DescribeTransactions answers for a known id of every
  ``__transaction_state`` partition, and each partition's load (from the
  coordinator's own "taking over" and "loaded" log lines) per 100,000 of its
  records (target at the largest level: at most :data:`LOAD_S_PER_100K_MAX`
  s), beside the time the bench takes to fetch the same records itself
  (partition_svc's share of a load). A level not run (1,000,000 ids by
  default) is extrapolated from the largest one run, labelled so.

Progress goes to stderr; the figures come back as dicts for scale.py to print.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.measure import MB, cpu_seconds, latency_summary, progress
from services.coordination import coordinators
from services.tooling.cluster import (
    LocalCluster,
    pid_alive,
    registration_session,
    tail,
    zookeeper_counters,
    zookeeper_session_requests,
)
from txlog.protocol import TRANSACTION_STATE_TOPIC, errors
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, partition_pb2, partition_pb2_grpc

PARTITIONS_PER_TOPIC = 1_000  # partition_svc's partitions_per_topic_max default
PARTITION_KB_MAX = 100
LOG_LENGTH_RATIO_MAX = 1.25
ID_BYTES_MAX = 1_024
LOAD_S_PER_100K_MAX = 1.0
CALL_TIMEOUT_S = 60.0
# A Fetch answers up to the server's max_bytes (4 x batch_bytes_max, 64 MB): 30 MB for 125,000 transaction log records.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
POLL_S = 0.02
DESCRIBE_SECONDS = 3.0  # sequential DescribeTransactions after each idle window: three timer passes
LOG_BATCH_RECORDS = 1_000
LOG_RECORD_BYTES = 1_000  # one 1 MB batch per Produce
LOG_IN_FLIGHT = 4
TRANSACTION_TIMEOUT_MS = 60_000
RETRIABLE_COORDINATOR = {"CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"}
RETRY_BACKOFF_S = 0.05
TOPIC_PREFIX = "idle-"
LOG_TOPIC = "log-length"
TAKING_OVER = "taking over transaction log partition"  # coordinator_svc's log lines around a partition's load
LOADED = "loaded transaction log partition"
PARTITION_SVC = "partition_svc-0"
COORDINATOR_SVC = "coordinator_svc-0"


def rss_kb(pid: int) -> int:
    """A process's resident memory (VmRSS), KB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def judged(value: float, target: float, **more) -> dict:
    return {"value": round(value, 3), "target_at_most": target, "meets_target": value <= target, **more}


async def until(condition: Callable[[], Awaitable[bool]], deadline_s: float, what: str) -> float:
    """Seconds until ``condition()`` holds, asked every POLL_S; RuntimeError past the deadline."""
    started = time.monotonic()
    while not await condition():
        if time.monotonic() - started > deadline_s:
            raise RuntimeError(f"{what}: not within {deadline_s:.0f} s")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - started


async def health_serving(address: str) -> bool:
    """A fresh channel each time: one made before the port listens backs off for a second or more."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


async def restart_until(cluster: LocalCluster, name: str, answering: Callable[[str], Awaitable[float]], deadline_s: float) -> dict:
    """SIGTERM, start again; seconds from the start until health is SERVING
    and until ``answering(address)`` returns (it waits for its own condition)."""
    cluster.stop(name)
    started = time.monotonic()
    cluster.start(name, wait=False)
    info = cluster.state.services[name]

    async def serving_or_gone() -> bool:
        if not pid_alive(info.pid):
            raise RuntimeError(f"{name} exited after a restart")
        return await health_serving(info.address)

    try:
        await until(serving_or_gone, deadline_s, f"{name} SERVING after a restart")
        serving = time.monotonic() - started
        await answering(info.address)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; the end of {info.log}:\n{tail(info.log)}") from None
    return {"until_serving_s": round(serving, 2), "until_answering_s": round(time.monotonic() - started, 2)}


def idle_window(cluster: LocalCluster, name: str, seconds: float, node_id: int | None = None) -> dict:
    """What a service and ZooKeeper do while nobody calls: the service's CPU,
    ZooKeeper's requests per second (every session's), its znodes and
    watches, and the service's resident memory at the end; with a partition_svc
    ``node_id``, the requests of that instance's own ZooKeeper session too
    (ZooKeeper's per-connection count: the cluster-wide one swings by hundreds
    a second with the controller's passes, more than one idle instance asks)."""
    pid = cluster.state.services[name].pid
    session = None if node_id is None else registration_session(cluster.state.zookeeper, "partition_svc", node_id,
                                                                 cluster.state.zookeeper_root)
    own = lambda: 0 if session is None else zookeeper_session_requests(cluster.state.zookeeper, session)  # noqa: E731
    before, own_before, cpu_before, started = zookeeper_counters(cluster.state.zookeeper), own(), cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    after, own_after, cpu_after, taken = zookeeper_counters(cluster.state.zookeeper), own(), cpu_seconds(pid), time.monotonic() - started
    row = {"idle_seconds": round(taken, 1), "rss_kb": rss_kb(pid),
           "cpu_utilisation": round((cpu_after - cpu_before) / taken, 4),
           "zookeeper_requests_per_s": round((after["zk_packets_received"] - before["zk_packets_received"]) / taken, 1),
           "zookeeper_znodes": after["zk_znode_count"], "zookeeper_watches": after["zk_watch_count"]}
    if session is not None:
        row["own_zookeeper_requests_per_s"] = round((own_after - own_before) / taken, 1)
    return row


def per(row: dict, base: dict, key: str, count: int, unit: int = 1, ndigits: int = 3) -> float:
    """How much ``key`` grew from ``base`` to ``row``, per ``unit`` of ``count``."""
    return round((row[key] - base[key]) * unit / count, ndigits)


# --- partition_svc ---------------------------------------------------------------------------


class PartitionSvc:
    """Hand-built calls to one partition_svc."""

    def __init__(self, address: str):
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = partition_pb2_grpc.PartitionServiceStub(self.channel)

    async def create(self, name: str, partitions: int) -> None:
        reply = await self.stub.CreateTopics(partition_pb2.CreateTopicsRequest(topics=[
            partition_pb2.CreatableTopic(name=name, partition_count=partitions, replication_factor=1)]), timeout=CALL_TIMEOUT_S)
        assert reply.results[0].error.code == 0, reply.results[0].error

    async def offsets(self, topic: str, partitions: int, spec: int = partition_pb2.OFFSET_SPEC_LATEST) -> list[int] | None:
        """Each partition's offset of ``spec``; None unless every one answers."""
        request = partition_pb2.ListOffsetsRequest(partitions=[
            partition_pb2.ListOffsetsPartition(topic=topic, partition=p, spec=spec) for p in range(partitions)])
        try:
            reply = await self.stub.ListOffsets(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError:
            return None
        if any(result.error.code for result in reply.results):
            return None
        return [result.offset for result in reply.results]

    async def all_answer(self, topics: dict[str, int]) -> bool:
        found = await asyncio.gather(*(self.offsets(name, count) for name, count in topics.items()))
        return all(offsets is not None for offsets in found)

    async def fill(self, topic: str, target_bytes: int) -> int:
        """Non-idempotent 1 MB batches to partition 0, LOG_IN_FLIGHT outstanding,
        until ``target_bytes`` of record values were written; the records written."""
        records = [common_pb2.Record(key=i.to_bytes(8, "big"), value=bytes([i % 251]) * LOG_RECORD_BYTES)
                   for i in range(LOG_BATCH_RECORDS)]
        request = partition_pb2.ProduceRequest(acks=-1, batches=[partition_pb2.PartitionBatch(
            topic=topic, partition=0, batch=common_pb2.RecordBatch(records=records))])
        batches = -(-target_bytes // (LOG_BATCH_RECORDS * LOG_RECORD_BYTES))
        pending = iter(range(batches))

        async def worker() -> None:
            for _ in pending:
                reply = await self.stub.Produce(request, timeout=CALL_TIMEOUT_S)
                assert reply.results[0].error.code == 0, reply.results[0].error

        await asyncio.gather(*(worker() for _ in range(LOG_IN_FLIGHT)))
        return batches * LOG_BATCH_RECORDS

    async def read_all(self, topic: str, partition: int) -> int:
        """Fetches the partition from offset 0 to its high watermark as the
        coordinator's load does (read_uncommitted, the server's default
        max_bytes); the records read."""
        offset, records = 0, 0
        while True:
            reply = await self.stub.Fetch(partition_pb2.FetchRequest(
                isolation_level=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED,
                partitions=[partition_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]), timeout=CALL_TIMEOUT_S)
            result = reply.results[0]
            if result.error.code == errors.ErrorCode.Value("OFFSET_OUT_OF_RANGE") and offset < result.log_start_offset:
                offset = result.log_start_offset  # compaction moved the log start: the load starts there too
                continue
            assert result.error.code == 0, result.error
            records += sum(len(batch.records) for batch in result.batches)
            if result.next_fetch_offset >= result.high_watermark:
                return records
            offset = result.next_fetch_offset

    async def close(self) -> None:
        await self.channel.close()


async def on_partition_svc(address: str, work: Callable[[PartitionSvc], Awaitable]):
    partition_svc = PartitionSvc(address)
    try:
        return await work(partition_svc)
    finally:
        await partition_svc.close()


def answering_deadline_s(partitions: int) -> float:
    return 120 + partitions * 0.05


def create_partitions(cluster: LocalCluster, topics: dict[str, int], count: int) -> float:
    """Adds topics of ``count`` partitions in all to ``topics``; seconds until every new partition answers."""
    wanted = {}
    while count > 0:
        wanted[f"{TOPIC_PREFIX}{len(topics) + len(wanted):04d}"] = min(count, PARTITIONS_PER_TOPIC)
        count -= PARTITIONS_PER_TOPIC

    async def work(partition_svc: PartitionSvc) -> float:
        started = time.monotonic()
        for topic, partitions in wanted.items():
            await partition_svc.create(topic, partitions)
        await until(lambda: partition_svc.all_answer(wanted), answering_deadline_s(sum(wanted.values())), "the new partitions answering")
        return time.monotonic() - started

    seconds = asyncio.run(on_partition_svc(cluster.state.services[PARTITION_SVC].address, work))
    topics.update(wanted)
    return seconds


def restart_partition_svc(cluster: LocalCluster, topics: dict[str, int]) -> dict:
    """A restart timed until every partition of ``topics`` answers ListOffsets."""
    deadline_s = answering_deadline_s(sum(topics.values()))

    async def answering(address: str) -> float:
        return await on_partition_svc(address, lambda p: until(lambda: p.all_answer(topics), deadline_s, "every partition answering"))

    return asyncio.run(restart_until(cluster, PARTITION_SVC, answering, deadline_s))


def start_cluster(directory: Path, **counts: int) -> LocalCluster:
    cluster = LocalCluster(directory)
    cluster.up(**counts)
    return cluster


def measure_partitions(workdir: Path, levels: list[int], idle_s: float, restarts: bool) -> dict:
    """Memory, CPU and ZooKeeper load of idle partitions, and (``restarts``) the restart time, per level."""
    cluster = start_cluster(workdir / "partitions", producer_id_svcs=0, partition_svcs=1, coordinator_svcs=0)
    topics: dict[str, int] = {}
    rows = []
    try:
        progress(f"partition_svc idle, no partitions ({idle_s:.0f} s)")
        base = {"partitions": 0, **idle_window(cluster, PARTITION_SVC, idle_s, node_id=0)}
        for level in levels:
            progress(f"partitions {sum(topics.values())} -> {level}")
            created_s = create_partitions(cluster, topics, level - sum(topics.values()))
            progress(f"partition_svc idle, {level} partitions ({idle_s:.0f} s)")
            # own_zookeeper_requests_per_s: the controller's session (the one instance is the controller)
            row = {"partitions": level, "create_until_answering_s": round(created_s, 1),
                   **idle_window(cluster, PARTITION_SVC, idle_s, node_id=0)}
            row.update(kb_per_partition=per(row, base, "rss_kb", level, ndigits=1),
                       cpu_ms_per_s_per_1000_partitions=per(row, base, "cpu_utilisation", level, 1_000_000, 1),
                       zookeeper_requests_per_s_per_1000_partitions=per(row, base, "zookeeper_requests_per_s", level, 1000, 1),
                       zookeeper_znodes_per_partition=per(row, base, "zookeeper_znodes", level, ndigits=2),
                       zookeeper_watches_per_partition=per(row, base, "zookeeper_watches", level, ndigits=2))
            if restarts:
                progress(f"restart with {level} partitions")
                row["restart"] = restart_partition_svc(cluster, topics)
                row["restart"]["rss_kb_once_answering"] = rss_kb(cluster.state.services[PARTITION_SVC].pid)
            rows.append(row)
        bystander = measure_bystander(cluster, base, rows[-1]["partitions"], idle_s)
    finally:
        cluster.down(grace_s=5)
    largest = rows[-1]
    figures = {
        "memory": {
            "levels": [base, *rows],
            "kb_per_partition": judged(largest["kb_per_partition"], PARTITION_KB_MAX, at_partitions=largest["partitions"]),
            "bystander": bystander,
        },
    }
    if restarts:
        figures["restart_against_partitions"] = {
            "levels": [{"partitions": r["partitions"], **r["restart"]} for r in rows],
            "seconds_per_1000_partitions": round(largest["restart"]["until_answering_s"] * 1000 / largest["partitions"], 2),
            "target": None,
            "note": "issue 18 sets no target for this curve; it is reported for the estimates on paper",
        }
    return figures


def measure_bystander(cluster: LocalCluster, base: dict, partitions: int, idle_s: float) -> dict:
    """A second partition_svc, started once every partition is placed, so it
    holds none: what every pod pays for the partitions of the others (its
    memory, CPU, and the requests of its own ZooKeeper session)."""
    progress(f"a second partition_svc holding none of the {partitions} partitions ({idle_s:.0f} s settling, {idle_s:.0f} s idle)")
    name = cluster.add_service("partition_svc", 1).name
    time.sleep(idle_s)
    row = idle_window(cluster, name, idle_s, node_id=1)
    return {"partitions_held": 0, "partitions_in_cluster": partitions, **row,
            "kb_per_partition_not_held": per(row, base, "rss_kb", partitions, ndigits=2),
            "cpu_ms_per_s_per_1000_partitions_not_held": round(row["cpu_utilisation"] * 1_000_000 / partitions, 1),
            "own_zookeeper_requests_per_s_per_1000_partitions_not_held": round(row["own_zookeeper_requests_per_s"] * 1000 / partitions, 2)}


def data_dir_mb(cluster: LocalCluster) -> float:
    folder = Path(cluster.state.dir) / PARTITION_SVC
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MB, 1)


def measure_log_length(workdir: Path, log_mb: list[int], rounds: int) -> dict:
    """Restart time of one partition against the length of its log: a cluster
    per length, restarted in turn (short, long, short, ...), so that a busy
    moment of the machine favours neither."""
    clusters = {mb: start_cluster(workdir / f"log-{mb}mb", producer_id_svcs=0, partition_svcs=1, coordinator_svcs=0) for mb in log_mb}
    rows = {}
    try:
        for mb, cluster in clusters.items():
            progress(f"a log of {mb} MB in one partition")
            address = cluster.state.services[PARTITION_SVC].address
            started = time.monotonic()
            asyncio.run(on_partition_svc(address, lambda p: p.create(LOG_TOPIC, 1)))
            records = asyncio.run(on_partition_svc(address, lambda p, mb=mb: p.fill(LOG_TOPIC, mb * MB)))
            rows[mb] = {"log_mb": mb, "records": records, "fill_s": round(time.monotonic() - started, 1),
                        "data_dir_mb": data_dir_mb(cluster), "restarts": []}
        for round_index in range(rounds):
            progress(f"restarts, round {round_index + 1}/{rounds}: {', '.join(f'{mb} MB' for mb in clusters)}")
            for mb, cluster in clusters.items():
                rows[mb]["restarts"].append(restart_partition_svc(cluster, {LOG_TOPIC: 1}))
    finally:
        for cluster in clusters.values():
            cluster.down(grace_s=5)
    for row in rows.values():
        row["median_until_answering_s"] = round(statistics.median(t["until_answering_s"] for t in row["restarts"]), 2)
    short, long = rows[log_mb[0]], rows[log_mb[-1]]
    ratio = long["median_until_answering_s"] / short["median_until_answering_s"]
    return {"levels": list(rows.values()),
            "long_vs_short_log_restart": judged(ratio, LOG_LENGTH_RATIO_MAX, long_mb=long["log_mb"], short_mb=short["log_mb"])}


# --- coordinator_svc -------------------------------------------------------------------------


def transactional_id(index: int) -> str:
    return f"scale-{index:07d}"


async def init_ids(address: str, indexes: range, concurrency: int) -> dict[str, int]:
    """InitProducerId for each id, ``concurrency`` calls outstanding, retriable
    answers retried; the retries by error name."""
    retries: Counter[str] = Counter()
    pending = iter(indexes)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)

        async def worker() -> None:
            for index in pending:
                request = coordinator_pb2.InitProducerIdRequest(transactional_id=transactional_id(index), producer_id=-1,
                                                                producer_epoch=-1, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS)
                while True:
                    try:
                        await stub.InitProducerId(request, timeout=CALL_TIMEOUT_S)
                        break
                    except grpc.RpcError as exc:
                        error = errors.from_rpc_error(exc)
                        if error.name not in RETRIABLE_COORDINATOR:
                            raise RuntimeError(f"InitProducerId {request.transactional_id}: {error.name} {error.message}") from None
                        retries[error.name] += 1
                        await asyncio.sleep(RETRY_BACKOFF_S)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return dict(retries)


async def describe_errors(stub: coordinator_pb2_grpc.CoordinatorServiceStub, ids: list[str]) -> list[int]:
    reply = await stub.DescribeTransactions(coordinator_pb2.DescribeTransactionsRequest(transactional_ids=ids), timeout=CALL_TIMEOUT_S)
    return [t.error.code for t in reply.transactions]


async def describe_latency(address: str, ids: list[str], seconds: float) -> dict:
    """Sequential DescribeTransactions of one id for ``seconds``: the latency a
    client sees while the coordinator does its periodic work."""
    taken = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        finish = time.monotonic() + seconds
        while time.monotonic() < finish:
            started = time.perf_counter()
            assert await describe_errors(stub, ids[:1]) == [0]
            taken.append(time.perf_counter() - started)
    return {"calls": len(taken), **{f"{key}_ms": value for key, value in latency_summary(taken).items()}}


def partition_layout(ids: int, partition_count: int) -> tuple[list[int], list[str]]:
    """(ids per __transaction_state partition, a known id of each partition)."""
    counts, known = [0] * partition_count, [""] * partition_count
    for index in range(ids):
        tid = transactional_id(index)
        partition = coordinators.transaction_log_partition(tid, partition_count)
        counts[partition] += 1
        known[partition] = known[partition] or tid
    return counts, known


def load_times(log_path: str, offset: int) -> dict[int, float]:
    """Seconds each partition took from "taking over" to "loaded", from the
    coordinator's log lines written past ``offset``."""
    started, loaded = {}, {}
    with open(log_path, "rb") as log_file:
        log_file.seek(offset)
        for line in log_file:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("msg") in (TAKING_OVER, LOADED):
                at = datetime.fromisoformat(entry["ts"]).timestamp()
                (started if entry["msg"] == TAKING_OVER else loaded)[entry["partition"]] = at
    return {p: loaded[p] - started[p] for p in loaded if p in started}


def reload(cluster: LocalCluster, ids: int) -> dict:
    """Restarts the coordinator; until every partition answers, and each partition's load per 100,000 records."""
    coordinator = cluster.state.services[COORDINATOR_SVC]
    partition_svc = cluster.state.services[PARTITION_SVC].address

    async def read_log(p: PartitionSvc) -> list[tuple[int, float]]:
        """(records, seconds) of each partition, read as a load reads it."""
        reply = await p.stub.Metadata(partition_pb2.MetadataRequest(topics=[TRANSACTION_STATE_TOPIC]), timeout=CALL_TIMEOUT_S)
        read = []
        for partition in range(len(reply.topics[0].partitions)):
            started = time.perf_counter()
            records = await p.read_all(TRANSACTION_STATE_TOPIC, partition)
            read.append((records, time.perf_counter() - started))
        return read

    progress("fetching the transaction log as a load does")
    records, fetched = zip(*asyncio.run(on_partition_svc(partition_svc, read_log)), strict=True)
    counts, known = partition_layout(ids, len(records))
    known = [tid for tid in known if tid]
    log_offset = os.path.getsize(coordinator.log)

    async def answering(address: str) -> float:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)

            async def all_known() -> bool:
                try:
                    return not any(await describe_errors(stub, known))
                except grpc.RpcError:
                    return False
            return await until(all_known, 600, "DescribeTransactions of every partition's known id")

    progress(f"coordinator restart with {ids} transactional ids")
    restart = asyncio.run(restart_until(cluster, COORDINATOR_SVC, answering, 600))
    restart["rss_kb_once_answering"] = rss_kb(coordinator.pid)
    loads = load_times(coordinator.log, log_offset)
    partitions = [{"partition": p, "records": records[p], "transactional_ids": counts[p], "fetch_only_s": round(fetched[p], 3),
                   "load_s": round(loads[p], 3) if p in loads else None} for p in range(len(records))]
    timed = [row for row in partitions if row["load_s"] is not None]
    total_s, total_records = sum(r["load_s"] for r in timed), sum(r["records"] for r in timed)
    return {"restart": restart, "partitions": partitions,
            "fetch_only_s_per_100000_records": round(sum(fetched) * 100_000 / max(sum(records), 1), 3),
            "load_s_per_100000_records": judged(total_s * 100_000 / max(total_records, 1), LOAD_S_PER_100K_MAX,
                                                records=total_records, load_s=round(total_s, 3),
                                                how="sum of the partitions' load times (coordinator log) over their records")}


def measure_coordinator(workdir: Path, levels: list[int], concurrency: int, idle_s: float, paper_ids: int) -> dict:
    """Memory and idle CPU of the coordinator per transactional id, and the load time of its log."""
    cluster = start_cluster(workdir / "coordinator", producer_id_svcs=1, partition_svcs=1, coordinator_svcs=1)
    rows, done = [], 0
    try:
        cluster.wait_until_coordinators_settle()
        address = cluster.state.services[COORDINATOR_SVC].address
        progress(f"coordinator idle, no transactional ids ({idle_s:.0f} s)")
        base = {"transactional_ids": 0, **idle_window(cluster, COORDINATOR_SVC, idle_s)}
        for level in levels:
            progress(f"transactional ids {done} -> {level}")
            started = time.monotonic()
            retries = asyncio.run(init_ids(address, range(done, level), concurrency))
            taken = time.monotonic() - started
            progress(f"coordinator idle, {level} transactional ids ({idle_s:.0f} s)")
            row = {"transactional_ids": level, "init_s": round(taken, 1), "init_per_s": round((level - done) / taken, 1),
                   "init_retries": retries, **idle_window(cluster, COORDINATOR_SVC, idle_s)}
            row.update(rss_bytes_per_id=per(row, base, "rss_kb", level, 1024, 1),
                       idle_cpu_ms_per_s_per_100000_ids=per(row, base, "cpu_utilisation", level, 100_000_000, 1),
                       describe_latency=asyncio.run(describe_latency(address, [transactional_id(0)], DESCRIBE_SECONDS)))
            load = reload(cluster, level)
            row["after_restart"] = {**load["restart"], "rss_bytes_per_id": round((load["restart"]["rss_kb_once_answering"] - base["rss_kb"])
                                                                                  * 1024 / level, 1),
                                    "load_s_per_100000_records": load["load_s_per_100000_records"]["value"],
                                    "fetch_only_s_per_100000_records": load["fetch_only_s_per_100000_records"]}
            rows.append(row)
            done = level
    finally:
        cluster.down(grace_s=5)
    largest = rows[-1]
    figures = {"levels": [base, *rows],
               "rss_bytes_per_id": judged(largest["rss_bytes_per_id"], ID_BYTES_MAX, at_ids=largest["transactional_ids"]),
               "idle_cpu_ms_per_s_per_100000_ids": largest["idle_cpu_ms_per_s_per_100000_ids"],
               "transaction_log_load": load}
    if paper_ids > largest["transactional_ids"]:
        scale = paper_ids / largest["transactional_ids"]
        figures[f"at_{paper_ids}_ids"] = {
            "extrapolated": True, "from_ids": largest["transactional_ids"],
            "init_s": round((paper_ids - largest["transactional_ids"]) / largest["init_per_s"] + sum(r["init_s"] for r in rows)),
            "rss_mb": round((base["rss_kb"] * 1024 + largest["rss_bytes_per_id"] * paper_ids) / MB, 1),
            "idle_cpu_utilisation": round(base["cpu_utilisation"] + (largest["cpu_utilisation"] - base["cpu_utilisation"]) * scale, 3),
            "reload_s": round(load["load_s_per_100000_records"]["value"] * paper_ids / 100_000, 1),
        }
    return figures
