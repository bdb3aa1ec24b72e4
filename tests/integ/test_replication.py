"""Replication through the real services (issue 14): three partition_svc
processes, topics with three replicas, leaders killed, paused and wiped.

Settings are shortened so that failures are noticed quickly (a 4 s ZooKeeper
session, a 2 s replica lag time); every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import io
import json
import posixpath
import shutil
import signal
import threading

import grpc
import pytest
from kazoo.client import KazooClient

from services.tooling.cluster import LocalCluster
from tests.integ.raw import Raw
from txlog import Admin, Consumer, LogTruncationError, Producer, TopicPartition
from txlog.cli import commands as console
from txlog.protocol.errors import ErrorCode
from txlog.two_phase import wait_until
from txlog.v1 import common_pb2, partition_pb2

SESSION_S = 4
FAST = ["--zookeeper-session-timeout-s", str(SESSION_S), "--replica-lag-time-max-ms", "2000",
        "--controller-pass-interval-ms", "1000", "--partition-state-refresh-ms", "1000"]
FAILOVER_TIMEOUT_S = 60


@pytest.fixture
def cluster(tmp_path):
    """ZooKeeper, producer_id_svc and three partition_svc (no coordinator)."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=0, service_args={"partition_svc": FAST})
    yield local
    for name in local.state.services:  # a test that failed mid-pause must not leave a stopped process behind
        local.kill(name, signal.SIGCONT)
    local.down(grace_s=5)


@pytest.fixture
def raw(cluster):
    return Raw(cluster)


@pytest.fixture
def zk(cluster):
    client = KazooClient(hosts=cluster.state.zookeeper)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def wait_for(probe, timeout_s=FAILOVER_TIMEOUT_S, what="condition"):
    """``probe()``'s first truthy answer (a failed call counts as none), asked again with back-off until
    ``timeout_s`` (txlog.two_phase.wait_until)."""
    answers = []

    def answered() -> bool:
        try:
            answers.append(probe())
        except grpc.RpcError:
            answers.append(None)
        return bool(answers[-1])

    wait_until(answered, timeout_s, f"waiting for {what}")
    return answers[-1]


def partition_meta(raw: Raw, topic: str, partition: int) -> partition_pb2.PartitionMetadata:
    reply = raw.metadata(partition_pb2.MetadataRequest(topics=[topic]))
    return reply.topics[0].partitions[partition]


def name_of(node_id: int) -> str:
    return f"partition_svc-{node_id}"


def create(bootstrap: str, topic: str, partitions: int, replication_factor: int, **configs) -> None:
    with Admin(bootstrap) as admin:
        assert admin.create_topics([(topic, partitions, replication_factor)], configs) == {topic: partitions}


def fully_replicated(raw: Raw, topic: str, partition: int, replicas: int = 3):
    meta = partition_meta(raw, topic, partition)
    return meta if meta.error.code == 0 and len(meta.isr) == replicas else None


def state_seen_after_registration(zk: KazooClient, topic: str, partition: int, node: int) -> dict | None:
    """The partition's state in ZooKeeper once it was written after ``node``
    last registered: the controller has handled its restart."""
    registration = zk.exists(f"/txlog/services/partition_svc/{node}")
    data, stat = zk.get(f"/txlog/topics/{topic}/partitions/{partition}/state")
    return json.loads(data) if registration is not None and stat.mzxid > registration.czxid else None


def read_values(raw: Raw, topic: str, partition: int, isolation=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED) -> list[bytes]:
    """Every record of the partition, from whoever leads it now (retried while leadership settles)."""
    def attempt():
        values, offset = [], 0
        while True:
            result = raw.fetch(topic, partition, offset, isolation=isolation)
            if result.error.code != 0:
                return None
            values += [r.value for b in result.batches for r in b.records]
            if result.next_fetch_offset >= (result.last_stable_offset if isolation else result.high_watermark):
                return (values,)
            offset = result.next_fetch_offset
    return wait_for(attempt, what=f"a readable leader of {topic}-{partition}")[0]


