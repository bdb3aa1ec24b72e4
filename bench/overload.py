"""Benchmark: a partition_svc under ten times the load it can serve (issue 36).

The issue's promise: "Under ten times the load a cluster can serve, health
answers within a second, memory stays under the configured bound, every
acknowledged write is kept, and throughput stays within 20% of its best
instead of collapsing." This measures exactly that, on a local cluster of real
processes (ZooKeeper, one producer_id_svc, one partition_svc; see
services/tooling/cluster.py) whose partition_svc runs with small admission
bounds (``--max-concurrent-rpcs 64 --max-queued-request-bytes 8388608`` by
default: clients get 48 calls and 6 MiB, services/runtime/admission.py):

* load: ``--processes`` load generator processes (this module with
  ``--worker``), each with asyncio clients over ``--channels`` connections; a
  client keeps one hand-built Produce outstanding (acks=-1, fsync on, one batch
  of ``--batch-records`` records of ``--record-bytes`` in the encoded batch
  format, to ``--partitions`` partitions in turn) and retries a refused call
  (RESOURCE_EXHAUSTED, LIMIT_EXCEEDED) with the same bytes after the RetryInfo
  delay the refusal carries, until the step ends. Every record's key is
  (generator, index): unique in the run. The default batch, 256 KiB (the SDK's
  batches go up to 1 MiB), makes the byte bound bind first (24 calls of it fit
  in 6 MiB); with 16 KiB batches (``--batch-records 16``) only the call bound
  ever binds and an unbounded flood holds a few MB;
* capacity: 1, 2, 4, ... clients for ``--step-s`` each, up to ``--clients-max``
  or the most clients the bounds admit together (so every step is served, not
  refused); then a steady step of ``--duration-s`` at the capacity's clients,
  the most clients of a step within 90% of the best (the service is at
  capacity from a few clients on and the steps differ by noise). The best MB/s
  of the ramp and the steady step is the baseline, measured in the same run;
* flood: ``--flood-factor`` (10) times those clients for ``--duration-s``.
  During the steady step and the flood, a prober calls grpc.health.v1 Check on
  the partition_svc every ``--probe-interval-ms`` (one channel, 5 s deadline),
  a sampler reads its VmRSS from /proc as often and its txlog_rpc_in_flight,
  _in_flight_bytes, _refused_total and RocksDB memtable bytes from /metrics
  every second; its peak RSS in each step is also read from VmHWM, reset
  before the step (/proc/PID/clear_refs), so no spike between samples is missed;
* kept: after the flood every partition is read back from offset 0
  (read_uncommitted, to the high watermark): every acknowledged batch must be
  there exactly once, at the offset its acknowledgement named, and no batch
  whose last answer was a refusal may be there;
* the same steady step and flood (same clients, no ramp) on a second cluster
  whose bounds are out of reach (10^6 calls, 10^12 bytes): what admission
  control changed (``admission_changed``; skip it with ``--skip-unbounded``).

Targets, each a boolean in ``targets``: flood MB/s >= 0.8 x the baseline;
every health check answered SERVING within 1 s; memory: the flood's peak RSS
less RocksDB's memtables (both read at each per-second sample: a memtable
fills to 64 MB and is flushed whatever the load, so where it stands at a
step's peak is chance, and it moved the raw peaks' difference by tens of MB
between runs; the raw ``flood_rss_peak_over_steady_mb`` is reported beside it)
over the steady step's (same process, same duration) <= the byte bound plus
``--memory-allowance-mb``, 64 MiB by default: partition_svc lets glibc keep up
to that much freed heap resident (2 x --malloc-mmap-threshold-bytes,
services/runtime/malloc.py), so two peaks of the same load can differ by that
much; and, beside it, the service's own count of admitted request bytes within
the bound plus one request; none lost, none duplicated, nothing refused stored.

The load generators share the machine's CPUs with the service: the report has
the CPU each process spent (from /proc), the partition_svc's event loop (its
main thread) apart, and the machine's busy CPUs (``cpu``), so a ceiling that
is the machine's, not the service's, shows. Throughput on this kind of machine
moves by tens of percent from one second to the next (``mb_per_s_by_second``).

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.overload [--duration-s S] [--clients-max N] [--batch-records N] [--skip-unbounded]``
(about 2.5 minutes with the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.measure import CLOCK_TICKS, MB, Phase, latency_summary, progress
from bench.produce_fetch import REPOSITORY, create_topic, memory_status, open_channel
from services.runtime.admission import RESERVED_INTERNAL_SHARE_DEFAULT, Limits
from services.tooling.cluster import LocalCluster
from txlog.protocol import batch_format, errors
from txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc

KEY = struct.Struct(">II")  # a record's key: (generator, index), unique in the run
SERVICE = "partition_svc-0"
TOPIC = "overload"
PRODUCE_METHOD = "/txlog.v1.PartitionService/Produce"
CALL_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 5.0
HEALTH_TARGET_S = 1.0
THROUGHPUT_TARGET = 0.8
CAPACITY_SHARE = 0.9
# Freed heap glibc keeps resident: partition_svc sets its trim threshold to 2 x
# --malloc-mmap-threshold-bytes (32 MiB), services/runtime/malloc.py.
MEMORY_ALLOWANCE_MB = round(2 * 32 * 1024 * 1024 / MB, 1)
DRAIN_TIMEOUT_S = 60.0  # how long a step waits for the calls still outstanding at its end
SCRAPE_INTERVAL_S = 1.0
METRICS = ("txlog_rpc_in_flight", "txlog_rpc_in_flight_bytes", "txlog_rpc_refused_total")
UNBOUNDED = {"max_concurrent_rpcs": 1_000_000, "max_queued_request_bytes": 10**12}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=20.0, help="seconds of the steady step and of the flood "
                        "(default: %(default)s)")
    parser.add_argument("--clients-max", type=int, default=32, help="the most clients of the ramp, which doubles them from 1 "
                        "and stays within what the bounds admit (default: %(default)s)")
    parser.add_argument("--step-s", type=float, default=3.0, help="seconds of each ramp step (default: %(default)s)")
    parser.add_argument("--flood-factor", type=int, default=10, help="the flood's clients, times the capacity's (default: %(default)s)")
    parser.add_argument("--processes", type=int, default=2, help="load generator processes (default: %(default)s)")
    parser.add_argument("--channels", type=int, default=4, help="gRPC channels (connections) per generator (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the topic (default: %(default)s)")
    parser.add_argument("--batch-records", type=int, default=256, help="records per produced batch (default: %(default)s)")
    parser.add_argument("--record-bytes", type=int, default=1024, help="payload bytes a record, its 8-byte key included "
                        "(default: %(default)s)")
    parser.add_argument("--max-concurrent-rpcs", type=int, default=64, help="the partition_svc's bound (default: %(default)s)")
    parser.add_argument("--max-queued-request-bytes", type=int, default=8 * 1024 * 1024,
                        help="the partition_svc's bound (default: %(default)s)")
    parser.add_argument("--memory-allowance-mb", type=float, default=MEMORY_ALLOWANCE_MB, help="the flood's peak RSS over the "
                        "steady step's allowed beyond the byte bound (default: %(default)s; see above)")
    parser.add_argument("--probe-interval-ms", type=int, default=200, help="health and RSS sampling interval (default: %(default)s)")
    parser.add_argument("--skip-unbounded", action="store_true", help="skip the run without effective bounds")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # a load generator, driven on stdin
    args = parser.parse_args(argv)
    if min(args.clients_max, args.flood_factor, args.processes, args.channels, args.partitions, args.batch_records) < 1:
        parser.error("--clients-max, --flood-factor, --processes, --channels, --partitions and --batch-records must be >= 1")
    if args.record_bytes <= KEY.size or args.duration_s <= 0 or args.step_s <= 0 or args.probe_interval_ms < 1:
        parser.error(f"--record-bytes must be > {KEY.size}, --duration-s, --step-s and --probe-interval-ms > 0")
    return args


# --- the load generators (separate processes) ---------------------------------------------


class Generator:
    """One load generator process: clients on a few channels to one partition_svc,
    driven by a command a line on stdin, answering each with its figures on stdout."""

    def __init__(self, worker: int, args: argparse.Namespace, address: str):
        self.worker, self.args = worker, args
        self.value = os.urandom(args.record_bytes - KEY.size)
        self.next_index = 0
        self.channels = [open_channel(address) for _ in range(args.channels)]
        self.produce = [channel.unary_unary(PRODUCE_METHOD, request_serializer=None,
                                            response_deserializer=partition_pb2.ProduceResponse.FromString)
                        for channel in self.channels]

    def request(self, first: int, partition: int) -> bytes:
        """A serialized ProduceRequest of one batch: records first, first + 1, ... of this generator."""
        count = self.args.batch_records
        records = common_pb2.RecordBatch(records=[common_pb2.Record(key=KEY.pack(self.worker, first + i), value=self.value)
                                                  for i in range(count)]).SerializeToString()
        return partition_pb2.ProduceRequest(acks=-1, batches=[partition_pb2.PartitionBatch(
            topic=TOPIC, partition=partition, encoded_batch=batch_format.encode(records, count, untimed=True))]).SerializeToString()

    async def client(self, slot: int, start: float, end: float, out: dict) -> None:
        """Produces batch after batch until ``end``; a refused call is retried
        after its RetryInfo delay until ``end``, then given up."""
        produce = self.produce[slot % len(self.produce)]
        while time.monotonic() < end:
            first = self.next_index
            self.next_index += self.args.batch_records
            partition = first // self.args.batch_records % self.args.partitions
            body = self.request(first, partition)
            out["request_bytes"] = len(body)
            began = time.monotonic()
            while True:
                attempt = time.monotonic()
                try:
                    reply = await produce(body, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    failure = errors.from_rpc_error(exc)
                    if failure.name != "LIMIT_EXCEEDED":
                        out["unknown"].append([first, partition, failure.name])
                        break
                    out["refusals"] += 1
                    out["refusal_s"].append(round(time.monotonic() - attempt, 5))
                    if time.monotonic() >= end:
                        out["given_up"].append([first, partition])
                        break
                    await asyncio.sleep((failure.retry_delay_ms or 100) / 1000)
                    continue
                result = reply.results[0]
                if result.error.code:
                    out["unknown"].append([first, partition, errors.ErrorCode.Name(result.error.code)])
                    break
                done = time.monotonic()
                out["acked"].append([first, partition, result.base_offset, round(done - start, 4)])
                out["produce_s"].append(round(done - began, 5))
                out["admitted_call_s"].append(round(done - attempt, 5))
                break

    async def step(self, clients: int, start: float, seconds: float) -> dict:
        out = {"worker": self.worker, "request_bytes": 0, "acked": [], "given_up": [], "unknown": [], "refusals": 0, "refusal_s": [],
               "produce_s": [], "admitted_call_s": []}
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        tasks = [asyncio.ensure_future(self.client(slot, start, start + seconds, out)) for slot in range(clients)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + DRAIN_TIMEOUT_S)
        return out


async def worker_main(worker: int, args: argparse.Namespace) -> int:
    """Reads {"address"} first, then {"clients", "start", "seconds"} a line; answers
    each step with one JSON line. Ends when stdin closes."""
    loop = asyncio.get_running_loop()
    readline = sys.stdin.readline
    generator = Generator(worker, args, json.loads(await loop.run_in_executor(None, readline))["address"])
    print(json.dumps({"ready": os.getpid()}), flush=True)
    while line := await loop.run_in_executor(None, readline):
        command = json.loads(line)
        print(json.dumps(await generator.step(command["clients"], command["start"], command["seconds"])), flush=True)
    for channel in generator.channels:
        await channel.close()
    return 0


class Generators:
    """The load generator processes, started as ``python -m bench.overload --worker K``."""

    def __init__(self, args: argparse.Namespace, first_worker: int):
        self.args, self.first_worker = args, first_worker
        self.processes: list[asyncio.subprocess.Process] = []

    async def start(self, address: str) -> dict[str, int]:
        passed = [f"--{name.replace('_', '-')}={getattr(self.args, name)}" for name in
                  ("channels", "partitions", "batch_records", "record_bytes")]
        for k in range(self.args.processes):
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.overload", "--worker", str(self.first_worker + k), *passed,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPOSITORY, limit=1 << 30)
            self.processes.append(process)
            process.stdin.write(json.dumps({"address": address}).encode() + b"\n")
        for k, process in enumerate(self.processes):
            await self._answer(k, process)
        return {f"generator_{k}": p.pid for k, p in enumerate(self.processes)}

    async def step(self, clients: int, start: float, seconds: float) -> list[dict]:
        """``clients`` spread over the processes, from ``start`` (time.monotonic(), the same clock in every process) for ``seconds``."""
        for k, process in enumerate(self.processes):
            share = clients // len(self.processes) + (k < clients % len(self.processes))
            process.stdin.write(json.dumps({"clients": share, "start": start, "seconds": seconds}).encode() + b"\n")
        return [await self._answer(k, process) for k, process in enumerate(self.processes)]

    @staticmethod
    async def _answer(k: int, process: asyncio.subprocess.Process) -> dict:
        line = await process.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator {k} (pid {process.pid}) exited: {await process.wait()}")
        return json.loads(line)

    async def stop(self) -> None:
        for process in self.processes:
            process.stdin.close()
        for process in self.processes:
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


# --- watching the service ------------------------------------------------------------------


def scrape(address: str) -> dict[str, float]:
    """The admission figures (METRICS) of one /metrics endpoint, each summed over
    its series, and RocksDB's memtable bytes (``memtable_bytes``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = dict.fromkeys((*METRICS, "memtable_bytes"), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name] += sample.value
            elif sample.name == "txlog_rocksdb" and sample.labels.get("property") == "memtable_bytes":
                found["memtable_bytes"] += sample.value
    return found


