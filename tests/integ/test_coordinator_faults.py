"""Coordinator faults through the real services: a paused (SIGSTOP) coordinator
replaced by the other one (its late markers are fenced, its answers after the
pause), a ZooKeeper stall while markers are retried, a coordinator killed with a
transaction open, a restart that reloads __transaction_state, ListTransactions'
fan-out, and the answers of a coordinator that does not own, or is still
loading, an id.

Coordinators here run with a 5 s ZooKeeper session (instead of 10 s) so that a
paused or killed one is replaced sooner; every wait polls with a deadline."""

import asyncio
import concurrent.futures
import json
import re
import signal
import time
from dataclasses import dataclass

import grpc
import pytest
from support.errors import error_name
from support.reads import COMMITTED, UNCOMMITTED, values
from support.waiting import wait_until

from coordinator_svc.transaction_state import TransactionRecord, TransactionState
from services.coordination import coordinators, zk
from services.tooling.cluster import LocalCluster, health_serving
from tests.integ.raw import Raw, plain_batch
from tests.integ.test_metrics import scrape
from tests.integ.txn_raw import TxnProducer
from txlog.protocol import TRANSACTION_STATE_TOPIC, errors
from txlog.protocol.hashing import partition_for_id
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, partition_pb2

STATE_TOPIC = TRANSACTION_STATE_TOPIC
SESSION_TIMEOUT_S = 5
COORDINATOR_ARGS = [
    "--transaction-check-interval-ms", "200",
    "--ownership-check-interval-ms", "300",
    "--zookeeper-session-timeout-s", str(SESSION_TIMEOUT_S),
]
TAKEOVER_TIMEOUT_S = 40  # session expiry + ownership check + load, with room for a slow machine
ONGOING = TransactionState.ONGOING.to_proto()
EMPTY = TransactionState.EMPTY.to_proto()
PREPARE_ABORT = TransactionState.PREPARE_ABORT.to_proto()
COMPLETE_ABORT = TransactionState.COMPLETE_ABORT.to_proto()
COMPLETE_COMMIT = TransactionState.COMPLETE_COMMIT.to_proto()
# answers that only say "not here / not yet; retry"
NOT_SERVING_HERE = {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"}
SINGLE_REPLICA_ARGS = ["--default-replication-factor", "1", "--internal-topic-replication-factor", "1"]


@pytest.fixture
def fault_cluster(tmp_path, zookeeper_for):
    """ZooKeeper, producer_id_svc, two partition_svc, two coordinator_svc with fast checks and a 5 s session.
    Every partition has one replica: these tests stop a partition's only instance to hold its markers back
    (tests/integ/test_replication.py is where partitions fail over)."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(service_args={"coordinator_svc": COORDINATOR_ARGS, "partition_svc": SINGLE_REPLICA_ARGS}, zookeeper=zookeeper_for)
    yield local
    for name in local.state.services:  # a test that failed mid-pause must not leave a stopped process behind
        local.kill(name, signal.SIGCONT)
    local.down(grace_s=5)


@pytest.fixture
def zk_client(fault_cluster):
    client = zk.connect(fault_cluster.state.zookeeper)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def raw(fault_cluster, zk_client):
    """A raw client, once the coordinators have settled who owns what (the first one up takes every partition,
    the second takes its share a moment later: tests that pick ids by owner must not see that move)."""
    client = Raw(fault_cluster)
    wait_until_balanced(fault_cluster, client, zk_client)
    yield client
    client.close()


# --- helpers -----------------------------------------------------------------------------


def read_owner(zk_client, cluster, index) -> coordinators.PartitionOwner | None:
    found = asyncio.run(coordinators.read_owner(zk_client, cluster.state.zookeeper_root, index))
    return None if found is None else found[0]


def owner(zk_client, cluster, index) -> coordinators.PartitionOwner:
    """ZooKeeper's owner of a __transaction_state partition."""
    found = read_owner(zk_client, cluster, index)
    assert found is not None, f"{STATE_TOPIC} partition {index} has no owner node"
    return found


def wait_until_balanced(cluster, raw, zk_client) -> None:
    """Until partition i of __transaction_state is owned, and served, by the i-th live coordinator (modulo
    their number: coordinator_svc's balancing rule)."""
    count = wait_until(lambda: len(raw.leaders(STATE_TOPIC)), 30, f"{STATE_TOPIC} to exist")
    nodes = sorted(int(name.rsplit("-", 1)[1]) for name, info in cluster.state.services.items() if info.kind == "coordinator_svc")
    probes = [tid_in("probe", lambda t, i=i: partition_for_id(t, count) == i) for i in range(count)]

    def balanced():
        for index, probe in enumerate(probes):
            current = read_owner(zk_client, cluster, index)
            if current is None or current.node_id != nodes[index % len(nodes)]:
                return False
            described = describe_at(raw, cluster.address(coordinator_name(cluster, current.node_id)), probe)
            if error_name(described) != "TRANSACTIONAL_ID_NOT_FOUND":
                return False
        return True

    wait_until(balanced, 30, "every transaction log partition to be served by its coordinator")


def wait_for_new_owner(zk_client, cluster, index, old: coordinators.PartitionOwner) -> coordinators.PartitionOwner:
    def replaced():
        current = owner(zk_client, cluster, index)
        return current if current.node_id != old.node_id and current.coordinator_epoch > old.coordinator_epoch else None

    return wait_until(replaced, TAKEOVER_TIMEOUT_S, f"another coordinator to own {STATE_TOPIC} partition {index} at an epoch above {old.coordinator_epoch}")


def coordinator_name(cluster, node_id) -> str:
    name = f"coordinator_svc-{node_id}"
    assert name in cluster.state.services, name
    return name


def name_of(cluster, address) -> str:
    return next(name for name, info in cluster.state.services.items() if info.address == address)


def coordinator_stub(raw, address) -> coordinator_pb2_grpc.CoordinatorServiceStub:
    channel = raw._channels.setdefault(address, grpc.insecure_channel(address))
    return coordinator_pb2_grpc.CoordinatorServiceStub(channel)


def describe_at(raw, address, transactional_id) -> coordinator_pb2.TransactionDescription:
    request = coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[transactional_id])
    return coordinator_stub(raw, address).DescribeTransactions(request, timeout=10).transactions[0]


