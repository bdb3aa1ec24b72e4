"""Records sent through the Producer are encoded once in send() and their
futures resolved per batch (accumulator.py: BatchOutcome, RecordFuture): each
record still lands with its own fields, each future gets its own offset, and a
refused batch fails every future of it, each callback running once."""

import threading

from fake_cluster import FakeCluster

from txlog import Producer
from txlog.errors import ClientError
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition

E = ErrorCode.Value
TP = TopicPartition("t", 0)


def _producer(fake, **kwargs):
    options = {"retry_backoff_ms": 1, "retry_backoff_max_ms": 5, "linger_ms": 1, **kwargs}
    return Producer(fake.addresses[0], transport=fake, **options)


def test_each_record_lands_with_its_own_fields_and_its_future_gets_its_offset():
    fake = FakeCluster({"t": 1})
    sent = []
    with _producer(fake, batch_records_max=7) as producer:
        for i in range(40):
            key = None if i % 3 == 0 else f"k{i}".encode()
            value = None if i % 5 == 0 else f"v{i}".encode() * i
            headers = [("h", f"{i}".encode()), ("", None)] if i % 4 == 0 else None
            timestamp_ms = 1_700_000_000_000 + i if i % 2 else None
            sent.append((producer.send("t", value, key=key, headers=headers, timestamp_ms=timestamp_ms),
                         key, value, headers, timestamp_ms))
        producer.flush(timeout_s=30)
        assert producer.stats.batches_sent >= 40 // 7
    for index, (future, key, value, headers, timestamp_ms) in enumerate(sent):
        metadata = future.result(timeout=0)
        assert (metadata.topic, metadata.partition, metadata.offset) == ("t", 0, index)
        stored = fake.partitions[TP].records[metadata.offset]
        assert (stored.key if stored.HasField("key") else None) == key
        assert (stored.value if stored.HasField("value") else None) == value
        assert [(h.key, h.value if h.HasField("value") else None) for h in stored.headers] == (headers or [])
        assert stored.timestamp_ms == (timestamp_ms or 0)
        assert metadata.timestamp_ms == (timestamp_ms or -1)  # the fake answers no append time


def test_a_refused_batch_fails_every_record_and_each_callback_runs_once():
    fake = FakeCluster({"t": 1})
    fake.fail_produce(0, lambda tp: E("INVALID_RECORD"))  # not retriable: the batch fails whole
    calls: dict[int, int] = {}
    lock = threading.Lock()

    def called(index):
        def callback(future):
            with lock:
                calls[index] = calls.get(index, 0) + 1
        return callback

    with _producer(fake, linger_ms=10_000, batch_records_max=5) as producer:
        futures = [producer.send("t", f"v{i}".encode()) for i in range(8)]
        for index, future in enumerate(futures):
            future.add_done_callback(called(index))
        producer.flush(timeout_s=30)
    failed, landed = futures[:5], futures[5:]
    assert all(isinstance(f.exception(0), ClientError) and f.exception(0).code == E("INVALID_RECORD") for f in failed)
    assert [f.result(0).offset for f in landed] == [0, 1, 2]
    assert calls == dict.fromkeys(range(8), 1)
    assert fake.values(TP) == [b"v5", b"v6", b"v7"]


class _SizedFake(FakeCluster):
    """Keeps the encoded size of every Produce request it is sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.produce_bytes: list[int] = []

    async def call(self, address, rpc, request, *, timeout_ms=None):
        if rpc == "Produce":
            self.produce_bytes.append(request.ByteSize())
        return await super().call(address, rpc, request, timeout_ms=timeout_ms)


def test_no_request_exceeds_max_request_size_with_the_longest_topic_name():
    topic = "t" * 249  # the longest name: each batch's topic field counts against the request
    fake = _SizedFake({topic: 4})
    limit = 20_000
    with _producer(fake, max_request_size_bytes=limit, batch_size_bytes=limit, linger_ms=50) as producer:
        largest = producer._record_bytes_max - 16  # the record's own tags and lengths on top of its value
        futures = [producer.send(topic, b"v" * (largest if i % 7 == 0 else 900 + i), partition=i % 4) for i in range(60)]
        producer.flush(timeout_s=30)
    assert all(f.exception(timeout=0) is None for f in futures)
    assert fake.produce_bytes and max(fake.produce_bytes) <= limit, sorted(fake.produce_bytes)[-3:]
