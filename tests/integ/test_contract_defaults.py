"""The contract from any language: a field a client leaves out has its safe
meaning, contradictory fields are refused, every per-item error says its class,
and a client that knows only the bootstrap addresses finds its coordinator.
Each test is one trap a client generated from protos/ alone fell into, through
the real services (they fail on the tree before the contract changed)."""

import grpc
import pytest
from support.errors import error_name
from support.waiting import wait_until

from tests.integ.txn_raw import TxnProducer
from txlog.protocol import errors
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, errors_pb2, partition_pb2


def produce(raw, topic, batch, **request_fields):
    reply = raw.leader(topic, 0).Produce(partition_pb2.ProduceRequest(
        batches=[partition_pb2.PartitionBatch(topic=topic, partition=0, batch=batch)], **request_fields), timeout=10)
    return reply.results[0]


def records(*values):
    return [common_pb2.Record(value=v.encode()) for v in values]


def coordinator_service(raw, address=None) -> coordinator_pb2_grpc.CoordinatorServiceStub:
    address = address or raw.bootstrap[0]
    return coordinator_pb2_grpc.CoordinatorServiceStub(raw._channels.setdefault(address, grpc.insecure_channel(address)))


def test_a_batch_without_producer_fields_is_not_idempotent_and_never_producer_zero(shared_raw):
    shared_raw.create_topic("plain-default", 1)
    first = produce(shared_raw, "plain-default", common_pb2.RecordBatch(records=records("a")))
    second = produce(shared_raw, "plain-default", common_pb2.RecordBatch(records=records("b")))
    assert (first.error.code, second.error.code) == (0, 0)
    assert (first.base_offset, second.base_offset) == (0, 1)  # the second was written, not answered as a duplicate
    fetched = shared_raw.fetch("plain-default", 0, 0)
    assert [r.value for b in fetched.batches for r in b.records] == [b"a", b"b"]
    assert {(b.producer_id, b.producer_epoch, b.base_sequence) for b in fetched.batches} == {(-1, -1, -1)}
    assert list(shared_raw.producers("plain-default", 0).producers) == []  # no producer 0


def test_a_batch_setting_only_some_producer_fields_is_refused_and_changes_nothing(shared_raw):
    shared_raw.create_topic("half-producer", 1)
    for fields in ({"producer_id": 7}, {"producer_id": 7, "producer_epoch": 0}, {"base_sequence": 0},
                   {"is_transactional": True}):
        result = produce(shared_raw, "half-producer", common_pb2.RecordBatch(records=records("x"), **fields))
        assert error_name(result.error) == "INVALID_REQUEST", fields
        assert result.error.error_class == errors_pb2.ERROR_CLASS_FATAL
    assert shared_raw.list_offset("half-producer", 0, partition_pb2.OFFSET_SPEC_LATEST).offset == 0


def test_init_producer_id_without_producer_fields_means_no_previous_producer(shared_raw):
    coordinator = TxnProducer(shared_raw, "default-init").coordinator()
    request = coordinator_pb2.InitProducerIdRequest(transactional_id="default-init", transaction_timeout_ms=60_000)
    first = coordinator.InitProducerId(request, timeout=10)
    second = coordinator.InitProducerId(request, timeout=10)  # a restarted client: not PRODUCER_FENCED
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
    for stub in (coordinator, coordinator_service(shared_raw)):
        with pytest.raises(grpc.RpcError) as info:
            stub.InitProducerId(coordinator_pb2.InitProducerIdRequest(
                transactional_id="default-init" if stub is coordinator else "", transaction_timeout_ms=60_000,
                producer_id=first.producer_id), timeout=10)
        assert errors.from_rpc_error(info.value).name == "INVALID_REQUEST"