def reset_peak_rss(pid: int) -> bool:
    """Resets the process's VmHWM to its VmRSS (Linux: 5 to /proc/PID/clear_refs); False where not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class Watcher:
    """While a step runs: a health probe and an RSS sample every interval, /metrics every second."""

    def __init__(self, service, interval_s: float):
        self.service, self.interval_s = service, interval_s
        self.health_s: list[float] = []
        self.unhealthy: Counter = Counter()  # answers other than SERVING, and failed probes, by what they were
        self.rss: list[int] = []
        self.scrapes: list[dict[str, float]] = []
        self.rss_less_memtables: list[float] = []  # at each scrape: RSS less RocksDB's memtables, read together
        self.done = asyncio.Event()
        self.before = memory_status(service.pid)
        self.hwm_reset = reset_peak_rss(service.pid)
        self.tasks = [asyncio.ensure_future(self.probe()), asyncio.ensure_future(self.sample_metrics())]

    async def probe(self) -> None:
        async with grpc.aio.insecure_channel(self.service.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S)  # connected before the first timed probe
            while not self.done.is_set():
                asked = time.monotonic()
                try:
                    answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S)
                    if answer.status != health_pb2.HealthCheckResponse.SERVING:
                        self.unhealthy[health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)] += 1
                except grpc.aio.AioRpcError as exc:
                    self.unhealthy[exc.code().name] += 1
                self.health_s.append(time.monotonic() - asked)
                self.rss.append(memory_status(self.service.pid)["VmRSS"] or 0)
                await self.pause(asked, self.interval_s)

    async def sample_metrics(self) -> None:
        while not self.done.is_set():
            asked = time.monotonic()
            self.scrapes.append(await asyncio.to_thread(scrape, self.service.metrics_address))
            self.rss_less_memtables.append((memory_status(self.service.pid)["VmRSS"] or 0) - self.scrapes[-1]["memtable_bytes"])
            await self.pause(asked, SCRAPE_INTERVAL_S)

    async def pause(self, since: float, interval_s: float) -> None:
        try:
            await asyncio.wait_for(self.done.wait(), max(0.0, since + interval_s - time.monotonic()))
        except TimeoutError:
            pass

    async def stop(self) -> dict:
        """Health, memory and admission figures of the step."""
        self.done.set()
        await asyncio.gather(*self.tasks)
        self.scrapes.append(await asyncio.to_thread(scrape, self.service.metrics_address))  # the step's calls have all ended
        after = memory_status(self.service.pid)
        peak = max(max(self.rss, default=0), after["VmHWM"] or 0 if self.hwm_reset else 0)
        return {
            "health": {
                "checks": len(self.health_s),
                "ms": latency_summary(self.health_s),
                "over_1s": sum(s > HEALTH_TARGET_S for s in self.health_s),
                "not_serving": dict(self.unhealthy),
            },
            "memory": {
                "rss_before_mb": round((self.before["VmRSS"] or 0) / MB, 1),
                "rss_peak_mb": round(peak / MB, 1),
                "rss_after_mb": round((after["VmRSS"] or 0) / MB, 1),
                "peak_from": "VmHWM (reset before the step) and samples" if self.hwm_reset else "samples",
                "growth_mb": round((peak - (self.before["VmRSS"] or 0)) / MB, 1),
                "rocksdb_memtables_max_mb": round(max(s["memtable_bytes"] for s in self.scrapes) / MB, 1),
                "rss_less_memtables_peak_mb": round(max(self.rss_less_memtables, default=0) / MB, 1),
            },
            "in_flight_max": {name: max(s[name] for s in self.scrapes) for name in METRICS[:2]},
            "server_refused": self.scrapes[-1]["txlog_rpc_refused_total"] - self.scrapes[0]["txlog_rpc_refused_total"],
        }


# --- one cluster: ramp, steady, flood, read back ------------------------------------------------------


class Run:
    """What the generators reported, step by step, and what is needed to check the log."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.record_bytes = args.record_bytes
        self.acked: dict[tuple[int, int], tuple[int, int]] = {}  # (worker, first index) -> (partition, base offset)
        self.given_up: set[tuple[int, int]] = set()
        self.unknown: Counter = Counter()  # outcome unknown (neither acknowledged nor refused), by error name
        self.unknown_batches: set[tuple[int, int]] = set()

    def absorb(self, reports: list[dict]) -> None:
        for report in reports:
            worker = report["worker"]
            for first, partition, base_offset, _ in report["acked"]:
                self.acked[(worker, first)] = (partition, base_offset)
            self.given_up.update((worker, first) for first, _ in report["given_up"])
            for first, _, name in report["unknown"]:
                self.unknown[name] += 1
                self.unknown_batches.add((worker, first))

    def step_figures(self, reports: list[dict], clients: int, phase: Phase) -> dict:
        """Throughput of the acknowledgements that came within the step (its
        calls still outstanding at its end are counted for the check, not here)."""
        self.absorb(reports)
        in_window = sum(1 for r in reports for *_, at in r["acked"] if at <= phase.seconds) * self.args.batch_records
        refusals = sum(r["refusals"] for r in reports)
        attempts = refusals + sum(len(r["acked"]) + len(r["unknown"]) for r in reports)
        rates = phase.rates(in_window, self.record_bytes)
        produce_s = [s for r in reports for s in r["produce_s"]]
        refusal_s = [s for r in reports for s in r["refusal_s"]]
        return {
            "clients": clients,
            **rates,
            "generators_cpu_utilisation": round(sum(v for k, v in rates["cpu_utilisation"].items() if k.startswith("generator")), 3),
            "machine_cpu": phase.others_cpu_utilisation(),
            "calls": attempts,
            "refused": refusals,
            "refused_share": round(refusals / attempts, 4) if attempts else 0.0,
            # the requests of refused calls, which the service received in full before refusing them
            "request_bytes": max(r["request_bytes"] for r in reports),
            "refused_request_mb_per_s": round(refusals * max(r["request_bytes"] for r in reports) / MB / phase.seconds, 2),
            "produce_ms": latency_summary(produce_s) if produce_s else None,  # first attempt to acknowledgement
            "admitted_call_ms": latency_summary([s for r in reports for s in r["admitted_call_s"]]) if produce_s else None,
            "refusal_ms": latency_summary(refusal_s) if refusal_s else None,
            "mb_per_s_by_second": per_second(reports, phase.seconds, self.args.batch_records * self.record_bytes),
            "given_up_refused": sum(len(r["given_up"]) for r in reports),
            "unknown_outcome": dict(Counter(name for r in reports for *_, name in r["unknown"])),
        }


