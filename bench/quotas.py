"""Benchmark: client quotas hold a client to its rate and keep a noisy tenant off the others (issue 36).

The issue's "done": "a quota holds a client to its rate within 20%" and "one
noisy tenant cannot take more than its quota from the others". On a local
cluster of real processes (ZooKeeper, one producer_id_svc, one partition_svc;
services/tooling/cluster.py) and a topic of two partitions, with 1 KB records
(8-byte key, 1024-byte value) in batches of ``--batch-records`` (16: ~16.5 KB):

* baseline: the unthrottled produce rate of one client, ``calm``: hand-built
  ProduceRequests (acks=-1, fsync on, one encoded batch without a producer id
  each, the partitions in turn), ``--in-flight`` outstanding on one channel,
  for ``--baseline-s`` - before the quota phase and again after it (the mean
  is the baseline, so drift on a shared machine favours neither side; see
  below for a neighbour that comes and goes). Beside it, the SDK's
  ``txlog.Producer`` (a send() loop, 16 KB batches) for as long
  (``load_generator``): the hand-built requests were the faster of the two
  here (the SDK 0.7 - 1.0 of their rate) and cost this process about 60% of
  the CPU the SDK does, so they are the load;
* no quota: ``flood`` (another client id, ``--flood-connections`` channels with
  ``--flood-in-flight`` calls outstanding on each) and ``calm`` together for
  ``--baseline-s``: what a noisy tenant takes when nothing holds it;
* quota: producer_byte_rate of client id ``flood`` set to ``--quota-bytes``
  (default: a fifth of the baseline, rounded to two significant digits) with
  txlog.Admin; the flood and calm start at once and the phase's clock starts
  at the first answer carrying throttle_time_ms (the quota applied). After
  ``--warmup-s``, until ``--duration-s``: each client's acknowledged bytes per
  second - request bytes, what the quota counts (the server's
  ProduceRequest.ByteSize()), and payload - the flood's steady rate against
  its quota, the calm client's against its baseline (what the flood took from
  it, against the quota), the throttle_time_ms the flood's answers carried
  and how many of its calls were refused (more of them waiting their turn
  than the server lets wait: each is sent again after its RetryInfo, as a
  compliant client does). The flood's several connections share one client
  id: the quota is the client id's, whatever connection a call comes on;
* consumers (skip with ``--skip-consumer``): the same with Fetch loops (max_bytes
  1 MiB, read_uncommitted, each partition in turn from offset 0 to its high
  watermark and round again, the encoded batch format): ``calm-reader`` (one
  call at a time) alone before and after, consumer_byte_rate of
  ``flood-reader`` set to a fifth of its rate, and both for
  ``--consumer-duration-s``; the fetch answers' bytes are what that quota
  counts.

What a quota bounds is the rate over the span it is measured over, 11 windows
of a second (Kafka's sampled rate): ``flood_vs_quota_each_11s_span`` is the
flood's rate over every 11 whole seconds of the phase, beside the steady rate.
Single seconds are not bounded: the window that held the burst before the quota
bit leaves the span 11 s later and lets about as much through again at once
(an echo every 11 s, as with Kafka's sampled rate;
``flood_burstiest_second_vs_quota``).

Targets, each a boolean in ``targets``: the flood's steady rate within 0.8 -
1.2 x its quota (producer and consumer; the upper bound is what "holds a
client to its rate" means, the lower one says the hold does not starve it);
the calm client's loss against its baseline at most 1.2 x the flood's quota
(with a quota of a fifth of the capacity that allows 4% of the capacity: the
noise of a shared machine is of that order). That one compares phases run one
after another: the calm client alone is the mean of the baselines beside
which other processes kept the machine as busy as in the quota phase (within
0.25 CPU), ``*_calm_comparison_neighbour_steady`` says whether there was one
(if not, both are used and the comparison speaks of the neighbour more than of
the flood), and ``cpu_per_mb_with_flood_vs_alone``, the partition_svc's CPU per
MB served with the flood held beside the calm client over that of the calm
client alone, is the figure a neighbour moves least: a held flood that cost
the service more than its bytes would raise it.

The ceiling: the machine's CPUs (2 here) are shared by the partition_svc and
this process, which runs every client. Each phase reports the CPU each of them
spent (from /proc, the partition_svc's CPU seconds too) and what other
processes kept busy (a neighbour on a shared box moves the figures by tens of
percent from one second to the next: ``mb_per_s_by_second``); ``cpu`` says
whether the machine was the bound in the producer quota phase or, with CPUs to
spare, the partition_svc (about one CPU and a tenth when nothing else runs)
was. A throttled client's calls wait their turn on the server before they
are applied (KIP-219: its answers come at once and say throttle_time_ms), so
the flood at its quota is a fifth of the load, plus what its waiting and
refused calls cost.

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.quotas [--duration-s S] [--quota-bytes N]`` (about 2 minutes
by default).
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

from bench.measure import MB, Phase, latency_summary, mean_of, progress
from bench.produce_fetch import (
    CALL_TIMEOUT_S,
    PRODUCE_METHOD,
    RECORD_BYTES,
    RequestBuilder,
    create_topic,
    open_channel,
    record_key,
    record_value,
)
from partition_svc.client_quotas import SAMPLES, WINDOW_MS
from services.tooling.cluster import LocalCluster
from txlog import Admin, Producer
from txlog.net.identity import CLIENT_ID_METADATA
from txlog.protocol import errors
from txlog.v1 import common_pb2, partition_pb2

TOPIC = "quotas"
PARTITIONS = 2
FETCH_METHOD = "/txlog.v1.PartitionService/Fetch"
FETCH_MAX_BYTES = 1 << 20
QUOTA_SHARE = 5  # the default quota: the baseline over this
TARGET_LOW, TARGET_HIGH = 0.8, 1.2
APPLIED_TIMEOUT_S = 30.0
NEIGHBOUR_STEADY_CPUS = 0.25  # other processes' CPUs may differ this much between the phases compared
SPAN_S = SAMPLES * WINDOW_MS // 1000  # the span a quota's rate is measured over


OPTIONS = (  # flag, type, default, what it is
    ("--duration-s", float, 30.0, "seconds of the quota phase, from the first throttled answer, warm-up included"),
    ("--warmup-s", float, 5.0, "seconds of a quota phase left out of its rates"),
    ("--baseline-s", float, 6.0, "seconds of each baseline and of the run without a quota"),
    ("--batch-records", int, 16, "records per produced batch"),
    ("--in-flight", int, 8, "calls outstanding of the calm client"),
    ("--flood-connections", int, 4, "the flood's gRPC channels"),
    ("--flood-in-flight", int, 4, "the flood's calls outstanding on each channel"),
    ("--consumer-duration-s", float, 20.0, "seconds of the consumer quota phase, warm-up included"),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default, meaning in OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=f"{meaning} (default: %(default)s)")
    parser.add_argument("--quota-bytes", type=int, default=None,
                        help="the flood's producer_byte_rate (default: a fifth of the measured baseline, rounded)")
    parser.add_argument("--skip-consumer", action="store_true", help="skip the consumer_byte_rate part")
    args = parser.parse_args(argv)
    if min(args.batch_records, args.in_flight, args.flood_connections, args.flood_in_flight) < 1:
        parser.error("--batch-records, --in-flight, --flood-connections and --flood-in-flight must be >= 1")
    if args.warmup_s < 0 or min(args.duration_s, args.consumer_duration_s) <= args.warmup_s + 1 or args.baseline_s < 2:
        parser.error("--duration-s and --consumer-duration-s must exceed --warmup-s by more than 1 s; --baseline-s >= 2")
    if args.quota_bytes is not None and args.quota_bytes < 1:
        parser.error("--quota-bytes must be >= 1")
    return args


# --- the clients -----------------------------------------------------------------------------


class Tenant:
    """One client id's load: ``connections`` channels with ``in_flight`` calls
    outstanding on each, one after another until stopped. Each answer is kept as
    (time.monotonic(), wire bytes - what the client's quota counts -, payload
    bytes, throttle_time_ms)."""

    def __init__(self, address: str, client_id: str, connections: int, in_flight: int):
        self.client_id = client_id
        self.channels = [open_channel(address) for _ in range(connections)]
        self.metadata = ((CLIENT_ID_METADATA, client_id),)
        self.workers = connections * in_flight
        self.answers: list[tuple[float, int, int, int]] = []
        self.refused = 0  # calls refused LIMIT_EXCEEDED (sent again after their RetryInfo)
        self.tasks: list[asyncio.Task] = []

    async def call(self, worker: int) -> tuple[int, int, int]:
        """One call of ``worker``: (wire bytes, payload bytes, throttle_time_ms)."""
        raise NotImplementedError

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._loop(worker)) for worker in range(self.workers)]

    async def _loop(self, worker: int) -> None:
        while True:
            try:
                answer = await self.call(worker)
            except grpc.aio.AioRpcError as exc:
                # over the quota with too many calls already waiting their turn: nothing was applied; the
                # refusal's RetryInfo says when to send it again (what a compliant client does)
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self.refused += 1
                await asyncio.sleep((errors.from_rpc_error(exc).retry_delay_ms or 100) / 1000)
                continue
            self.answers.append((time.monotonic(), *answer))

    async def stop(self) -> None:
        """Ends the calls (those still held are cancelled, not counted)."""
        for task in self.tasks:
            task.cancel()
        done = await asyncio.gather(*self.tasks, return_exceptions=True)
        failed = [d for d in done if isinstance(d, BaseException) and not isinstance(d, asyncio.CancelledError)]
        self.tasks = []
        if failed:
            raise RuntimeError(f"{self.client_id}: a call failed: {failed[0]!r}") from failed[0]

    async def close(self) -> None:
        await self.stop()
        for channel in self.channels:
            await channel.close()

    def first_throttled(self) -> float | None:
        return next((at for at, *_, throttle_ms in self.answers if throttle_ms), None)

    def figures(self, start: float, end: float, warmup_s: float) -> dict:
        """Rates of the answers in [start + warmup_s, end), and the bytes the quota
        counts second by second from ``start`` (whole seconds)."""
        steady = [a for a in self.answers if start + warmup_s <= a[0] < end]
        seconds = end - start - warmup_s
        throttled = [a[3] for a in steady if a[3]]
        by_second = [0.0] * int(end - start)
        for at, wire, _, _ in self.answers:
            if start <= at < start + len(by_second):
                by_second[int(at - start)] += wire / MB
        return {
            "client_id": self.client_id,
            "calls_outstanding": self.workers,
            "seconds": round(seconds, 2),
            "answers": len(steady),
            "bytes_per_s": round(sum(a[1] for a in steady) / seconds),  # what its quota counts
            "payload_mb_per_s": round(sum(a[2] for a in steady) / MB / seconds, 2),
            "throttled_answers": len(throttled),
            "refused_calls": self.refused,  # over the quota with its waiting calls at the bound: sent again
            # latency_summary takes seconds and answers in ms: the throttle times, as the answers said
            "throttle_time_ms": latency_summary([ms / 1000 for ms in throttled]) if throttled else None,
            "mb_per_s_by_second": [round(mb, 2) for mb in by_second],
        }


class Producing(Tenant):
    """Hand-built ProduceRequests, serialized once, the partitions in turn."""

    def __init__(self, address: str, client_id: str, connections: int, in_flight: int, bodies: list[bytes], payload: int):
        super().__init__(address, client_id, connections, in_flight)
        self.bodies, self.payload = bodies, payload
        self.produce = [c.unary_unary(PRODUCE_METHOD, request_serializer=None,
                                      response_deserializer=partition_pb2.ProduceResponse.FromString) for c in self.channels]
        self.sent = 0

    async def call(self, worker: int) -> tuple[int, int, int]:
        body = self.bodies[self.sent % len(self.bodies)]
        self.sent += 1
        reply = await self.produce[worker % len(self.produce)](body, timeout=CALL_TIMEOUT_S, metadata=self.metadata)
        for result in reply.results:
            if result.error.code:
                raise RuntimeError(f"{self.client_id}: Produce refused: {result.error}")
        return len(body), self.payload, reply.throttle_time_ms


class Fetching(Tenant):
    """Fetch loops, each worker on one partition from offset 0 to its high
    watermark and round again; answers taken as bytes (what the server sent)."""

    def __init__(self, address: str, client_id: str, connections: int, in_flight: int):
        super().__init__(address, client_id, connections, in_flight)
        self.fetch = [c.unary_unary(FETCH_METHOD, request_serializer=None, response_deserializer=None) for c in self.channels]
        self.offsets = [0] * self.workers

    async def call(self, worker: int) -> tuple[int, int, int]:
        partition = worker % PARTITIONS
        request = partition_pb2.FetchRequest(
            isolation_level=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED, max_wait_ms=0, max_bytes=FETCH_MAX_BYTES,
            batch_format=partition_pb2.BATCH_FORMAT_ENCODED,
            partitions=[partition_pb2.FetchPartition(topic=TOPIC, partition=partition, fetch_offset=self.offsets[worker])])
        raw = await self.fetch[worker % len(self.fetch)](request.SerializeToString(), timeout=CALL_TIMEOUT_S,
                                                         metadata=self.metadata)
        reply = partition_pb2.FetchResponse.FromString(raw)
        result = reply.results[0]
        if result.error.code:
            raise RuntimeError(f"{self.client_id}: Fetch refused: {result.error}")
        at_end = not result.encoded_batches or result.next_fetch_offset >= result.high_watermark
        self.offsets[worker] = 0 if at_end else result.next_fetch_offset
        return len(raw), sum(len(b) for b in result.encoded_batches), reply.throttle_time_ms


# --- phases ----------------------------------------------------------------------------------


def cpu_figures(phase: Phase) -> dict:
    """CPUs each process kept busy in the phase, and the rest of the machine."""
    return {"cpus": os.cpu_count(),
            **{name: None if spent is None else round(spent / phase.seconds, 3) for name, spent in phase.cpu.items()},
            "partition_svc_cpu_seconds": None if phase.cpu["partition_svc"] is None else round(phase.cpu["partition_svc"], 2),
            "machine_busy": phase.others_cpu_utilisation()}


async def timed(tenants: list[Tenant], seconds: float, pids: dict[str, int], warmup_s: float = 1.0) -> dict:
    """``tenants`` together for ``seconds``, the first ``warmup_s`` (connections, first calls) left out."""
    for tenant in tenants:
        tenant.start()
    start = time.monotonic()
    await asyncio.sleep(warmup_s)
    with Phase(pids) as phase:
        await asyncio.sleep(seconds - warmup_s)
    end = time.monotonic()
    for tenant in tenants:
        await tenant.stop()
    return {"tenants": {t.client_id: t.figures(start, end, warmup_s) for t in tenants}, "cpu": cpu_figures(phase)}


async def quota_phase(bootstrap: str, flood: Tenant, calm: Tenant, key: str, quota: int, seconds: float, warmup_s: float,
                      pids: dict[str, int]) -> dict:
    """``key`` of ``flood``'s client id set to ``quota``; both tenants from then
    on, timed from the flood's first throttled answer for ``seconds``."""
    flood.answers.clear()
    calm.answers.clear()
    await asyncio.to_thread(alter_quota, bootstrap, flood.client_id, key, quota)
    altered = time.monotonic()
    flood.start()
    calm.start()
    while (start := flood.first_throttled()) is None:
        if time.monotonic() - altered > APPLIED_TIMEOUT_S:
            raise RuntimeError(f"{flood.client_id}: no answer held {APPLIED_TIMEOUT_S} s after {key} was set")
        await asyncio.sleep(0.05)
    progress(f"{key} applied: the first held answer {time.monotonic() - altered:.2f} s after the change")
    await asyncio.sleep(max(0.0, start + warmup_s - time.monotonic()))
    with Phase(pids) as phase:
        await asyncio.sleep(max(0.0, start + seconds - time.monotonic()))
    end = time.monotonic()
    await flood.stop()
    await calm.stop()
    return {"applied_s": round(start - altered, 3), "quota_bytes_per_s": quota, "warmup_s": warmup_s,
            "tenants": {t.client_id: t.figures(start, end, warmup_s) for t in (flood, calm)}, "cpu": cpu_figures(phase)}


