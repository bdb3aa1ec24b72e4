"""Consumer groups through the real services (issue 16): subscribing
consumers share a topic's partitions, each partition owned by exactly one
member at every moment; a member that leaves or dies hands its partitions
on (at once, or after its session timeout); a zombie's transactional offset
commit is refused (KIP-447)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer, OffsetAndMetadata, Producer, TopicPartition
from txlog.cli import commands as console
from txlog.cli import program as cli
from txlog.errors import ClientError
from txlog.protocol import CONSUMER_OFFSETS_TOPIC
from txlog.protocol.hashing import partition_for_id
from txlog.two_phase import wait_until

PARTITIONS = 6
SESSION_MS = 3_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("groups") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=1,
             service_args={"partition_svc": ["--group-heartbeat-interval-ms", "200"]})
    local.wait_until_coordinators_settle()
    with Admin(local.state.bootstrap) as admin:
        admin.create_topics([("orders", PARTITIONS, 2), ("orders-out", 1, 2)])
    yield local
    local.down(grace_s=5)


class Polling:
    """A consumer polled in its own thread (as an application would), recording what it owns."""

    def __init__(self, bootstrap: str, group: str, **options):
        self.consumer = Consumer(bootstrap, group_id=group, session_timeout_ms=SESSION_MS, **options)
        self.values: list[bytes] = []
        self.revoked: list[set] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None
        self.owned: set = set()

    def start(self, topics=("orders",)):
        self.consumer.subscribe(list(topics), on_revoke=self.revoked.append)
        self.thread.start()
        return self

    def _run(self):
        try:
            while not self.stop.is_set():
                self.values += [r.value for r in self.consumer.poll(timeout_s=0.1)]
                self.owned = self.consumer.assignment()
        except BaseException as exc:  # noqa: BLE001 -- shown by the test
            self.error = exc

    def halt(self, close=True):
        self.stop.set()
        self.thread.join(30)
        if close:
            self.consumer.close()


def all_partitions() -> set:
    return {TopicPartition("orders", p) for p in range(PARTITIONS)}


def test_members_share_the_partitions_and_hand_them_on_when_one_leaves(cluster):
    first = Polling(cluster.state.bootstrap, "sharing").start()
    try:
        wait_until(lambda: first.owned == all_partitions(), 30, "the only member owning every partition")
        second = Polling(cluster.state.bootstrap, "sharing").start()
        try:
            def split() -> bool:
                a, b = first.owned, second.owned
                assert not (a & b), f"a partition owned twice: {a & b}"
                return a | b == all_partitions() and len(a) == len(b) == PARTITIONS // 2
            wait_until(split, 30, "the partitions split evenly")
            assert first.revoked and first.revoked[-1] <= all_partitions(), "the first member revoked what it handed on"
        finally:
            second.halt()  # close: it leaves the group at once
        wait_until(lambda: first.owned == all_partitions(), 30, "the remaining member owning every partition again")
        assert first.error is None and second.error is None
    finally:
        first.halt()


def test_a_dead_members_partitions_move_after_its_session_timeout_and_its_commits_are_refused(cluster):
    with Producer(cluster.state.bootstrap) as producer:
        for p in range(PARTITIONS):
            producer.send("orders", value=f"v{p}".encode(), partition=p)
        producer.flush()
    survivor = Polling(cluster.state.bootstrap, "dying").start()
    zombie = Polling(cluster.state.bootstrap, "dying").start()
    try:
        wait_until(lambda: survivor.owned and zombie.owned and survivor.owned | zombie.owned == all_partitions(), 30,
                   "both members owning partitions")
        metadata = zombie.consumer.group_metadata()
        zombie.halt(close=False)
        zombie.consumer._loop.call_soon(zombie.consumer._membership._task.cancel)  # it stops heartbeating: "dies"
        wait_until(lambda: survivor.owned == all_partitions(), 30, "the survivor owning everything after the session timeout")
        with Producer(cluster.state.bootstrap, transactional_id="zombie-ctp") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("orders-out", value=b"from a zombie", partition=0)
            with pytest.raises(ClientError) as refused:
                producer.send_offsets_to_transaction({TopicPartition("orders", 0): 1}, metadata)
            assert "UNKNOWN_MEMBER_ID" in str(refused.value) or "STALE_MEMBER_EPOCH" in str(refused.value)
            producer.abort_transaction()
        live = survivor.consumer.group_metadata()
        assert live.member_epoch > 0
    finally:
        survivor.halt()
        zombie.consumer.close()


def run_cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(args)) == 0
    return out.getvalue()


def test_the_groups_commands_say_who_owns_what_how_far_behind_and_move_it_back(cluster):
    with Producer(cluster.state.bootstrap) as producer:
        for p in range(PARTITIONS):
            for i in range(3):
                producer.send("orders", value=f"tooling-{p}-{i}".encode(), partition=p)
        producer.flush()
    member = Polling(cluster.state.bootstrap, "tooling").start()
    try:
        wait_until(lambda: member.owned == all_partitions(), 30, "the member owning every partition")
        member.consumer.commit({TopicPartition("orders", 0): 1})  # a member commits with its id and epoch
        described = json.loads(run_cli("groups", "describe", "tooling", "--dir", cluster.state.dir))
        assert described["state"] in ("Stable", "Reconciling") and len(described["members"]) == 1
        row = next(r for r in described["partitions"] if (r["topic"], r["partition"]) == ("orders", 0))
        assert row["committed"] == 1 and row["owner"] == described["members"][0]["member_id"]
        assert row["lag"] == row["end"] - 1 and row["end"] >= 3
        listed = [json.loads(line) for line in run_cli("groups", "list", "--dir", cluster.state.dir).splitlines()]
        assert {"group_id": "tooling", "state": described["state"], "members": 1} in listed
        with pytest.raises(ClientError, match="live members"):
            console_target = console.Target(cluster.state.bootstrap)
            console.groups_reset_offsets(console_target, "tooling", ["orders"], ("earliest", None), True, io.StringIO())
    finally:
        member.halt()
    wait_until(lambda: json.loads(run_cli("groups", "describe", "tooling", "--dir", cluster.state.dir))["state"] == "Empty", 30,
               "the group empty once its member closed")
    plan = [json.loads(line) for line in run_cli("groups", "reset-offsets", "tooling", "--topic", "orders", "--to-earliest",
                                                  "--dir", cluster.state.dir).splitlines()]
    assert {(p["partition"], p["new"], p["applied"]) for p in plan if p["partition"] == 0} == {(0, 0, False)}
    assert json.loads(run_cli("groups", "describe", "tooling", "--dir", cluster.state.dir))["partitions"][0]["committed"] == 1
    run_cli("groups", "reset-offsets", "tooling", "--topic", "orders", "--to-earliest", "--execute", "--dir", cluster.state.dir)
    rows = json.loads(run_cli("groups", "describe", "tooling", "--dir", cluster.state.dir))["partitions"]
    assert {r["committed"] for r in rows} == {0}
    deleted = json.loads(run_cli("groups", "delete", "tooling", "--dir", cluster.state.dir))
    assert deleted == {"group": "tooling", "offsets_deleted": PARTITIONS}
    with Admin(cluster.state.bootstrap) as admin:
        assert admin.list_group_offsets("tooling") == {}
        assert "tooling" not in {g.group_id for g in admin.list_groups()}


def test_a_group_with_live_members_cannot_be_deleted(cluster):
    member = Polling(cluster.state.bootstrap, "in-use").start()
    try:
        wait_until(lambda: member.owned == all_partitions(), 30, "the member owning every partition")
        member.consumer.commit({TopicPartition("orders", 1): 2})
        with Admin(cluster.state.bootstrap) as admin, pytest.raises(ClientError, match="NON_EMPTY_GROUP"):
            admin.delete_group("in-use")
        with Admin(cluster.state.bootstrap) as admin:
            assert admin.list_group_offsets("in-use") == {TopicPartition("orders", 1): 2}, "nothing deleted"
    finally:
        member.halt()


def test_a_static_member_restarts_and_gets_its_partitions_back_without_a_rebalance(cluster):
    stays = Polling(cluster.state.bootstrap, "static", group_instance_id="stays").start()
    restarts = Polling(cluster.state.bootstrap, "static", group_instance_id="restarts").start()
    try:
        wait_until(lambda: len(stays.owned) == len(restarts.owned) == PARTITIONS // 2, 30, "the partitions split")
        before, kept, revocations = set(restarts.owned), set(stays.owned), len(stays.revoked)
        restarts.halt()  # close(): a static member leaves for a restart (member epoch -2)
        with Admin(cluster.state.bootstrap) as admin:
            during = admin.describe_group("static")
        held = {m.instance_id: m.assigned for m in during.members}
        assert held.get("restarts") == before, f"its partitions are kept for it while it restarts: {held}"
        again = Polling(cluster.state.bootstrap, "static", group_instance_id="restarts").start()
        try:
            wait_until(lambda: again.owned == before, 30, "the restarted member owning its partitions again")
            assert stays.owned == kept and len(stays.revoked) == revocations, "the other member was not disturbed"
            # a new process, a new member id: the coordinator knows it under that id, so it goes on beating and commits
            mine = again.consumer.group_metadata()
            with Admin(cluster.state.bootstrap) as admin:
                after = {m.instance_id: m for m in admin.describe_group("static").members}
            assert after["restarts"].member_id == mine.member_id and after["restarts"].assigned == before, after
            partition = min(before, key=lambda tp: tp.partition)
            again.consumer.commit({partition: 1})
            assert again.error is None and again.owned == before
        finally:
            again.halt()
    finally:
        stays.halt()


def test_a_node_member_shares_a_group_with_a_python_member(cluster):
    """clients/node/group_member.js, a member written against the protos alone,
    joins the group beside the Python SDK: the coordinator splits the
    partitions between them, the Node member reads and commits its own as a
    member, and when it leaves the Python member takes them over."""
    node = shutil.which("node")
    assert node, "node is not installed: scripts/setup.sh installs it (apt-get install nodejs npm)"
    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([("mixed", PARTITIONS, 2)])
    with Producer(cluster.state.bootstrap) as producer:
        for p in range(PARTITIONS):
            for i in range(3):
                producer.send("mixed", value=f"mixed-{p}-{i}".encode(), partition=p)
        producer.flush()
    script = Path(__file__).resolve().parents[2] / "clients" / "node" / "group_member.js"
    member = subprocess.Popen([node, str(script), cluster.state.bootstrap, "mixed-group", "mixed"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    python = Polling(cluster.state.bootstrap, "mixed-group").start(topics=("mixed",))
    everything = {TopicPartition("mixed", p) for p in range(PARTITIONS)}
    try:
        with Admin(cluster.state.bootstrap) as admin:
            def shared():
                group = admin.describe_group("mixed-group")
                held = [m.assigned for m in group.members]
                return len(held) == 2 and all(held) and not (held[0] & held[1]) and held[0] | held[1] == everything and group
            group = wait_until_value(shared, "the Node and the Python member sharing the partitions")
            node_member = next(m for m in group.members if m.assigned != python.consumer.assignment())
            mine = {tp.partition for tp in node_member.assigned}
            wait_until(lambda: all(admin.list_group_offsets("mixed-group").get(TopicPartition("mixed", p)) == 3 for p in mine), 60,
                       "the Node member committing its partitions' offsets")
        member.send_signal(signal.SIGTERM)
        out, err = member.communicate(timeout=60)
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["ok"] and summary["member_id"] == node_member.member_id and summary["commits"] > 0, (summary, err[-2000:])
        for p in mine:
            assert summary["read"][str(p)][-3:] == [f"mixed-{p}-{i}" for i in range(3)]
        wait_until(lambda: python.owned == everything, 30, "the Python member taking the Node member's partitions over")
    finally:
        if member.poll() is None:
            member.kill()
        python.halt()


def wait_until_value(probe, what: str, timeout_s: float = 60):
    found = []
    wait_until(lambda: bool(found.append(probe()) or found[-1]), timeout_s, what)
    return found[-1]


def produce_values(bootstrap: str, topic: str, partitions: int, prefix: str, count: int = 3) -> set[bytes]:
    values = {f"{prefix}-{p}-{i}".encode(): p for p in range(partitions) for i in range(count)}
    with Producer(bootstrap) as producer:
        for value, partition in values.items():
            producer.send(topic, value=value, partition=partition)
        producer.flush()
    return set(values)


def test_a_pattern_subscription_takes_matching_topics_and_picks_up_one_created_later(cluster):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("metrics.cpu", 2, 2), ("metrics.cpu.old", 1, 2)])
    member = Polling(bootstrap, "by-pattern", metadata_max_age_ms=300)
    member.consumer.subscribe(pattern=r"metrics\.[a-z]+", on_revoke=member.revoked.append)
    member.thread.start()
    try:
        # a whole-name match: "metrics.cpu.old" is not taken
        wait_until(lambda: member.owned == {TopicPartition("metrics.cpu", 0), TopicPartition("metrics.cpu", 1)}, 30,
                   "the member owning the matching topic's partitions")
        with Admin(bootstrap) as admin:
            admin.create_topics([("metrics.disk", 1, 2)])
        wait_until(lambda: TopicPartition("metrics.disk", 0) in member.owned, 30, "the topic created later assigned")
        assert {tp.topic for tp in member.owned} == {"metrics.cpu", "metrics.disk"}
        sent = produce_values(bootstrap, "metrics.disk", 1, "disk")
        wait_until(lambda: sent <= set(member.values), 30, "the new topic's records read")
        assert member.error is None
    finally:
        member.halt()


def test_a_paused_partitions_records_are_not_returned_until_it_is_resumed(cluster):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("pausing", 3, 2)])
    sent = produce_values(bootstrap, "pausing", 3, "p")
    with Consumer(bootstrap, group_id="pauser", max_poll_records=1) as consumer:
        consumer.assign([("pausing", 0), ("pausing", 1), ("pausing", 2)])
        consumer.pause(("pausing", 2))  # before anything was fetched
        assert consumer.paused() == {TopicPartition("pausing", 2)}
        read: list = []
        wait_until(lambda: bool(read.extend(consumer.poll(0.2))) or any(r.partition == 1 for r in read), 30,
                   "a first record of partition 1, the rest of its fetch buffered")
        consumer.pause(("pausing", 1))  # with records fetched and not returned yet
        wait_until(lambda: bool(read.extend(consumer.poll(0.2))) or sum(r.partition == 0 for r in read) == 3, 30,
                   "partition 0's records")
        # with partition 0 drained, polls return nothing: partitions 1 and 2 are paused, not empty
        assert not consumer.poll(0.5)
        assert sum(r.partition == 1 for r in read) == 1 and not any(r.partition == 2 for r in read)
        assert consumer.position(("pausing", 2)) == 0
        consumer.resume(("pausing", 1), ("pausing", 2))
        assert consumer.paused() == set()
        wait_until(lambda: bool(read.extend(consumer.poll(0.2))) or len(read) >= 9, 30, "the paused partitions' records after resume")
        assert sorted(r.value for r in read) == sorted(sent)
        with pytest.raises(ClientError, match="not assigned"):
            consumer.pause(("pausing", 0), ("nowhere", 0))
        assert consumer.paused() == set()  # a refused pause pauses nothing


def test_iterating_over_a_consumer_yields_every_record_and_stops_after_its_timeout(cluster):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("iterated", 2, 2)])
    sent = produce_values(bootstrap, "iterated", 2, "it", count=5)
    with Consumer(bootstrap, group_id="iterator", consumer_timeout_ms=1500) as consumer:
        consumer.subscribe(["iterated"])
        seen = [record.value for record in consumer]
    assert sorted(seen) == sorted(sent)


def test_offsets_are_committed_with_their_metadata(cluster):
    bootstrap = cluster.state.bootstrap
    tp = TopicPartition("orders", 0)
    with Consumer(bootstrap, group_id="with-metadata") as consumer:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(0, "run 7 of the nightly job")})
        assert consumer.committed_offsets([tp, ("orders", 1)]) == {tp: OffsetAndMetadata(0, "run 7 of the nightly job"),
                                                                   TopicPartition("orders", 1): None}
        assert consumer.committed(tp) == 0
        with pytest.raises(ClientError, match="metadata"):
            consumer.commit({tp: OffsetAndMetadata(5, "x" * 5000)})
        assert consumer.committed_offsets([tp])[tp] == OffsetAndMetadata(0, "run 7 of the nightly job")


def test_a_coordinator_move_keeps_every_member_its_epoch_and_partitions(tmp_path):
    """The group's __consumer_offsets leader killed: the next leader rebuilds the
    group from its membership records, and no member is fenced, rejoins or
    gives up a partition (no rebalance), while consumption goes on."""
    local = LocalCluster(tmp_path / "cluster")
    session = ["--zookeeper-session-timeout-s", "4"]
    local.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=1,
             service_args={"partition_svc": ["--group-heartbeat-interval-ms", "200", *session], "coordinator_svc": session})
    members = []
    try:
        local.wait_until_coordinators_settle()
        bootstrap = local.state.bootstrap
        with Admin(bootstrap) as admin:
            admin.create_topics([("moving", 4, 3)])
        members = [Polling(bootstrap, "movers", group_instance_id=None).start(["moving"]) for _ in range(2)]
        everything = {TopicPartition("moving", p) for p in range(4)}
        with Admin(bootstrap) as admin:
            before = wait_until_value(lambda: settled(admin.describe_group("movers"), everything), "a stable group")
            revoked_before = [list(m.revoked) for m in members]  # the second member's join took partitions from the first
            offsets_partitions = admin.describe_topics([CONSUMER_OFFSETS_TOPIC])[0].partitions
            index = partition_for_id("movers", len(offsets_partitions))
            coordinator = next(p.leader_id for p in offsets_partitions if p.partition == index)
        local.kill(f"partition_svc-{coordinator}", signal.SIGKILL)
        with Admin(bootstrap) as admin:
            def moved_and_settled():
                leader = next(p.leader_id for p in admin.describe_topics([CONSUMER_OFFSETS_TOPIC])[0].partitions if p.partition == index)
                return leader not in (coordinator, -1) and settled(admin.describe_group("movers"), everything)
            after = wait_until_value(moved_and_settled, "the group served by the next leader", timeout_s=90)
        assert after.group_epoch == before.group_epoch
        assert {(m.member_id, m.member_epoch, m.assigned) for m in after.members} == \
            {(m.member_id, m.member_epoch, m.assigned) for m in before.members}
        sent = produce_values(bootstrap, "moving", 4, "after-move")
        wait_until(lambda: sent <= {v for m in members for v in m.values}, 60, "records read after the move")
        assert [m.revoked for m in members] == revoked_before, "a partition was given up: the move caused a rebalance"
        assert [m.error for m in members] == [None, None]
    finally:
        for member in members:
            member.halt()
        local.down(grace_s=5)


def settled(group, everything: set, members: int = 2):
    """The group when Stable with ``members`` members and every partition assigned, else None."""
    assigned = {tp for m in group.members for tp in m.assigned}
    return group if group.state == "Stable" and len(group.members) == members and assigned == everything else None


def test_reset_offsets_to_yesterday_and_from_a_file(cluster, tmp_path):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("dated", 2, 2)])
    day_ms = 24 * 3600 * 1000
    yesterday_ms = 1_795_000_000_000  # 2026-11-18T11:06:40Z
    with Producer(bootstrap) as producer:
        for p in range(2):  # offsets 0-1 two days old, 2-3 from yesterday, 4-5 from today
            for i, when in enumerate([yesterday_ms - day_ms] * 2 + [yesterday_ms] * 2 + [yesterday_ms + day_ms] * 2):
                producer.send("dated", value=f"d{i}".encode(), partition=p, timestamp_ms=when)
        producer.flush()
    with Admin(bootstrap) as admin:
        admin.alter_group_offsets("dated-readers", {TopicPartition("dated", 0): 6, TopicPartition("dated", 1): 5})
    plan = [json.loads(line) for line in run_cli("groups", "reset-offsets", "dated-readers", "--topic", "dated",
                                                  "--to-datetime", "2026-11-18T11:06:40", "--execute",
                                                  "--dir", cluster.state.dir).splitlines()]
    assert {(p["partition"], p["current"], p["new"]) for p in plan} == {(0, 6, 2), (1, 5, 2)}
    offsets_file = tmp_path / "plan.csv"
    offsets_file.write_text("# topic,partition,offset\ndated,1,4\n\n")
    plan = [json.loads(line) for line in run_cli("groups", "reset-offsets", "dated-readers", "--from-file", str(offsets_file),
                                                  "--execute", "--dir", cluster.state.dir).splitlines()]
    assert [(p["partition"], p["new"], p["applied"]) for p in plan] == [(1, 4, True)]
    with Admin(bootstrap) as admin:
        assert admin.list_group_offsets("dated-readers") == {TopicPartition("dated", 0): 2, TopicPartition("dated", 1): 4}
    offsets_file.write_text("dated,one,4\n")
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        assert cli.main(["groups", "reset-offsets", "dated-readers", "--from-file", str(offsets_file), "--execute",
                         "--dir", cluster.state.dir]) == 1
    assert "line 1: expected topic,partition,offset" in errors.getvalue()
    with Admin(bootstrap) as admin:  # a bad file changes nothing
        assert admin.list_group_offsets("dated-readers") == {TopicPartition("dated", 0): 2, TopicPartition("dated", 1): 4}


def test_a_groups_offsets_for_a_topic_it_no_longer_reads_are_deleted_and_a_subscribed_topics_stay(cluster):
    orders = {TopicPartition("orders", p): 1 for p in range(2)}
    outputs = {TopicPartition("orders-out", 0): 4}
    with Admin(cluster.state.bootstrap) as admin:
        admin.alter_group_offsets("pruned", {**orders, **outputs})
    member = Polling(cluster.state.bootstrap, "pruned").start()
    try:
        wait_until(lambda: member.owned == all_partitions(), 30, "the member owning every partition")
        with Admin(cluster.state.bootstrap) as admin:
            with pytest.raises(ClientError, match="INVALID_REQUEST"):  # bad input changes nothing
                admin.delete_group_offsets("pruned", [TopicPartition("orders-out", -1)])
            refused = admin.delete_group_offsets("pruned", [TopicPartition("orders", 0)])
            assert refused[TopicPartition("orders", 0)].name == "GROUP_SUBSCRIBED_TO_TOPIC"
            assert admin.list_group_offsets("pruned") == {**orders, **outputs}
        lines = [json.loads(line) for line in run_cli("groups", "delete-offsets", "pruned", "--topic", "orders-out",
                                                      "--dir", cluster.state.dir).splitlines()]
        assert lines == [{"topic": "orders-out", "partition": 0, "deleted": True}]
        with Admin(cluster.state.bootstrap) as admin:
            assert admin.list_group_offsets("pruned") == orders
            assert admin.describe_group("pruned").members, "the group and its member stay"
    finally:
        member.halt()
    with Admin(cluster.state.bootstrap) as admin:
        wait_until(lambda: not admin.describe_group("pruned").members, 30, "the member gone")
        assert admin.delete_group_offsets("pruned", [TopicPartition("orders", 1)]) == {TopicPartition("orders", 1): None}
        assert admin.list_group_offsets("pruned") == {TopicPartition("orders", 0): 1}
