"""Compressed batches through the real services (issue 17): three
partition_svc processes, a coordinator, topics with three replicas. Each codec
stores an idempotent producer's batches compressed (smaller than the same
records plain), a consumer reads every record once with its offset, timestamp
and headers (from the middle of a batch too), a reader that does not list
the codec (an old or foreign client) gets plain records with offsets, an aborted
compressed transaction stays hidden from read_committed, a topic's
compression.type re-encodes, and after the leader is killed the new one serves
the very bytes the old one stored.

The leader kill comes last: the cluster is shared by the module.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from services.tooling.cluster import LocalCluster
from tests.integ.raw import Raw
from tests.integ.test_replication import FAST, create, fully_replicated, name_of, partition_meta, wait_for
from txlog import Admin, AIOProducer, Consumer, Producer
from txlog.protocol import compression
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2

CODECS = ["gzip", "zstd", "lz4"]
ALL = sorted(compression.CODECS)
BASE_TIME_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("compression") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=1, service_args={"partition_svc": FAST})
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)


@pytest.fixture(scope="module")
def raw(cluster):
    client = Raw(cluster)
    yield client
    client.close()


def value_of(i: int) -> bytes:
    """Compressible, JSON-like, about 300 bytes."""
    return json.dumps({"id": i, "user": f"user-{i % 17}", "event": "page_view", "path": "/catalog/items?page=2",
                       "agent": "Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0",
                       "tags": ["alpha", "beta", "gamma"], "ok": True}).encode()


def produce(bootstrap: str, topic: str, count: int, compression_type: str, **options) -> list:
    """``count`` records to partition 0, odd ones with a timestamp of their own, even ones with none (the
    leader's append time); answers their RecordMetadata."""
    with Producer(bootstrap, compression_type=compression_type, linger_ms=20, batch_records_max=200, **options) as producer:
        futures = [producer.send(topic, value_of(i), key=f"k{i}", headers=[("n", str(i).encode())], partition=0,
                                 timestamp_ms=BASE_TIME_MS + i if i % 2 else None)
                   for i in range(count)]
        producer.flush(timeout_s=60)
        return [f.result(timeout=0) for f in futures]


def consume(bootstrap: str, topic: str, expected: int, start: int = 0, **options) -> list:
    records = []
    with Consumer(bootstrap, fetch_max_wait_ms=100, **options) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek((topic, 0), start)
        deadline = time.monotonic() + 60
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(timeout_s=1)
        records += consumer.poll(timeout_s=0.3)  # nothing more may come
    return records


def raw_batches(raw: Raw, topic: str, offset: int = 0, accepted=(), stub=None) -> list[common_pb2.RecordBatch] | None:
    """Every batch from ``offset`` on as a raw Fetch answers it, listing ``accepted`` codecs (None: an error)."""
    batches = []
    while True:
        result = raw.fetch(topic, 0, offset, accepted_compressions=list(accepted), stub=stub)
        if result.error.code != 0:
            return None
        if not result.batches:
            return batches
        batches += result.batches
        offset = result.next_fetch_offset


def stored_bytes(raw: Raw, topic: str) -> int:
    """The partition's batches as the leader stored them: a fetch accepting every codec returns them as
    they are (plus a leader-epoch field of a few bytes each)."""
    return sum(b.ByteSize() for b in raw_batches(raw, topic, accepted=ALL))


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_stores_an_idempotent_producers_batches_compressed_and_consumers_read_each_record_once(cluster, raw, codec):
    bootstrap, count = cluster.state.bootstrap, 1000
    create(bootstrap, f"plain-{codec}", 1, 3)
    create(bootstrap, f"packed-{codec}", 1, 3)
    produce(bootstrap, f"plain-{codec}", count, "none")
    sent = produce(bootstrap, f"packed-{codec}", count, codec)
    assert [m.offset for m in sent] == list(range(count))

    stored = raw_batches(raw, f"packed-{codec}", accepted=ALL)
    assert stored and {b.compression for b in stored} == {compression.CODEC_BY_NAME[codec]}
    assert all(not b.records and b.log_append_time_ms > 0 for b in stored)
    plain, packed = stored_bytes(raw, f"plain-{codec}"), stored_bytes(raw, f"packed-{codec}")
    assert packed < plain / 3, (plain, packed)

    records = consume(bootstrap, f"packed-{codec}", count)
    assert [r.offset for r in records] == list(range(count))  # every record once, in order
    for i, record in enumerate(records):
        assert (record.key, record.value, record.headers) == (f"k{i}".encode(), value_of(i), [("n", str(i).encode())])
        assert record.timestamp_ms == (BASE_TIME_MS + i if i % 2 else sent[i].timestamp_ms)
        assert record.timestamp_ms > 0
    middle = consume(bootstrap, f"packed-{codec}", count - 37, start=37)  # inside the first batch
    assert [r.offset for r in middle] == list(range(37, count))

    # a reader listing no codec (every client before compression): plain records with offsets, from its offset
    old = raw_batches(raw, f"packed-{codec}", offset=37)
    assert all(not b.compression and not b.compressed_records for b in old)
    assert [(r.offset, r.value, r.timestamp_ms) for b in old for r in b.records] == [
        (r.offset, r.value, r.timestamp_ms) for r in middle]


def test_an_aborted_compressed_transaction_is_hidden_from_read_committed(cluster, raw):
    bootstrap = cluster.state.bootstrap
    create(bootstrap, "txn-packed", 1, 3)
    with Producer(bootstrap, transactional_id="packed-tx", compression_type="zstd", linger_ms=5) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(50):
            producer.send("txn-packed", b"aborted-%d" % i, partition=0)
        producer.flush(timeout_s=30)
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(50):
            producer.send("txn-packed", b"committed-%d" % i, partition=0)
        producer.commit_transaction()
    stored = raw_batches(raw, "txn-packed", accepted=ALL)
    assert {b.compression for b in stored} == {common_pb2.COMPRESSION_ZSTD} and all(b.is_transactional for b in stored)
    committed = consume(bootstrap, "txn-packed", 50, isolation_level="read_committed")
    assert [r.value for r in committed] == [b"committed-%d" % i for i in range(50)]
    everything = consume(bootstrap, "txn-packed", 100, isolation_level="read_uncommitted")
    assert len(everything) == 100


def test_a_gzip_topic_stores_an_uncompressed_producers_batches_compressed(cluster, raw):
    bootstrap = cluster.state.bootstrap
    create(bootstrap, "gzip-topic", 1, 3, **{"compression.type": "gzip"})
    produce(bootstrap, "gzip-topic", 300, "none")
    stored = raw_batches(raw, "gzip-topic", accepted=ALL)
    assert {b.compression for b in stored} == {common_pb2.COMPRESSION_GZIP}
    assert [r.value for r in consume(bootstrap, "gzip-topic", 300)] == [value_of(i) for i in range(300)]
    with Admin(bootstrap) as admin:  # altered: batches from now on are stored plain, the old ones stay
        assert admin.alter_topic_configs("gzip-topic", {"compression.type": "uncompressed"})["compression.type"] == "uncompressed"
        with pytest.raises(Exception, match="compression.type must be one of"):
            admin.alter_topic_configs("gzip-topic", {"compression.type": "snappy"})

    def stored_plain() -> bool:  # every replica takes the change within partition_state_refresh_ms
        produce(bootstrap, "gzip-topic", 1, "zstd")
        return raw_batches(raw, "gzip-topic", accepted=ALL)[-1].compression == common_pb2.COMPRESSION_NONE
    wait_for(stored_plain, what="the altered compression.type")


def test_the_cli_produces_compressed_and_creates_a_zstd_topic(cluster, raw):
    where = ("--dir", str(cluster.dir))

    def txlog(*args, stdin=None):
        result = subprocess.run([sys.executable, "-m", "txlog.cli", *args, *where], input=stdin, capture_output=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr.decode()
        return result

    txlog("topics", "create", "cli-zstd", "--partitions", "1", "--config", "compression.type=zstd")
    txlog("produce", "cli-zstd", stdin=b"".join(b"line %d\n" % i for i in range(100)))
    txlog("topics", "create", "cli-lz4", "--partitions", "1")
    txlog("produce", "cli-lz4", "--compression-type", "lz4", stdin=b"".join(b"line %d\n" % i for i in range(100)))
    for topic, codec in (("cli-zstd", common_pb2.COMPRESSION_ZSTD), ("cli-lz4", common_pb2.COMPRESSION_LZ4)):
        stored = raw_batches(raw, topic, accepted=ALL)
        assert {b.compression for b in stored} == {codec}
        assert [r.value for r in consume(cluster.state.bootstrap, topic, 100)] == [b"line %d" % i for i in range(100)]


def test_the_asyncio_producer_takes_the_compression_type_too(cluster, raw):
    bootstrap = cluster.state.bootstrap
    create(bootstrap, "aio-gzip", 1, 3)

    async def send() -> list:
        async with AIOProducer(bootstrap, compression_type="gzip", linger_ms=5) as producer:
            return [await producer.send_and_wait("aio-gzip", value_of(i), partition=0) for i in range(20)]
    sent = asyncio.run(send())
    assert [m.offset for m in sent] == list(range(20))
    assert {b.compression for b in raw_batches(raw, "aio-gzip", accepted=ALL)} == {common_pb2.COMPRESSION_GZIP}
    assert [r.value for r in consume(bootstrap, "aio-gzip", 20)] == [value_of(i) for i in range(20)]


def test_garbage_compressed_records_are_refused_and_nothing_is_stored(cluster, raw):
    bootstrap = cluster.state.bootstrap
    create(bootstrap, "garbage", 1, 3)
    bomb = compression.compress(common_pb2.COMPRESSION_ZSTD, bytes(64 << 20))
    for codec, data in ((common_pb2.COMPRESSION_GZIP, b"not gzip at all"), (common_pb2.COMPRESSION_ZSTD, bomb)):
        result = raw.produce("garbage", 0, common_pb2.RecordBatch(compression=codec, compressed_records=data))
        assert result.error.code == ErrorCode.Value("INVALID_RECORD") and "compressed_records" in result.error.message, result.error
    assert raw.fetch("garbage", 0, 0).high_watermark == 0


def test_a_new_leader_after_a_kill_serves_the_bytes_the_old_one_stored(cluster, raw):
    bootstrap = cluster.state.bootstrap
    create(bootstrap, "failover-packed", 1, 3)
    first = wait_for(lambda: fully_replicated(raw, "failover-packed", 0), what="every replica in sync")
    produce(bootstrap, "failover-packed", 500, "lz4")
    before = raw_batches(raw, "failover-packed", accepted=ALL)
    assert before and {b.compression for b in before} == {common_pb2.COMPRESSION_LZ4}
    cluster.kill(name_of(first.leader_id))

    def new_leader():
        meta = partition_meta(raw, "failover-packed", 0)
        return meta if meta.error.code == 0 and meta.leader_id != first.leader_id and meta.leader_address else None
    after_meta = wait_for(new_leader, what="a new leader")
    after = wait_for(lambda: raw_batches(raw, "failover-packed", accepted=ALL, stub=raw.stub(after_meta.leader_address)),
                     what="the new leader's batches")
    assert [(b.base_offset, b.compressed_records, b.log_append_time_ms) for b in after] == [
        (b.base_offset, b.compressed_records, b.log_append_time_ms) for b in before]
    assert [r.value for r in consume(bootstrap, "failover-packed", 500)] == [value_of(i) for i in range(500)]