class BackgroundProducer:
    """An idempotent SDK producer sending to partition 0 of ``topic`` in a thread, ``window`` records at a
    time, until the block ends; ``acked`` holds what was acknowledged, in order."""

    def __init__(self, bootstrap: str, topic: str, window: int = 20):
        self.bootstrap, self.topic, self.window = bootstrap, topic, window
        self.acked: list[bytes] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=180)

    def _run(self) -> None:
        try:
            with Producer(self.bootstrap, linger_ms=1, delivery_timeout_ms=120_000) as producer:
                i = 0
                while not self._stop.is_set():
                    values = [f"{self.topic}-{i + j}".encode() for j in range(self.window)]
                    futures = [producer.send(self.topic, value, partition=0) for value in values]
                    for value, future in zip(values, futures, strict=True):
                        future.result(timeout=120)
                        self.acked.append(value)
                    i += self.window
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.errors.append(exc)


def test_a_topic_is_replicated_and_described_with_leader_replicas_and_isr(cluster, raw):
    create(cluster.state.bootstrap, "described", 3, 3, **{"min.insync.replicas": "2"})
    for p in range(3):
        meta = wait_for(lambda p=p: fully_replicated(raw, "described", p), what="every replica in sync")
        assert sorted(meta.replicas) == [0, 1, 2] and meta.leader_id == meta.replicas[0]
    leaders = {partition_meta(raw, "described", p).leader_id for p in range(3)}
    assert leaders == {0, 1, 2}  # leaders spread: one partition led by each instance

    with Admin(cluster.state.bootstrap) as admin:
        with pytest.raises(Exception) as refused:
            admin.create_topics([("too-many", 1, 4)])
        assert "INVALID_REPLICATION_FACTOR" in repr(refused.value)
        with pytest.raises(Exception) as refused:
            admin.create_topics([("min-isr-too-high", 1, 2)], {"min.insync.replicas": "3"})
        assert "INVALID_CONFIG" in repr(refused.value)
        assert "too-many" not in admin.list_topics() and "min-isr-too-high" not in admin.list_topics()

    out = io.StringIO()
    console.topics_describe(cluster.state.bootstrap, "described", out)
    described = json.loads(out.getvalue())
    for entry in described["partitions"]:
        assert set(entry) >= {"partition", "leader", "leader_epoch", "replicas", "isr"}
        assert entry["leader"] in entry["isr"] and sorted(entry["replicas"]) == [0, 1, 2]


def test_killing_the_leader_loses_no_acknowledged_record_and_the_idempotent_producer_carries_on(cluster, raw):
    create(cluster.state.bootstrap, "failover", 1, 3, **{"min.insync.replicas": "2"})
    first = wait_for(lambda: fully_replicated(raw, "failover", 0), what="every replica in sync")
    with BackgroundProducer(cluster.state.bootstrap, "failover") as producing:
        acked = producing.acked
        wait_for(lambda: len(acked) >= 200, what="records acknowledged before the kill")
        cluster.kill(name_of(first.leader_id))
        killed_at = len(acked)
        second = wait_for(lambda: (m := partition_meta(raw, "failover", 0)).error.code == 0 and m.leader_id != first.leader_id
                          and m, what="a new leader")
        assert second.leader_epoch > first.leader_epoch and second.leader_id in first.isr
        wait_for(lambda: len(acked) >= killed_at + 200, what="records acknowledged by the new leader")
    assert not producing.errors, producing.errors
    values = read_values(raw, "failover", 0)
    assert len(values) == len(set(values)), "a record was written twice"
    assert set(acked) <= set(values), f"acknowledged records lost: {sorted(set(acked) - set(values))[:10]}"

    cluster.start(name_of(first.leader_id))  # it comes back as a follower, catches up, and leads again (preferred)
    back = wait_for(lambda: (m := partition_meta(raw, "failover", 0)).leader_id == first.leader_id and len(m.isr) == 3 and m,
                    what="the preferred leader back in the ISR and leading")
    assert back.leader_epoch > second.leader_epoch
    assert read_values(raw, "failover", 0) == values