def per_second(reports: list[dict], seconds: float, batch_bytes: int) -> list[float]:
    """Acknowledged MB in each whole second of the step."""
    buckets = [0] * max(1, int(seconds))
    for report in reports:
        for *_, at in report["acked"]:
            if int(at) < len(buckets):
                buckets[int(at)] += batch_bytes
    return [round(b / MB, 2) for b in buckets]


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process's main thread: a Python asyncio
    service's event loop, which one core bounds (RocksDB and gRPC have threads of their own)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def timed_step(generators: Generators, run: Run, clients: int, seconds: float, pids: dict[str, int]) -> dict:
    start = time.monotonic() + 0.2  # every generator has the command by then
    pending = asyncio.ensure_future(generators.step(clients, start, seconds))
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    loop_before = main_thread_cpu_seconds(pids["partition_svc"])
    with Phase(pids) as phase:
        await asyncio.sleep(seconds)
    loop_busy = (main_thread_cpu_seconds(pids["partition_svc"]) - loop_before) / phase.seconds
    return {**run.step_figures(await pending, clients, phase), "partition_svc_event_loop_cpu_utilisation": round(loop_busy, 3)}


async def read_back(address: str, run: Run) -> dict:
    """Every batch of every partition from offset 0 to the high watermark: each
    acknowledged one there once at its offset, no refused one there."""
    stored: Counter = Counter()
    misplaced = foreign = 0
    started = time.perf_counter()
    async with open_channel(address) as channel:
        stub = partition_pb2_grpc.PartitionServiceStub(channel)
        for partition in range(run.args.partitions):
            offset = 0
            while True:
                reply = await stub.Fetch(partition_pb2.FetchRequest(
                    isolation_level=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED, max_bytes=32 * 1024 * 1024,
                    batch_format=partition_pb2.BATCH_FORMAT_ENCODED,
                    partitions=[partition_pb2.FetchPartition(topic=TOPIC, partition=partition, fetch_offset=offset)]),
                    timeout=CALL_TIMEOUT_S)
                result = reply.results[0]
                if result.error.code:
                    raise RuntimeError(f"Fetch {TOPIC}-{partition} at {offset}: {result.error}")
                for data in result.encoded_batches:
                    header = batch_format.verified_header(data)
                    keys = [KEY.unpack(r.key) for r in batch_format.open_records(data, header, 1 << 30).records]
                    worker, first = keys[0]
                    if keys != [(worker, first + i) for i in range(len(keys))]:
                        foreign += 1
                    stored[(worker, first)] += 1
                    acked = run.acked.get((worker, first))
                    misplaced += acked is not None and acked != (partition, header.base_offset)
                if not result.encoded_batches and offset < result.high_watermark:
                    raise RuntimeError(f"Fetch {TOPIC}-{partition} at {offset}: nothing below the high watermark {result.high_watermark}")
                offset = result.next_fetch_offset
                if offset >= result.high_watermark:
                    break
    return {
        "batches_stored": sum(stored.values()),
        "batches_acknowledged": len(run.acked),
        "lost": sum(1 for batch in run.acked if batch not in stored),
        "duplicated": sum(count - 1 for count in stored.values() if count > 1),
        "acknowledged_at_another_offset": misplaced,
        "refused_then_stored": sum(1 for batch in run.given_up if batch in stored),
        "refused_given_up": len(run.given_up),
        "unknown_outcome": dict(run.unknown),
        "unknown_outcome_stored": sum(1 for batch in run.unknown_batches if batch in stored),
        "stored_never_sent_or_damaged": foreign + sum(1 for batch in stored if batch not in run.acked and batch not in run.given_up
                                                       and batch not in run.unknown_batches),
        "read_back_s": round(time.perf_counter() - started, 2),
    }


