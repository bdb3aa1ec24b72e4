"""`txlog topics|produce|consume|producers` as a user runs them, against a real
local cluster (`--dir` reads its bootstrap addresses from cluster.json)."""

import json
import subprocess
import sys

import pytest

from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer, Producer, TopicPartition
from txlog import __version__ as txlog_version
from txlog.errors import ClientError
from txlog.two_phase import wait_until


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli") / "cluster"
    cluster = LocalCluster(directory)
    cluster.up(partition_svcs=2)
    yield str(directory)
    cluster.down(grace_s=5)


def txlog(*args, stdin=None, check=True):
    result = subprocess.run([sys.executable, "-m", "txlog.cli", *args], input=stdin, capture_output=True,
                            timeout=120)
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def test_cli_produce_consume_round_trip(cluster_dir):
    where = ("--dir", cluster_dir)
    assert b"topic lines has 3 partition(s)" in txlog("topics", "create", "lines", "--partitions", "3",
                                                      "--config", "retention.ms=3600000", *where).stdout
    txlog("topics", "create", "lines", "--partitions", "3", *where)  # the same again: not an error
    assert "lines" in txlog("topics", "list", *where).stdout.decode().split()
    described = json.loads(txlog("topics", "describe", "lines", *where).stdout)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert described["configs"]["retention.ms"] == "3600000"

    lines = [f"key{i % 5}:value {i}" for i in range(100)]
    produced = txlog("produce", "lines", "--key-separator", ":", *where, stdin="\n".join(lines).encode() + b"\n")
    assert b"produced 100 record(s) to lines" in produced.stderr

    out = txlog("consume", "lines", "--from-beginning", "--to-end", "--print-key", "--key-separator", ":",
                *where).stdout.decode().splitlines()
    assert sorted(out) == sorted(lines)
    for key in {line.split(":")[0] for line in lines}:  # one key, one partition: send order kept
        assert [line for line in out if line.startswith(key + ":")] == [line for line in lines if line.startswith(key + ":")]

    first = txlog("consume", "lines", "--from-beginning", "--group", "cli", "--max-records", "30", *where)
    rest = txlog("consume", "lines", "--group", "cli", "--to-end", *where)
    assert len(first.stdout.splitlines()) == 30 and len(rest.stdout.splitlines()) == 70
    assert sorted(first.stdout.splitlines() + rest.stdout.splitlines()) == sorted(
        line.split(":", 1)[1].encode() for line in lines)

    producers = [json.loads(line) for line in txlog("producers", "describe", "lines", *where).stdout.splitlines()]
    assert producers and {p["topic"] for p in producers} == {"lines"}
    assert all(p["producer_epoch"] == 0 and p["last_sequence"] >= 0 for p in producers)
    only = txlog("producers", "describe", "lines", "--partition", "1", *where).stdout.splitlines()
    assert {json.loads(line)["partition"] for line in only} == {1}


def test_cli_errors_are_one_line_with_the_code(cluster_dir):
    where = ("--dir", cluster_dir)
    txlog("topics", "create", "errs", "--partitions", "2", *where)
    cases = [
        (("topics", "create", "errs", "--partitions", "3", *where), "error: TOPIC_ALREADY_EXISTS: "),
        (("topics", "create", "bad name", "--partitions", "1", *where), "error: INVALID_TOPIC: "),
        (("topics", "create", "t2", "--partitions", "1", "--config", "nonsense", *where), "error: INVALID_REQUEST: "),
        (("topics", "describe", "missing", *where), "error: UNKNOWN_TOPIC_OR_PARTITION: "),
        (("consume", "missing", "--to-end", *where), "error: UNKNOWN_TOPIC_OR_PARTITION: "),
        (("produce", "missing", *where), "error: UNKNOWN_TOPIC_OR_PARTITION: "),
        (("topics", "list", "--bootstrap", "127.0.0.1:1", "--timeout-s", "1"), "error: LEADER_NOT_AVAILABLE: "),
    ]
    for args, expected in cases:
        result = txlog(*args, stdin=b"", check=False)
        stderr = result.stderr.decode()
        assert result.returncode == 1, (args, stderr)
        assert stderr.startswith(expected) and stderr.count("\n") == 1, (args, stderr)
    bad_line = txlog("produce", "errs", "--key-separator", ":", *where, stdin=b"no separator\n", check=False)
    assert bad_line.returncode == 1 and b"error: INVALID_REQUEST: line 1 has no key separator" in bad_line.stderr