def test_acks_all_is_refused_below_min_insync_replicas_and_nothing_is_appended(cluster, raw):
    create(cluster.state.bootstrap, "min-isr", 1, 3, **{"min.insync.replicas": "2"})
    meta = wait_for(lambda: fully_replicated(raw, "min-isr", 0), what="every replica in sync")
    followers = [n for n in meta.replicas if n != meta.leader_id]
    for node in followers:
        cluster.kill(name_of(node))
    wait_for(lambda: list(partition_meta(raw, "min-isr", 0).isr) == [meta.leader_id], what="the ISR shrunk to the leader")
    leader = raw.leader("min-isr", 0)
    batch = common_pb2.RecordBatch(records=[common_pb2.Record(value=b"refused")])
    result = raw.produce("min-isr", 0, batch, stub=leader, acks=-1)
    assert ErrorCode.Name(result.error.code) == "NOT_ENOUGH_REPLICAS", result
    assert "min.insync.replicas" in result.error.message
    assert read_values(raw, "min-isr", 0) == []  # nothing was appended
    result = raw.produce("min-isr", 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"one")]), stub=leader, acks=1)
    assert result.error.code == 0 and result.base_offset == 0  # acks=1 needs only the leader
    for node in followers:
        cluster.start(name_of(node))
    wait_for(lambda: fully_replicated(raw, "min-isr", 0), what="the followers back in sync")
    result = raw.produce("min-isr", 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"two")]), stub=leader, acks=-1)
    assert result.error.code == 0 and result.base_offset == 1


def test_a_wiped_follower_rebuilds_from_the_leader_and_can_lead_with_the_same_producer_state(cluster, raw, zk):
    create(cluster.state.bootstrap, "wiped", 1, 3)
    meta = wait_for(lambda: fully_replicated(raw, "wiped", 0), what="every replica in sync")
    producer_id = raw.producer_id()
    leader = raw.leader("wiped", 0)

    def batch(seq: int, value: bytes) -> common_pb2.RecordBatch:
        return common_pb2.RecordBatch(producer_id=producer_id, producer_epoch=0, base_sequence=seq, records=[common_pb2.Record(value=value)])

    for seq, value in enumerate([b"a", b"b", b"c"]):
        assert raw.produce("wiped", 0, batch(seq, value), stub=leader).error.code == 0

    wiped = [n for n in meta.replicas if n != meta.leader_id][0]
    cluster.kill(name_of(wiped))
    shutil.rmtree(cluster.dir / name_of(wiped))
    cluster.start(name_of(wiped))
    # back in the ISR by a state written since its restart: until the controller sees the restart, the
    # state from before it still lists the wiped replica (and it must not lead on it: the test below)
    wait_for(lambda: wiped in (state_seen_after_registration(zk, "wiped", 0, wiped) or {"isr": []})["isr"],
             what="the wiped follower back in the ISR")
    # the other two go: the wiped one, in the ISR, must lead with the same log and producer state
    for node in meta.replicas:
        if node != wiped:
            cluster.kill(name_of(node))
    wait_for(lambda: partition_meta(raw, "wiped", 0).leader_id == wiped, what="the rebuilt replica leading")
    assert read_values(raw, "wiped", 0) == [b"a", b"b", b"c"]
    stub = raw.leader("wiped", 0)
    duplicate = raw.produce("wiped", 0, batch(2, b"c"), stub=stub, acks=1)
    assert duplicate.error.code == 0 and duplicate.base_offset == 2  # a retry is answered its original offset
    gap = raw.produce("wiped", 0, batch(5, b"f"), stub=stub, acks=1)
    assert ErrorCode.Name(gap.error.code) == "OUT_OF_ORDER_SEQUENCE", gap
    assert read_values(raw, "wiped", 0) == [b"a", b"b", b"c"]