def list_at(raw, address, **filters) -> dict[str, coordinator_pb2.TransactionListing]:
    reply = coordinator_stub(raw, address).ListTransactions(coordinator_pb2.ListTransactionsRequest(**filters), timeout=20)
    listed = {t.transactional_id: t for t in reply.transactions}
    assert len(listed) == len(reply.transactions), f"an id is listed twice: {reply}"
    return listed


def rpc_error(call) -> errors.TxlogError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return errors.from_rpc_error(info.value)


def names_the_partition(message, index) -> bool:
    return re.search(rf"\bpartition {index}\b", message) is not None


def tid_in(prefix, wanted) -> str:
    """A transactional id for which ``wanted(id)`` holds."""
    return next(f"{prefix}-{i}" for i in range(10_000) if wanted(f"{prefix}-{i}"))


def open_transaction_logged_apart(raw, topic, prefix) -> tuple[TxnProducer, int, str]:
    """A transaction with record "t1" in a new one-partition ``topic``, of an id
    whose transaction log the other partition_svc leads, so the data's leader can
    be stopped while the log is written: (its producer, its __transaction_state
    partition, the data's leader)."""
    raw.create_topic(topic, 1)
    data_leader = raw.leaders(topic)[0]
    state_leaders = raw.leaders(STATE_TOPIC)
    count = len(state_leaders)
    tid = tid_in(prefix, lambda t: state_leaders[partition_for_id(t, count)] != data_leader)
    producer = TxnProducer(raw, tid).init()
    producer.add((topic, 0))
    assert producer.send(topic, 0, "t1").error.code == 0
    return producer, partition_for_id(tid, count), data_leader


def committed_or_none(raw, topic, partition=0) -> list[str] | None:
    """The committed values, or None while the partition answers a (retriable) error: a restarted leader
    leads again only once the controller has elected it again."""
    result = raw.fetch(topic, partition, 0, isolation=COMMITTED)
    return None if result.error.code else [r.value.decode() for b in result.batches for r in b.records]


@dataclass(frozen=True)
class PartitionView:
    """Everything a late marker could change on a partition."""

    high_watermark: int
    last_stable_offset: int
    uncommitted: tuple[str, ...]
    committed: tuple[str, ...]
    producers: tuple[tuple[int, int, int, int], ...]  # (id, epoch, coordinator epoch, open transaction's first offset)


def view(raw, topic, partition=0) -> PartitionView:
    uncommitted = raw.fetch(topic, partition, 0, isolation=UNCOMMITTED)
    committed = raw.fetch(topic, partition, 0, isolation=COMMITTED)
    assert uncommitted.error.code == 0 and committed.error.code == 0, (uncommitted.error, committed.error)
    described = raw.producers(topic, partition)
    assert described.error.code == 0, described.error
    return PartitionView(
        uncommitted.high_watermark,
        uncommitted.last_stable_offset,
        tuple(r.value.decode() for b in uncommitted.batches for r in b.records),
        tuple(r.value.decode() for b in committed.batches for r in b.records),
        tuple((p.producer_id, p.producer_epoch, p.coordinator_epoch, p.current_txn_start_offset) for p in described.producers),
    )


def producer_entry(raw, topic, producer_id, partition=0):
    described = raw.producers(topic, partition)
    assert described.error.code == 0, described.error
    [entry] = [p for p in described.producers if p.producer_id == producer_id]
    return entry


def write_marker(raw, topic, producer_id, producer_epoch, committed, coordinator_epoch, partition=0):
    """A WriteTxnMarkers straight to the partition leader, as a coordinator sends it."""
    request = partition_pb2.WriteTxnMarkersRequest(
        markers=[
            partition_pb2.TxnMarker(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                committed=committed,
                coordinator_epoch=coordinator_epoch,
                partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)],
            )
        ]
    )
    return raw.leader(topic, partition).WriteTxnMarkers(request, timeout=10).markers[0].results[0]