def test_produce_without_acks_waits_for_durability_and_acks_zero_promises_no_offset(shared_raw):
    shared_raw.create_topic("acks-default", 1)
    durable = produce(shared_raw, "acks-default", common_pb2.RecordBatch(records=records("d")))
    assert durable.error.code == 0 and durable.base_offset == 0
    assert shared_raw.list_offset("acks-default", 0, partition_pb2.OFFSET_SPEC_LATEST).offset == 1  # durable when answered
    unacknowledged = produce(shared_raw, "acks-default", common_pb2.RecordBatch(records=records("u")), acks=0)
    assert unacknowledged.error.code == 0 and unacknowledged.base_offset == -1  # nothing to rely on
    bad = lambda: produce(shared_raw, "acks-default", common_pb2.RecordBatch(records=records("x")), acks=2)  # noqa: E731
    with pytest.raises(grpc.RpcError) as info:
        bad()
    assert errors.from_rpc_error(info.value).name == "INVALID_REQUEST"
    with pytest.raises(grpc.RpcError) as info:
        produce(shared_raw, "acks-default", common_pb2.RecordBatch(records=records("x")), timeout_ms=-1)
    assert errors.from_rpc_error(info.value).name == "INVALID_REQUEST"
    assert produce(shared_raw, "acks-default", common_pb2.RecordBatch(records=records("t")), timeout_ms=30_000).base_offset == 2


def test_leader_epoch_is_checked_only_when_given(shared_raw):
    shared_raw.create_topic("epochs", 1)
    leader = shared_raw.leader("epochs", 0)

    def produce_with(**epoch):
        reply = leader.Produce(partition_pb2.ProduceRequest(batches=[partition_pb2.PartitionBatch(
            topic="epochs", partition=0, batch=common_pb2.RecordBatch(records=records("e")), **epoch)]), timeout=10)
        return reply.results[0]

    def fetch_with(**epoch):
        reply = leader.Fetch(partition_pb2.FetchRequest(partitions=[partition_pb2.FetchPartition(
            topic="epochs", partition=0, fetch_offset=0, **epoch)]), timeout=10)
        return reply.results[0]

    assert produce_with().error.code == 0 and produce_with(leader_epoch=0).error.code == 0
    assert produce_with(leader_epoch=-1).error.code == 0
    newer = produce_with(leader_epoch=5)
    assert error_name(newer.error) == "UNKNOWN_LEADER_EPOCH" and newer.error.error_class == errors_pb2.ERROR_CLASS_RETRIABLE
    assert fetch_with().error.code == 0 and len(fetch_with(leader_epoch=0).batches) == 3
    assert error_name(fetch_with(leader_epoch=5).error) == "UNKNOWN_LEADER_EPOCH"
    assert shared_raw.list_offset("epochs", 0, partition_pb2.OFFSET_SPEC_LATEST).offset == 3  # the refused batch was not written


def test_every_per_item_error_carries_its_class(shared_raw):
    shared_raw.create_topic("classes", 1)
    leader = shared_raw.leader("classes", 0)
    reply = leader.Produce(partition_pb2.ProduceRequest(batches=[
        partition_pb2.PartitionBatch(topic="classes", partition=7, batch=common_pb2.RecordBatch(records=records("x")))]), timeout=10)
    error = reply.results[0].error
    assert error_name(error) == "UNKNOWN_TOPIC_OR_PARTITION" and error.error_class == errors_pb2.ERROR_CLASS_RETRIABLE
    fetched = leader.Fetch(partition_pb2.FetchRequest(partitions=[
        partition_pb2.FetchPartition(topic="classes", partition=0, fetch_offset=99)]), timeout=10).results[0]
    assert error_name(fetched.error) == "OFFSET_OUT_OF_RANGE" and fetched.error.error_class == errors_pb2.ERROR_CLASS_FATAL
    ok = leader.Fetch(partition_pb2.FetchRequest(partitions=[
        partition_pb2.FetchPartition(topic="classes", partition=0, fetch_offset=0)]), timeout=10).results[0]
    assert not ok.HasField("error")  # absent means NONE


