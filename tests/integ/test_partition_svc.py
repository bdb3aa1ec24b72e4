"""partition_svc through raw gRPC: idempotence rules, recovery after kill -9,
bad input, placement, long polls, offsets, retention and compaction."""

import threading
import time

import grpc
import pytest
from support.errors import error_name
from support.reads import record_values
from support.waiting import wait_until

from tests.integ.raw import Raw, batch, plain_batch
from txlog.protocol import errors
from txlog.protocol.retry import RetryPolicy
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, errors_pb2, partition_pb2

LATEST, EARLIEST, LSO, BY_TIME = (
    partition_pb2.OFFSET_SPEC_LATEST,
    partition_pb2.OFFSET_SPEC_EARLIEST,
    partition_pb2.OFFSET_SPEC_LAST_STABLE,
    partition_pb2.OFFSET_SPEC_TIMESTAMP,
)


@pytest.fixture
def raw(txlog_cluster):
    with Raw(txlog_cluster) as client:
        yield client


@pytest.fixture(scope="module")
def shared_raw(shared_txlog_cluster):
    """For the tests that each work on topics and groups of their own and stop nothing: one cluster for them all."""
    with Raw(shared_txlog_cluster) as client:
        yield client


def test_sequence_rules_over_raw_grpc(shared_raw):
    shared_raw.create_topic("seq", 1)
    pid = shared_raw.producer_id()
    first = shared_raw.produce("seq", 0, batch(pid, 0, ["a", "b"]))
    assert error_name(first) == "NONE" and first.base_offset == 0
    again = shared_raw.produce("seq", 0, batch(pid, 0, ["a", "b"]))  # duplicate: original offsets, nothing appended
    assert error_name(again) == "NONE" and again.base_offset == 0
    assert error_name(shared_raw.produce("seq", 0, batch(pid, 5, ["gap"]))) == "OUT_OF_ORDER_SEQUENCE"
    assert error_name(shared_raw.produce("seq", 0, batch(shared_raw.producer_id(), 3, ["x"]))) == "UNKNOWN_PRODUCER_ID"
    for i in range(1, 7):  # 6 more batches push the first out of the 5-batch cache
        assert error_name(shared_raw.produce("seq", 0, batch(pid, 2 * i, ["c", "d"]))) == "NONE"
    assert error_name(shared_raw.produce("seq", 0, batch(pid, 0, ["a", "b"]))) == "DUPLICATE_SEQUENCE"
    cached = shared_raw.produce("seq", 0, batch(pid, 12, ["c", "d"]))
    assert error_name(cached) == "NONE" and cached.base_offset == 12
    assert error_name(shared_raw.produce("seq", 0, batch(pid, 0, ["e"], epoch=1))) == "NONE"  # new epoch from 0
    assert error_name(shared_raw.produce("seq", 0, batch(pid, 14, ["late"], epoch=0))) == "INVALID_PRODUCER_EPOCH"
    assert error_name(shared_raw.produce("seq", 0, batch(pid, 7, ["x"], epoch=2))) == "OUT_OF_ORDER_SEQUENCE"
    assert error_name(shared_raw.produce("seq", 0, plain_batch(["p1", "p2"]))) == "NONE"  # no producer id: accepted
    assert record_values(shared_raw.read_all("seq", 0)) == ["a", "b"] + ["c", "d"] * 6 + ["e", "p1", "p2"]
    assert [r.offset for r in shared_raw.read_all("seq", 0)] == list(range(17))
    state = {p.producer_id: p for p in shared_raw.producers("seq", 0).producers}[pid]
    assert (state.producer_epoch, state.last_sequence, state.current_txn_start_offset) == (1, 0, -1)


RETRY_BACKOFF = RetryPolicy(attempts_max=1 << 30, backoff_initial_ms=20, backoff_max_ms=500)  # a client's, between retries