def test_a_replica_back_on_a_new_disk_never_leads_on_the_isr_it_was_in_before(cluster, raw, zk):
    """Every instance dies and one comes back with its disk lost: the state in ZooKeeper still lists it in
    the ISR, but it holds nothing; electing it would empty the log. The partition stays offline until a
    replica that kept its log returns."""
    create(cluster.state.bootstrap, "lost-disk", 1, 3)
    meta = wait_for(lambda: fully_replicated(raw, "lost-disk", 0), what="every replica in sync")
    for value in (b"a", b"b", b"c"):
        assert raw.produce("lost-disk", 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=value)]), acks=-1).error.code == 0
    for node in meta.replicas:
        cluster.kill(name_of(node))
    # dead for ZooKeeper too (their sessions expired): until then the controller may elect a killed replica
    # that is still registered, and the state it writes is not the one this test is about
    wait_for(lambda: not any(zk.exists(f"/txlog/services/partition_svc/{n}") for n in meta.replicas),
             what="the killed instances' registrations gone")
    lost = [n for n in meta.replicas if n != meta.leader_id][0]
    shutil.rmtree(cluster.dir / name_of(lost))
    cluster.start(name_of(lost))
    state = wait_for(lambda: state_seen_after_registration(zk, "lost-disk", 0, lost), what="the controller handling the restart")
    assert state["leader"] == -1 and lost not in state["isr"], state
    cluster.start(name_of(meta.leader_id))
    wait_for(lambda: partition_meta(raw, "lost-disk", 0).leader_id == meta.leader_id, what="the replica that kept its log leading")
    assert read_values(raw, "lost-disk", 0) == [b"a", b"b", b"c"]


def test_unclean_leader_election_is_off_by_default(cluster, raw):
    create(cluster.state.bootstrap, "clean", 1, 3)
    meta = wait_for(lambda: fully_replicated(raw, "clean", 0), what="every replica in sync")
    laggard, survivor = [n for n in meta.replicas if n != meta.leader_id]
    cluster.kill(name_of(laggard))
    wait_for(lambda: laggard not in partition_meta(raw, "clean", 0).isr, what="the stopped follower out of the ISR")
    raw.produce("clean", 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"only-in-isr")]))
    cluster.kill(name_of(meta.leader_id))
    cluster.kill(name_of(survivor))
    cluster.start(name_of(laggard))
    # the laggard lacks an acknowledged record: it must not lead, the partition stays offline
    offline = wait_for(lambda: (m := partition_meta(raw, "clean", 0)).leader_id == -1 and m, what="the partition offline")
    assert ErrorCode.Name(offline.error.code) == "LEADER_NOT_AVAILABLE" and laggard not in offline.isr
    cluster.start(name_of(survivor))
    wait_for(lambda: partition_meta(raw, "clean", 0).leader_id == survivor, what="an ISR member leading again")
    assert read_values(raw, "clean", 0) == [b"only-in-isr"]


