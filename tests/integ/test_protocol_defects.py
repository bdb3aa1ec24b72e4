"""The protocol defects a review reproduced with raw gRPC calls, each through the
real services: a late marker closing the next transaction, a re-applied marker
not raising the coordinator epoch, zombies appending to a prepared transaction,
fenced zombies rejoining, answers from a coordinator that lost its partition,
non-transactional batches inside a transaction, retried KIP-360 inits, aborts
of an empty transaction, and batches straddling the last sequence."""

import time

import grpc
import pytest
from support.errors import error_name
from support.reads import COMMITTED, UNCOMMITTED, values
from support.waiting import wait_until

from coordinator_svc.transaction_state import TransactionState
from services.coordination import coordinators
from tests.integ.raw import Raw, batch
from tests.integ.txn_raw import TxnProducer, retrying
from txlog.protocol import errors
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, partition_pb2


def rpc_error_name(call) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return errors.from_rpc_error(info.value).name


def producer_entry(raw, topic, partition, producer_id):
    found = [p for p in raw.producers(topic, partition).producers if p.producer_id == producer_id]
    return found[0] if found else None


def write_marker(raw, topic, partition, producer_id, producer_epoch, committed, coordinator_epoch):
    reply = raw.leader(topic, partition).WriteTxnMarkers(partition_pb2.WriteTxnMarkersRequest(markers=[
        partition_pb2.TxnMarker(producer_id=producer_id, producer_epoch=producer_epoch, committed=committed,
                                coordinator_epoch=coordinator_epoch, transactional_id="replayed",
                                partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)])]), timeout=10)
    return reply.markers[0].results[0].error.code


def settled(producer, state):
    return lambda: producer.describe().state == state.to_proto()


def commit_one(raw, topic, transactional_id, value):
    """A producer whose first transaction wrote ``value`` to ``topic``-0 and committed, visibly; with the
    epoch its markers carried and the coordinator epoch they recorded."""
    raw.create_topic(topic, 1)
    producer = TxnProducer(raw, transactional_id).init()
    producer.add((topic, 0))
    assert error_name(producer.send(topic, 0, value).error.code) == "NONE"
    marker_epoch = producer.end(committed=True).producer_epoch
    wait_until(lambda: values(raw, topic, 0) == [value], message="the commit")
    return producer, marker_epoch, producer_entry(raw, topic, 0, producer.producer_id).coordinator_epoch


# --- defect 1: a late marker of transaction N must not end transaction N+1 ----------------------------