def test_kill_9_mid_stream_loses_nothing_acknowledged_and_appends_no_duplicate(raw, txlog_cluster):
    raw.create_topic("crash", 1)
    pid = raw.producer_id()
    leader_name = next(n for n, p in txlog_cluster.state.services.items() if p.address == raw.leaders("crash")[0])
    acked, stop = [], threading.Event()

    def produce_until_stopped():
        # one batch at a time; an unanswered batch is retried with the same sequence until it is answered
        sequence = failures = 0
        while not stop.is_set() or sequence < len(acked) * 10:
            try:
                result = raw.produce("crash", 0, batch(pid, sequence, [f"{sequence + i}" for i in range(10)]), stub=raw.stub(raw.leaders("crash")[0]))
            except grpc.RpcError:
                result = None  # the leader is down
            if result is None or result.error.error_class == errors_pb2.ERROR_CLASS_RETRIABLE:  # or elected again
                failures += 1  # the same batch again after the client's backoff (the deadlines are the main thread's)
                time.sleep(RETRY_BACKOFF.delay_ms(failures) / 1000)
                continue
            failures = 0
            assert error_name(result) == "NONE", result
            acked.append(result.base_offset)
            sequence += 10
            if stop.is_set():
                return

    worker = threading.Thread(target=produce_until_stopped)
    worker.start()
    wait_until(lambda: len(acked) >= 5, 30, "batches acknowledged before the crash")
    txlog_cluster.kill(leader_name)
    acked_before_restart = len(acked)
    txlog_cluster.start(leader_name)
    wait_until(lambda: len(acked) >= acked_before_restart + 5, 60, "batches acknowledged after the restart")
    stop.set()
    worker.join(timeout=60)
    assert acked_before_restart > 0
    records = raw.read_all("crash", 0)
    assert record_values(records) == [str(i) for i in range(len(records))]  # in order, no duplicate, no gap
    assert len(records) == len(acked) * 10  # every acknowledged batch is there exactly once
    assert acked == list(range(0, len(acked) * 10, 10))
    state = {p.producer_id: p for p in raw.producers("crash", 0).producers}[pid]
    assert state.last_sequence == len(records) - 1  # producer state recovered
    # a retry of the last batch after the restart is still recognised as a duplicate
    last = raw.produce("crash", 0, batch(pid, len(records) - 10, [str(i) for i in range(len(records) - 10, len(records))]))
    assert error_name(last) == "NONE" and last.base_offset == len(records) - 10
    assert len(raw.read_all("crash", 0)) == len(records)