def test_a_consumer_detects_a_log_truncated_by_an_unclean_election_and_reads_the_new_records(cluster, raw):
    """KIP-320 through the real services: a consumer read 4 records from a
    leader; the only replica left (elected uncleanly) has the first 2 and takes
    2 new ones at the same offsets. The consumer must go back and return them
    (one with auto_offset_reset='none' must raise LogTruncationError), not
    wait at offset 4 having silently missed them."""
    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([("dirty", 1, 3)], {"unclean.leader.election.enable": "true"})
    meta = wait_for(lambda: fully_replicated(raw, "dirty", 0), what="every replica in sync")
    laggard, other = [n for n in meta.replicas if n != meta.leader_id]
    raw.produce("dirty", 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=v) for v in (b"a0", b"a1")]))
    wait_for(lambda: fully_replicated(raw, "dirty", 0), what="the first records on every replica")
    cluster.kill(name_of(laggard))
    wait_for(lambda: laggard not in partition_meta(raw, "dirty", 0).isr, what="the stopped follower out of the ISR")
    raw.produce("dirty", 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=v) for v in (b"b0", b"b1")]))
    tp = TopicPartition("dirty", 0)
    consumers = {reset: Consumer(cluster.state.bootstrap, isolation_level="read_uncommitted", auto_offset_reset=reset,
                                 fetch_max_wait_ms=100) for reset in ("earliest", "none")}
    try:
        for consumer in consumers.values():
            consumer.assign([tp])
            consumer.seek(tp, 0)
            read = []
            wait_until(lambda c=consumer, r=read: r.extend(x.value for x in c.poll(0.5)) or len(r) >= 4, 60, "the first 4 records")
            assert read == [b"a0", b"a1", b"b0", b"b1"]
        cluster.kill(name_of(meta.leader_id))
        cluster.kill(name_of(other))
        cluster.start(name_of(laggard))
        # its id and its address: metadata can name the restarted laggard before its registration is known to
        # the instance answering (an empty address), and the produce below goes to that address
        wait_for(lambda: (m := partition_meta(raw, "dirty", 0)).leader_id == laggard and m.leader_address,
                 what="the laggard elected uncleanly, at its address")
        raw.produce("dirty", 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=v) for v in (b"c0", b"c1")]))
        assert read_values(raw, "dirty", 0) == [b"a0", b"a1", b"c0", b"c1"]
        new = partition_meta(raw, "dirty", 0)
        asked = [partition_pb2.EpochEndOffsetsPartition(topic="dirty", partition=0, leader_epoch=e, current_leader_epoch=c)
                 for e, c in ((meta.leader_epoch, new.leader_epoch), (meta.leader_epoch, meta.leader_epoch), (-1, new.leader_epoch))]
        answers = raw.stub(new.leader_address).EpochEndOffsets(partition_pb2.EpochEndOffsetsRequest(partitions=asked)).results
        assert (answers[0].leader_epoch, answers[0].end_offset) == (meta.leader_epoch, 2)  # the old epoch ends at 2 here
        assert [ErrorCode.Name(a.error.code) for a in answers[1:]] == ["FENCED_LEADER_EPOCH", "INVALID_REQUEST"]
        after = []
        lenient = consumers["earliest"]
        wait_until(lambda: after.extend((x.offset, x.value) for x in lenient.poll(0.5)) or len(after) >= 2, 60,
                   "the new records at offsets 2 and 3")
        assert after == [(2, b"c0"), (3, b"c1")] and lenient.position(tp) == 4
        strict = consumers["none"]
        raised = []

        def truncation_raised() -> bool:
            try:
                strict.poll(0.5)
            except LogTruncationError as exc:
                raised.append(exc)
            return bool(raised)

        wait_until(truncation_raised, 60, "LogTruncationError")
        assert raised[0].position == 4 and raised[0].divergent_offset == 2
    finally:
        for consumer in consumers.values():
            consumer.close()


def test_controller_failover_elects_another_controller_that_keeps_electing_leaders(cluster, raw, zk):
    create(cluster.state.bootstrap, "ctl", 3, 3)
    for p in range(3):
        wait_for(lambda p=p: fully_replicated(raw, "ctl", p), what="every replica in sync")
    path = posixpath.join("/txlog", "controller")
    controller = json.loads(zk.get(path)[0])["node_id"]
    epoch = int(zk.get("/txlog/controller_epoch")[0])
    cluster.kill(name_of(controller))
    def new_controller():
        node = json.loads(zk.get(path)[0])["node_id"] if zk.exists(path) else controller
        return node != controller and node

    new = wait_for(new_controller, what="a new controller")
    assert int(zk.get("/txlog/controller_epoch")[0]) > epoch
    led = [p for p in range(3) if partition_meta(raw, "ctl", p).replicas[0] == controller]
    for p in led:  # the dead controller's partitions were moved by the new one
        wait_for(lambda p=p: partition_meta(raw, "ctl", p).leader_id not in (controller, -1), what="a new leader")
    assert new != controller


def zk_partition_state(zk: KazooClient, topic: str, partition: int) -> dict:
    return json.loads(zk.get(f"/txlog/topics/{topic}/partitions/{partition}/state")[0])