def test_find_coordinator_answers_on_every_partition_svc_address(shared_raw):
    producer = TxnProducer(shared_raw, "found-tx").init()
    expected = shared_raw.metadata(partition_pb2.MetadataRequest(transactional_ids=["found-tx"], group_ids=["found-group"]))
    for address in shared_raw.bootstrap:
        bootstrap = coordinator_service(shared_raw, address)
        found = bootstrap.FindCoordinator(coordinator_pb2.FindCoordinatorRequest(
            key="found-tx", key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION), timeout=10)
        assert found.address == expected.transaction_coordinators[0].address
        at_coordinator = producer.coordinator().FindCoordinator(coordinator_pb2.FindCoordinatorRequest(
            key="found-tx", key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION), timeout=10)
        assert (found.coordinator_id, found.partition, found.coordinator_epoch) == (
            at_coordinator.coordinator_id, at_coordinator.partition, at_coordinator.coordinator_epoch)
        group = bootstrap.FindCoordinator(coordinator_pb2.FindCoordinatorRequest(
            key="found-group", key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_GROUP), timeout=10)
        assert group.address == expected.group_coordinators[0].address
        with pytest.raises(grpc.RpcError) as info:  # transactional rpcs name where to go instead of UNIMPLEMENTED
            bootstrap.AddPartitionsToTxn(coordinator_pb2.AddPartitionsToTxnRequest(transactional_id="found-tx"), timeout=10)
        assert errors.from_rpc_error(info.value).name == "NOT_COORDINATOR"
        with pytest.raises(grpc.RpcError) as info:
            bootstrap.FindCoordinator(coordinator_pb2.FindCoordinatorRequest(
                key="bad id!", key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION), timeout=10)
        assert errors.from_rpc_error(info.value).name == "INVALID_TRANSACTIONAL_ID"


