"""Transactions end to end through the real services (raw gRPC steps): atomic
commits, aborts, the LSO, fencing, timeouts, coordinator failover, bad input."""

import collections
import concurrent.futures
import json
import signal

import grpc
import pytest
from support.errors import error_name, failure_name
from support.reads import COMMITTED, UNCOMMITTED, values
from support.waiting import wait_until

from coordinator_svc.transaction_state import TransactionState
from services.tooling.cluster import LocalCluster
from tests.conftest import running
from tests.integ.raw import Raw, plain_batch
from tests.integ.test_metrics import total
from tests.integ.txn_raw import TxnProducer, retrying
from txlog import Admin
from txlog.protocol import errors
from txlog.protocol.hashing import partition_for_id
from txlog.v1 import common_pb2, coordinator_pb2, partition_pb2


def test_commit_is_atomic_across_two_instances_and_abort_leaves_nothing_committed(shared_raw):
    shared_raw.create_topic("atomic", 2)
    leaders = shared_raw.leaders("atomic")
    assert leaders[0] != leaders[1]  # the transaction spans both partition_svc instances
    producer = TxnProducer(shared_raw, "atomic-tx").init()
    producer.add(("atomic", 0), ("atomic", 1))
    for p in (0, 1):
        assert error_name(producer.send("atomic", p, f"c{p}")) == "NONE"
    assert values(shared_raw, "atomic", 0, COMMITTED) == [] and values(shared_raw, "atomic", 1, COMMITTED) == []
    epoch = producer.producer_epoch
    assert producer.end(committed=True).producer_epoch == epoch + 1  # Transactions V2: every EndTxn bumps the epoch
    wait_until(lambda: values(shared_raw, "atomic", 0, COMMITTED) == ["c0"] and values(shared_raw, "atomic", 1, COMMITTED) == ["c1"], message="commit")

    producer.add(("atomic", 0), ("atomic", 1))
    for p in (0, 1):
        assert error_name(producer.send("atomic", p, f"a{p}")) == "NONE"
    producer.end(committed=False)
    wait_until(lambda: producer.describe().state == TransactionState.COMPLETE_ABORT.to_proto(), message="abort")
    for p in (0, 1):
        assert values(shared_raw, "atomic", p, COMMITTED) == [f"c{p}"]
        assert values(shared_raw, "atomic", p, UNCOMMITTED) == [f"c{p}", f"a{p}"]  # markers are never returned
        assert shared_raw.list_offset("atomic", p, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset == 4  # 2 records + 2 markers


def test_an_open_transaction_holds_the_lso_over_later_commits(shared_raw):
    shared_raw.create_topic("lso", 1)
    first, second = TxnProducer(shared_raw, "lso-first").init(), TxnProducer(shared_raw, "lso-second").init()
    first.add(("lso", 0))
    assert error_name(first.send("lso", 0, "first")) == "NONE"
    second.add(("lso", 0))
    assert error_name(second.send("lso", 0, "second")) == "NONE"
    second.end(committed=True)
    wait_until(lambda: second.describe().state == TransactionState.COMPLETE_COMMIT.to_proto(), message="second commit")
    assert shared_raw.list_offset("lso", 0, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset == 0
    assert values(shared_raw, "lso", 0, COMMITTED) == []  # the later commit waits behind the open transaction
    first.end(committed=True)
    wait_until(lambda: values(shared_raw, "lso", 0, COMMITTED) == ["first", "second"], message="both visible")


def test_a_new_producer_fences_the_zombie_and_aborts_its_transaction(shared_raw):
    shared_raw.create_topic("zombie", 1)
    zombie = TxnProducer(shared_raw, "shared-id").init()
    zombie.add(("zombie", 0))
    assert error_name(zombie.send("zombie", 0, "zombie-1")) == "NONE"
    successor = TxnProducer(shared_raw, "shared-id").init()  # retries CONCURRENT_TRANSACTIONS while the old one is aborted
    assert successor.producer_id == zombie.producer_id and successor.producer_epoch > zombie.producer_epoch
    assert error_name(zombie.send("zombie", 0, "zombie-2")) == "PRODUCER_FENCED"
    assert failure_name(lambda: zombie.end(committed=True)) == "PRODUCER_FENCED"
    successor.add(("zombie", 0))
    assert error_name(successor.send("zombie", 0, "successor")) == "NONE"
    successor.end(committed=True)
    wait_until(lambda: values(shared_raw, "zombie", 0, COMMITTED) == ["successor"], message="successor's commit")
    assert values(shared_raw, "zombie", 0, UNCOMMITTED) == ["zombie-1", "successor"]


def test_a_timed_out_transaction_is_aborted_and_its_late_commit_changes_nothing(shared_raw):
    shared_raw.create_topic("slow", 1)
    producer = TxnProducer(shared_raw, "slow-tx", timeout_ms=1000).init()
    producer.add(("slow", 0))
    assert error_name(producer.send("slow", 0, "too-late")) == "NONE"
    wait_until(lambda: producer.describe().state == TransactionState.COMPLETE_ABORT.to_proto(), message="timeout abort")
    assert shared_raw.list_offset("slow", 0, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset == 2
    # the next incarnation begins a transaction; then the paused producer's EndTxn arrives (KAFKA-17754)
    successor = TxnProducer(shared_raw, "slow-tx").init()
    successor.add(("slow", 0))
    assert error_name(successor.send("slow", 0, "next")) == "NONE"
    assert failure_name(lambda: producer.end(committed=True)) == "PRODUCER_FENCED"
    assert error_name(producer.send("slow", 0, "zombie")) == "PRODUCER_FENCED"
    assert successor.describe().state == TransactionState.ONGOING.to_proto()
    successor.end(committed=True)
    wait_until(lambda: values(shared_raw, "slow", 0, COMMITTED) == ["next"], message="successor's commit")


def test_another_coordinator_completes_a_commit_decided_before_a_crash(raw, txn_cluster):
    raw.create_topic("failover", 1)
    data_leader = raw.leaders("failover")[0]
    state_leaders = raw.leaders("__transaction_state")
    # a transactional id whose log partition lives on the other partition_svc, so the data leader can be down
    tid = next(f"fo-{i}" for i in range(1000) if state_leaders[partition_for_id(f"fo-{i}", len(state_leaders))] != data_leader)
    producer = TxnProducer(raw, tid).init()
    producer.add(("failover", 0))
    assert error_name(producer.send("failover", 0, "decided")) == "NONE"
    names = {p.address: n for n, p in txn_cluster.state.services.items()}
    metadata = raw.metadata(partition_pb2.MetadataRequest(transactional_ids=[tid]))
    coordinator_name = names[metadata.transaction_coordinators[0].address]
    data_leader_name = names[data_leader]
    txn_cluster.kill(data_leader_name)  # the markers cannot land yet
    producer.end(committed=True)  # PrepareCommit is durable; the answer comes before the markers
    txn_cluster.kill(coordinator_name)  # the coordinator dies with the markers unsent
    txn_cluster.start(data_leader_name)
    wait_until(lambda: values(raw, "failover", 0, COMMITTED) == ["decided"], timeout_s=40,
               message="the other coordinator's markers")
    # CompleteCommit is written once the markers are: a moment after a reader sees them (seen in CI)
    wait_until(lambda: producer.describe().state == TransactionState.COMPLETE_COMMIT.to_proto(), timeout_s=40,
               message="the transaction completed")
    txn_cluster.start(coordinator_name)


def test_concurrent_add_partitions_of_one_transaction_either_succeed_or_ask_for_a_retry(shared_raw):
    """Found by the Spark job: AddOffsets racing an AddPartitions of the same id hit a
    coordinator check-then-await-then-write window and failed with UNKNOWN_SERVER_ERROR."""
    producer = TxnProducer(shared_raw, "racing").init()
    coordinator = producer.coordinator()

    def add(topic, partition):
        try:
            reply = coordinator.AddPartitionsToTxn(coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id="racing", producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
                partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)]), timeout=10)
            return [error_name(r) for r in reply.results][0]
        except grpc.RpcError as exc:
            return errors.from_rpc_error(exc).name

    answers = collections.Counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for round_ in range(8):  # a topic the coordinator has not seen makes it look the topic up (an await)
            topic = f"race{round_}"
            shared_raw.create_topic(topic, 4)
            answers.update(pool.map(lambda p, t=topic: add(t, p), range(4)))
    assert set(answers) <= {"NONE", "CONCURRENT_TRANSACTIONS"}, answers
    for round_ in range(8):  # what was refused goes in on a retry; the transaction then holds every partition
        producer.add(*[(f"race{round_}", p) for p in range(4)])
    assert len(producer.describe().partitions) == 32


