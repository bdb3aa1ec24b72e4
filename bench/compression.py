"""Benchmark: compressed batches (issue 17), each codec against none in the same run.

What it measures, for compressible 1 KB records (an 8-byte key and a 1024-byte
JSON-like value: event fields of a few hundred distinct users, paths and
agents, as application logs look), on a local cluster started for the run
(ZooKeeper, one producer_id_svc and one partition_svc as real processes):

* produce: ``txlog.Producer(compression_type=codec)``, idempotent,
  acks=all, fsync on, a send() loop of ``--records`` records to one partition
  and flush(); records/s, MB/s of uncompressed payload, and the CPU seconds of
  this process (which compresses) and of partition_svc (which decompresses
  once to check every record, and stores the producer's bytes);
* stored bytes: what the partition's log holds, the sum of its stored
  batches as a Fetch listing every codec in accepted_compressions returns them
  (the bytes on disk, as the leader stored them, plus a few bytes of
  leader-epoch field each), and per record;
* consume: ``txlog.Consumer`` reading the partition back from offset 0
  (the consumer accepts every codec and decompresses); records/s and MB/s;
* ratios against none, in the same run: stored bytes (smaller is better),
  produce MB/s and consume MB/s (the cost or gain of the codec).

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.compression [--records N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import grpc

from bench.measure import Phase, progress
from txlog.protocol import compression
from txlog.v1 import partition_pb2, partition_pb2_grpc

KEY_BYTES = 8
VALUE_BYTES = 1024
RECORD_BYTES = KEY_BYTES + VALUE_BYTES
CODECS = ("none", "gzip", "zstd", "lz4")
SERVICE = "partition_svc-0"
CONSUME_TIMEOUT_S = 300
WARMUP_RECORDS = 10_000


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per codec (default 100,000: ~100 MB)")
    parser.add_argument("--seed", type=int, default=17)
    return parser.parse_args(argv)


def record_value(rng: random.Random, i: int) -> bytes:
    """A JSON-like event padded to exactly VALUE_BYTES with more of its kind."""
    fields = []
    while len(", ".join(fields)) < VALUE_BYTES:
        fields.append(json.dumps({
            "seq": i, "user": f"user-{rng.randrange(500):04d}", "event": rng.choice(("view", "click", "buy", "search")),
            "path": rng.choice(("/", "/catalog", "/catalog/items", "/cart", "/checkout", "/account/orders")),
            "agent": rng.choice(("Mozilla/5.0 (X11; Linux x86_64)", "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5)",
                                 "curl/8.5.0")),
            "ms": rng.randrange(1000), "ok": rng.random() < 0.97}))
    return ", ".join(fields).encode()[:VALUE_BYTES]


def stored_bytes(address: str, topic: str) -> tuple[int, int]:
    """(stored bytes, batches) of partition 0: its batches as a Fetch accepting every codec returns them."""
    total = batches = offset = 0
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 << 20)]) as channel:
        stub = partition_pb2_grpc.PartitionServiceStub(channel)
        while True:
            reply = stub.Fetch(partition_pb2.FetchRequest(
                accepted_compressions=sorted(compression.CODECS), max_bytes=64 << 20,
                partitions=[partition_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=offset)]), timeout=60)
            result = reply.results[0]
            if result.error.code or not result.batches:
                return total, batches
            total += sum(b.ByteSize() for b in result.batches)
            batches += len(result.batches)
            offset = result.next_fetch_offset


def measure_codec(cluster, codec: str, keys: list[bytes], values: list[bytes], records: int, pids: dict[str, int]) -> dict:
    from txlog import Admin, Consumer, Producer

    topic, warmup = f"bench-compression-{codec}", f"bench-compression-{codec}-warmup"
    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([(topic, 1), (warmup, 1)])
    with Producer(cluster.state.bootstrap, compression_type=codec) as producer:
        for i in range(min(records, WARMUP_RECORDS)):  # connections, producer id, the codec's first use
            producer.send(warmup, key=keys[i % len(keys)], value=values[i % len(values)], partition=0)
        producer.flush()
        producer.send(topic, key=keys[0], value=values[0], partition=0).result(timeout=60)  # its metadata, not timed
        with Phase(pids) as produce:
            for i in range(1, records):
                producer.send(topic, key=keys[i % len(keys)], value=values[i % len(values)], partition=0)
            producer.flush()
    stored, batches = stored_bytes(cluster.state.services[SERVICE].address, topic)
    got = 0
    with Consumer(cluster.state.bootstrap, fetch_max_wait_ms=100) as consumer:
        consumer.assign([(topic, 0)])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        with Phase(pids) as consume:
            while got < records and time.monotonic() < deadline:
                got += len(consumer.poll(timeout_s=1))
    if got != records:
        raise RuntimeError(f"{codec}: consumed {got} of {records} records")
    return {
        "produce": produce.rates(records, RECORD_BYTES),
        "consume": consume.rates(records, RECORD_BYTES),
        "stored_bytes": stored,
        "stored_batches": batches,
        "stored_bytes_per_record": round(stored / records, 1),
    }


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a and b else None


def main(argv=None) -> int:
    args = parse_args(argv)
    from services.tooling.cluster import LocalCluster

    rng = random.Random(args.seed)
    keys = [b"%08d" % i for i in range(1000)]
    values = [record_value(rng, i) for i in range(1000)]
    figures = {}
    with tempfile.TemporaryDirectory(prefix="txlog-bench-compression-") as workdir:
        cluster = LocalCluster(os.path.join(workdir, "cluster"))
        try:
            progress(f"starting ZooKeeper, 1 producer_id_svc, 1 partition_svc in {cluster.dir}")
            cluster.up(producer_id_svcs=1, partition_svcs=1)
            pids = {"bench": os.getpid(), "partition_svc": cluster.state.services[SERVICE].pid}
            for codec in CODECS:
                progress(f"{codec}: producing {args.records} records, then consuming them")
                figures[codec] = measure_codec(cluster, codec, keys, values, args.records, pids)
                progress(f"{codec}: produce {figures[codec]['produce']['mb_per_s']} MB/s, "
                         f"consume {figures[codec]['consume']['mb_per_s']} MB/s, stored {figures[codec]['stored_bytes']} B")
        finally:
            progress("stopping the cluster")
            cluster.down()
    none = figures["none"]
    report = {
        "benchmark": "compressed batches per codec vs none, compressible 1 KB records, SDK producer and consumer",
        "parameters": {"records": args.records, "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES, "acks": -1,
                       "idempotent": True, "fsync": True, "mb": "10^6 bytes of uncompressed payload (key + value)"},
        "machine": {"cpus": os.cpu_count()},
        "codecs": figures,
        "ratios_vs_none": {
            codec: {
                "stored_bytes": ratio(figures[codec]["stored_bytes"], none["stored_bytes"]),
                "produce_mb_per_s": ratio(figures[codec]["produce"]["mb_per_s"], none["produce"]["mb_per_s"]),
                "consume_mb_per_s": ratio(figures[codec]["consume"]["mb_per_s"], none["consume"]["mb_per_s"]),
            }
            for codec in CODECS if codec != "none"
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