def alter_quota(bootstrap: str, client_id: str, key: str, value: int | None) -> None:
    with Admin(bootstrap) as admin:
        admin.alter_client_quotas(entity={"client-id": client_id}, quotas={key: value})


def default_quota(bytes_per_s: float) -> int:
    """A fifth of ``bytes_per_s``, rounded to two significant digits."""
    share = bytes_per_s / QUOTA_SHARE
    return int(round(share, 2 - len(str(int(share)))))


def sdk_producer(bootstrap: str, seconds: float, batch_bytes: int, pids: dict[str, int]) -> dict:
    """txlog.Producer: a send() loop for ``seconds``, then flush()."""
    keys = [record_key(i) for i in range(1000)]
    values = [record_value(i) for i in range(1000)]
    # a small buffer: send() blocks while it is full, so the loop lasts about ``seconds`` and flush() little
    with Producer(bootstrap, client_id="sdk", batch_size_bytes=batch_bytes, buffer_memory_bytes=16 * batch_bytes) as producer:
        producer.send(TOPIC, key=keys[0], value=values[0]).result(timeout=60)  # metadata and producer id first
        sent = 0
        with Phase(pids) as phase:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for i in range(100):
                    producer.send(TOPIC, key=keys[i], value=values[sent % 1000])
                sent += 100
            producer.flush()
        metrics = producer.metrics()
    return {"api": "Producer(bootstrap, batch_size_bytes=...).send(topic, key=, value=) loop + flush()",
            "records": sent, "seconds": round(phase.seconds, 2),
            "payload_mb_per_s": round(sent * RECORD_BYTES / MB / phase.seconds, 2),
            "batch_size_avg_bytes": metrics["batch_size_avg_bytes"], "cpu": cpu_figures(phase)}


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3)