def test_clients_cannot_produce_to_internal_topics(raw):
    """Found by the hostile-input suite: a stray record in __transaction_state stopped every later load of
    its partition. Only the owning coordinator's log producer writes there; offsets go through OffsetCommit."""
    TxnProducer(raw, "internal-probe").init()  # creates __transaction_state
    raw.stub(raw.bootstrap[0]).Metadata(partition_pb2.MetadataRequest(group_ids=["g"]), timeout=10)  # and __consumer_offsets
    for topic in ("__transaction_state", "__consumer_offsets"):
        before = raw.list_offset(topic, 0, partition_pb2.OFFSET_SPEC_LATEST).offset
        for producer_id, epoch, sequence in ((-1, -1, -1), (123456, 0, 0)):
            batch = common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                                           records=[common_pb2.Record(key=b"k", value=b"garbage")])
            result = raw.produce(topic, 0, batch)
            assert error_name(result) == "INVALID_TOPIC" and "internal topic" in result.error.message, result
        assert raw.list_offset(topic, 0, partition_pb2.OFFSET_SPEC_LATEST).offset == before


def test_offsets_in_a_transaction_become_visible_with_its_commit(shared_raw):
    shared_raw.create_topic("in", 1)
    producer = TxnProducer(shared_raw, "ctp").init()
    coordinator = producer.coordinator()
    retrying(lambda: coordinator.AddOffsetsToTxn(coordinator_pb2.AddOffsetsToTxnRequest(
        transactional_id="ctp", producer_id=producer.producer_id, producer_epoch=producer.producer_epoch, group_id="grp"), timeout=10))
    group_coordinator = shared_raw.stub(shared_raw.stub(shared_raw.bootstrap[0]).Metadata(partition_pb2.MetadataRequest(group_ids=["grp"]), timeout=10).group_coordinators[0].address)
    reply = group_coordinator.TxnOffsetCommit(partition_pb2.TxnOffsetCommitRequest(
        transactional_id="ctp", group_id="grp", producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
        offsets=[partition_pb2.PartitionOffset(topic="in", partition=0, offset=7)]), timeout=10)
    assert [r.error.code for r in reply.results] == [0]

    def committed(require_stable=False):
        return group_coordinator.OffsetFetch(partition_pb2.OffsetFetchRequest(
            group_id="grp", partitions=[common_pb2.TopicPartition(topic="in", partition=0)], require_stable=require_stable), timeout=10).offsets[0].offset

    assert committed() == -1
    assert failure_name(lambda: committed(require_stable=True)) == "UNSTABLE_OFFSET_COMMIT"
    producer.end(committed=True)
    wait_until(lambda: committed(require_stable=True) == 7, message="offsets committed with the transaction")