def pause_the_leader_after_a_write_only_it_may_have(cluster, raw, zk, topic: str):
    """Stops the followers, writes ``maybe`` with acks=1 to the leader, stops the leader and resumes the
    followers. The leader's metadata before the pause and the new leader's after it, or None when a stalled
    machine broke the scenario: a follower stopped for longer than the replica lag time is rightly dropped
    from the ISR by the leader (and one stopped past its session by the controller), and a leader that dies
    alone in its ISR leaves the partition offline until it returns, as unclean election is off. The state in
    ZooKeeper says which happened; the old leader is resumed before this returns None."""
    create(cluster.state.bootstrap, topic, 1, 3)
    meta = wait_for(lambda: fully_replicated(raw, topic, 0), what="every replica in sync")
    old_leader = raw.leader(topic, 0)
    assert raw.produce(topic, 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"acked")]), stub=old_leader).error.code == 0
    followers = [n for n in meta.replicas if n != meta.leader_id]
    for node in followers:
        cluster.kill(name_of(node), signal.SIGSTOP)
    try:
        # acks=1 while the followers are stopped: a fetch already answered may still carry it to them, or not
        maybe = raw.produce(topic, 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"maybe")]), stub=old_leader, acks=1)
        assert maybe.error.code == 0 and maybe.base_offset == 1
        cluster.kill(name_of(meta.leader_id), signal.SIGSTOP)
    finally:
        for node in followers:
            cluster.kill(name_of(node), signal.SIGCONT)

    def decided():
        led = partition_meta(raw, topic, 0)
        if led.leader_id in followers:
            return ("led", led)
        stranded = not set(zk_partition_state(zk, topic, 0)["isr"]) & set(followers)
        return ("stranded", None) if stranded else None

    try:
        outcome, new = wait_for(decided, what=f"a follower leading {topic}-0")
    except BaseException:
        cluster.kill(name_of(meta.leader_id), signal.SIGCONT)
        raise
    if outcome == "stranded":
        cluster.kill(name_of(meta.leader_id), signal.SIGCONT)
        return None
    return meta, old_leader, new


def test_a_paused_leader_is_fenced_and_its_unreplicated_tail_truncated(cluster, raw, zk):
    for attempt in range(3):
        topic = f"paused{attempt}"
        scenario = pause_the_leader_after_a_write_only_it_may_have(cluster, raw, zk, topic)
        if scenario is not None:
            break
    else:
        pytest.fail("three times the followers were dropped from the ISR while stopped: the machine stalled "
                    f"for longer than the {SESSION_S} s session or the 2 s replica lag time each time")
    meta, old_leader, new = scenario
    followers = [n for n in meta.replicas if n != meta.leader_id]
    try:
        assert new.leader_epoch > meta.leader_epoch
        assert raw.produce(topic, 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"after")])).error.code == 0
    finally:
        cluster.kill(name_of(meta.leader_id), signal.SIGCONT)
    assert new.leader_id in followers
    # the resumed old leader, before it hears of its successor, may still take an acks=1 write at its old epoch:
    # that tail exists only on it
    zombie = raw.produce(topic, 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"zombie")]), stub=old_leader, acks=1)
    if zombie.error.code != 0:
        assert ErrorCode.Name(zombie.error.code) in ("NOT_LEADER", "FENCED_LEADER_EPOCH", "LEADER_NOT_AVAILABLE"), zombie
    # acks=all at its old epoch never succeeds: the followers no longer fetch from it
    stale = raw.produce(topic, 0, common_pb2.RecordBatch(records=[common_pb2.Record(value=b"stale")]), stub=old_leader)
    assert ErrorCode.Name(stale.error.code) in ("NOT_LEADER", "FENCED_LEADER_EPOCH", "LEADER_NOT_AVAILABLE",
                                                 "NOT_ENOUGH_REPLICAS_AFTER_APPEND"), stale
    # it rejoins as a follower, truncates what only it has, and leads again once in sync (the preferred replica)
    wait_for(lambda: partition_meta(raw, topic, 0).leader_id == meta.leader_id and fully_replicated(raw, topic, 0),
             what="the old leader back in sync and leading")
    values = read_values(raw, topic, 0)
    assert values in ([b"acked", b"after"], [b"acked", b"maybe", b"after"]), values