def service_cpu_ms_per_mb(run: dict) -> float | None:
    """partition_svc CPU ms per MB its tenants moved (the bytes their quotas count)."""
    mb_per_s = sum(t["bytes_per_s"] for t in run["tenants"].values()) / MB
    return None if run["cpu"]["partition_svc"] is None else round(run["cpu"]["partition_svc"] / mb_per_s * 1000, 2)


def judged(quoted: dict, before: dict, after: dict, flood: str, calm: str) -> dict:
    """The flood's rate against its quota - over the steady part, over every
    whole span the quota measures (11 s) and in its burstiest second - and what
    it took from the calm client against the quota, the calm client alone
    being the mean of ``before`` and ``after`` that ran beside a neighbour as
    busy as the quota phase did (``neighbour_steady``: one at least; else
    both). Beside it, what a neighbour kept busy in each and the
    partition_svc's CPU per MB in each (which no neighbour changes much: a
    flood held at its quota that cost the service more than its bytes would
    raise it)."""
    quota = quoted["quota_bytes_per_s"]
    runs = {"alone_before": before, "with_flood": quoted, "alone_after": after}
    neighbour = {name: run["cpu"]["machine_busy"]["other_processes"] for name, run in runs.items()}
    cost = {name: service_cpu_ms_per_mb(run) for name, run in runs.items()}
    known = None not in neighbour.values() and None not in cost.values()
    # the calm client alone: the baselines run beside a neighbour as busy as in the quota phase (else both)
    comparable = [name for name in ("alone_before", "alone_after")
                  if known and abs(neighbour[name] - neighbour["with_flood"]) <= NEIGHBOUR_STEADY_CPUS]
    alone = round(statistics.fmean(runs[name]["tenants"][calm]["bytes_per_s"]
                                   for name in comparable or ("alone_before", "alone_after")))
    flood_rate = quoted["tenants"][flood]["bytes_per_s"]
    calm_rate = quoted["tenants"][calm]["bytes_per_s"]
    by_second = quoted["tenants"][flood]["mb_per_s_by_second"]
    spans = [sum(by_second[i:i + SPAN_S]) / SPAN_S * MB / quota for i in range(len(by_second) - SPAN_S + 1)]
    return {"calm_alone_bytes_per_s": alone, "calm_alone_from": comparable or ["alone_before", "alone_after"],
            "flood_vs_quota": ratio(flood_rate, quota),
            "flood_vs_quota_each_11s_span": {"min": round(min(spans), 3), "max": round(max(spans), 3)} if spans else None,
            "flood_burstiest_second_vs_quota": ratio(max(by_second) * MB, quota),
            "calm_vs_alone": ratio(calm_rate, alone),
            "taken_from_calm_bytes_per_s": alone - calm_rate, "taken_from_calm_vs_quota": ratio(alone - calm_rate, quota),
            "flood_plus_calm_vs_alone": ratio(flood_rate + calm_rate, alone),
            "neighbour_cpus": neighbour,
            "neighbour_steady": bool(comparable),
            "partition_svc_cpu_ms_per_mb": cost,
            "cpu_per_mb_with_flood_vs_alone": ratio(cost["with_flood"], (cost["alone_before"] + cost["alone_after"]) / 2)
            if known else None}