def test_bad_transactional_requests_get_clear_errors_and_change_nothing(shared_raw):
    shared_raw.create_topic("strict", 2)
    producer = TxnProducer(shared_raw, "strict-tx").init()
    coordinator = producer.coordinator()

    def init(**fields):
        request = dict(transactional_id="strict-tx", transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1)
        return lambda: coordinator.InitProducerId(coordinator_pb2.InitProducerIdRequest(**{**request, **fields}), timeout=10)

    assert failure_name(init(transaction_timeout_ms=10**9)) == "INVALID_TRANSACTION_TIMEOUT"
    assert failure_name(init(transaction_timeout_ms=0)) == "INVALID_TRANSACTION_TIMEOUT"
    assert failure_name(init(transactional_id="bad id!")) == "INVALID_TRANSACTIONAL_ID"
    assert failure_name(lambda: producer.end(committed=True)) == "INVALID_TXN_STATE"  # commit without a transaction
    # a send to a partition never added to the transaction: refused by the leader after asking the coordinator
    producer.add(("strict", 0))
    assert error_name(producer.send("strict", 1, "unregistered")) == "INVALID_TXN_STATE"
    assert values(shared_raw, "strict", 1, UNCOMMITTED) == []
    wrong_epoch = TxnProducer(shared_raw, "strict-tx")
    wrong_epoch.producer_id, wrong_epoch.producer_epoch = producer.producer_id, producer.producer_epoch + 5
    assert failure_name(lambda: wrong_epoch.add(("strict", 0))) == "INVALID_PRODUCER_EPOCH"
    unknown = TxnProducer(shared_raw, "never-initialised")
    unknown.producer_id, unknown.producer_epoch = 123456, 0
    assert failure_name(lambda: unknown.end(committed=True)) == "INVALID_PRODUCER_ID_MAPPING"
    assert producer.describe().state == TransactionState.ONGOING.to_proto()
    assert shared_raw.produce("strict", 1, plain_batch(["plain"])).error.code == 0
    producer.end(committed=False)