def test_consume_into_a_pipe_that_closes_early_ends_quietly(cluster_dir):
    where = ("--dir", cluster_dir)
    txlog("topics", "create", "piped", "--partitions", "1", *where)
    txlog("produce", "piped", *where, stdin=b"".join(b"line %d\n" % i for i in range(2000)))
    reader = subprocess.Popen([sys.executable, "-m", "txlog.cli", "consume", "piped", "--from-beginning", "--to-end", *where],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout.readline() == b"line 0\n"
    reader.stdout.close()  # as `| head -1` does
    _, stderr = reader.communicate(timeout=120)
    assert reader.returncode == 0 and b"Traceback" not in stderr and b"BrokenPipe" not in stderr, stderr.decode()


def test_produce_honours_its_timeout_when_the_partitions_leader_is_down(cluster_dir):
    cluster = LocalCluster(cluster_dir)
    where = ("--dir", cluster_dir)
    txlog("topics", "create", "orphaned", "--partitions", "2", "--replication-factor", "1", *where)
    with Admin(cluster.state.bootstrap) as admin:
        leaders = {p.partition: p.leader_id for p in admin.describe_topics(["orphaned"])[0].partitions}
    cluster.kill(f"partition_svc-{leaders[0]}")
    try:
        result = txlog("produce", "orphaned", "--partition", "0", "--timeout-s", "3", *where, stdin=b"lost\n", check=False)
        stderr = result.stderr.decode()
        assert result.returncode == 1 and stderr.startswith("error: REQUEST_TIMED_OUT: orphaned-0: "), stderr
        assert "the last attempt: LEADER_NOT_AVAILABLE" in stderr, stderr
    finally:
        cluster.start(f"partition_svc-{leaders[0]}")


def test_offsets_at_a_time_the_clusters_health_and_records_with_their_fields(cluster_dir):
    where = ("--dir", cluster_dir)
    txlog("topics", "create", "timed", "--partitions", "2", *where)
    with Producer(LocalCluster(cluster_dir).state.bootstrap) as producer:
        for i, when in enumerate([1_000, 2_000, 3_000]):
            producer.send("timed", value=f"t{i}".encode(), key=b"k", partition=0, timestamp_ms=when,
                          headers=[("source", b"test")])
        producer.flush()
    lines = [json.loads(line) for line in txlog("offsets", "timed", "--time", "1500", *where).stdout.splitlines()]
    assert lines == [{"topic": "timed", "partition": 0, "offset": 1, "timestamp_ms": 2_000},
                     {"topic": "timed", "partition": 1, "offset": -1, "timestamp_ms": -1}]
    latest = [json.loads(line) for line in txlog("offsets", "timed", "--partition", "0", *where).stdout.splitlines()]
    assert latest == [{"topic": "timed", "partition": 0, "offset": 3}]
    iso = json.loads(txlog("offsets", "timed", "--time", "1970-01-01T00:00:02", "--partition", "0", *where).stdout)
    assert iso["offset"] == 1

    printed = txlog("consume", "timed", "--from-beginning", "--to-end", "--partition", "0", "--format", "json", *where)
    records = [json.loads(line) for line in printed.stdout.splitlines()]
    assert [(r["offset"], r["timestamp_ms"], r["key"], r["value"], r["headers"]) for r in records] == [
        (i, when, "k", f"t{i}", [["source", "test"]]) for i, when in enumerate([1_000, 2_000, 3_000])]
    plain = txlog("consume", "timed", "--from-beginning", "--max-records", "1", "--partition", "0", "--print-offset",
                  "--print-timestamp", *where).stdout
    assert plain == b"CreateTime:1000\tOffset:0\tt0\n"

    described = json.loads(txlog("cluster", "describe", *where).stdout)
    assert [n["node_id"] for n in described["partition_svcs"]] == [0, 1] and described["offline"] == 0
    assert described["controller_id"] in (0, 1) and described["controller_epoch"] >= 1
    registered = sorted((i["kind"], i["node_id"], i["address"]) for i in described["instances"])
    running = sorted((info.kind, int(name.rpartition("-")[2]), info.address)
                     for name, info in LocalCluster(cluster_dir).state.services.items() if info.kind != "zookeeper")
    assert registered == running, "every live instance of every service, as registered"
    assert {i["version"] for i in described["instances"]} == {txlog_version}
    assert described["partitions"] >= 2 and sum(n["leaders"] for n in described["partition_svcs"]) == described["partitions"]


def test_a_topics_configs_change_on_every_replica_and_survive_a_leader_change(cluster_dir):
    cluster = LocalCluster(cluster_dir)
    where = ("--dir", cluster_dir)
    txlog("topics", "create", "tuned", "--partitions", "1", "--replication-factor", "2", *where)

    def refused(args, expected):
        result = txlog("topics", "alter-configs", "tuned", *args, *where, check=False)
        assert result.returncode == 1 and expected in result.stderr.decode(), result.stderr.decode()

    refused(("--set", "retention.msec=5"), "INVALID_CONFIG: unknown topic config 'retention.msec'")
    refused(("--set", "min.insync.replicas=3"), "INVALID_CONFIG: topic config min.insync.replicas=3 is out of range 1..2")
    refused(("--set", "retention.ms=5", "--delete", "retention.ms"), "is both set and deleted")
    dry = json.loads(txlog("topics", "alter-configs", "tuned", "--set", "max.record.bytes=100", "--dry-run", *where).stdout)
    assert dry["configs"]["max.record.bytes"] == "100" and dry["applied"] is False
    with Admin(cluster.state.bootstrap) as admin:
        assert admin.describe_topics(["tuned"])[0].configs["max.record.bytes"] != "100", "bad input and a dry run change nothing"
        with pytest.raises(ClientError, match="INVALID_CONFIG: __consumer_offsets is internal"):
            admin.alter_topic_configs("__consumer_offsets", {"retention.ms": "1"})

    done = json.loads(txlog("topics", "alter-configs", "tuned", "--set", "max.record.bytes=100", *where).stdout)
    assert done["configs"]["max.record.bytes"] == "100" and done["applied"] is True

    def too_large_refused() -> bool:
        with Producer(cluster.state.bootstrap, delivery_timeout_ms=20_000, request_timeout_ms=5_000, linger_ms=0) as producer:
            try:
                producer.send("tuned", value=b"x" * 200, partition=0).result(timeout=30)
                return False
            except ClientError as exc:
                return "RECORD_TOO_LARGE" in str(exc)

    assert too_large_refused(), "the leader takes the change at once"
    # min.insync.replicas is checked by the leader alone: a follower that kept the old value would take acks=all
    # writes as the only replica left once it leads
    txlog("topics", "alter-configs", "tuned", "--set", "min.insync.replicas=2", *where)
    with Admin(cluster.state.bootstrap) as admin:
        leader = admin.describe_topics(["tuned"])[0].partitions[0].leader_id
    assert wait_for_configs(cluster, 1 - leader, "min.insync.replicas", "2")["max.record.bytes"] == "100"
    cluster.kill(f"partition_svc-{leader}")
    try:
        wait_until(lambda: "NOT_ENOUGH_REPLICAS" in produce_error(cluster), 60,
                   "the new leader refusing acks=all below the topic's min.insync.replicas")
    finally:
        cluster.start(f"partition_svc-{leader}")
    back = json.loads(txlog("topics", "alter-configs", "tuned", "--delete", "max.record.bytes", "--delete", "min.insync.replicas",
                            *where).stdout)
    assert back["configs"]["max.record.bytes"] == "1048576" and back["configs"]["min.insync.replicas"] == "1"


def produce_error(cluster: LocalCluster) -> str:
    """What a one-record acks=all produce to tuned-0 ends with ("" when it is acknowledged)."""
    with Producer(cluster.state.bootstrap, delivery_timeout_ms=6_000, request_timeout_ms=2_000, linger_ms=0) as producer:
        try:
            producer.send("tuned", value=b"small", partition=0).result(timeout=30)
            return ""
        except ClientError as exc:
            return str(exc)


def wait_for_configs(cluster: LocalCluster, node: int, key: str, value: str) -> dict:
    """The topic's configs as instance ``node`` describes them, once it has ``key`` = ``value``."""
    found: dict = {}

    def changed() -> bool:
        with Admin(cluster.address(f"partition_svc-{node}")) as admin:
            found.update(admin.describe_topics(["tuned"])[0].configs)
        return found.get(key) == value

    wait_until(changed, 30, f"partition_svc-{node} taking {key}={value}")
    return found


def test_partitions_added_to_a_topic_get_leaders_take_records_and_reach_a_groups_member(cluster_dir):
    cluster = LocalCluster(cluster_dir)
    where = ("--dir", cluster_dir)
    txlog("topics", "create", "grown", "--partitions", "2", "--replication-factor", "2", *where)
    for args, expected in ((("--partitions", "2"), "INVALID_PARTITIONS: topic 'grown' has 2 partitions"),
                           (("--partitions", "0"), "INVALID_PARTITIONS"),
                           (("--partitions", "9", "--topic-typo"), "unrecognized argument --topic-typo")):
        result = txlog("partitions", "add", "grown", *args, *where, check=False)
        assert result.returncode in (1, 2) and expected in result.stderr.decode(), result.stderr.decode()
    with Admin(cluster.state.bootstrap) as admin:
        with pytest.raises(ClientError, match="INVALID_PARTITIONS: __consumer_offsets is internal"):
            admin.create_partitions({"__consumer_offsets": 100})
        assert admin.create_partitions({"grown": 5}, validate_only=True) == {"grown": 5}
        assert len(admin.describe_topics(["grown"])[0].partitions) == 2, "a dry run adds nothing"
    with Consumer(cluster.state.bootstrap, group_id="growing", session_timeout_ms=6_000, auto_offset_reset="earliest") as member:
        member.subscribe(["grown"])
        wait_until(lambda: member.poll(timeout_s=0.2) is not None and len(member.assignment()) == 2, 60, "the member owning both")
        assert json.loads(txlog("partitions", "add", "grown", "--partitions", "4", *where).stdout) == {
            "topic": "grown", "partitions": 4, "applied": True}

        def every_partition_led() -> bool:
            with Admin(cluster.state.bootstrap) as admin:
                partitions = admin.describe_topics(["grown"])[0].partitions
            return len(partitions) == 4 and all(p.error == "NONE" and len(p.isr) == 2 for p in partitions)

        wait_until(every_partition_led, 60, "the new partitions led, with both replicas in sync")
        with Producer(cluster.state.bootstrap) as producer:
            producer.send("grown", value=b"in-three", partition=3).result(timeout=60)
        seen: list = []
        wait_until(lambda: seen.extend(member.poll(timeout_s=0.5)) or any(r.value == b"in-three" for r in seen), 60,
                   "the member reading the new partition")
        assert member.assignment() == {TopicPartition("grown", p) for p in range(4)}


def test_cli_topics_delete_removes_topics_and_refuses_internal_and_unknown_ones(cluster_dir):
    where = ("--dir", cluster_dir)
    for name in ("gone-a", "gone-b"):
        txlog("topics", "create", name, "--partitions", "2", *where)
    txlog("produce", "gone-a", *where, stdin=b"one\ntwo\n")
    deleted = [json.loads(line) for line in txlog("topics", "delete", "gone-a", "gone-b", *where).stdout.splitlines()]
    assert deleted == [{"topic": "gone-a", "deleted": True}, {"topic": "gone-b", "deleted": True}]
    listed = txlog("topics", "list", *where).stdout.decode().split()
    assert "gone-a" not in listed and "gone-b" not in listed
    for args, expected in ((("gone-a",), "error: UNKNOWN_TOPIC_OR_PARTITION"),
                           (("__transaction_state",), "error: INVALID_REQUEST: __transaction_state is internal"),
                           ((), "the following arguments are required: NAME")):
        result = txlog("topics", "delete", *args, *where, check=False)
        assert result.returncode in (1, 2) and expected in result.stderr.decode(), result.stderr.decode()
    assert "__transaction_state" in txlog("topics", "list", *where).stdout.decode().split()
    txlog("topics", "create", "gone-a", "--partitions", "1", *where)  # the name is free again, the topic empty
    assert txlog("consume", "gone-a", "--from-beginning", "--to-end", *where).stdout == b""


def test_a_rebalance_spreads_replicas_over_a_new_instance_moving_only_its_share(tmp_path):
    directory = tmp_path / "cluster"
    cluster = LocalCluster(directory)
    cluster.up(partition_svcs=2)
    try:
        where = ("--dir", str(directory))
        bootstrap = cluster.state.bootstrap
        with Admin(bootstrap) as admin:
            admin.create_topics([("spread", 6, 2)])
        with Producer(bootstrap) as producer:
            for i in range(60):
                producer.send("spread", f"{i}", partition=i % 6)
            producer.flush()
        assert json.loads(txlog("partitions", "rebalance", *where).stdout)["partitions"] == [], "balanced already"
        cluster.add_service("partition_svc", 2)
        with Admin(bootstrap) as admin:
            wait_until(lambda: 2 in admin.live_partition_nodes(), 60, "the new instance live")
            before = {p.partition: set(p.replicas) for p in admin.describe_topics(["spread"])[0].partitions}
        planned = json.loads(txlog("partitions", "rebalance", "--execute", *where).stdout.decode().split("reassigning")[0])
        assert len(planned["partitions"]) >= 1
        with Admin(bootstrap) as admin:
            def spread() -> dict[int, int] | None:
                if admin.list_partition_reassignments():
                    return None
                loads = {0: 0, 1: 0, 2: 0}
                for p in admin.describe_topics(["spread"])[0].partitions:
                    if set(p.isr) != set(p.replicas):
                        return None
                    for node in p.replicas:
                        loads[node] += 1
                return loads

            wait_until(lambda: spread() == {0: 4, 1: 4, 2: 4}, 120, "12 replicas, 4 on each instance, all in sync")
            after = {p.partition: set(p.replicas) for p in admin.describe_topics(["spread"])[0].partitions}
        moved = sum(len(after[p] - before[p]) for p in before)
        assert moved == 4, f"only the new instance's share moves: {before} -> {after}"
        with Consumer(bootstrap, fetch_max_wait_ms=100) as consumer:
            consumer.assign([("spread", p) for p in range(6)])
            consumer.seek_to_beginning()
            read = []
            wait_until(lambda: read.extend(consumer.poll(timeout_s=1)) or len(read) >= 60, 60, "every record read back")
        assert sorted(int(r.value) for r in read) == list(range(60))
        assert json.loads(txlog("partitions", "rebalance", *where).stdout)["partitions"] == [], "nothing more to do"
    finally:
        cluster.down(grace_s=5)