def log_events(cluster, name, message) -> list[dict]:
    """The JSON log lines of one service whose msg is ``message``."""
    events = []
    with open(cluster.state.services[name].log) as log_file:
        for line in log_file:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("msg") == message:
                events.append(event)
    return events


def unloads(cluster, name, index) -> int:
    return sum(1 for e in log_events(cluster, name, "no longer serving transaction log partition") if e.get("partition") == index)


# --- 1. a paused coordinator cannot write markers ---------------------------------------


def test_a_paused_coordinator_replaced_by_the_other_cannot_change_anything_when_it_resumes(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    zombie, index, data_leader = open_transaction_logged_apart(raw, "paused", "pz")
    tid = zombie.transactional_id
    old = owner(zk_client, cluster, index)
    old_name = coordinator_name(cluster, old.node_id)
    old_address = cluster.address(old_name)
    assert raw.metadata(partition_pb2.MetadataRequest(transactional_ids=[tid])).transaction_coordinators[0].address == old_address
    data_leader_name = name_of(cluster, data_leader)

    cluster.kill(data_leader_name)  # the COMMIT markers cannot land: the old coordinator keeps retrying them
    zombie_epoch = zombie.producer_epoch
    zombie.end(committed=True)  # PrepareCommit is durable; the answer does not wait for the markers
    assert zombie.producer_epoch == zombie_epoch + 1
    unloads_before = unloads(cluster, old_name, index)
    cluster.kill(old_name, signal.SIGSTOP)  # paused with the markers unsent
    try:
        cluster.start(data_leader_name)
        new = wait_for_new_owner(zk_client, cluster, index, old)
        # the new owner loads PrepareCommit and finishes the commit with its own coordinator epoch
        wait_until(lambda: values(raw, "paused", 0, COMMITTED) == ["t1"], TAKEOVER_TIMEOUT_S, "the new owner's COMMIT marker")
        assert producer_entry(raw, "paused", zombie.producer_id).coordinator_epoch == new.coordinator_epoch
        successor = TxnProducer(raw, tid).init()
        assert (successor.producer_id, successor.producer_epoch) == (zombie.producer_id, zombie.producer_epoch + 1)
        successor.add(("paused", 0))
        assert successor.send("paused", 0, "t2").error.code == 0  # transaction 2 is open: t1 @0, marker @1, t2 @2
        before = view(raw, "paused")
        assert before.last_stable_offset == 2 and before.high_watermark == 3, before
        assert before.committed == ("t1",) and before.uncommitted == ("t1", "t2"), before

        # a marker with the old coordinator epoch is refused even at the producer's current epoch, where it
        # would otherwise close transaction 2
        for committed in (False, True):
            result = write_marker(raw, "paused", successor.producer_id, successor.producer_epoch, committed, old.coordinator_epoch)
            assert error_name(result) == "TRANSACTION_COORDINATOR_FENCED", result
            assert view(raw, "paused") == before
    finally:
        cluster.kill(old_name, signal.SIGCONT)

    # The resumed coordinator's marker retries and timers run against state it no longer owns. It either answers
    # NOT_COORDINATOR, or, once it has taken the partition back (it is the partition's preferred owner when both
    # are live) at a still newer epoch, the state the new owner left; wait until it has let go of its old view.
    def settled():
        described = describe_at(raw, old_address, tid)
        if error_name(described) == "NOT_COORDINATOR":
            assert names_the_partition(described.error.message, index), described
            return unloads(cluster, old_name, index) > unloads_before
        return described.error.code == 0 and described.producer_epoch == successor.producer_epoch and described.state == ONGOING

    wait_until(settled, TAKEOVER_TIMEOUT_S, "the resumed coordinator to give up its stale view")
    assert unloads(cluster, old_name, index) > unloads_before  # its stale partition (and marker task) is gone
    current = owner(zk_client, cluster, index)
    assert current.coordinator_epoch > old.coordinator_epoch
    if current.node_id == old.node_id:
        assert current.coordinator_epoch > new.coordinator_epoch  # taken back only through a new fence
    assert view(raw, "paused") == before  # nothing the old coordinator sent late changed the partition
    assert producer_entry(raw, "paused", zombie.producer_id).coordinator_epoch == new.coordinator_epoch
    assert successor.describe().state == ONGOING

    successor.end(committed=True)
    wait_until(lambda: values(raw, "paused", 0, COMMITTED) == ["t1", "t2"], 30, "transaction 2's commit")
    final_owner = owner(zk_client, cluster, index)
    # the commit's marker carries the epoch of the owner that wrote it: the new owner's, or a later one's if the
    # resumed coordinator (the partition's preferred owner) took the partition back before the commit; it may
    # also take it back just after, so the owner read now may be newer than the marker (a suite run saw 1 < 2)
    marker_epoch = producer_entry(raw, "paused", zombie.producer_id).coordinator_epoch
    assert new.coordinator_epoch <= marker_epoch <= final_owner.coordinator_epoch, (marker_epoch, new, final_owner)


def test_a_resumed_coordinator_never_answers_from_the_state_it_had_before_it_was_replaced(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    raw.create_topic("stale", 1)
    tid = "stale-tx"
    index = partition_for_id(tid, len(raw.leaders(STATE_TOPIC)))
    zombie = TxnProducer(raw, tid).init()
    zombie.add(("stale", 0))
    assert zombie.send("stale", 0, "zombie").error.code == 0
    stale = zombie.describe()
    assert stale.state == ONGOING
    old = owner(zk_client, cluster, index)
    old_name = coordinator_name(cluster, old.node_id)
    old_address = cluster.address(old_name)
    cluster.kill(old_name, signal.SIGSTOP)
    try:
        wait_for_new_owner(zk_client, cluster, index, old)
        successor = TxnProducer(raw, tid).init()  # at the new owner: fences the zombie, aborts its transaction
        truth = successor.describe()
        assert (truth.state, truth.producer_epoch) == (EMPTY, stale.producer_epoch + 3)  # the fence bumps twice, the init once
        wait_until(lambda: values(raw, "stale", 0, UNCOMMITTED) == ["zombie"] and raw.fetch("stale", 0, 0).last_stable_offset == 2, 20, "the abort marker")
    finally:
        cluster.kill(old_name, signal.SIGCONT)

    # Ask the resumed coordinator at once, and until it has settled: an answer is either "not here / not yet"
    # or the truth, never the view it had before the pause (Ongoing at the zombie's epoch).
    answers = []
    deadline = time.monotonic() + TAKEOVER_TIMEOUT_S
    while True:
        try:
            described = describe_at(raw, old_address, tid)
            answer = (error_name(described), described.state, described.producer_epoch)
        except grpc.RpcError as exc:
            answer = (errors.from_rpc_error(exc).name, None, None)
        answers.append(answer)
        if answer[0] == "NOT_COORDINATOR" or answer == ("NONE", truth.state, truth.producer_epoch):
            break
        assert time.monotonic() < deadline, f"the resumed coordinator never settled: {answers[-5:]}"
        time.sleep(0.02)
    assert values(raw, "stale", 0, COMMITTED) == [] and values(raw, "stale", 0, UNCOMMITTED) == ["zombie"]
    assert successor.describe().producer_epoch == truth.producer_epoch
    wrong = [a for a in answers if a[0] == "NONE" and a[1:] != (truth.state, truth.producer_epoch)]
    assert not wrong, (
        f"after SIGCONT the deposed coordinator answered DescribeTransactions({tid!r}) {len(wrong)} time(s) from its "
        f"pre-pause memory (state, epoch) = {wrong[0][1:]} instead of NOT_COORDINATOR; the truth is "
        f"({truth.state}, {truth.producer_epoch}); all answers: {answers}"
    )


@pytest.mark.own_zookeeper  # stops ZooKeeper
def test_a_decided_commit_completes_although_zookeeper_stalled_while_its_markers_were_retried(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    raw.create_topic("zkstall", 1)
    data_leader = raw.leaders("zkstall")[0]
    state_leaders = raw.leaders(STATE_TOPIC)
    count = len(state_leaders)
    tid = tid_in("zs", lambda t: state_leaders[partition_for_id(t, count)] != data_leader)
    index = partition_for_id(tid, count)
    producer = TxnProducer(raw, tid).init()
    producer.add(("zkstall", 0))
    assert producer.send("zkstall", 0, "decided").error.code == 0
    decided_by = owner(zk_client, cluster, index)
    address = cluster.address(coordinator_name(cluster, decided_by.node_id))
    data_leader_name = name_of(cluster, data_leader)
    cluster.kill(data_leader_name)  # the markers cannot land: the coordinator retries them, looking the leader up each round
    producer.end(committed=True)  # decided: PrepareCommit is durable
    cluster.kill("zookeeper", signal.SIGSTOP)
    try:
        # the coordinator's ZooKeeper requests hang until its client gives the connection up (2/3 of the 5 s
        # session; health turns NOT_SERVING); ZooKeeper resumes at once, within the session, so no owner changes
        wait_until(lambda: not health_serving(address), 2 * SESSION_TIMEOUT_S, "the coordinator to lose its ZooKeeper connection")
    finally:
        cluster.kill("zookeeper", signal.SIGCONT)
    cluster.start(data_leader_name)
    wait_until(lambda: health_serving(address), 30, "the coordinator's ZooKeeper session to come back")
    deadline = time.monotonic() + 30
    while committed_or_none(raw, "zkstall") != ["decided"]:
        if time.monotonic() > deadline:
            now_owner = read_owner(zk_client, cluster, index) if zk_client.connected else "unknown"
            pytest.fail(
                f"the decided commit of {tid!r} never completed after a ZooKeeper stall; owner before {decided_by}, "
                f"now {now_owner}; its coordinator describes it as {describe_at(raw, address, tid)}"
            )
        time.sleep(0.1)
    wait_until(lambda: producer.describe().state == COMPLETE_COMMIT, 20, "CompleteCommit")


# --- 2. a coordinator killed with a transaction open -------------------------------------


def test_a_transaction_left_open_by_a_killed_coordinator_times_out_at_the_new_owner(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    timeout_ms = 9_000  # longer than the takeover (5 s session), so the new owner's timer has to do it
    raw.create_topic("orphan", 1)
    tid = "orphan-tx"
    index = partition_for_id(tid, len(raw.leaders(STATE_TOPIC)))
    producer = TxnProducer(raw, tid, timeout_ms=timeout_ms).init()
    producer.add(("orphan", 0))
    assert producer.send("orphan", 0, "orphaned").error.code == 0  # offset 0
    assert raw.produce("orphan", 0, plain_batch(["plain"])).error.code == 0  # offset 1, held behind the LSO
    opened = producer.describe()
    assert opened.state == ONGOING and opened.transaction_start_time_ms > 0
    old = owner(zk_client, cluster, index)
    cluster.kill(coordinator_name(cluster, old.node_id))
    assert values(raw, "orphan", 0, COMMITTED) == [] and raw.fetch("orphan", 0, 0).last_stable_offset == 0

    new = wait_for_new_owner(zk_client, cluster, index, old)
    taken_over_ms = time.time() * 1000
    new_address = cluster.address(coordinator_name(cluster, new.node_id))
    seen = []

    def aborted():
        assert "orphaned" not in values(raw, "orphan", 0, COMMITTED)  # read_committed never shows it
        described = describe_at(raw, new_address, tid)
        seen.append(described)
        return described.error.code == 0 and described.state == COMPLETE_ABORT

    wait_until(aborted, timeout_ms / 1000 + 30, "the new owner to abort the timed-out transaction")
    loaded = [d for d in seen if d.error.code == 0]
    assert all(error_name(d) in NOT_SERVING_HERE for d in seen if d.error.code), seen
    for described in loaded:  # loaded from the log with its producer, epoch, partitions and original start time
        assert (described.producer_id, described.transaction_timeout_ms) == (opened.producer_id, timeout_ms)
        if described.state in (ONGOING, PREPARE_ABORT):
            assert described.transaction_start_time_ms == opened.transaction_start_time_ms, described
            assert list(described.partitions) == [common_pb2.TopicPartition(topic="orphan", partition=0)], described
    if taken_over_ms + 1_000 < opened.transaction_start_time_ms + timeout_ms:  # taken over well before the timeout:
        assert any(d.state == ONGOING for d in loaded), seen  # the new owner held it open until then
    assert loaded[-1].producer_epoch == opened.producer_epoch + 1  # the timeout abort bumped it: the producer is fenced

    after = wait_until(lambda: (lambda v: v if v.last_stable_offset == v.high_watermark == 3 else None)(view(raw, "orphan")), 20, "the LSO past the abort marker")
    assert after.committed == ("plain",) and after.uncommitted == ("orphaned", "plain"), after
    entry = producer_entry(raw, "orphan", producer.producer_id)
    assert (entry.coordinator_epoch, entry.current_txn_start_offset) == (new.coordinator_epoch, -1)
    late = rpc_error(lambda: producer.end(committed=True))  # the producer's commit after its timeout
    assert late.name == "PRODUCER_FENCED", late
    assert values(raw, "orphan", 0, COMMITTED) == ["plain"]


# --- 3. a restarted coordinator reloads its transactions ---------------------------------


def test_a_restarted_coordinator_reloads_its_transactions_and_bumps_epochs(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    raw.create_topic("restart", 1)
    count = len(raw.leaders(STATE_TOPIC))
    node = owner(zk_client, cluster, 0).node_id
    name = coordinator_name(cluster, node)
    address = cluster.address(name)
    mine = lambda t: owner(zk_client, cluster, partition_for_id(t, count)).node_id == node  # noqa: E731
    idle, ongoing, committed = (tid_in(f"rs-{kind}", mine) for kind in ("idle", "ongoing", "committed"))
    indexes = {partition_for_id(t, count) for t in (idle, ongoing, committed)}
    producers = {tid: TxnProducer(raw, tid).init() for tid in (idle, ongoing, committed)}
    for tid in (ongoing, committed):
        producers[tid].add(("restart", 0))
        assert producers[tid].send("restart", 0, tid).error.code == 0
    producers[committed].end(committed=True)
    wait_until(lambda: producers[committed].describe().state == COMPLETE_COMMIT, 20, "the commit")
    before = {tid: describe_at(raw, address, tid) for tid in producers}
    assert [before[t].state for t in (idle, ongoing, committed)] == [EMPTY, ONGOING, COMPLETE_COMMIT]
    epochs_before = {i: owner(zk_client, cluster, i).coordinator_epoch for i in indexes}

    cluster.kill(name)
    cluster.start(name, wait=False)
    answers = []

    def reloaded():
        reply = coordinator_stub(raw, address).DescribeTransactions(
            coordinator_pb2.DescribeTransactionsRequest(transactional_ids=list(producers)), timeout=10
        )
        answers.extend(reply.transactions)
        return all(d.error.code == 0 for d in reply.transactions)

    wait_until(reloaded, 60, "the restarted coordinator to load its partitions")
    for described in answers:  # while loading: "not here / not yet", never "unknown id" nor another state
        if described.error.code:
            assert error_name(described) in NOT_SERVING_HERE, described
        else:
            assert described == before[described.transactional_id], described
    for i in indexes:
        current = owner(zk_client, cluster, i)
        assert current.node_id == node and current.coordinator_epoch > epochs_before[i]
    listed = list_at(raw, address, local_only=True)
    for tid, described in before.items():
        assert (listed[tid].producer_id, listed[tid].state) == (described.producer_id, described.state)

    # InitProducerId for an existing id bumps its epoch (same producer id), it does not start over
    for tid in (idle, committed):
        again = TxnProducer(raw, tid).init()
        assert (again.producer_id, again.producer_epoch) == (before[tid].producer_id, before[tid].producer_epoch + 1), tid
    again = TxnProducer(raw, ongoing).init()  # fences the open transaction (fence and abort, +2) and then bumps (+1)
    assert (again.producer_id, again.producer_epoch) == (before[ongoing].producer_id, before[ongoing].producer_epoch + 3)
    wait_until(lambda: values(raw, "restart", 0, COMMITTED) == [committed] and view(raw, "restart").last_stable_offset == view(raw, "restart").high_watermark,
             20, "the reloaded open transaction to be aborted")
    assert values(raw, "restart", 0, UNCOMMITTED) == [ongoing, committed]


# --- 4. ListTransactions fans out ---------------------------------------------------------


def test_list_transactions_on_either_coordinator_lists_both_with_filters(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    raw.create_topic("listed", 2)
    count = len(raw.leaders(STATE_TOPIC))
    nodes = sorted({owner(zk_client, cluster, i).node_id for i in range(count)})
    assert len(nodes) == 2, nodes  # both coordinators own partitions
    first, second = nodes
    on = lambda node: lambda t: owner(zk_client, cluster, partition_for_id(t, count)).node_id == node  # noqa: E731
    old_open, idle = tid_in("ls-old", on(first)), tid_in("ls-idle", on(first))
    young_open, done = tid_in("ls-young", on(second)), tid_in("ls-done", on(second))
    duration_ms = 2_500

    p_old = TxnProducer(raw, old_open).init()
    p_old.add(("listed", 0))
    assert p_old.send("listed", 0, "old").error.code == 0
    old_start = p_old.describe().transaction_start_time_ms
    p_idle = TxnProducer(raw, idle).init()
    p_done = TxnProducer(raw, done).init()
    p_done.add(("listed", 1))
    assert p_done.send("listed", 1, "done").error.code == 0
    p_done.end(committed=True)
    wait_until(lambda: p_done.describe().state == COMPLETE_COMMIT, 20, "the commit")
    wait_until(lambda: time.time() * 1000 - old_start > duration_ms + 200, duration_ms / 1000 + 5, "the old transaction to age")
    p_young = TxnProducer(raw, young_open).init()
    p_young.add(("listed", 1))
    young_start = p_young.describe().transaction_start_time_ms
    expected = {old_open: (p_old.producer_id, ONGOING), idle: (p_idle.producer_id, EMPTY),
                young_open: (p_young.producer_id, ONGOING), done: (p_done.producer_id, COMPLETE_COMMIT)}
    addresses = {node: cluster.address(coordinator_name(cluster, node)) for node in nodes}

    for node, address in addresses.items():  # either coordinator answers for both
        listed = list_at(raw, address)
        assert {t: (x.producer_id, x.state) for t, x in listed.items()} == expected, node
    local = list_at(raw, addresses[first], local_only=True)
    assert set(local) == {old_open, idle}
    assert set(list_at(raw, addresses[second], local_only=True)) == {young_open, done}

    assert set(list_at(raw, addresses[first], state_filters=[ONGOING])) == {old_open, young_open}
    assert set(list_at(raw, addresses[second], state_filters=[EMPTY, COMPLETE_COMMIT])) == {idle, done}
    assert set(list_at(raw, addresses[first], producer_id_filters=[p_done.producer_id])) == {done}
    assert set(list_at(raw, addresses[second], producer_id_filters=[p_old.producer_id, p_idle.producer_id])) == {old_open, idle}
    assert list_at(raw, addresses[first], state_filters=[ONGOING], producer_id_filters=[p_done.producer_id]) == {}
    listed = list_at(raw, addresses[second], duration_filter_ms=duration_ms)
    asked_at_ms = time.time() * 1000
    assert old_open in listed  # open for longer than duration_ms, on the other coordinator
    assert young_open not in listed or asked_at_ms - young_start > duration_ms  # younger than duration_ms
    assert not {idle, done} & set(listed)  # the filter lists only open transactions
    assert set(list_at(raw, addresses[first], duration_filter_ms=duration_ms, producer_id_filters=[p_old.producer_id])) == {old_open}

    assert rpc_error(lambda: list_at(raw, addresses[first], duration_filter_ms=-1)).name == "INVALID_REQUEST"
    assert rpc_error(lambda: list_at(raw, addresses[first], state_filters=[99])).name == "INVALID_REQUEST"


# --- 5. answers of a coordinator that does not own, or is loading, an id ------------------


def test_requests_to_a_coordinator_that_does_not_own_the_id_get_not_coordinator_naming_the_partition(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    raw.create_topic("routed", 1)
    tid = "routed-tx"
    index = partition_for_id(tid, len(raw.leaders(STATE_TOPIC)))
    producer = TxnProducer(raw, tid).init()
    producer.add(("routed", 0))
    assert producer.send("routed", 0, "routed").error.code == 0
    before = producer.describe()
    current = owner(zk_client, cluster, index)
    other = next(n for n in (0, 1) if n != current.node_id)
    wrong = coordinator_stub(raw, cluster.address(coordinator_name(cluster, other)))
    ids = dict(transactional_id=tid, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch)
    calls = {
        "InitProducerId": lambda: wrong.InitProducerId(coordinator_pb2.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1), timeout=10),
        "AddPartitionsToTxn": lambda: wrong.AddPartitionsToTxn(coordinator_pb2.AddPartitionsToTxnRequest(
            partitions=[common_pb2.TopicPartition(topic="routed", partition=0)], **ids), timeout=10),
        "AddOffsetsToTxn": lambda: wrong.AddOffsetsToTxn(coordinator_pb2.AddOffsetsToTxnRequest(group_id="routed-group", **ids), timeout=10),
        "EndTxn(commit)": lambda: wrong.EndTxn(coordinator_pb2.EndTxnRequest(committed=True, **ids), timeout=10),
        "EndTxn(abort)": lambda: wrong.EndTxn(coordinator_pb2.EndTxnRequest(committed=False, **ids), timeout=10),
    }
    for what, call in calls.items():
        error = rpc_error(call)
        assert error.name == "NOT_COORDINATOR" and error.retriable, (what, error)
        assert names_the_partition(error.message, index), (what, error.message)
    described = wrong.DescribeTransactions(coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid]), timeout=10).transactions[0]
    assert error_name(described) == "NOT_COORDINATOR" and names_the_partition(described.error.message, index), described
    assert tid not in list_at(raw, cluster.address(coordinator_name(cluster, other)), local_only=True)
    # the wrong coordinator still routes: FindCoordinator names the owner
    found = wrong.FindCoordinator(coordinator_pb2.FindCoordinatorRequest(key=tid), timeout=10)
    assert (found.coordinator_id, found.partition, found.coordinator_epoch) == (current.node_id, index, current.coordinator_epoch)
    assert found.address == cluster.address(coordinator_name(cluster, current.node_id))
    assert producer.describe() == before  # none of the misrouted requests changed the transaction
    producer.end(committed=True)
    wait_until(lambda: values(raw, "routed", 0, COMMITTED) == ["routed"], 20, "the commit through the owner")


def test_a_coordinator_still_loading_a_partition_answers_load_in_progress_never_a_wrong_answer(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    partition_svcs = {info.address: name for name, info in cluster.state.services.items() if info.kind == "partition_svc"}
    # pause the partition_svc that coordinators do NOT pick for their Metadata calls (the first live address),
    # so the restarted coordinator finds out the leaders and then blocks writing its fence record there
    paused_address = sorted(partition_svcs)[-1]
    paused_name = partition_svcs[paused_address]
    state_leaders = raw.leaders(STATE_TOPIC)
    count = len(state_leaders)
    index = min(i for i in range(count) if state_leaders[i] == paused_address)  # no lower partition of its owner blocks on the pause
    tid = tid_in("ld", lambda t: partition_for_id(t, count) == index)
    raw.create_topic("loading", 1)
    producer = TxnProducer(raw, tid).init()
    producer.add(("loading", 0))
    assert producer.send("loading", 0, "open").error.code == 0
    before_owner = owner(zk_client, cluster, index)
    name = coordinator_name(cluster, before_owner.node_id)
    address = cluster.address(name)
    before = describe_at(raw, address, tid)
    assert before.state == ONGOING
    listed_while_loading = None

    cluster.kill(paused_name, signal.SIGSTOP)
    try:
        cluster.kill(name)
        cluster.start(name)
        # ZooKeeper names it the owner at a new epoch before it has loaded the partition (its fence write hangs)
        wait_until(lambda: (lambda o: o.node_id == before_owner.node_id and o.coordinator_epoch > before_owner.coordinator_epoch)(
            owner(zk_client, cluster, index)), 30, "the restarted coordinator to claim the partition")
        seen = []

        def loading():
            described = describe_at(raw, address, tid)
            seen.append(described)
            return error_name(described) == "COORDINATOR_LOAD_IN_PROGRESS"

        wait_until(loading, 10, "COORDINATOR_LOAD_IN_PROGRESS")
        for described in seen:
            assert error_name(described) in {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS"}, described
        assert names_the_partition(seen[-1].error.message, index), seen[-1]
        stub = coordinator_stub(raw, address)
        init = rpc_error(lambda: stub.InitProducerId(coordinator_pb2.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1), timeout=10))
        assert init.name == "COORDINATOR_LOAD_IN_PROGRESS" and init.retriable, init
        end = rpc_error(lambda: stub.EndTxn(coordinator_pb2.EndTxnRequest(
            transactional_id=tid, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch, committed=True), timeout=10))
        assert end.name == "COORDINATOR_LOAD_IN_PROGRESS", end
        try:
            listed_while_loading = sorted(list_at(raw, address, local_only=True))
        except grpc.RpcError as exc:
            listed_while_loading = errors.from_rpc_error(exc).name
        assert error_name(describe_at(raw, address, tid)) == "COORDINATOR_LOAD_IN_PROGRESS"  # still loading
    finally:
        cluster.kill(paused_name, signal.SIGCONT)

    wait_until(lambda: describe_at(raw, address, tid) == before, 60, "the coordinator to finish loading")
    # another of its partitions may still be loading (COORDINATOR_LOAD_IN_PROGRESS, retriable): ask until it answers
    assert tid in wait_until(lambda: list_at(raw, address, local_only=True), 60, "ListTransactions once every partition loaded")
    producer.end(committed=True)  # nothing was lost while it loaded
    wait_until(lambda: values(raw, "loading", 0, COMMITTED) == ["open"], 20, "the commit")
    # Kafka answers ListTransactions with COORDINATOR_LOAD_IN_PROGRESS while any partition loads; a list that
    # silently leaves out the loading partition's transactions is a wrong answer
    assert listed_while_loading == "COORDINATOR_LOAD_IN_PROGRESS", (
        f"ListTransactions while {STATE_TOPIC} partition {index} was loading answered {listed_while_loading!r}, "
        f"a list without {tid!r} (Ongoing), instead of COORDINATOR_LOAD_IN_PROGRESS"
    )


def rpcs_in_flight(cluster, name) -> float:
    """The calls a service is handling now (its txlog_rpc_in_flight gauge)."""
    return sum(value for _, value in scrape(cluster.state.services[name].metrics_address)["txlog_rpc_in_flight"])


def test_the_next_transactions_add_waits_for_the_markers_and_one_record_completes_the_last_and_opens_it(raw, fault_cluster, zk_client):
    cluster = fault_cluster
    producer, index, data_leader = open_transaction_logged_apart(raw, "carried", "carry")
    tid = producer.transactional_id
    coordinator = coordinator_name(cluster, owner(zk_client, cluster, index).node_id)
    data_leader_name = name_of(cluster, data_leader)

    stub = producer.coordinator()  # found before the stop: the stopped instance may be the one Metadata would ask
    cluster.kill(data_leader_name, signal.SIGSTOP)  # the COMMIT marker cannot land
    try:
        producer.end(committed=True)  # answered once PrepareCommit is durable
        add = coordinator_pb2.AddPartitionsToTxnRequest(transactional_id=tid, producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
                                                        partitions=[common_pb2.TopicPartition(topic="carried", partition=0)])
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            adding = pool.submit(stub.AddPartitionsToTxn, add, timeout=30)  # the next transaction's first add
            wait_until(lambda: adding.done() or rpcs_in_flight(cluster, coordinator) >= 1, 20, "the add to wait at the coordinator")
            assert not adding.done(), adding.result()
            cluster.kill(data_leader_name, signal.SIGCONT)
            assert [r.error.code for r in adding.result(timeout=30).results] == [0]
    finally:
        cluster.kill(data_leader_name, signal.SIGCONT)

    described = producer.describe()
    assert described.state == ONGOING and [(p.topic, p.partition) for p in described.partitions] == [("carried", 0)], described
    records = [r for r in raw.read_all(STATE_TOPIC, index) if r.key == tid.encode() and r.HasField("value")]
    logged = [TransactionRecord.decode(tid, r.value).state for r in records]
    # the commit's markers were acknowledged before the next transaction's record, which completes it: no CompleteCommit between
    assert logged[-2:] == [TransactionState.PREPARE_COMMIT, TransactionState.ONGOING], logged
    wait_until(lambda: raw.leaders("carried")[0], 30, "carried-0 to have a leader again (the stop may have cost its session)")
    assert producer.send("carried", 0, "t2").error.code == 0
    producer.end(committed=True)
    wait_until(lambda: values(raw, "carried", 0, COMMITTED) == ["t1", "t2"], 30, "both transactions committed, once each")