def test_a_hanging_transaction_the_coordinator_forgot_is_found_and_aborted(raw, txn_cluster):
    raw.create_topic("hang", 1)
    producer = TxnProducer(raw, "hanging-tx").init()
    producer.add(("hang", 0))
    assert error_name(producer.send("hang", 0, "stuck")) == "NONE"
    # delete the coordinator's record of the id (a tombstone in its log partition, written as its owner
    # writes: only the owner's log producer may write there), then let it reload
    state_partition = partition_for_id("hanging-tx", len(raw.leaders("__transaction_state")))
    (log_writer,) = [p for p in raw.producers("__transaction_state", state_partition).producers if p.last_sequence >= 0]
    tombstone = common_pb2.RecordBatch(producer_id=log_writer.producer_id, producer_epoch=log_writer.producer_epoch,
                                       base_sequence=log_writer.last_sequence + 1, records=[common_pb2.Record(key=b"hanging-tx")])
    assert raw.produce("__transaction_state", state_partition, tombstone).error.code == 0
    names = {p.address: n for n, p in txn_cluster.state.services.items()}
    coordinator = names[raw.metadata(partition_pb2.MetadataRequest(transactional_ids=["hanging-tx"])).transaction_coordinators[0].address]
    txn_cluster.kill(coordinator)
    txn_cluster.start(coordinator)
    wait_until(lambda: producer.describe().error.code == errors.ErrorCode.Value("TRANSACTIONAL_ID_NOT_FOUND"), timeout_s=30, message="reload")

    # hanging: the partition has an open transaction that no coordinator knows
    described = raw.producers("hang", 0)
    hanging = [p for p in described.producers if p.current_txn_start_offset >= 0]
    assert [(p.producer_id, p.current_txn_start_offset) for p in hanging] == [(producer.producer_id, 0)]
    listed = retrying(lambda: producer.coordinator().ListTransactions(
        coordinator_pb2.ListTransactionsRequest(producer_id_filters=[producer.producer_id]), timeout=10))  # retries LOAD_IN_PROGRESS
    assert list(listed.transactions) == []
    assert raw.list_offset("hang", 0, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset == 0  # it holds the LSO forever

    with Admin(txn_cluster.state.bootstrap) as admin:
        found = admin.find_hanging(["hang"])
        assert [(h.topic, h.partition, h.producer_id, h.start_offset) for h in found] == [("hang", 0, producer.producer_id, 0)]
        admin.abort_transaction(("hang", 0), found[0].producer_id, found[0].producer_epoch, found[0].coordinator_epoch)
        assert admin.find_hanging(["hang"]) == []
    assert raw.list_offset("hang", 0, partition_pb2.OFFSET_SPEC_LAST_STABLE).offset == 2
    assert values(raw, "hang", 0, COMMITTED) == [] and values(raw, "hang", 0, UNCOMMITTED) == ["stuck"]
    assert [p.current_txn_start_offset for p in raw.producers("hang", 0).producers] == [-1]



@pytest.fixture
def expiring_cluster(tmp_path):
    local = LocalCluster(tmp_path / "cluster")
    local.up(coordinator_svcs=1, service_args={"coordinator_svc": [
        "--transaction-check-interval-ms", "200", "--ownership-check-interval-ms", "300", "--transactional-id-expiration-ms", "1500"]})
    yield local
    local.down(grace_s=5)


def test_transactional_ids_idle_past_their_expiration_are_removed(expiring_cluster):
    raw = Raw(expiring_cluster)
    try:
        raw.create_topic("idle", 1)
        idle = TxnProducer(raw, "idle-tx").init()
        busy = TxnProducer(raw, "busy-tx").init()
        busy.add(("idle", 0))  # Ongoing: never expires while open (its timeout aborts it instead)
        wait_until(lambda: idle.describe().error.code == errors.ErrorCode.Value("TRANSACTIONAL_ID_NOT_FOUND"), message="expiration")
        assert busy.describe().state == TransactionState.ONGOING.to_proto()
        again = TxnProducer(raw, "idle-tx").init()  # a removed id starts afresh
        assert again.producer_epoch == 0 and again.producer_id != idle.producer_id
    finally:
        raw.close()


@pytest.fixture
def compacting_cluster(tmp_path, zookeeper_for):
    """The full cluster, its partition_svc running retention and compaction every 200 ms."""
    yield from running(tmp_path / "cluster", zookeeper_for, {"service_args": {"partition_svc": ["--retention-check-interval-ms", "200"]}})


INDEXED = "txlog_partition_aborted_transactions"  # a led partition's aborted-index entries


def from_log_start(raw, topic: str, isolation) -> list[str] | None:
    """The values from the partition's log start (None when compaction moved it in between: asked again)."""
    start = raw.list_offset(topic, 0, partition_pb2.OFFSET_SPEC_EARLIEST).offset
    try:
        return values(raw, topic, 0, isolation, offset=start)
    except errors.TxlogError as exc:
        if exc.name != "OFFSET_OUT_OF_RANGE":
            raise
        return None


def test_compaction_removes_aborted_transactions_with_their_index_entries_for_good(compacting_cluster):
    """Found by the hour's soak: compaction removed the aborted batches of a compacted topic
    (__consumer_offsets, with every aborted transaction that committed offsets) but kept
    their entries in the aborted index, in memory and on disk, for ever."""
    cluster = compacting_cluster
    with Raw(cluster) as raw:
        raw.create_topic("compacted", 1, **{"cleanup.policy": "compact"})
        raw.create_topic("deleted", 1)  # cleanup.policy=delete, a week's retention: its aborted transaction stays indexed
        producer = TxnProducer(raw, "compacting").init()
        for value, committed in (("aborted-1", False), ("aborted-2", False), ("aborted-3", False), ("kept", True)):
            producer.add(("compacted", 0), ("deleted", 0))
            assert producer.send("compacted", 0, value).error.code == 0 and producer.send("deleted", 0, value).error.code == 0
            producer.end(committed=committed)
        wait_until(lambda: total(cluster, "partition_svc", INDEXED, topic="deleted") == 3, 30, "the aborted transactions indexed")
        wait_until(lambda: from_log_start(raw, "compacted", COMMITTED) == ["kept"], 30, "the commit")
        wait_until(lambda: from_log_start(raw, "compacted", UNCOMMITTED) == ["kept"] and total(cluster, "partition_svc", INDEXED, topic="compacted") == 0,
                   30, "the aborted batches compacted away, with their index entries")
        leader = next(name for name, info in cluster.state.services.items() if info.address == raw.leaders("compacted")[0])
        cluster.kill(leader)
        cluster.start(leader)
        wait_until(lambda: from_log_start(raw, "compacted", COMMITTED) == ["kept"], 60, "the partition led again")
        assert total(cluster, "partition_svc", INDEXED, topic="compacted") == 0  # nothing loaded back from disk


def test_compaction_removes_the_markers_of_transactions_it_emptied_once_delete_retention_has_passed(compacting_cluster):
    """Found by the hour's soak: a compacted topic kept every transaction's marker for good (37,531 markers
    in the consume-transform-produce group's __consumer_offsets partition after an hour, beside about 300
    batches, its log start stuck at the first marker). A marker goes delete.retention.ms after compaction
    found none of its transaction's batches left; the transaction whose batch is kept keeps its marker."""
    cluster = compacting_cluster
    with Raw(cluster) as raw:
        raw.create_topic("markers", 1, **{"cleanup.policy": "compact", "delete.retention.ms": "1000"})
        producer = TxnProducer(raw, "marking").init()

        def transaction(value: str, committed: bool = True) -> int:
            producer.add(("markers", 0))
            result = producer.send("markers", 0, value)  # keyless: each record supersedes the one before
            assert result.error.code == 0, result
            producer.end(committed=committed)
            return result.base_offset

        for value, committed in (("v1", True), ("aborted", False), ("v2", True)):
            transaction(value, committed)
        last = transaction("v3")
        earliest = lambda: (log_start_answered(raw, "markers") or [None])[0]  # noqa: E731
        # the old code kept the log start at 1, v1's marker, for ever
        wait_until(lambda: earliest() == last and from_log_start(raw, "markers", COMMITTED) == ["v3"], 30,
                   "every marker but v3's compacted away with its transaction's batches")
        # what v3's marker ends is still ended: the LSO moves past the next transaction, after a restart too
        last = transaction("v4")
        wait_until(lambda: earliest() == last and from_log_start(raw, "markers", COMMITTED) == ["v4"], 30, "v4 alone left")
        leader = next(name for name, info in cluster.state.services.items() if info.address == raw.leaders("markers")[0])
        cluster.kill(leader)
        cluster.start(leader)
        wait_until(lambda: from_log_start(raw, "markers", COMMITTED) == ["v4"], 60, "the partition led again")
        last = transaction("v5")
        wait_until(lambda: from_log_start(raw, "markers", COMMITTED) == ["v5"] and earliest() == last, 60, "v5 committed and alone")


@pytest.fixture
def three_replica_cluster(tmp_path, zookeeper_for):
    """Three partition_svc, compaction every 200 ms, a follower out of the ISR 2 s after it stops fetching."""
    yield from running(tmp_path / "cluster", zookeeper_for, {
        "partition_svcs": 3, "service_args": {"partition_svc": ["--retention-check-interval-ms", "200", "--replica-lag-time-max-ms", "2000"]}})


def log_start_answered(raw, topic: str) -> list[int] | None:
    """[the leader's log start], or None while it answers an error (a leader still taking over)."""
    result = raw.list_offset(topic, 0, partition_pb2.OFFSET_SPEC_EARLIEST)
    return None if result.HasField("error") and result.error.code else [result.offset]


def compaction_passes(cluster, name: str, topic: str) -> list[int]:
    """The log starts an instance's compaction passes on ``topic`` left, from its log."""
    with open(cluster.state.services[name].log) as lines:
        found = [json.loads(line) for line in lines if '"msg": "retention"' in line]
    return [entry["log_start_offset"] for entry in found if entry.get("topic") == topic]


def test_a_follower_keeps_the_markers_a_paused_replica_has_not_fetched_and_leads_with_them(three_replica_cluster):
    """A follower compacts its own copy, below what its leader says every replica holds
    (ReplicaFetch's replicated_end_offset): with a third replica paused before a transaction's
    marker, the other follower keeps the marker, and still has it once it leads."""
    cluster = three_replica_cluster
    with Raw(cluster) as raw:
        raw.create_topic("kept-markers", 1, **{"cleanup.policy": "compact", "delete.retention.ms": "0",
                                               "min.insync.replicas": "2"})
        by_address = {info.address: name for name, info in cluster.state.services.items()}
        leader = by_address[raw.leaders("kept-markers")[0]]
        paused, follower = sorted(n for n, i in cluster.state.services.items() if i.kind == "partition_svc" and n != leader)
        cluster.kill(paused, signal.SIGSTOP)
        try:
            producer = TxnProducer(raw, "kept-markers").init()
            producer.add(("kept-markers", 0))
            assert producer.send("kept-markers", 0, "v1").error.code == 0  # keyless: v2 supersedes it
            producer.end(committed=True)  # its marker at offset 1
            producer.add(("kept-markers", 0))
            assert producer.send("kept-markers", 0, "v2").error.code == 0
            producer.end(committed=True)
            # v1 compacted away on the follower: its log start at v1's marker, which it keeps
            wait_until(lambda: compaction_passes(cluster, follower, "kept-markers"), 30, "the follower's compaction of v1")
            assert set(compaction_passes(cluster, follower, "kept-markers")) == {1}  # 2 had it dropped the marker too
            cluster.kill(leader)
            wait_until(lambda: raw.leaders("kept-markers")[0] == cluster.state.services[follower].address, 60, "the follower leading")
            start = wait_until(lambda: log_start_answered(raw, "kept-markers"), 30, "the new leader's log start")
            assert start == [1]  # the marker at 1 kept ([2] had the follower dropped it)
        finally:
            cluster.kill(paused, signal.SIGCONT)
        # the paused replica and the old leader, started again, catch up from the new leader, markers
        # included; then they go (a replica that is down holds their removal back)
        cluster.start(leader)
        wait_until(lambda: raw.list_offset("kept-markers", 0, partition_pb2.OFFSET_SPEC_EARLIEST).offset == 2
                   and from_log_start(raw, "kept-markers", COMMITTED) == ["v2"], 60, "the markers gone once every live replica has them")
