"""Benchmark: idempotent produce and fetch through partition_svc, against the raw
rates of its two physical limits, RocksDB synced writes and gRPC streaming.

What it measures, for 1 KB records (8-byte key, 1024-byte value), on a local
cluster started for the run (ZooKeeper, one producer_id_svc and one
partition_svc as real processes, see services/tooling/cluster.py):

* produce to ONE partition: one idempotent producer (its id from
  CoordinatorService.InitProducerId on the partition_svc), hand-built
  RecordBatches of ``--batch-records`` records (~1 MB) with producer id, epoch
  and continuing base sequences, one batch per ProduceRequest, up to
  ``--in-flight`` requests outstanding on one grpc.aio channel, acks=-1, the
  server's default fsync=on. Records/s and MB/s;
* produce to FOUR partitions: the same producer, per-partition sequences, each
  ProduceRequest carrying one batch for every partition (4 x ~1 MB);
* fetch: read_uncommitted, the one-partition data read back from offset 0 by a
  loop of FetchStream calls with a large max_bytes (``--fetch-max-bytes``), in
  chunks of ``--stream-chunk-bytes``, each read as it comes (what the SDK
  does); and again by Fetch calls, one response each (the "before" of the
  stream, ``fetch_one_partition_one_response_a_call``);
* each batch is sent and fetched in the encoded batch format (what the SDK
  sends, PartitionBatch.encoded_batch; the reader checks each batch's CRC and
  parses its records); the one-partition produce and the fetch are measured
  in the message form too (PartitionBatch.batch, FetchPartitionResult.batches,
  a topic of its own), the form before batches were stored as sent, so the
  ``message_form_*`` ratios are the "before" of the same run;
* produce through the client SDK, ``txlog.Producer`` (a send() loop
  and flush()), when it exists and imports; else null with the reason;
* memory: VmRSS of a fresh partition_svc (a second cluster) after producing
  ``--memory-records`` records to each of ``--memory-partitions`` partitions of
  one topic (default 100 x 10,000 records, ~1 GB written).

The baselines, measured in the same run on the same machine and disk:

* raw RocksDB: rocksdict, one WriteBatch of ``--batch-records`` puts (8-byte
  key, 1024-byte value each) per write, WriteOptions.sync = True - the same
  bytes and the same durability as a produce with fsync on;
* raw gRPC: a Python grpc.aio server in a separate process (this file with
  ``--serve-echo``, generic handlers, bytes in and out, no .proto) and a bidi
  stream of messages of one batch's payload bytes; ``echo`` sends every message
  back (the baseline the targets use, MB/s one-way = bytes sent per second),
  ``upload`` answers each message with an 8-byte ack (shaped like produce) and
  ``download`` streams the messages server -> client (shaped like fetch); the
  last two are reported beside the targets. Each mode moves 4x the bytes of a
  produce run (it is fast; a longer run is a steadier figure).

``ratios.ceiling_raw_rocksdb_synced_mb_vs_raw_grpc_echo_mb`` is the best
produce/echo ratio any service whose acks wait for a synced RocksDB write could
reach here: when it is below 0.5, the produce-vs-gRPC target cannot be met with
fsync on, whatever the service does.

Each baseline runs before and after the service runs and the ratios use the
mean, so drift (page cache, a noisy neighbour, disk write-back) favours neither
side. Throughput counts payload bytes only (key + value, 1032 bytes a record;
MB = 10^6 bytes); protobuf framing adds ~1% on the wire that nobody is credited
for. CPU seconds of every process (this script, partition_svc, the echo
server) come from /proc, to show where the time goes.

Targets: produce to one partition >= 50% of the raw synced RocksDB MB/s and
>= 50% of the raw gRPC echo stream MB/s; fetch >= 50% of the raw gRPC echo
stream; partition_svc VmRSS <= 300 MB after the memory workload.

Why the baselines run in the same run: fsync latency and loopback gRPC speed
depend on the disk, the kernel and whatever else runs (2 cores here, shared by
client, server and RocksDB's own threads), so a fixed MB/s would mean nothing;
a ratio to what the same machine does without txlog holds anywhere.

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.produce_fetch [--records N] [--skip-memory]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc

from bench.measure import MB, Phase, latency_summary, mean_of, progress
from txlog.protocol.protowire import field_tag, varint

REPOSITORY = Path(__file__).resolve().parent.parent  # the echo server child runs from there
KEY_BYTES = 8
VALUE_BYTES = 1024
RECORD_BYTES = KEY_BYTES + VALUE_BYTES  # payload bytes a record: what MB/s counts
DISTINCT_VALUES = 1000  # random values, so no layer gets to compress repeats
RATIO_TARGET = 0.5
RSS_TARGET_BYTES = 300 * MB
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
CALL_TIMEOUT_S = 120.0
RESENDABLE = {"OUT_OF_ORDER_SEQUENCE", "UNKNOWN_PRODUCER_ID", "NOT_LEADER"}
RESENDS_PER_REQUEST_MAX = 20
SERVICE = "partition_svc-0"
TOPIC_ONE = "bench-one"
TOPIC_ONE_MESSAGE = "bench-one-message"  # the same batches in the message form, produced and fetched so
TOPIC_FOUR = "bench-four"
TOPIC_CLIENT = "bench-client"
TOPIC_MEMORY = "bench-memory"
GRPC_BASELINE_BYTES_FACTOR = 4  # the streams move 4x the bytes of a produce run: at ~1 GB/s, ~2 s a mode, steadier
MEMORY_PARTITIONS_PER_REQUEST = 4  # like the four-partition run: ~4 MB requests
ECHO_SERVICE = "bench.Echo"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records", type=int, default=500_000,
        help="records per timed throughput run, and bytes of the baselines (default 500000, ~5 s a run here)",
    )
    parser.add_argument("--batch-records", type=int, default=1000, help="records per batch / WriteBatch / message (default 1000)")
    parser.add_argument("--in-flight", type=int, default=5, help="Produce requests outstanding on the channel (default 5)")
    parser.add_argument("--warmup-batches", type=int, default=20, help="untimed batches before each run (default 20)")
    parser.add_argument("--fetch-max-bytes", type=int, default=32 * 1024 * 1024, help="Fetch max_bytes (default 32 MiB)")
    parser.add_argument("--stream-chunk-bytes", type=int, default=1024 * 1024,
                        help="FetchStreamRequest.chunk_bytes of the streamed fetch (default 1 MiB, the server's default)")
    parser.add_argument("--skip-memory", action="store_true", help="skip the 100-partition memory run")
    parser.add_argument("--memory-partitions", type=int, default=100, help="partitions of the memory run (default 100)")
    parser.add_argument("--memory-records", type=int, default=10_000, help="records per partition in the memory run (default 10000)")
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)  # the raw gRPC baseline's server
    args = parser.parse_args(argv)
    if min(args.records, args.batch_records, args.in_flight, args.fetch_max_bytes, args.stream_chunk_bytes, args.memory_partitions,
           args.memory_records) < 1:
        parser.error("--records, --batch-records, --in-flight, --fetch-max-bytes, --stream-chunk-bytes and --memory-* must be >= 1")
    if args.warmup_batches < 0:
        parser.error("--warmup-batches must be >= 0")
    if args.memory_records % args.batch_records:
        parser.error("--memory-records must be a multiple of --batch-records")
    return args


# --- measuring memory -----------------------------------------------------------------


def memory_status(pid: int) -> dict[str, int | None]:
    """VmRSS, VmHWM (peak RSS), RssAnon and RssFile of a process from /proc, bytes."""
    wanted = {"VmRSS": None, "VmHWM": None, "RssAnon": None, "RssFile": None}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in wanted:
                    wanted[name] = int(value.split()[0]) * 1024  # kB
    except OSError:
        pass
    return wanted


def in_mb(status: dict[str, int | None]) -> dict[str, float | None]:
    return {f"{name}_mb": None if value is None else round(value / MB, 1) for name, value in status.items()}


# --- the bytes -------------------------------------------------------------------------

VALUES = [os.urandom(VALUE_BYTES) for _ in range(DISTINCT_VALUES)]


def record_key(index: int) -> bytes:
    return index.to_bytes(KEY_BYTES, "big")


def record_value(index: int) -> bytes:
    return VALUES[index % DISTINCT_VALUES]


def _length_delimited(tag: bytes, data: bytes) -> bytes:
    """One length-delimited field: ``tag`` from txlog.protocol.protowire.field_tag, then the length and the bytes."""
    return tag + varint(len(data)) + data


def batch_bytes(form: str, records_blob: bytes, count: int, producer_id: int, producer_epoch: int, base_sequence: int,
                transactional: bool = False) -> bytes:
    """One batch of the serialized records ``records_blob`` (a RecordBatch of only
    them) with its producer fields, in ``form``: "encoded" (the header and its
    CRC, what a producer computes per batch; PartitionBatch.encoded_batch) or
    "message" (a RecordBatch's header fields then the records: protobuf parses
    the concatenation as one message; PartitionBatch.batch)."""
    from txlog.protocol import batch_format
    from txlog.v1 import common_pb2

    if form == "encoded":
        return batch_format.encode(records_blob, count, producer_id=producer_id, producer_epoch=producer_epoch,
                                   base_sequence=base_sequence, transactional=transactional, untimed=True)
    header = common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
                                    is_transactional=transactional).SerializeToString()
    return header + records_blob


class RequestBuilder:
    """Serialized ProduceRequests, built by concatenation: the records of a batch
    are serialized once, and only the header fields (producer id, epoch, base
    sequence, topic, partition) are encoded per request, so the client spends
    almost no CPU (two cores are shared with the server). Protobuf parses the
    concatenation of two encodings as their merge; the first request is checked
    against one built field by field."""

    def __init__(self, producer_id: int, producer_epoch: int, batch_records: int, form: str = "encoded"):
        from txlog.v1 import common_pb2, partition_pb2

        self.common_pb2, self.partition_pb2 = common_pb2, partition_pb2
        self.producer_id, self.producer_epoch, self.batch_records = producer_id, producer_epoch, batch_records
        self.form = form  # "encoded": PartitionBatch.encoded_batch (what clients send); "message": PartitionBatch.batch
        self.records = [common_pb2.Record(key=record_key(i), value=record_value(i)) for i in range(batch_records)]
        self.records_blob = common_pb2.RecordBatch(records=self.records).SerializeToString()
        self.head = partition_pb2.ProduceRequest(acks=-1).SerializeToString()
        self.batches_tag = field_tag(partition_pb2.ProduceRequest, "batches")
        self.batch_tag = field_tag(partition_pb2.PartitionBatch, "encoded_batch" if form == "encoded" else "batch")
        self._checked = False

    def batch_bytes(self, base_sequence: int) -> bytes:
        return batch_bytes(self.form, self.records_blob, self.batch_records, self.producer_id, self.producer_epoch, base_sequence)

    def request(self, topic: str, sequences: list[tuple[int, int]]) -> bytes:
        """A ProduceRequest with one batch for each (partition, base_sequence)."""
        parts = [self.head]
        for partition, base_sequence in sequences:
            item = self.partition_pb2.PartitionBatch(topic=topic, partition=partition).SerializeToString()
            item += _length_delimited(self.batch_tag, self.batch_bytes(base_sequence))
            parts.append(_length_delimited(self.batches_tag, item))
        body = b"".join(parts)
        if not self._checked:
            self._check(topic, sequences, body)
        return body

    def _check(self, topic: str, sequences: list[tuple[int, int]], body: bytes) -> None:
        pb = self.partition_pb2
        expected = pb.ProduceRequest(
            acks=-1,
            batches=[
                pb.PartitionBatch(topic=topic, partition=partition, encoded_batch=self.batch_bytes(base_sequence))
                if self.form == "encoded" else
                pb.PartitionBatch(
                    topic=topic,
                    partition=partition,
                    batch=self.common_pb2.RecordBatch(
                        producer_id=self.producer_id,
                        producer_epoch=self.producer_epoch,
                        base_sequence=base_sequence,
                        records=self.records,
                    ),
                )
                for partition, base_sequence in sequences
            ],
        )
        if pb.ProduceRequest.FromString(body) != expected:
            raise AssertionError("the concatenated ProduceRequest does not parse as the one built field by field")
        self._checked = True


class Sequencer:
    """Per-partition sequence numbers of one producer, assigned in send order."""

    def __init__(self, batch_records: int):
        self.batch_records = batch_records
        self.next: dict[int, int] = {}

    def take(self, partitions: Iterable[int]) -> list[tuple[int, int]]:
        taken = []
        for partition in partitions:
            sequence = self.next.get(partition, 0)
            self.next[partition] = sequence + self.batch_records
            taken.append((partition, sequence))
        return taken


def requests_for(builder: RequestBuilder, sequencer: Sequencer, topic: str, groups: Iterable[list[int]]) -> Iterator[tuple[bytes, int]]:
    """(request body, record count) for each group of partitions, built lazily in send order."""
    for partitions in groups:
        yield builder.request(topic, sequencer.take(partitions)), len(partitions) * builder.batch_records


# --- baseline: raw RocksDB synced batch writes ---------------------------------------------


def measure_raw_rocksdb(path: str, records: int, batch_records: int, warmup_batches: int, pids: dict[str, int]) -> dict:
    from rocksdict import Options, Rdict, WriteBatch, WriteOptions

    shutil.rmtree(path, ignore_errors=True)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(path, options)
    write_options = WriteOptions()
    write_options.sync = True
    key = 0

    def write_batches(count: int) -> None:
        nonlocal key
        for _ in range(count):
            batch = WriteBatch(raw_mode=True)
            for _ in range(batch_records):
                batch.put(key.to_bytes(KEY_BYTES, "big"), VALUES[key % DISTINCT_VALUES])
                key += 1
            db.write(batch, write_options)

    try:
        write_batches(warmup_batches)
        batches = -(-records // batch_records)
        with Phase(pids) as phase:
            write_batches(batches)
    finally:
        db.close()
        shutil.rmtree(path, ignore_errors=True)
    return {"batches": batches, "records_per_batch": batch_records, **phase.rates(batches * batch_records, RECORD_BYTES)}


# --- baseline: raw gRPC streams (server in a separate process) -------------------------------


def echo_server_main() -> int:
    """The raw gRPC baseline's server: generic handlers, bytes in and out. Prints
    its port on stdout, serves until stdin closes or SIGTERM."""

    async def echo(request_iterator, context):
        async for message in request_iterator:
            yield message

    async def upload(request_iterator, context):
        async for message in request_iterator:
            yield len(message).to_bytes(8, "big")

    async def download(request, context):
        count, size = struct.unpack(">QQ", request)
        payload = b"".join(VALUES)[:size].ljust(size, b"\0")
        for _ in range(count):
            yield payload

    async def serve() -> None:
        server = grpc.aio.server(options=[*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    ECHO_SERVICE,
                    {
                        "Echo": grpc.stream_stream_rpc_method_handler(echo),
                        "Upload": grpc.stream_stream_rpc_method_handler(upload),
                        "Download": grpc.unary_stream_rpc_method_handler(download),
                    },
                )
            ]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"port {port}", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)  # returns when the parent closes our stdin
        await server.stop(1)

    asyncio.run(serve())
    return 0


class EchoServer:
    """This module run with --serve-echo (``python -m bench.produce_fetch --serve-echo``), as a child process."""

    def __enter__(self) -> EchoServer:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.produce_fetch", "--serve-echo"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPOSITORY,  # bench is a package of the repository root, not an installed one
        )
        line = self.process.stdout.readline()
        if not line.startswith("port "):
            self.__exit__()
            raise RuntimeError(f"the echo server did not start (said {line!r})")
        self.address = f"127.0.0.1:{int(line.split()[1])}"
        self.pid = self.process.pid
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


async def stream_run(channel: grpc.aio.Channel, method: str, payload: bytes, count: int) -> int:
    """Writes ``count`` messages on a bidi stream while reading the answers; bytes read back."""
    call = channel.stream_stream(f"/{ECHO_SERVICE}/{method}")(timeout=CALL_TIMEOUT_S * 10)

    async def write_all() -> None:
        for _ in range(count):
            await call.write(payload)
        await call.done_writing()

    writer = asyncio.ensure_future(write_all())
    received = answers = 0
    while True:
        message = await call.read()
        if message is grpc.aio.EOF:
            break
        received += len(message)
        answers += 1
    await writer
    if answers != count:
        raise RuntimeError(f"{method}: {answers} answers to {count} messages")
    return received


async def download_run(channel: grpc.aio.Channel, size: int, count: int) -> int:
    call = channel.unary_stream(f"/{ECHO_SERVICE}/Download")(struct.pack(">QQ", count, size), timeout=CALL_TIMEOUT_S * 10)
    received = messages = 0
    async for message in call:
        received += len(message)
        messages += 1
    if messages != count:
        raise RuntimeError(f"Download: {messages} messages, {count} asked for")
    return received


async def measure_raw_grpc(address: str, records: int, batch_records: int, warmup_batches: int, pids: dict[str, int]) -> dict:
    size = batch_records * RECORD_BYTES
    payload = b"".join(VALUES)[:size].ljust(size, b"\0")
    count = -(-records * GRPC_BASELINE_BYTES_FACTOR // batch_records)
    results = {}
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        for mode in ("echo", "upload", "download"):

            def run(n: int, mode: str = mode):
                if mode == "download":
                    return download_run(channel, size, n)
                return stream_run(channel, mode.capitalize(), payload, n)

            await run(max(warmup_batches, 1))
            with Phase(pids) as phase:
                received = await run(count)
            results[mode] = {
                "messages": count,
                "message_bytes": size,
                "bytes_returned": received,
                **phase.rates(count * batch_records, RECORD_BYTES),
            }
    return results


# --- through the service ------------------------------------------------------------------------


PRODUCE_METHOD = "/txlog.v1.PartitionService/Produce"


async def send_pipelined(channel: grpc.aio.Channel, requests: Iterator[tuple[bytes, int]], window: int) -> dict:
    """Serialized ProduceRequests sent in order with up to ``window`` outstanding and
    settled in order with the recovery of a real
    client when partition_svc refuses a request with a sequencing error because a
    later one overtook it on the way in (gRPC does not order the calls of one
    channel, and partition_svc awaits lookups - the coordinator verification of a
    transaction's first batch - before the sequence check): every request sent
    after the refused one is refused too (each arrives before its predecessor's
    resend), so nothing new is sent until every request in flight has settled,
    the refused ones are sent again one at a time in sequence order (Kafka's
    producer also sends retried batches alone, in order), and the pipeline
    resumes. A new producer's (or epoch's) later batch that arrives first is
    UNKNOWN_PRODUCER_ID (or OUT_OF_ORDER_SEQUENCE). (Resending while new requests
    keep going out makes every later request fail once too, for good, after
    the first overtaking: under load, whole runs were resent.)
    Returns records, requests, latencies, resends with their reasons, and the
    recoveries with the time they took."""
    from txlog.protocol.errors import ErrorCode
    from txlog.v1 import partition_pb2

    produce = channel.unary_unary(PRODUCE_METHOD, request_serializer=None, response_deserializer=partition_pb2.ProduceResponse.FromString)
    in_flight: deque[tuple[int, bytes, int, asyncio.Future]] = deque()  # (index in send order, body, records, call)
    latencies: list[float] = []
    stats = {
        "records": 0, "requests": 0, "resends": 0, "resend_reasons": {}, "recoveries": 0,
        "recoveries_in_first_window": 0,  # set off by one of the first ``window`` requests
        "recovery_s": 0.0, "first_latency_s": None,  # of request 0, when it was not refused
    }

    async def one(body: bytes):
        started = time.perf_counter()
        reply = await produce(body, timeout=CALL_TIMEOUT_S)
        return reply, time.perf_counter() - started

    def settled(records: int, reply, latency: float, index: int = -1) -> bool:
        """Counts an accepted request; False (and counts why) for a resendable refusal."""
        refused = [r.error for r in reply.results if r.error.code != 0]
        if not refused:
            if index == 0:
                stats["first_latency_s"] = latency
            latencies.append(latency)
            stats["records"] += records
            stats["requests"] += 1
            return True
        names = [ErrorCode.Name(e.code) for e in refused]
        if any(name not in RESENDABLE for name in names):
            raise RuntimeError(f"Produce failed: {names[0]} {refused[0].message}")
        for name in names:
            stats["resend_reasons"][name] = stats["resend_reasons"].get(name, 0) + 1
        stats["resends"] += 1
        return False

    async def recover(index: int, first: tuple[bytes, int]) -> None:
        started = time.perf_counter()
        stats["recoveries_in_first_window"] += index < window
        refused = [first]
        while in_flight:
            _, body, records, task = in_flight.popleft()
            if not settled(records, *await task):
                refused.append((body, records))
        for body, records in refused:
            for _ in range(RESENDS_PER_REQUEST_MAX):
                if settled(records, *await one(body)):
                    break
            else:
                raise RuntimeError(f"Produce still refused after {RESENDS_PER_REQUEST_MAX} resends")
        stats["recoveries"] += 1
        stats["recovery_s"] += time.perf_counter() - started

    async def settle_oldest() -> None:
        index, body, records, task = in_flight.popleft()
        if not settled(records, *await task, index):
            await recover(index, (body, records))

    try:
        for index, (body, records) in enumerate(requests):
            if len(in_flight) >= window:
                await settle_oldest()
            in_flight.append((index, body, records, asyncio.ensure_future(one(body))))
        while in_flight:
            await settle_oldest()
    finally:
        for *_, task in in_flight:
            task.cancel()
    return {**stats, "latencies_s": latencies}


async def init_producer(channel: grpc.aio.Channel) -> tuple[int, int]:
    from txlog.v1 import coordinator_pb2, coordinator_pb2_grpc

    reply = await coordinator_pb2_grpc.CoordinatorServiceStub(channel).InitProducerId(
        coordinator_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=30
    )
    return reply.producer_id, reply.producer_epoch


async def create_topic(channel: grpc.aio.Channel, name: str, partitions: int,
                       credentials: grpc.ChannelCredentials | None = None) -> None:
    """Creates the topic and returns once every partition answers at its
    leader. ``credentials``: those ``channel`` was opened with (the leaders
    are dialled the same way)."""
    from txlog.v1 import partition_pb2, partition_pb2_grpc

    stub = partition_pb2_grpc.PartitionServiceStub(channel)
    reply = await stub.CreateTopics(
        partition_pb2.CreateTopicsRequest(topics=[partition_pb2.CreatableTopic(name=name, partition_count=partitions)]), timeout=30
    )
    if reply.results[0].error.code != 0:
        raise RuntimeError(f"CreateTopics {name}: {reply.results[0].error}")
    # The controller elects the partitions' leaders after the topic exists: a
    # pipelined produce before then would see its first batches refused and
    # its later ones out of sequence. Wait until every partition answers at
    # the leader metadata names (with several instances, it need not be the
    # one behind ``channel``): one ListOffsets per leader.
    leaders: dict[str, grpc.aio.Channel] = {}
    deadline = time.monotonic() + 60
    try:
        while True:
            metadata = await stub.Metadata(partition_pb2.MetadataRequest(topics=[name]), timeout=30)
            by_leader: dict[str, list[int]] = {}
            problems = []
            for info in metadata.topics[0].partitions:
                if info.leader_id < 0:
                    problems.append(f"partition {info.partition}: no leader yet")
                else:
                    by_leader.setdefault(info.leader_address, []).append(info.partition)
            for address, led in by_leader.items():
                if address not in leaders:
                    leaders[address] = open_channel(address, credentials)
                answer = await partition_pb2_grpc.PartitionServiceStub(leaders[address]).ListOffsets(partition_pb2.ListOffsetsRequest(
                    partitions=[partition_pb2.ListOffsetsPartition(topic=name, partition=p, spec=partition_pb2.OFFSET_SPEC_LATEST) for p in led]),
                    timeout=30)
                problems += [f"partition {r.partition}: {r.error.message}" for r in answer.results if r.error.code]
            if len(metadata.topics[0].partitions) == partitions and not problems:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: partitions without a leader after 60 s: {problems}")
            await asyncio.sleep(0.05)
    finally:
        for leader in leaders.values():
            await leader.close()


async def timed_produce(
    channel: grpc.aio.Channel, builder: RequestBuilder, sequencer: Sequencer, topic: str, partitions: list[int],
    requests: int, args: argparse.Namespace, pids: dict[str, int],
) -> dict:
    warmup = requests_for(builder, sequencer, topic, [partitions] * args.warmup_batches)
    await send_pipelined(channel, warmup, args.in_flight)
    with Phase(pids) as phase:
        sent = await send_pipelined(channel, requests_for(builder, sequencer, topic, [partitions] * requests), args.in_flight)
    return {
        "partitions": len(partitions),
        "records_per_batch": builder.batch_records,
        "batches_per_request": len(partitions),
        "in_flight_max": args.in_flight,
        "requests": sent["requests"],
        "resends": sent["resends"],
        "resend_reasons": sent["resend_reasons"],
        "request_latency_ms": latency_summary(sent["latencies_s"]),
        "recoveries": sent["recoveries"],
        **phase.rates(sent["records"], RECORD_BYTES),
    }


async def fetch_all(channel: grpc.aio.Channel, topic: str, end_offset: int, max_bytes: int, pids: dict[str, int],
                    form: str = "encoded", stream_chunk_bytes: int = 0) -> dict:
    """Reads partition 0 of ``topic`` from offset 0 to ``end_offset`` with
    sequential Fetch calls, checking that offsets are contiguous. ``form``
    "encoded": batches as stored (FetchRequest.batch_format), each one's CRC
    checked and its records parsed here, as a consumer does; "message":
    RecordBatch messages, which the response's parse decodes. With
    ``stream_chunk_bytes``, each call is a FetchStream of chunks of that size,
    each chunk read as it comes."""
    from txlog.protocol import batch_format
    from txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc

    stub = partition_pb2_grpc.PartitionServiceStub(channel)
    offset = records = calls = 0
    latencies = []
    first_batch = None
    with Phase(pids) as phase:
        while offset < end_offset:
            request = partition_pb2.FetchRequest(
                isolation_level=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED,
                max_wait_ms=0,
                max_bytes=max_bytes,
                partitions=[partition_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=offset)],
                batch_format=partition_pb2.BATCH_FORMAT_ENCODED if form == "encoded" else partition_pb2.BATCH_FORMAT_MESSAGE,
            )
            started = time.perf_counter()
            if stream_chunk_bytes:
                replies = stub.FetchStream(partition_pb2.FetchStreamRequest(fetch=request, chunk_bytes=stream_chunk_bytes),
                                           timeout=CALL_TIMEOUT_S)
            else:
                replies = [await stub.Fetch(request, timeout=CALL_TIMEOUT_S)]
            async for reply in _each(replies):
                result = reply.results[0]
                if result.error.code != 0:
                    raise RuntimeError(f"Fetch at {offset}: {result.error}")
                if form == "encoded":  # (base offset, records) of each batch, its CRC checked and its records parsed
                    batches = []
                    for data in result.encoded_batches:
                        header = batch_format.verified_header(data)
                        batches.append((header.base_offset, batch_format.open_records(data, header, 1 << 30).records))
                else:
                    batches = [(batch.base_offset, batch.records) for batch in result.batches]
                if first_batch is None and batches:
                    first_batch = batches[0][1]
                for base_offset, batch_records in batches:
                    if base_offset != offset:
                        raise RuntimeError(f"Fetch: a batch at offset {base_offset}, {offset} expected")
                    offset += len(batch_records)
                records = offset
                if result.next_fetch_offset != offset or not batches:
                    raise RuntimeError(f"Fetch: next_fetch_offset {result.next_fetch_offset}, {offset} expected")
            latencies.append(time.perf_counter() - started)
            calls += 1
    expected = [(record_key(i), record_value(i)) for i in range(len(first_batch))]
    if [(r.key, r.value) for r in first_batch] != expected:
        raise RuntimeError("Fetch: the records read back are not the ones produced")
    return {
        "batch_format": form,
        "call": "FetchStream" if stream_chunk_bytes else "Fetch",
        "stream_chunk_bytes": stream_chunk_bytes or None,
        "max_bytes": max_bytes,
        "fetch_calls": calls,
        "records_per_call": round(records / calls, 1),
        "fetch_latency_ms": latency_summary(latencies),
        **phase.rates(records, RECORD_BYTES),
    }


async def _each(replies):
    """The replies of a FetchStream (an async iterator) or of a Fetch (a list of one)."""
    if isinstance(replies, list):
        for reply in replies:
            yield reply
    else:
        async for reply in replies:
            yield reply


def open_channel(address: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    """A plaintext channel, or TLS with ``credentials`` (bench/security.py)."""
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, credentials, options=CHANNEL_OPTIONS)


async def measure_service(address: str, args: argparse.Namespace, pids: dict[str, int],
                          credentials: grpc.ChannelCredentials | None = None) -> dict:
    async with open_channel(address, credentials) as channel:
        producer_id, epoch = await init_producer(channel)
        progress(f"producer id {producer_id}, epoch {epoch}")
        for topic, partitions in ((TOPIC_ONE, 1), (TOPIC_ONE_MESSAGE, 1), (TOPIC_FOUR, 4)):
            await create_topic(channel, topic, partitions, credentials)
        builder = RequestBuilder(producer_id, epoch, args.batch_records)
        sequences_one = Sequencer(args.batch_records)  # one producer: its sequences per partition of each topic
        sequences_four = Sequencer(args.batch_records)
        sequences_message = Sequencer(args.batch_records)
        batches = -(-args.records // args.batch_records)

        # the message form first (the form before the encoded one, still accepted: the "before" of this run)
        progress(f"produce, 1 partition, message form: {batches} batches of {args.batch_records} records")
        message_builder = RequestBuilder(producer_id, epoch, args.batch_records, form="message")
        one_message = await timed_produce(channel, message_builder, sequences_message, TOPIC_ONE_MESSAGE, [0], batches, args, pids)
        progress(f"produce, 1 partition, message form: {one_message['mb_per_s']} MB/s")

        progress(f"produce, 1 partition: {batches} batches of {args.batch_records} records, {args.in_flight} in flight")
        one = await timed_produce(channel, builder, sequences_one, TOPIC_ONE, [0], batches, args, pids)
        progress(f"produce, 1 partition: {one['mb_per_s']} MB/s, {one['records_per_s']} records/s")

        requests = -(-batches // 4)
        progress(f"produce, 4 partitions: {requests} requests of 4 batches, {args.in_flight} in flight")
        four = await timed_produce(channel, builder, sequences_four, TOPIC_FOUR, [0, 1, 2, 3], requests, args, pids)
        progress(f"produce, 4 partitions: {four['mb_per_s']} MB/s, {four['records_per_s']} records/s")

        end_offset = sequences_one.next[0]  # every record of the topic is this producer's: sequence == offset
        progress(f"fetch: {end_offset} records of {TOPIC_ONE} from offset 0, max_bytes {args.fetch_max_bytes}")
        fetch_unary = await fetch_all(channel, TOPIC_ONE, end_offset, args.fetch_max_bytes, pids)
        progress(f"fetch, one response a call: {fetch_unary['mb_per_s']} MB/s, {fetch_unary['records_per_s']} records/s")
        fetch = await fetch_all(channel, TOPIC_ONE, end_offset, args.fetch_max_bytes, pids, stream_chunk_bytes=args.stream_chunk_bytes)
        progress(f"fetch, streamed in {args.stream_chunk_bytes}-byte chunks: {fetch['mb_per_s']} MB/s, {fetch['records_per_s']} records/s")
        fetch_message = await fetch_all(channel, TOPIC_ONE_MESSAGE, sequences_message.next[0], args.fetch_max_bytes, pids,
                                        form="message")
        progress(f"fetch, message form: {fetch_message['mb_per_s']} MB/s")
        await create_topic(channel, TOPIC_CLIENT, 1, credentials)
    return {
        "producer_id": producer_id,
        "produce_one_partition": one,
        "produce_four_partitions": four,
        "fetch_one_partition": fetch,  # the fetch clients make: a FetchStream
        "fetch_one_partition_one_response_a_call": fetch_unary,
        "message_form": {"produce_one_partition": one_message, "fetch_one_partition": fetch_message},
    }


def measure_client_producer(bootstrap: str, args: argparse.Namespace, pids: dict[str, int]) -> dict:
    """txlog.Producer, if it exists: a send() loop and flush()."""
    try:
        from txlog import Producer
    except ImportError as exc:
        return {"records_per_s": None, "mb_per_s": None, "reason": f"txlog.Producer does not import: {exc}"}
    keys = [record_key(i) for i in range(args.batch_records)]
    values = [record_value(i) for i in range(args.batch_records)]
    producer = None
    try:
        producer = Producer(bootstrap)
        warmup = args.warmup_batches * args.batch_records
        for i in range(warmup):
            producer.send(TOPIC_CLIENT, key=keys[i % args.batch_records], value=values[i % args.batch_records])
        producer.flush()
        with Phase(pids) as phase:
            for i in range(args.records):
                producer.send(TOPIC_CLIENT, key=keys[i % args.batch_records], value=values[i % args.batch_records])
            producer.flush()
        return {"api": "Producer(bootstrap).send(topic, key=, value=) loop + flush()", **phase.rates(args.records, RECORD_BYTES)}
    except Exception as exc:  # the SDK is being written: report what happened, keep the other figures
        return {
            "records_per_s": None,
            "mb_per_s": None,
            "reason": f"txlog.Producer imports but the run failed: {type(exc).__name__}: {exc}",
            "traceback_tail": traceback.format_exc().strip().splitlines()[-3:],
        }
    finally:
        if producer is not None and hasattr(producer, "close"):
            try:
                producer.close()
            except Exception as exc:
                progress(f"Producer.close() failed: {exc!r}")


# --- memory --------------------------------------------------------------------------------------


async def memory_workload(address: str, pid: int, args: argparse.Namespace) -> dict:
    partitions = list(range(args.memory_partitions))
    groups_per_round = [
        partitions[i : i + MEMORY_PARTITIONS_PER_REQUEST] for i in range(0, len(partitions), MEMORY_PARTITIONS_PER_REQUEST)
    ]
    rounds = args.memory_records // args.batch_records
    started = memory_status(pid)
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        producer_id, epoch = await init_producer(channel)
        await create_topic(channel, TOPIC_MEMORY, args.memory_partitions)
        after_create = memory_status(pid)
        builder = RequestBuilder(producer_id, epoch, args.batch_records)
        sequencer = Sequencer(args.batch_records)
        with Phase({"partition_svc": pid}) as phase:
            sent = await send_pipelined(
                channel, requests_for(builder, sequencer, TOPIC_MEMORY, groups_per_round * rounds), args.in_flight
            )
    after_produce = memory_status(pid)
    await asyncio.sleep(5)
    after_idle = memory_status(pid)
    return {
        "partitions": args.memory_partitions,
        "records_per_partition": args.memory_records,
        "records_per_batch": args.batch_records,
        "batches_per_request": MEMORY_PARTITIONS_PER_REQUEST,
        "in_flight_max": args.in_flight,
        "resends": sent["resends"],
        "produce": phase.rates(sent["records"], RECORD_BYTES),
        "partition_svc_started": in_mb(started),
        "partition_svc_after_create_topic": in_mb(after_create),
        "partition_svc_after_produce": in_mb(after_produce),
        "partition_svc_after_5s_idle": in_mb(after_idle),
        "vm_rss_mb": round(after_produce["VmRSS"] / MB, 1),
    }


def measure_memory(workdir: str, args: argparse.Namespace) -> dict:
    from services.tooling.cluster import LocalCluster

    cluster = LocalCluster(os.path.join(workdir, "memory-cluster"))
    try:
        progress("memory: starting a fresh cluster (1 producer_id_svc, 1 partition_svc)")
        cluster.up(producer_id_svcs=1, partition_svcs=1)
        service = cluster.state.services[SERVICE]
        progress(
            f"memory: {args.memory_partitions} partitions x {args.memory_records} records "
            f"({args.memory_partitions * args.memory_records * RECORD_BYTES / MB:.0f} MB)"
        )
        result = asyncio.run(memory_workload(service.address, service.pid, args))
        progress(f"memory: partition_svc VmRSS {result['vm_rss_mb']} MB after the produce")
        return result
    finally:
        progress("memory: stopping the cluster")
        cluster.down()


# --- report --------------------------------------------------------------------------------------


def ratio(numerator: float | None, denominator: float) -> float | None:
    return None if numerator is None else round(numerator / denominator, 4)


def targets(service: dict, rocksdb_mb_per_s: float, grpc: dict, memory: dict | None) -> dict:
    produce = service["produce_one_partition"]["mb_per_s"]
    fetch = service["fetch_one_partition"]["mb_per_s"]
    echo, upload, download = (grpc[mode]["mb_per_s"] for mode in ("echo", "upload", "download"))
    result = {
        "produce_one_partition_vs_raw_rocksdb_synced": {
            "target": f"produce MB/s (1 partition) >= {RATIO_TARGET:.0%} of raw synced RocksDB WriteBatch MB/s",
            "actual": ratio(produce, rocksdb_mb_per_s),
            "met": produce / rocksdb_mb_per_s >= RATIO_TARGET,
        },
        "produce_one_partition_vs_raw_grpc_stream": {
            "target": f"produce MB/s (1 partition) >= {RATIO_TARGET:.0%} of the raw gRPC bidi echo stream, MB/s one-way",
            "actual": ratio(produce, echo),
            "met": produce / echo >= RATIO_TARGET,
            "vs_upload_stream_with_small_acks": ratio(produce, upload),
        },
        "fetch_vs_raw_grpc_stream": {
            "target": f"fetch MB/s >= {RATIO_TARGET:.0%} of the raw gRPC bidi echo stream, MB/s one-way",
            "actual": ratio(fetch, echo),
            "met": fetch / echo >= RATIO_TARGET,
            "vs_download_stream": ratio(fetch, download),
        },
    }
    if memory is not None:
        result["partition_svc_rss_after_100_partitions"] = {
            "target": f"partition_svc VmRSS <= {RSS_TARGET_BYTES / MB:.0f} MB after {memory['partitions']} partitions x "
            f"{memory['records_per_partition']} records",
            "actual_mb": memory["vm_rss_mb"],
            "met": memory["vm_rss_mb"] * MB <= RSS_TARGET_BYTES,
        }
    return result


def measure(workdir: str, args: argparse.Namespace) -> dict:
    from services.tooling.cluster import LocalCluster

    cluster = LocalCluster(os.path.join(workdir, "cluster"))
    rocksdb_path = os.path.join(workdir, "raw-rocksdb")
    try:
        progress(f"starting ZooKeeper, 1 producer_id_svc, 1 partition_svc in {cluster.dir}")
        cluster.up(producer_id_svcs=1, partition_svcs=1)
        service = cluster.state.services[SERVICE]
        with EchoServer() as echo:
            pids = {"bench": os.getpid(), "partition_svc": service.pid}
            raw_pids = {"bench": os.getpid(), "echo_server": echo.pid}
            baselines = {}
            for when in ("before", "after"):
                if when == "after":
                    service_figures = asyncio.run(measure_service(service.address, args, pids))
                    progress("produce through txlog.Producer (if it exists)")
                    client = measure_client_producer(cluster.state.bootstrap, args, pids)
                    progress(f"client Producer: {client.get('mb_per_s')} MB/s {client.get('reason', '')}")
                progress(f"baseline ({when} the service runs): raw RocksDB, synced WriteBatch of {args.batch_records} puts")
                rocks = measure_raw_rocksdb(rocksdb_path, args.records, args.batch_records, args.warmup_batches, {"bench": os.getpid()})
                progress(f"raw RocksDB: {rocks['mb_per_s']} MB/s")
                progress(f"baseline ({when} the service runs): raw gRPC streams, {args.batch_records * RECORD_BYTES} B messages")
                streams = asyncio.run(measure_raw_grpc(echo.address, args.records, args.batch_records, args.warmup_batches, raw_pids))
                progress("raw gRPC: " + ", ".join(f"{mode} {r['mb_per_s']} MB/s" for mode, r in streams.items()))
                baselines[when] = {"rocksdb": rocks, "grpc": streams}
    finally:
        progress("stopping the cluster")
        cluster.down()
    rocksdb_mb = mean_of(baselines["before"]["rocksdb"], baselines["after"]["rocksdb"])
    grpc_mb = {mode: {"mb_per_s": mean_of(baselines["before"]["grpc"][mode], baselines["after"]["grpc"][mode])} for mode in ("echo", "upload", "download")}
    memory = None if args.skip_memory else measure_memory(workdir, args)
    produce = service_figures["produce_one_partition"]["mb_per_s"]
    fetch = service_figures["fetch_one_partition"]["mb_per_s"]
    return {
        "baselines": {
            "raw_rocksdb_synced_write_batches": {
                "mb_per_s": rocksdb_mb,
                "records_per_s": mean_of(baselines["before"]["rocksdb"], baselines["after"]["rocksdb"], "records_per_s"),
                "before_service_runs": baselines["before"]["rocksdb"],
                "after_service_runs": baselines["after"]["rocksdb"],
            },
            "raw_grpc_streams": {
                mode: {
                    "mb_per_s": grpc_mb[mode]["mb_per_s"],
                    "before_service_runs": baselines["before"]["grpc"][mode],
                    "after_service_runs": baselines["after"]["grpc"][mode],
                }
                for mode in ("echo", "upload", "download")
            },
        },
        "service": {**service_figures, "produce_client_producer": client},
        "memory": memory if memory is not None else {"skipped": True},
        "ratios": {
            "produce_one_partition_mb_vs_raw_rocksdb_synced_mb": ratio(produce, rocksdb_mb),
            "produce_one_partition_mb_vs_raw_grpc_echo_mb": ratio(produce, grpc_mb["echo"]["mb_per_s"]),
            "fetch_mb_vs_raw_grpc_echo_mb": ratio(fetch, grpc_mb["echo"]["mb_per_s"]),
            "produce_four_partitions_mb_vs_raw_rocksdb_synced_mb": ratio(service_figures["produce_four_partitions"]["mb_per_s"], rocksdb_mb),
            "produce_one_partition_mb_vs_raw_grpc_upload_mb": ratio(produce, grpc_mb["upload"]["mb_per_s"]),
            "fetch_mb_vs_raw_grpc_download_mb": ratio(fetch, grpc_mb["download"]["mb_per_s"]),
            # one Fetch response a call instead of a FetchStream's chunks (the fetch before streaming), same run
            "one_response_a_call_fetch_mb_vs_raw_grpc_echo_mb": ratio(
                service_figures["fetch_one_partition_one_response_a_call"]["mb_per_s"], grpc_mb["echo"]["mb_per_s"]),
            "one_response_a_call_fetch_mb_vs_raw_grpc_download_mb": ratio(
                service_figures["fetch_one_partition_one_response_a_call"]["mb_per_s"], grpc_mb["download"]["mb_per_s"]),
            "client_producer_mb_vs_hand_built_one_partition_mb": ratio(client.get("mb_per_s"), produce),
            # the same figures in the message form (PartitionBatch.batch, FetchPartitionResult.batches): the form
            # before batches were stored as sent, measured in the same run
            "message_form_produce_one_partition_mb_vs_raw_rocksdb_synced_mb": ratio(
                service_figures["message_form"]["produce_one_partition"]["mb_per_s"], rocksdb_mb),
            "message_form_fetch_mb_vs_raw_grpc_echo_mb": ratio(
                service_figures["message_form"]["fetch_one_partition"]["mb_per_s"], grpc_mb["echo"]["mb_per_s"]),
            # the best produce/echo ratio a service bound by synced RocksDB writes could reach on this machine
            "ceiling_raw_rocksdb_synced_mb_vs_raw_grpc_echo_mb": ratio(rocksdb_mb, grpc_mb["echo"]["mb_per_s"]),
        },
        "targets": targets(service_figures, rocksdb_mb, grpc_mb, memory),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve_echo:
        return echo_server_main()
    with tempfile.TemporaryDirectory(prefix="txlog-bench-") as workdir:
        figures = measure(workdir, args)
    report = {
        "benchmark": "partition_svc idempotent produce and fetch, 1 KB records",
        "parameters": {
            "records": args.records,
            "key_bytes": KEY_BYTES,
            "value_bytes": VALUE_BYTES,
            "records_per_batch": args.batch_records,
            "in_flight_max": args.in_flight,
            "warmup_batches": args.warmup_batches,
            "fetch_max_bytes": args.fetch_max_bytes,
            "acks": -1,
            "fsync": True,
            "mb": "10^6 bytes of payload (key + value)",
        },
        "machine": {"cpus": os.cpu_count()},
        **figures,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