def test_reassignment_under_load_moves_replicas_without_losing_a_record(cluster, raw):
    create(cluster.state.bootstrap, "moved", 1, 2)
    before = wait_for(lambda: fully_replicated(raw, "moved", 0, 2), what="both replicas in sync")
    spare = ({0, 1, 2} - set(before.replicas)).pop()
    target = [spare, before.replicas[1]]  # the leader's replica moves to the spare instance
    with BackgroundProducer(cluster.state.bootstrap, "moved", window=1) as producing:
        acked = producing.acked
        wait_for(lambda: len(acked) >= 50, what="records before the reassignment")
        with Admin(cluster.state.bootstrap) as admin:
            with pytest.raises(Exception) as refused:
                admin.alter_partition_reassignments({("moved", 0): [spare, 7]})
            assert "INVALID_REPLICATION_FACTOR" in repr(refused.value) and "not live" in str(refused.value)
            admin.alter_partition_reassignments({("moved", 0): target})
            wait_for(lambda: not admin.list_partition_reassignments(), what="the reassignment done")
        after = wait_for(lambda: (m := partition_meta(raw, "moved", 0)).error.code == 0 and list(m.replicas) == target
                         and sorted(m.isr) == sorted(target) and m, what="the target replicas in sync")
        assert after.leader_id in target and after.leader_epoch > before.leader_epoch
        count = len(acked)
        wait_for(lambda: len(acked) >= count + 50, what="records after the reassignment")
    assert not producing.errors, producing.errors
    values = read_values(raw, "moved", 0)
    assert len(values) == len(set(values)) and set(acked) <= set(values)

    out = io.StringIO()
    assert console.partitions_under_replicated(cluster.state.bootstrap, out) == 0
    cluster.kill(name_of(after.leader_id))
    wait_for(lambda: console.partitions_under_replicated(cluster.state.bootstrap, io.StringIO()) >= 1,
             what="the partition listed as under-replicated")
    listed = [json.loads(line) for line in _under_replicated(cluster.state.bootstrap).splitlines()]
    moved = [entry for entry in listed if entry["topic"] == "moved"]
    assert moved and after.leader_id not in moved[0]["isr"] and moved[0]["replicas"] == target


def _under_replicated(bootstrap: str) -> str:
    out = io.StringIO()
    console.partitions_under_replicated(bootstrap, out)
    return out.getvalue()