def test_bad_produce_input_gets_clear_errors_and_stores_nothing(shared_raw):
    shared_raw.create_topic("bad", 1)
    stub = shared_raw.leader("bad", 0)
    pid = shared_raw.producer_id()

    def produce(**request):
        return stub.Produce(partition_pb2.ProduceRequest(**request), timeout=10)

    one = [partition_pb2.PartitionBatch(topic="bad", partition=0, batch=batch(pid, 0, ["x"]))]
    for request, mentions in [
        ({"acks": 5, "batches": one}, "acks"),
        ({"acks": -1, "batches": []}, "no partition"),
        ({"acks": -1, "batches": one * 2}, "twice"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            produce(**request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and mentions in info.value.details()

    cases = {
        ("nosuch", 0, "x"): "UNKNOWN_TOPIC_OR_PARTITION",
        ("bad", 7, "x"): "UNKNOWN_TOPIC_OR_PARTITION",
        ("bad", -1, "x"): "UNKNOWN_TOPIC_OR_PARTITION",
        ("bad name!", 0, "x"): "UNKNOWN_TOPIC_OR_PARTITION",
    }
    for (topic, partition, value), expected in cases.items():
        result = produce(acks=-1, batches=[partition_pb2.PartitionBatch(topic=topic, partition=partition, batch=batch(pid, 0, [value]))]).results[0]
        assert error_name(result) == expected and result.error.message
    bad_batches = [
        (batch(pid, 0, []), "INVALID_REQUEST"),
        (batch(pid, 0, [b"v" * (1024 * 1024 + 1)]), "RECORD_TOO_LARGE"),
        (batch(pid, 0, ["x"], control_type=common_pb2.CONTROL_TYPE_ABORT), "INVALID_REQUEST"),
        (batch(pid, -3, ["x"]), "INVALID_REQUEST"),
        (batch(pid, 0, ["x"], epoch=99999), "INVALID_REQUEST"),
        (batch(pid, 0, ["x"], is_transactional=True), "INVALID_REQUEST"),  # no transactional_id in the request
        (common_pb2.RecordBatch(producer_id=pid, producer_epoch=0, base_sequence=0, records=[common_pb2.Record(timestamp_ms=-5)]), "INVALID_TIMESTAMP"),
    ]
    for bad, expected in bad_batches:
        result = shared_raw.produce("bad", 0, bad, stub=stub)
        assert error_name(result) == expected, (bad, result)
    no_coordinator = stub.Produce(partition_pb2.ProduceRequest(acks=-1, transactional_id="tx", batches=[
        partition_pb2.PartitionBatch(topic="bad", partition=0, batch=batch(pid, 0, ["x"], is_transactional=True))]), timeout=10)
    assert error_name(no_coordinator.results[0]) == "COORDINATOR_NOT_AVAILABLE"  # no coordinator can vouch for it
    assert shared_raw.list_offset("bad", 0, LATEST).offset == 0
    assert shared_raw.producers("bad", 0).producers == []
    # the same producer can still start cleanly: nothing of the rejected batches stuck
    assert error_name(shared_raw.produce("bad", 0, batch(pid, 0, ["ok"]), stub=stub)) == "NONE"
    assert record_values(shared_raw.read_all("bad", 0)) == ["ok"]


def test_bad_fetch_and_topic_input(shared_raw):
    shared_raw.create_topic("f", 1)
    shared_raw.produce("f", 0, plain_batch(["a"]))
    result = shared_raw.fetch("f", 0, -1)
    assert error_name(result) == "OFFSET_OUT_OF_RANGE" and "-1" in result.error.message
    assert error_name(shared_raw.fetch("f", 0, 5)) == "OFFSET_OUT_OF_RANGE"
    with pytest.raises(grpc.RpcError) as info:
        shared_raw.fetch("f", 0, 0, max_wait_ms=-1)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        shared_raw.fetch("f", 0, 0, isolation=7)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stub = shared_raw.stub(shared_raw.bootstrap[0])
    reply = stub.CreateTopics(
        partition_pb2.CreateTopicsRequest(
            topics=[
                partition_pb2.CreatableTopic(name="ok-topic", partition_count=0),
                partition_pb2.CreatableTopic(name="bad/name", partition_count=1),
                partition_pb2.CreatableTopic(name="__mine", partition_count=1),
                partition_pb2.CreatableTopic(name="f", partition_count=3),
                partition_pb2.CreatableTopic(name="f", partition_count=1),
                partition_pb2.CreatableTopic(name="cfg", partition_count=1, configs={"retention.ms": "x"}),
            ]
        ),
        timeout=10,
    )
    assert [error_name(r) for r in reply.results] == [
        "INVALID_PARTITIONS", "INVALID_TOPIC", "INVALID_TOPIC", "TOPIC_ALREADY_EXISTS", "NONE", "INVALID_CONFIG"
    ]
    names = [t.name for t in stub.Metadata(partition_pb2.MetadataRequest(all_topics=True), timeout=10).topics]
    assert "ok-topic" not in names and "cfg" not in names and "f" in names


def test_partitions_spread_over_both_instances_and_others_answer_not_leader(raw, txlog_cluster):
    raw.create_topic("spread", 6)
    leaders = raw.leaders("spread")
    assert set(leaders.values()) == set(raw.bootstrap)
    for address in raw.bootstrap:  # every instance answers the same metadata
        assert {p.partition: p.leader_address for p in raw.stub(address).Metadata(partition_pb2.MetadataRequest(topics=["spread"]), timeout=10).topics[0].partitions} == leaders
    other = next(a for a in raw.bootstrap if a != leaders[0])
    result = raw.produce("spread", 0, plain_batch(["x"]), stub=raw.stub(other))
    assert error_name(result) == "NOT_LEADER" and "refresh metadata" in result.error.message


def test_fetch_long_poll_returns_when_data_arrives(shared_raw):
    shared_raw.create_topic("poll", 1)
    timer = threading.Timer(0.3, lambda: shared_raw.produce("poll", 0, plain_batch(["late"])))
    timer.start()
    result = shared_raw.fetch("poll", 0, 0, max_wait_ms=20_000)
    timer.join()
    assert record_values(r for b in result.batches for r in b.records) == ["late"]
    empty = shared_raw.fetch("poll", 0, 1, max_wait_ms=50)
    assert list(empty.batches) == [] and empty.high_watermark == 1


def test_fetch_limits_and_trimming(shared_raw):
    shared_raw.create_topic("limits", 1)
    for i in range(5):
        shared_raw.produce("limits", 0, plain_batch([f"{i}-{j}" for j in range(4)]))
    result = shared_raw.fetch("limits", 0, 6, max_records=1)
    got = [r for b in result.batches for r in b.records]
    assert [r.offset for r in got] == [6, 7]  # at least one whole batch, trimmed before offset 6
    assert result.next_fetch_offset == 8
    assert [r.offset for r in shared_raw.read_all("limits", 0, start=13)] == [13, 14, 15, 16, 17, 18, 19]


def test_list_offsets(shared_raw):
    shared_raw.create_topic("lo", 1)
    base = int(time.time() * 1000)
    for i in range(3):
        shared_raw.produce("lo", 0, common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                                     records=[common_pb2.Record(value=b"v", timestamp_ms=base + 1000 * i)]))
    assert shared_raw.list_offset("lo", 0, EARLIEST).offset == 0
    assert shared_raw.list_offset("lo", 0, LATEST).offset == 3
    assert shared_raw.list_offset("lo", 0, LSO).offset == 3
    at = shared_raw.list_offset("lo", 0, BY_TIME, base + 500)
    assert (at.offset, at.timestamp_ms) == (1, base + 1000)
    assert shared_raw.list_offset("lo", 0, BY_TIME, base + 10_000).offset == -1


def test_consumer_group_offsets_compacted_and_recovered(raw, txlog_cluster):
    raw.create_topic("src", 2)
    metadata = raw.stub(raw.bootstrap[0]).Metadata(partition_pb2.MetadataRequest(group_ids=["g1"]), timeout=10)
    coordinator = metadata.group_coordinators[0].address
    other = next(a for a in raw.bootstrap if a != coordinator)
    commit = partition_pb2.OffsetCommitRequest(group_id="g1", offsets=[partition_pb2.PartitionOffset(topic="src", partition=0, offset=1)])
    with pytest.raises(grpc.RpcError) as info:
        raw.stub(other).OffsetCommit(commit, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "NOT_COORDINATOR" in info.value.details()
    for offset in range(1, 41):
        reply = raw.stub(coordinator).OffsetCommit(
            partition_pb2.OffsetCommitRequest(
                group_id="g1",
                offsets=[partition_pb2.PartitionOffset(topic="src", partition=p, offset=offset * 10 + p, metadata=f"m{p}") for p in (0, 1)],
            ),
            timeout=10,
        )
        assert [error_name(r) for r in reply.results] == ["NONE", "NONE"]
    bad = raw.stub(coordinator).OffsetCommit(
        partition_pb2.OffsetCommitRequest(group_id="g1", offsets=[
            partition_pb2.PartitionOffset(topic="src", partition=0, offset=-4),
            partition_pb2.PartitionOffset(topic="nosuch", partition=0, offset=4),
            partition_pb2.PartitionOffset(topic="src", partition=9, offset=4),
        ]), timeout=10)
    assert [error_name(r) for r in bad.results] == ["INVALID_OFFSET", "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION"]

    def fetched():
        reply = raw.stub(coordinator).OffsetFetch(partition_pb2.OffsetFetchRequest(group_id="g1"), timeout=10)
        return {(o.topic, o.partition): (o.offset, o.metadata) for o in reply.offsets}

    assert fetched() == {("src", 0): (400, "m0"), ("src", 1): (401, "m1")}
    missing = raw.stub(coordinator).OffsetFetch(
        partition_pb2.OffsetFetchRequest(group_id="g1", partitions=[common_pb2.TopicPartition(topic="src", partition=1), common_pb2.TopicPartition(topic="other", partition=0)]),
        timeout=10,
    )
    assert [(o.offset) for o in missing.offsets] == [401, -1]

    offsets_partition = next(
        p for p in range(8) if raw.leaders("__consumer_offsets")[p] == coordinator
        and raw.list_offset("__consumer_offsets", p, LATEST).offset == 80
    )
    wait_until(lambda: raw.list_offset("__consumer_offsets", offsets_partition, EARLIEST).offset >= 78, 30, "the compaction")
    assert raw.list_offset("__consumer_offsets", offsets_partition, EARLIEST).offset == 78  # compacted to the newest commit

    name = next(n for n, p in txlog_cluster.state.services.items() if p.address == coordinator)
    txlog_cluster.kill(name)
    txlog_cluster.start(name)

    found = []

    def fetched_from_the_coordinator() -> bool:  # wherever it is now: the offsets partition may have a new leader
        try:
            where = raw.stub(raw.bootstrap[0]).Metadata(partition_pb2.MetadataRequest(group_ids=["g1"]), timeout=10).group_coordinators[0]
            if where.error.code:
                return False
            reply = raw.stub(where.address).OffsetFetch(partition_pb2.OffsetFetchRequest(group_id="g1"), timeout=10)
        except grpc.RpcError:
            return False
        found.append({(o.topic, o.partition): (o.offset, o.metadata) for o in reply.offsets})
        return True

    wait_until(fetched_from_the_coordinator, 60, "the group's coordinator after the restart")
    assert found[-1] == {("src", 0): (400, "m0"), ("src", 1): (401, "m1")}


def test_retention_by_size_and_by_time_deletes_whole_batches_from_the_start(shared_raw):
    shared_raw.create_topic("sized", 1, **{"retention.bytes": "2000"})
    for i in range(20):
        shared_raw.produce("sized", 0, plain_batch([f"{i}".encode() * 50]))

    def whole_from_its_start():
        """The log's start once retention began, if every offset from there to the end reads back."""
        start, records = shared_raw.read_from_log_start("sized", 0)
        return start if start > 0 and [r.offset for r in records] == list(range(start, 20)) else None

    start = wait_until(whole_from_its_start, 30, "retention by size, the rest readable")
    assert 0 < start < 20
    assert shared_raw.list_offset("sized", 0, LATEST).offset == 20
    assert error_name(shared_raw.fetch("sized", 0, start - 1)) == "OFFSET_OUT_OF_RANGE"

    shared_raw.create_topic("timed", 1, **{"retention.ms": "60000"})
    old = int(time.time() * 1000) - 120_000
    shared_raw.produce("timed", 0, common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, records=[common_pb2.Record(value=b"old", timestamp_ms=old)]))
    shared_raw.produce("timed", 0, plain_batch(["new"]))
    wait_until(lambda: shared_raw.list_offset("timed", 0, EARLIEST).offset, 30, "retention by time")
    assert shared_raw.list_offset("timed", 0, EARLIEST).offset == 1
    assert record_values(shared_raw.read_all("timed", 0, 1)) == ["new"]


def test_init_producer_id_for_idempotent_producers(shared_raw):
    ids = [shared_raw.producer_id() for _ in range(5)]
    assert len(set(ids)) == 5
    stub = coordinator_pb2_grpc.CoordinatorServiceStub(grpc.insecure_channel(shared_raw.bootstrap[1]))
    other = stub.InitProducerId(coordinator_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=10)
    assert other.producer_id not in ids
    # naming an id (KIP-360's reset) still gets a new one: partition_svc never bumps an id it is told
    renewed = stub.InitProducerId(coordinator_pb2.InitProducerIdRequest(producer_id=ids[0], producer_epoch=3), timeout=10)
    assert renewed.producer_epoch == 0 and renewed.producer_id not in (*ids, other.producer_id)
    with pytest.raises(grpc.RpcError) as info:
        stub.InitProducerId(coordinator_pb2.InitProducerIdRequest(transactional_id="t", producer_id=-1, producer_epoch=-1), timeout=10)
    assert "NOT_COORDINATOR" in info.value.details()


def test_transactional_coordinator_rpcs_answer_not_coordinator_and_bad_utf8_is_invalid(shared_raw):
    channel = grpc.insecure_channel(shared_raw.bootstrap[0])
    with pytest.raises(grpc.RpcError) as info:  # our error, saying where to go: not UNIMPLEMENTED, the word for missing features
        coordinator_pb2_grpc.CoordinatorServiceStub(channel).EndTxn(coordinator_pb2.EndTxnRequest(), timeout=10)
    assert errors.from_rpc_error(info.value).name == "NOT_COORDINATOR" and "EndTxn" in info.value.details()
    assert "FindCoordinator" in info.value.details()
    produce = channel.unary_unary("/txlog.v1.PartitionService/Produce", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        produce(b"\x0a\x02\xff\xfe", timeout=10)  # transactional_id holding invalid UTF-8
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in info.value.details()
    channel.close()


def test_fetch_record_and_byte_limits_hold_across_partitions(shared_raw):
    shared_raw.create_topic("multi", 3)  # round-robin over two instances: partitions 0 and 2 share a leader
    leaders = shared_raw.leaders("multi")
    assert leaders[0] == leaders[2]
    for partition in (0, 2):
        for i in range(3):
            shared_raw.produce("multi", partition, plain_batch([f"{i}-{j}" for j in range(5)]))

    def fetch(**limits):
        reply = shared_raw.stub(leaders[0]).Fetch(partition_pb2.FetchRequest(partitions=[
            partition_pb2.FetchPartition(topic="multi", partition=0, fetch_offset=0),
            partition_pb2.FetchPartition(topic="multi", partition=2, fetch_offset=0),
        ], **limits), timeout=10)
        return [sum(len(b.records) for b in r.batches) for r in reply.results], [r.next_fetch_offset for r in reply.results]

    assert fetch(max_records=7) == ([5, 0], [5, 0])  # the first batch always; another would pass 7 records
    assert fetch(max_records=3) == ([5, 0], [5, 0])  # the first batch even when it alone is over the limit
    assert fetch(max_records=10) == ([10, 0], [10, 0])
    assert fetch(max_records=20) == ([15, 5], [15, 5])
    assert fetch(max_bytes=1) == ([5, 0], [5, 0])