# --- the run ---------------------------------------------------------------------------------


async def on_cluster(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    service = cluster.state.services["partition_svc-0"]
    bootstrap = cluster.state.bootstrap
    pids = {"partition_svc": service.pid, "bench": os.getpid()}
    async with open_channel(service.address) as channel:
        await create_topic(channel, TOPIC, PARTITIONS)
    builder = RequestBuilder(-1, -1, args.batch_records)  # batches without a producer id: any number in flight
    bodies = [builder.request(TOPIC, [(p, -1)]) for p in range(PARTITIONS)]
    payload = args.batch_records * RECORD_BYTES
    calm = Producing(service.address, "calm", 1, args.in_flight, bodies, payload)
    flood = Producing(service.address, "flood", args.flood_connections, args.flood_in_flight, bodies, payload)
    figures: dict = {"request_bytes": len(bodies[0])}
    try:
        progress(f"baseline: calm alone, {args.in_flight} in flight, {args.baseline_s} s")
        before = await timed([calm], args.baseline_s, pids)
        progress(f"baseline: {before['tenants']['calm']['payload_mb_per_s']} MB/s")
        progress("baseline: txlog.Producer")
        figures["baseline_sdk_producer"] = await asyncio.to_thread(sdk_producer, bootstrap, args.baseline_s,
                                                                    builder.batch_records * RECORD_BYTES, pids)
        progress(f"baseline: txlog.Producer {figures['baseline_sdk_producer']['payload_mb_per_s']} MB/s")
        progress("no quota: flood and calm together")
        figures["no_quota"] = await timed([flood, calm], args.baseline_s, pids)
        quota = args.quota_bytes or default_quota(before["tenants"]["calm"]["bytes_per_s"])
        progress(f"quota: producer_byte_rate of flood {quota} B/s, {args.duration_s} s from the first held answer")
        quoted = await quota_phase(bootstrap, flood, calm, "producer_byte_rate", quota, args.duration_s, args.warmup_s, pids)
        progress(f"quota: flood {quoted['tenants']['flood']['bytes_per_s']} B/s, calm {quoted['tenants']['calm']['bytes_per_s']} B/s")
        progress("baseline again: calm alone")
        after = await timed([calm], args.baseline_s, pids)
        figures["baseline"] = {"before": before, "after": after}
        hand_built = mean_of(before["tenants"]["calm"], after["tenants"]["calm"], "payload_mb_per_s")
        sdk = figures["baseline_sdk_producer"]["payload_mb_per_s"]
        figures["load_generator"] = {"used": "hand-built ProduceRequests (grpc.aio, serialized once)",
                                     "hand_built_payload_mb_per_s": hand_built, "sdk_producer_payload_mb_per_s": sdk,
                                     "sdk_vs_hand_built": ratio(sdk, hand_built),
                                     "bench_cpu_utilisation": {"hand_built": before["cpu"]["bench"],
                                                               "sdk_producer": figures["baseline_sdk_producer"]["cpu"]["bench"]}}
        figures["producer_quota"] = {**quoted, **judged(quoted, before, after, "flood", "calm")}
        figures["no_quota"]["flood_share"] = ratio(
            figures["no_quota"]["tenants"]["flood"]["bytes_per_s"],
            sum(t["bytes_per_s"] for t in figures["no_quota"]["tenants"].values()))
    finally:
        await flood.close()
        await calm.close()
    if not args.skip_consumer:
        figures["consumer_quota"] = await consumers(service.address, bootstrap, args, pids)
    return figures


async def consumers(address: str, bootstrap: str, args: argparse.Namespace, pids: dict[str, int]) -> dict:
    calm = Fetching(address, "calm-reader", 1, 1)
    flood = Fetching(address, "flood-reader", args.flood_connections, args.flood_in_flight)
    try:
        progress("consumer baseline: calm-reader alone")
        before = await timed([calm], args.baseline_s, pids)
        quota = default_quota(before["tenants"]["calm-reader"]["bytes_per_s"])
        progress(f"consumer quota: consumer_byte_rate of flood-reader {quota} B/s")
        quoted = await quota_phase(bootstrap, flood, calm, "consumer_byte_rate", quota, args.consumer_duration_s,
                                   args.warmup_s, pids)
        progress(f"consumer quota: flood-reader {quoted['tenants']['flood-reader']['bytes_per_s']} B/s, "
                 f"calm-reader {quoted['tenants']['calm-reader']['bytes_per_s']} B/s")
        progress("consumer baseline again: calm-reader alone")
        after = await timed([calm], args.baseline_s, pids)
    finally:
        await flood.close()
        await calm.close()
    return {"baseline": {"before": before, "after": after}, **quoted,
            **judged(quoted, before, after, "flood-reader", "calm-reader")}


def targets(figures: dict) -> dict:
    checks = {}
    for part in ("producer_quota", "consumer_quota"):
        if part in figures:
            judged_part = figures[part]
            checks[f"{part}_flood_within_20_percent"] = TARGET_LOW <= judged_part["flood_vs_quota"] <= TARGET_HIGH
            checks[f"{part}_flood_at_most_quota_plus_20_percent"] = judged_part["flood_vs_quota"] <= TARGET_HIGH
            checks[f"{part}_calm_lost_at_most_quota_plus_20_percent"] = judged_part["taken_from_calm_vs_quota"] <= TARGET_HIGH
            # whether the line above means anything: a neighbour busy alike in the three phases it compares
            checks[f"{part}_calm_comparison_neighbour_steady"] = judged_part["neighbour_steady"]
    return checks


def cpu_ceiling(figures: dict) -> dict:
    """Where the CPUs went in the producer quota phase: the machine's bound (its
    CPUs nearly all busy) or, with CPUs to spare, the partition_svc's own."""
    phase = figures["producer_quota"]["cpu"]
    machine = phase["machine_busy"]["machine"]
    return {"cpus": phase["cpus"], "partition_svc": phase["partition_svc"], "bench": phase["bench"],
            "other_processes": phase["machine_busy"]["other_processes"], "machine_busy": machine,
            "machine_bound": machine is not None and machine >= 0.9 * (phase["cpus"] or 1)}


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="txlog-bench-quotas-") as workdir:
        progress("starting a cluster")
        cluster = LocalCluster(Path(workdir) / "cluster")
        cluster.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=0)
        try:
            figures = asyncio.run(on_cluster(cluster, args))
        finally:
            cluster.down(grace_s=5)
    print(json.dumps({
        "benchmark": "quotas: a flood client held to its producer_byte_rate / consumer_byte_rate beside a calm one",
        "parameters": {"duration_s": args.duration_s, "warmup_s": args.warmup_s, "baseline_s": args.baseline_s,
                       "partitions": PARTITIONS, "records_per_batch": args.batch_records, "record_bytes": RECORD_BYTES,
                       "request_bytes": figures.pop("request_bytes"), "calm_in_flight": args.in_flight,
                       "flood_connections": args.flood_connections, "flood_in_flight_per_connection": args.flood_in_flight,
                       "acks": -1, "fsync": True, "fetch_max_bytes": FETCH_MAX_BYTES,
                       "rates": "bytes_per_s: request (produce) or answer (fetch) bytes, what a quota counts; "
                                "payload_mb_per_s: record bytes (produce) or batch bytes (fetch), 10^6 a MB; "
                                "mb_per_s_by_second: the bytes a quota counts, 10^6 a MB, each whole second from "
                                "the phase's start (a quota phase's: its first held answer)"},
        "targets": targets(figures),
        "cpu": cpu_ceiling(figures),
        **figures,
        "seconds": round(time.monotonic() - started, 1),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