def test_transactional_requests_that_leave_out_the_producer_or_the_decision_are_refused_and_change_nothing(shared_raw):
    """Left out, producer_id/producer_epoch would read as producer 0 at epoch 0
    (answered PRODUCER_FENCED: "close this producer", the wrong cause) and
    `committed` as "abort" (answered like a commit). Each is INVALID_REQUEST
    naming the field, and the open transaction goes on untouched."""
    shared_raw.create_topic("named-producer", 1)
    tid, group = "named-tx", "named-group"
    producer = TxnProducer(shared_raw, tid).init()
    producer.add(("named-producer", 0))
    assert producer.send("named-producer", 0, "kept").error.code == 0
    before = producer.describe()
    who = {"producer_id": producer.producer_id, "producer_epoch": producer.producer_epoch}
    tp = common_pb2.TopicPartition(topic="named-producer", partition=0)
    coordinator = producer.coordinator()
    group_leader = shared_raw.stub(shared_raw.bootstrap[0])  # the check comes before the group is routed

    cases = []
    for left_out in who:
        named = {k: v for k, v in who.items() if k != left_out}
        cases += [
            (left_out, coordinator.AddPartitionsToTxn,
             coordinator_pb2.AddPartitionsToTxnRequest(transactional_id=tid, partitions=[tp], **named)),
            (left_out, coordinator.AddOffsetsToTxn,
             coordinator_pb2.AddOffsetsToTxnRequest(transactional_id=tid, group_id=group, **named)),
            (left_out, coordinator.EndTxn, coordinator_pb2.EndTxnRequest(transactional_id=tid, committed=False, **named)),
            (left_out, coordinator.PrepareTransaction, coordinator_pb2.PrepareTransactionRequest(transactional_id=tid, **named)),
            (left_out, coordinator.CompleteTransaction, coordinator_pb2.CompleteTransactionRequest(
                handle=coordinator_pb2.TransactionHandle(transactional_id=tid, **named), committed=False)),
            (left_out, coordinator.CommitTransactionGroup, coordinator_pb2.CommitTransactionGroupRequest(
                group_id=tid, handles=[coordinator_pb2.TransactionHandle(transactional_id=tid, **named)])),
            (left_out, coordinator.AbortTransaction,
             coordinator_pb2.AbortTransactionRequest(partition=tp, coordinator_epoch=0, **named)),
            (left_out, group_leader.TxnOffsetCommit, partition_pb2.TxnOffsetCommitRequest(
                transactional_id=tid, group_id=group, offsets=[partition_pb2.PartitionOffset(topic="named-producer", offset=1)],
                **named)),
        ]
    cases += [
        ("committed", coordinator.EndTxn, coordinator_pb2.EndTxnRequest(transactional_id=tid, **who)),
        ("committed", coordinator.CompleteTransaction, coordinator_pb2.CompleteTransactionRequest(
            handle=coordinator_pb2.TransactionHandle(transactional_id=tid, **who))),
        ("coordinator_epoch", coordinator.AbortTransaction, coordinator_pb2.AbortTransactionRequest(partition=tp, **who)),
    ]
    for field, rpc, request in cases:
        with pytest.raises(grpc.RpcError) as info:
            rpc(request, timeout=10)
        got = errors.from_rpc_error(info.value)
        assert got.name == "INVALID_REQUEST" and field in got.message, (type(request).__name__, field, got)

    after = producer.describe()
    assert (after.state, after.producer_id, after.producer_epoch, list(after.partitions)) == \
        (coordinator_pb2.TRANSACTION_STATE_ONGOING, before.producer_id, before.producer_epoch, [tp])
    producer.end(committed=True)
    wait_until(lambda: shared_raw.fetch("named-producer", 0, 0, isolation=common_pb2.ISOLATION_LEVEL_READ_COMMITTED).last_stable_offset == 2,
               message="the commit marker")
    fetched = shared_raw.fetch("named-producer", 0, 0, isolation=common_pb2.ISOLATION_LEVEL_READ_COMMITTED)
    assert [r.value for b in fetched.batches for r in b.records] == [b"kept"]


def test_an_offset_commit_that_leaves_out_an_offset_refuses_that_partition_not_rewinds_it(shared_raw):
    shared_raw.create_topic("committed-offsets", 2)
    address = shared_raw.stub(shared_raw.bootstrap[0]).Metadata(partition_pb2.MetadataRequest(group_ids=["offsets-group"]), timeout=10)
    group_leader = shared_raw.stub(address.group_coordinators[0].address)

    def commit(*offsets):
        return group_leader.OffsetCommit(partition_pb2.OffsetCommitRequest(group_id="offsets-group", offsets=offsets), timeout=10)

    def committed():
        return {o.partition: o.offset for o in group_leader.OffsetFetch(partition_pb2.OffsetFetchRequest(
            group_id="offsets-group", partitions=[common_pb2.TopicPartition(topic="committed-offsets", partition=p)
                                                  for p in (0, 1)]), timeout=10).offsets}

    assert [r.error.code for r in commit(partition_pb2.PartitionOffset(topic="committed-offsets", partition=0, offset=5),
                                         partition_pb2.PartitionOffset(topic="committed-offsets", partition=1, offset=0)).results] == [0, 0]
    assert committed() == {0: 5, 1: 0}  # offset 0 set explicitly is a commit of 0
    reply = commit(partition_pb2.PartitionOffset(topic="committed-offsets", partition=0),
                   partition_pb2.PartitionOffset(topic="committed-offsets", partition=1, offset=3))
    refused, taken = reply.results
    assert error_name(refused.error) == "INVALID_OFFSET" and "required" in refused.error.message
    assert refused.error.error_class == errors_pb2.ERROR_CLASS_FATAL and taken.error.code == 0
    assert committed() == {0: 5, 1: 3}  # partition 0 kept its offset; the other item was committed