def test_a_late_marker_of_the_previous_transaction_never_ends_the_open_one(shared_raw):
    producer, marker_epoch, coordinator_epoch = commit_one(shared_raw, "late", "late-tx", "n")  # transaction N

    producer.add(("late", 0))  # transaction N+1 writes at the same epoch N's markers carried
    assert error_name(producer.send("late", 0, "m").error.code) == "NONE"
    replayed = write_marker(shared_raw, "late", 0, producer.producer_id, marker_epoch, True, coordinator_epoch)
    assert error_name(replayed) != "NONE"  # a marker ends only a transaction opened at a lower epoch
    assert values(shared_raw, "late", 0) == ["n"]  # N+1 is still open: nothing of it is visible
    assert producer_entry(shared_raw, "late", 0, producer.producer_id).current_txn_start_offset >= 0

    producer.end(committed=False)
    wait_until(settled(producer, TransactionState.COMPLETE_ABORT), message="N+1 aborted")
    wait_until(lambda: shared_raw.list_offset("late", 0, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset
               == shared_raw.list_offset("late", 0, partition_pb2.OFFSET_SPEC_LATEST).offset, message="the LSO reaching the end")
    assert values(shared_raw, "late", 0) == ["n"]  # N+1's record never becomes visible


def test_a_re_sent_marker_with_no_transaction_open_is_a_no_op(shared_raw):
    producer, marker_epoch, coordinator_epoch = commit_one(shared_raw, "resent", "resent-tx", "a")
    end = shared_raw.list_offset("resent", 0, partition_pb2.OFFSET_SPEC_LATEST).offset
    assert error_name(write_marker(shared_raw, "resent", 0, producer.producer_id, marker_epoch, True, coordinator_epoch)) == "NONE"
    assert shared_raw.list_offset("resent", 0, partition_pb2.OFFSET_SPEC_LATEST).offset == end  # nothing appended


# --- defect 2: a re-applied marker records the higher coordinator epoch ------------------------------------


def test_a_re_applied_marker_records_the_higher_coordinator_epoch(shared_raw):
    producer, marker_epoch, old = commit_one(shared_raw, "coord-epoch", "coord-epoch-tx", "a")
    end = shared_raw.list_offset("coord-epoch", 0, partition_pb2.OFFSET_SPEC_LATEST).offset
    # the new owner after a failover re-sends the marker it found decided: written again only to record its
    # epoch (a control batch, so that every replica has it), changing nothing a reader sees
    committed_before = shared_raw.read_all("coord-epoch", 0)
    assert error_name(write_marker(shared_raw, "coord-epoch", 0, producer.producer_id, marker_epoch, True, old + 1)) == "NONE"
    assert producer_entry(shared_raw, "coord-epoch", 0, producer.producer_id).coordinator_epoch == old + 1
    assert shared_raw.list_offset("coord-epoch", 0, partition_pb2.OFFSET_SPEC_LATEST).offset == end + 1
    assert shared_raw.read_all("coord-epoch", 0) == committed_before
    # so the paused old owner's late re-send is fenced
    assert error_name(write_marker(shared_raw, "coord-epoch", 0, producer.producer_id, marker_epoch, True, old)) == "TRANSACTION_COORDINATOR_FENCED"


# --- defect 3: nothing joins a prepared transaction -----------------------------------------------------------


def prepare(producer):
    return retrying(lambda: producer.coordinator().PrepareTransaction(coordinator_pb2.PrepareTransactionRequest(
        transactional_id=producer.transactional_id, producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch), timeout=10)).handle


def test_a_zombie_cannot_append_records_or_offsets_to_a_prepared_transaction(shared_raw):
    shared_raw.create_topic("sealed", 1)
    shared_raw.create_topic("sealed-in", 1)
    producer = TxnProducer(shared_raw, "sealed/p0").init()
    producer.add(("sealed", 0))
    assert error_name(producer.send("sealed", 0, "a").error.code) == "NONE"
    group = "sealed-group"
    retrying(lambda: producer.coordinator().AddOffsetsToTxn(coordinator_pb2.AddOffsetsToTxnRequest(
        transactional_id=producer.transactional_id, producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch, group_id=group), timeout=10))

    def commit_offset(offset):
        group_leader = shared_raw.stub(shared_raw.metadata(partition_pb2.MetadataRequest(group_ids=[group])).group_coordinators[0].address)
        return group_leader.TxnOffsetCommit(partition_pb2.TxnOffsetCommitRequest(
            transactional_id=producer.transactional_id, group_id=group, producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            offsets=[partition_pb2.PartitionOffset(topic="sealed-in", partition=0, offset=offset)]), timeout=10)

    assert commit_offset(3).results[0].error.code == 0
    handle = prepare(producer)

    late = producer.send("sealed", 0, "zombie")  # same epoch, next sequence: the partition verified it before
    assert error_name(late.error.code) == "INVALID_TXN_STATE", late
    assert rpc_error_name(lambda: commit_offset(9)) == "INVALID_TXN_STATE"

    retrying(lambda: producer.coordinator().CompleteTransaction(
        coordinator_pb2.CompleteTransactionRequest(handle=handle, committed=True), timeout=10))
    wait_until(lambda: values(shared_raw, "sealed", 0) == ["a"], message="the commit")
    group_leader = shared_raw.stub(shared_raw.metadata(partition_pb2.MetadataRequest(group_ids=[group])).group_coordinators[0].address)
    fetched = group_leader.OffsetFetch(partition_pb2.OffsetFetchRequest(
        group_id=group, partitions=[common_pb2.TopicPartition(topic="sealed-in", partition=0)]), timeout=10)
    assert fetched.offsets[0].offset == 3
    assert values(shared_raw, "sealed", 0, UNCOMMITTED) == ["a"]  # the zombie's record was never written


# --- defect 4: a fenced zombie cannot rejoin ------------------------------------------------------------------------


def test_a_fenced_zombie_epoch_is_neither_current_nor_last(shared_raw):
    shared_raw.create_topic("fence", 1)
    zombie = TxnProducer(shared_raw, "fence-tx").init()
    zombie.add(("fence", 0))
    assert error_name(zombie.send("fence", 0, "z").error.code) == "NONE"
    coordinator = zombie.coordinator()
    # a new instance's first InitProducerId fences the open transaction (and answers CONCURRENT_TRANSACTIONS)
    assert rpc_error_name(lambda: coordinator.InitProducerId(coordinator_pb2.InitProducerIdRequest(
        transactional_id="fence-tx", transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1), timeout=10)) \
        == "CONCURRENT_TRANSACTIONS"
    wait_until(lambda: zombie.describe().state == TransactionState.COMPLETE_ABORT.to_proto(), message="the fence's abort")
    pid, epoch = zombie.producer_id, zombie.producer_epoch
    for committed in (False, True):
        assert rpc_error_name(lambda c=committed: coordinator.EndTxn(coordinator_pb2.EndTxnRequest(
            transactional_id="fence-tx", producer_id=pid, producer_epoch=epoch, committed=c), timeout=10)) == "PRODUCER_FENCED"
    assert rpc_error_name(lambda: coordinator.InitProducerId(coordinator_pb2.InitProducerIdRequest(
        transactional_id="fence-tx", transaction_timeout_ms=60_000, producer_id=pid, producer_epoch=epoch), timeout=10)) \
        == "PRODUCER_FENCED"
    described = zombie.describe()
    assert described.producer_epoch >= epoch + 2
    # the epoch the zombie could guess next is fenced too
    assert rpc_error_name(lambda: coordinator.AddPartitionsToTxn(coordinator_pb2.AddPartitionsToTxnRequest(
        transactional_id="fence-tx", producer_id=pid, producer_epoch=epoch + 1,
        partitions=[common_pb2.TopicPartition(topic="fence", partition=0)]), timeout=10)) == "PRODUCER_FENCED"
    newcomer = TxnProducer(shared_raw, "fence-tx").init()
    assert newcomer.producer_epoch > described.producer_epoch
    assert values(shared_raw, "fence", 0, COMMITTED) == []


# --- defect 6: no non-transactional batch inside a transaction; partition_svc's init never bumps an id ------------


def test_a_non_transactional_batch_of_a_producer_with_an_open_transaction_is_refused(shared_raw):
    shared_raw.create_topic("mixed", 1)
    producer = TxnProducer(shared_raw, "mixed-tx").init()
    producer.add(("mixed", 0))
    assert error_name(producer.send("mixed", 0, "t").error.code) == "NONE"
    plain = shared_raw.produce("mixed", 0, batch(producer.producer_id, 1, ["plain"], epoch=producer.producer_epoch))
    assert error_name(plain.error.code) == "INVALID_TXN_STATE"
    producer.end(committed=True)
    wait_until(lambda: values(shared_raw, "mixed", 0) == ["t"], message="the commit")
    assert values(shared_raw, "mixed", 0, UNCOMMITTED) == ["t"]


def test_partition_svc_init_producer_id_never_bumps_an_existing_producer_id(shared_raw):
    shared_raw.create_topic("bump", 1)
    producer = TxnProducer(shared_raw, "bump-tx").init()
    producer.add(("bump", 0))
    assert error_name(producer.send("bump", 0, "t").error.code) == "NONE"
    bootstrap = coordinator_pb2_grpc.CoordinatorServiceStub(shared_raw._channels.setdefault(shared_raw.bootstrap[0], grpc.insecure_channel(shared_raw.bootstrap[0])))
    reply = bootstrap.InitProducerId(coordinator_pb2.InitProducerIdRequest(
        producer_id=producer.producer_id, producer_epoch=producer.producer_epoch), timeout=10)
    assert reply.producer_id != producer.producer_id  # a new id: another producer's epochs are not ours to bump
    producer.end(committed=True)
    wait_until(lambda: values(shared_raw, "bump", 0) == ["t"], message="the commit")
    wait_until(lambda: shared_raw.list_offset("bump", 0, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset
               == shared_raw.list_offset("bump", 0, partition_pb2.OFFSET_SPEC_LATEST).offset, message="the LSO")


# --- defect 7: a retried KIP-360 InitProducerId gets the current epoch ---------------------------------------------


def test_a_retried_kip360_init_whose_answer_was_lost_gets_the_current_epoch(shared_raw):
    producer = TxnProducer(shared_raw, "kip360-tx").init()
    coordinator = producer.coordinator()

    def init():
        return retrying(lambda: coordinator.InitProducerId(coordinator_pb2.InitProducerIdRequest(
            transactional_id="kip360-tx", transaction_timeout_ms=60_000, producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch), timeout=10))

    first = init()  # its answer is lost: the producer asks again with the same id and epoch
    assert first.producer_epoch == producer.producer_epoch + 1
    second = init()
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch)


# --- defect 8: aborting an empty transaction bumps the epoch -------------------------------------------------------


def test_aborting_an_empty_transaction_bumps_the_epoch_and_a_late_add_is_fenced(shared_raw):
    shared_raw.create_topic("empty-abort", 1)
    producer = TxnProducer(shared_raw, "empty-abort-tx").init()
    old_epoch = producer.producer_epoch
    reply = producer.end(committed=False)
    assert reply.producer_epoch == old_epoch + 1
    coordinator = producer.coordinator()
    late = lambda: coordinator.AddPartitionsToTxn(coordinator_pb2.AddPartitionsToTxnRequest(  # noqa: E731
        transactional_id="empty-abort-tx", producer_id=producer.producer_id, producer_epoch=old_epoch,
        partitions=[common_pb2.TopicPartition(topic="empty-abort", partition=0)]), timeout=10)
    assert rpc_error_name(late) == "PRODUCER_FENCED"
    assert producer.describe().state == TransactionState.COMPLETE_ABORT.to_proto()
    # the retried abort answers the same epoch
    again = coordinator.EndTxn(coordinator_pb2.EndTxnRequest(transactional_id="empty-abort-tx", producer_id=producer.producer_id,
                                                              producer_epoch=old_epoch, committed=False), timeout=10)
    assert again.producer_epoch == old_epoch + 1


# --- defect 9: a batch straddling the last sequence is out of order, not a duplicate --------------------------------


def test_a_batch_straddling_the_last_sequence_is_out_of_order_not_a_duplicate(shared_raw):
    shared_raw.create_topic("straddle", 1)
    pid = shared_raw.producer_id()
    assert shared_raw.produce("straddle", 0, batch(pid, 0, [f"r{i}" for i in range(14)])).error.code == 0  # sequences 0..13
    straddling = shared_raw.produce("straddle", 0, batch(pid, 13, ["r13", "r14"]))
    assert error_name(straddling.error.code) == "OUT_OF_ORDER_SEQUENCE"
    assert shared_raw.produce("straddle", 0, batch(pid, 12, ["r12"])).error.code == errors.ErrorCode.Value("DUPLICATE_SEQUENCE")
    assert len(values(shared_raw, "straddle", 0, UNCOMMITTED)) == 14


# --- suspected: a delayed TxnOffsetCommit never takes a pending offset back ------------------------------------------


def test_a_delayed_txn_offset_commit_never_moves_a_pending_offset_back(shared_raw):
    shared_raw.create_topic("offsets-in", 1)
    producer = TxnProducer(shared_raw, "offsets-tx").init()
    group = "offsets-group"
    retrying(lambda: producer.coordinator().AddOffsetsToTxn(coordinator_pb2.AddOffsetsToTxnRequest(
        transactional_id=producer.transactional_id, producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch, group_id=group), timeout=10))
    group_leader = shared_raw.stub(shared_raw.metadata(partition_pb2.MetadataRequest(group_ids=[group])).group_coordinators[0].address)

    def commit_offset(offset):
        return group_leader.TxnOffsetCommit(partition_pb2.TxnOffsetCommitRequest(
            transactional_id=producer.transactional_id, group_id=group, producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            offsets=[partition_pb2.PartitionOffset(topic="offsets-in", partition=0, offset=offset)]), timeout=10)

    assert commit_offset(10).results[0].error.code == 0
    assert commit_offset(4).results[0].error.code == 0  # the first attempt of an earlier commit, delivered late
    producer.end(committed=True)
    wait_until(settled(producer, TransactionState.COMPLETE_COMMIT), message="the commit")
    fetched = group_leader.OffsetFetch(partition_pb2.OffsetFetchRequest(
        group_id=group, require_stable=True, partitions=[common_pb2.TopicPartition(topic="offsets-in", partition=0)]), timeout=10)
    assert fetched.offsets[0].offset == 10



# --- defect 5: a coordinator that lost a partition never answers from its old view ------------------------------------


def coordinator_stub(address):
    return coordinator_pb2_grpc.CoordinatorServiceStub(grpc.insecure_channel(address))


def id_on_odd_partition(prefix, partitions=8):
    return next(f"{prefix}-{i}" for i in range(1000) if coordinators.transaction_log_partition(f"{prefix}-{i}", partitions) % 2 == 1)


def read_owner_node(cluster, transactional_id, partitions=8):
    from services.coordination import zk

    client = zk.connect(cluster.state.zookeeper)
    try:
        index = coordinators.transaction_log_partition(transactional_id, partitions)
        data, _ = client.get(coordinators.owner_path(cluster.state.zookeeper_root, index))
        return coordinators.PartitionOwner.decode(data)
    finally:
        client.stop()
        client.close()


def test_a_coordinator_whose_partition_moved_answers_not_coordinator_not_a_fatal_error(cluster):
    cluster.add_service("producer_id_svc", 0)
    for node_id in (0, 1):
        cluster.add_service("partition_svc", node_id)
    # coordinator 0 looks at ZooKeeper only once a minute, and its lease outlasts the test:
    # after coordinator 1 takes a partition over, 0 still holds its old view of it
    cluster.add_service("coordinator_svc", 0, ["--ownership-check-interval-ms", "60000", "--zookeeper-session-timeout-s", "300"])
    cluster.wait_until_coordinators_settle()
    transactional_id = id_on_odd_partition("moved")
    old = coordinator_stub(cluster.address("coordinator_svc-0"))
    retrying(lambda: old.InitProducerId(coordinator_pb2.InitProducerIdRequest(
        transactional_id="warm-up", transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1), timeout=10))
    cluster.add_service("coordinator_svc", 1, ["--ownership-check-interval-ms", "200"])
    wait_until(lambda: read_owner_node(cluster, transactional_id).node_id == 1, message="coordinator 1 taking the partition over")
    new = coordinator_stub(cluster.address("coordinator_svc-1"))
    created = retrying(lambda: new.InitProducerId(coordinator_pb2.InitProducerIdRequest(
        transactional_id=transactional_id, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1), timeout=10))
    stale = lambda: old.AddPartitionsToTxn(coordinator_pb2.AddPartitionsToTxnRequest(  # noqa: E731
        transactional_id=transactional_id, producer_id=created.producer_id, producer_epoch=created.producer_epoch,
        partitions=[common_pb2.TopicPartition(topic="__consumer_offsets", partition=0)]), timeout=10)
    assert rpc_error_name(stale) == "NOT_COORDINATOR"


# --- suspected: the coordinator epoch outgrowing a producer epoch ---------------------------------------------------


def test_the_transaction_log_stays_writable_after_32767_changes_of_owner(cluster):
    from services.coordination import zk

    client = zk.connect(cluster.state.zookeeper)
    try:  # as if ownership had moved 32766 times already (on every coordinator join or leave)
        for index in range(8):
            client.create(coordinators.owner_path(cluster.state.zookeeper_root, index),
                          coordinators.PartitionOwner(9, 32766, 900_000 + index).encode(), makepath=True)
    finally:
        client.stop()
        client.close()
    cluster.add_service("producer_id_svc", 0)
    for node_id in (0, 1):
        cluster.add_service("partition_svc", node_id)
    cluster.add_service("coordinator_svc", 0, ["--ownership-check-interval-ms", "200"])
    cluster.wait_until_coordinators_settle()  # epoch 32767: the last that fits a producer epoch
    cluster.add_service("coordinator_svc", 1, ["--ownership-check-interval-ms", "200"])
    cluster.wait_until_coordinators_settle()  # the odd partitions move on to 32768
    transactional_id = id_on_odd_partition("wrapped")
    assert read_owner_node(cluster, transactional_id).coordinator_epoch == 32768
    raw = Raw(cluster)
    try:
        raw.create_topic("wrapped", 1)
        producer = TxnProducer(raw, transactional_id).init()
        producer.add(("wrapped", 0))
        assert error_name(producer.send("wrapped", 0, "w").error.code) == "NONE"
        producer.end(committed=True)
        wait_until(lambda: values(raw, "wrapped", 0) == ["w"], message="the commit")
        assert producer_entry(raw, "wrapped", 0, producer.producer_id).coordinator_epoch == 32768
    finally:
        raw.close()


# --- suspected: a group commit retried while its Complete records are written ------------------------------------------


COORDINATOR_MOVED = {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"}


def test_a_group_commit_retried_while_its_members_complete_answers_ok(shared_raw):
    import concurrent.futures

    members = [TxnProducer(shared_raw, f"big/m{i}") for i in range(600)]  # more than one transaction-log write of records

    def prepared(member):
        member.init()
        return prepare(member)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        handles = list(pool.map(prepared, members))
    coordinator = members[0].coordinator()
    request = coordinator_pb2.CommitTransactionGroupRequest(group_id="big", handles=handles)
    retrying(lambda: coordinator.CommitTransactionGroup(request, timeout=30))

    def retries(seconds=4.0):  # as clients whose answer was lost would send them, while the members complete
        answers, deadline, at = [], time.monotonic() + seconds, coordinator
        while time.monotonic() < deadline:
            try:
                at.CommitTransactionGroup(request, timeout=30)
                answers.append("NONE")
            except grpc.RpcError as exc:
                name = errors.from_rpc_error(exc).name
                if name in COORDINATOR_MOVED:  # a loaded machine's ZooKeeper session lapsed: look it up again, as a client does
                    at = members[0].coordinator()
                    continue
                answers.append(name)
        return answers

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = [a for batch_of in pool.map(lambda _: retries(), range(4)) for a in batch_of]
    assert answers and set(answers) <= {"NONE", "CONCURRENT_TRANSACTIONS"}, sorted(set(answers))
    wait_until(lambda: members[-1].describe().state == TransactionState.COMPLETE_COMMIT.to_proto(), message="the group's completion")
    states = {m.describe().state for m in members[::50]}
    assert states == {TransactionState.COMPLETE_COMMIT.to_proto()}