@pytest.fixture
def txn_cluster3(tmp_path):
    """Three partition_svc and a coordinator: the transaction log replicated too."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=1,
             service_args={"partition_svc": [*FAST, "--min-insync-replicas", "2"]})
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)


def test_killing_the_leader_under_committing_transactions_loses_nothing_and_the_lso_never_goes_back(txn_cluster3):
    cluster = txn_cluster3
    raw = Raw(cluster)
    create(cluster.state.bootstrap, "txn-failover", 1, 3)
    first = wait_for(lambda: fully_replicated(raw, "txn-failover", 0), what="every replica in sync")
    committed: list[bytes] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    stable_offsets: list[int] = []

    def transact() -> None:
        try:
            with Producer(cluster.state.bootstrap, transactional_id="failover-tx", linger_ms=1,
                          transaction_timeout_ms=60_000) as producer:
                producer.init_transactions()
                n = 0
                while not stop.is_set():
                    producer.begin_transaction()
                    values = [f"t{n}-{i}".encode() for i in range(5)]
                    for value in values:
                        producer.send("txn-failover", value, partition=0)
                    producer.commit_transaction()
                    committed.extend(values)
                    n += 1
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    def watch_lso() -> None:
        while not stop.is_set():
            try:
                meta = partition_meta(raw, "txn-failover", 0)
                result = raw.fetch("txn-failover", 0, 0, isolation=common_pb2.ISOLATION_LEVEL_READ_COMMITTED,
                                   stub=raw.stub(meta.leader_address), max_bytes=1)
                if result.error.code == 0:
                    stable_offsets.append(result.last_stable_offset)
            except (grpc.RpcError, IndexError):
                pass

    workers = [threading.Thread(target=transact), threading.Thread(target=watch_lso)]
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: len(committed) >= 50, what="transactions committed before the kill")
        cluster.kill(name_of(first.leader_id))
        count = len(committed)
        wait_for(lambda: len(committed) >= count + 50, what="transactions committed on the new leader")
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=180)
    assert not errors, errors
    assert stable_offsets == sorted(stable_offsets), "the last stable offset moved backwards"

    def settled():  # EndTxn answers before the markers are written: wait until the last one is
        result = raw.fetch("txn-failover", 0, 0, max_bytes=1)
        return result.error.code == 0 and result.last_stable_offset == result.high_watermark

    wait_for(settled, what="the last transaction's markers")
    values = read_values(raw, "txn-failover", 0, common_pb2.ISOLATION_LEVEL_READ_COMMITTED)
    assert len(values) == len(set(values)), "a committed record was read twice"
    assert set(committed) <= set(values), f"committed records lost: {sorted(set(committed) - set(values))[:10]}"


@pytest.fixture
def four(tmp_path):
    """ZooKeeper, producer_id_svc and four partition_svc with sessions long enough to pause the controller
    through a restart of another instance (the instances are stopped gracefully: their registrations go at once)."""
    local = LocalCluster(tmp_path / "cluster")
    slow_sessions = ["--zookeeper-session-timeout-s", "60", "--shutdown-grace-s", "1", *FAST[2:]]
    local.up(producer_id_svcs=1, partition_svcs=4, coordinator_svcs=0, service_args={"partition_svc": slow_sessions})
    yield local
    for name in local.state.services:
        local.kill(name, signal.SIGCONT)
    local.down(grace_s=5)


def test_a_replica_wiped_and_stopped_before_the_controller_saw_it_never_leads_on_a_later_state(four):
    """KIP-966's remaining case (found by the replication model): while the controller is paused, every
    replica stops and the leader comes back on a new disk and stops again, unseen. The controller then
    writes the partition offline (a state newer than the new storage), and the wiped replica starts once
    more: judged by the state's last write it was "kept" and led with an empty log. The state records the
    storage each ISR member is in it with, so it is taken out of the ISR, and a replica that kept its log
    leads with every acknowledged record."""
    raw = Raw(four)
    zookeeper = KazooClient(hosts=four.state.zookeeper)
    zookeeper.start(timeout=30)
    try:
        create(four.state.bootstrap, "unseen", 4, 3)
        controller = json.loads(zookeeper.get("/txlog/controller")[0])["node_id"]
        metas = [wait_for(lambda p=p: fully_replicated(raw, "unseen", p), what="every replica in sync") for p in range(4)]
        meta = next(m for m in metas if controller not in m.replicas)
        partition, leader = meta.partition, meta.leader_id
        kept = [n for n in meta.replicas if n != leader]
        for value in (b"a", b"b", b"c"):
            assert raw.produce("unseen", partition, common_pb2.RecordBatch(records=[common_pb2.Record(value=value)]),
                               acks=-1).error.code == 0
        state_path = f"/txlog/topics/unseen/partitions/{partition}/state"
        wait_for(lambda: len(json.loads(zookeeper.get(state_path)[0]).get("isr_storage", {})) == 3,
                 what="the controller recording the storage of every ISR member")

        def stop(*nodes: int) -> None:
            """SIGTERM, then their registrations gone (graceful: at once, not at the session's end)."""
            for node in nodes:
                four.kill(name_of(node), signal.SIGTERM)
            wait_for(lambda: not any(zookeeper.exists(f"/txlog/services/partition_svc/{n}") for n in nodes),
                     what=f"{list(nodes)} gone")

        four.kill(name_of(controller), signal.SIGSTOP)
        stop(leader)  # first: with no leader left to shrink it, the ISR keeps every replica
        stop(*kept)
        shutil.rmtree(four.dir / name_of(leader))
        four.start(name_of(leader))  # on a new disk, registered, then gone again before the controller looks
        stop(leader)
        four.kill(name_of(controller), signal.SIGCONT)
        offline = wait_for(lambda: (s := json.loads(zookeeper.get(state_path)[0]))["leader"] == -1 and s,
                           what="the controller taking the partition offline")
        assert leader in offline["isr"], offline
        assert json.loads(zookeeper.get("/txlog/controller")[0])["node_id"] == controller, "the pause outlived its session"

        four.start(name_of(leader))
        state = wait_for(lambda: state_seen_after_registration(zookeeper, "unseen", partition, leader),
                         what="the controller handling the wiped replica's start")
        assert state["leader"] == -1 and leader not in state["isr"], state
        four.start(name_of(kept[0]))
        wait_for(lambda: partition_meta(raw, "unseen", partition).leader_id == kept[0], what="a replica that kept its log leading")
        assert read_values(raw, "unseen", partition) == [b"a", b"b", b"c"]
    finally:
        zookeeper.stop()
        zookeeper.close()