async def watched_step(service, generators: Generators, run: Run, clients: int, seconds: float, pids: dict[str, int]) -> dict:
    """A step with the service's health, memory and admission watched."""
    watcher = Watcher(service, run.args.probe_interval_ms / 1000)
    step = await timed_step(generators, run, clients, seconds, pids)
    return {**step, **await watcher.stop()}


def clients_within(bounds: dict, args: argparse.Namespace) -> int:
    """The most clients the bounds admit together (clients get 1 - reserved_internal_share
    of each, 0.25 by default): the ramp stays within them, so what it measures is served, not refused."""
    limits = client_limits(bounds)
    return max(1, min(limits.client_rpcs, -(-limits.client_bytes // (args.batch_records * args.record_bytes))))


def client_limits(bounds: dict) -> Limits:
    return Limits(bounds["max_concurrent_rpcs"], bounds["max_queued_request_bytes"], RESERVED_INTERNAL_SHARE_DEFAULT)


def capacity_clients(ramp: list[dict]) -> int:
    """The most clients a ramp step ran that still served CAPACITY_SHARE of the
    best step's MB/s: where the service is at capacity (it was from a few
    clients on, here, and the steps' figures differ by noise)."""
    best = max(step["mb_per_s"] for step in ramp)
    return max(step["clients"] for step in ramp if step["mb_per_s"] >= CAPACITY_SHARE * best)


def ramp_row(step: dict) -> dict:
    return {"clients": step["clients"], "mb_per_s": step["mb_per_s"], "records_per_s": step["records_per_s"],
            "refused": step["refused"], "produce_ms_p99": step["produce_ms"]["p99"] if step["produce_ms"] else None,
            "partition_svc_cpu_utilisation": step["cpu_utilisation"]["partition_svc"],
            "partition_svc_event_loop_cpu_utilisation": step["partition_svc_event_loop_cpu_utilisation"]}


async def on_cluster(cluster: LocalCluster, args: argparse.Namespace, bounds: dict, clients: int | None, first_worker: int) -> dict:
    """On a started cluster: the ramp (unless ``clients`` is given), a steady
    step at the capacity's clients, the flood at flood_factor times those, the read-back."""
    service = cluster.state.services[SERVICE]
    async with open_channel(service.address) as channel:
        await create_topic(channel, TOPIC, args.partitions)
    generators = Generators(args, first_worker)
    others = {name: info.pid for name, info in cluster.state.services.items() if name != SERVICE}
    pids = {"partition_svc": service.pid, **others, "bench": os.getpid(), **await generators.start(service.address)}
    run = Run(args)
    ramp = []
    try:
        most = min(args.clients_max, clients_within(bounds, args))
        steps = [] if clients else [2**k for k in range(most.bit_length()) if 2**k <= most]
        for step_clients in steps:
            ramp.append(await timed_step(generators, run, step_clients, args.step_s, pids))
            progress(f"ramp: {step_clients} clients, {ramp[-1]['mb_per_s']} MB/s, refused {ramp[-1]['refused']}")
        clients = clients or capacity_clients(ramp)
        steady = await watched_step(service, generators, run, clients, args.duration_s, pids)
        progress(f"steady: {clients} clients, {steady['mb_per_s']} MB/s, refused {steady['refused']}")
        flood = await watched_step(service, generators, run, clients * args.flood_factor, args.duration_s, pids)
        progress(f"flood: {flood['clients']} clients, {flood['mb_per_s']} MB/s, refused {flood['refused']}; reading the log back")
        kept = await read_back(service.address, run)
    finally:
        await generators.stop()
    best = max([steady["mb_per_s"], *(step["mb_per_s"] for step in ramp)])
    return {
        "bounds": bounds,
        "ramp": [ramp_row(step) for step in ramp] or None,
        "steady": steady,
        "flood": flood,
        "best_mb_per_s": best,  # the best of the ramp's steps and the steady step
        "flood_vs_best": round(flood["mb_per_s"] / best, 3),
        "flood_vs_steady": round(flood["mb_per_s"] / steady["mb_per_s"], 3),
        "flood_clients_vs_steady": args.flood_factor,
        # calls arriving in the flood (retries of refused ones too) per call served in the steady step
        "flood_calls_per_steady_call": round(flood["calls"] / flood["seconds"] / (steady["records_per_s"] / args.batch_records), 2),
        # what the flood held over serving at capacity: the peak RSS of each step, on the same process
        "flood_rss_peak_over_steady_mb": round(flood["memory"]["rss_peak_mb"] - steady["memory"]["rss_peak_mb"], 1),
        # the same less RocksDB's memtables at each sample: where a memtable stands at each step's peak is chance
        "flood_rss_less_memtables_peak_over_steady_mb": round(flood["memory"]["rss_less_memtables_peak_mb"]
                                                              - steady["memory"]["rss_less_memtables_peak_mb"], 1),
        "kept": kept,
    }


def start_cluster(directory: Path, bounds: dict) -> LocalCluster:
    cluster = LocalCluster(directory)
    cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=0, service_args={"partition_svc": [
        "--max-concurrent-rpcs", str(bounds["max_concurrent_rpcs"]),
        "--max-queued-request-bytes", str(bounds["max_queued_request_bytes"])]})
    return cluster


def measure_cluster(workdir: str, name: str, args: argparse.Namespace, bounds: dict, clients: int | None, first_worker: int) -> dict:
    progress(f"{name}: starting a cluster, partition_svc bounds {bounds}")
    cluster = start_cluster(Path(workdir) / name, bounds)
    try:
        return asyncio.run(on_cluster(cluster, args, bounds, clients, first_worker))
    finally:
        cluster.down(grace_s=5)


def targets(bounded: dict, args: argparse.Namespace) -> dict:
    flood, kept = bounded["flood"], bounded["kept"]
    allowed_mb = args.max_queued_request_bytes / MB + args.memory_allowance_mb
    return {
        "throughput_flood_vs_best_at_least_0_8": bounded["flood_vs_best"] >= THROUGHPUT_TARGET,
        "health_every_check_serving_within_1s": flood["health"]["over_1s"] == 0 and not flood["health"]["not_serving"],
        "memory_flood_rss_less_memtables_peak_over_steady_within_byte_bound_plus_allowance":
            bounded["flood_rss_less_memtables_peak_over_steady_mb"] <= allowed_mb,
        "memory_allowed_mb": round(allowed_mb, 1),
        # the service's own count of what the byte bound bounds (sampled every second): clients' share of it plus one request
        "admitted_request_bytes_within_byte_bound": (flood["in_flight_max"]["txlog_rpc_in_flight_bytes"]
                                                     <= client_limits(bounded["bounds"]).client_bytes + flood["request_bytes"]),
        "every_acknowledged_write_kept": kept["lost"] == 0 and kept["acknowledged_at_another_offset"] == 0,
        "nothing_duplicated": kept["duplicated"] == 0,
        "nothing_refused_stored": kept["refused_then_stored"] == 0,
    }


def admission_changed(bounded: dict, unbounded: dict) -> dict:
    """The floods' figures side by side: what the bounds changed."""
    def row(run: dict) -> dict:
        flood = run["flood"]
        return {"mb_per_s": flood["mb_per_s"], "flood_vs_steady": run["flood_vs_steady"], "refused_share": flood["refused_share"],
                "produce_ms": flood["produce_ms"], "health_ms": flood["health"]["ms"], "health_over_1s": flood["health"]["over_1s"],
                "rss_peak_mb": flood["memory"]["rss_peak_mb"], "memory_growth_mb": flood["memory"]["growth_mb"],
                "rss_peak_over_steady_mb": run["flood_rss_peak_over_steady_mb"],
                "in_flight_max": flood["in_flight_max"], "lost": run["kept"]["lost"], "duplicated": run["kept"]["duplicated"]}
    return {"bounded": row(bounded), "unbounded": row(unbounded)}


def cpu_summary(step: dict) -> dict:
    """Where the CPUs went in a step: the service, its event loop, the generators, everything else."""
    machine = step["machine_cpu"]["machine"]
    return {
        "cpus": os.cpu_count(),
        "machine_busy": machine,
        "partition_svc": step["cpu_utilisation"]["partition_svc"],
        "partition_svc_event_loop": step["partition_svc_event_loop_cpu_utilisation"],
        "generators": step["generators_cpu_utilisation"],
        "other_processes": step["machine_cpu"]["other_processes"],
        # the machine's CPUs nearly all busy: the ceiling is the machine's, shared by the generators and the service
        "machine_bound": machine is not None and machine >= 0.9 * (os.cpu_count() or 1),
        # one core for the event loop: the service's own ceiling
        "event_loop_bound": step["partition_svc_event_loop_cpu_utilisation"] >= 0.9,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return asyncio.run(worker_main(args.worker, args))
    bounds = {"max_concurrent_rpcs": args.max_concurrent_rpcs, "max_queued_request_bytes": args.max_queued_request_bytes}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="txlog-bench-overload-") as workdir:
        bounded = measure_cluster(workdir, "bounded", args, bounds, None, 0)
        unbounded = None
        if not args.skip_unbounded:  # the same clients, no ramp
            unbounded = measure_cluster(workdir, "unbounded", args, UNBOUNDED, bounded["steady"]["clients"], args.processes)
    print(json.dumps({
        "benchmark": "overload: a partition_svc under flood_factor x the clients that reach its capacity, with admission bounds and without",
        "parameters": {"duration_s": args.duration_s, "step_s": args.step_s, "clients_max": args.clients_max,
                       "flood_factor": args.flood_factor, "processes": args.processes, "channels_per_process": args.channels,
                       "partitions": args.partitions, "records_per_batch": args.batch_records, "record_bytes": args.record_bytes,
                       "batch_bytes": args.batch_records * args.record_bytes, "acks": -1, "fsync": True,
                       "probe_interval_ms": args.probe_interval_ms, "memory_allowance_mb": args.memory_allowance_mb,
                       "mb": "10^6 bytes of payload"},
        "targets": targets(bounded, args),
        "cpu": cpu_summary(bounded["flood"]),
        "bounded": bounded,
        "unbounded": unbounded,
        "admission_changed": admission_changed(bounded, unbounded) if unbounded else None,
        "seconds": round(time.monotonic() - started, 1),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
