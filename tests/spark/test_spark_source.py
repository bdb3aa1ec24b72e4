"""The ``txlog`` data source on real Spark (local mode) and a real cluster:
planned offset ranges, read_committed around aborted and open transactions,
transactional writes with failing attempts, and bad options refused on the
driver before any task runs."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
from inputs import create, produce
from outputs import read_all
from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType
from spark_env import worker_pythonpath

from services.tooling.cluster import LocalCluster
from txlog import Admin, Producer
from txlog.two_phase import wait_until


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """One cluster for the module: every test uses topics of its own."""
    local = LocalCluster(tmp_path_factory.mktemp("spark-source") / "cluster")
    local.up()
    local.wait_until_coordinators_settle()
    yield local.state.bootstrap
    local.down(grace_s=5)


@pytest.fixture(scope="module", autouse=True)
def known_topic(bootstrap):
    create(bootstrap, "known", 1)


def reader(spark, bootstrap: str, topic: str, **options):
    read = spark.read.format("txlog").option("bootstrap", bootstrap).option("topic", topic)
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


def test_a_read_returns_every_record_with_its_coordinates_in_planned_ranges(spark, bootstrap):
    create(bootstrap, "src", 3)
    for partition in range(3):
        produce(bootstrap, "src", [f"p{partition}-{i}" for i in range(5)], partition=partition)
    df = reader(spark, bootstrap, "src")
    assert df.rdd.getNumPartitions() == 3  # one range per partition
    rows = df.collect()
    assert sorted((r.partition, r.offset, r.value.decode()) for r in rows) == \
        [(p, i, f"p{p}-{i}") for p in range(3) for i in range(5)]
    row = rows[0]
    assert row.topic == "src" and row.key == row.value and [(h.key, h.value) for h in row.headers] == [("origin", b"test")]
    assert row.timestamp.year >= 2026

    split = reader(spark, bootstrap, "src", maxRecordsPerSplit="2")
    assert split.rdd.getNumPartitions() == 9  # 5 offsets in ranges of at most 2: 3 ranges per partition
    assert split.count() == 15

    ranged = reader(spark, bootstrap, "src", startingOffsets=json.dumps({"src": {"0": 2, "1": -1}}),
                    endingOffsets=json.dumps({"src": {"0": 4}}))
    assert sorted((r.partition, r.offset) for r in ranged.collect()) == \
        [(0, 2), (0, 3)] + [(2, i) for i in range(5)]


def test_a_read_from_a_groups_committed_offsets_starts_where_the_group_is(spark, bootstrap):
    create(bootstrap, "grouped", 2)
    produce(bootstrap, "grouped", [f"v{i}" for i in range(6)], partition=0)
    produce(bootstrap, "grouped", [f"w{i}" for i in range(3)], partition=1)
    from txlog import Consumer

    with Consumer(bootstrap, group_id="readers") as consumer:
        consumer.commit({("grouped", 0): 4})  # partition 1 has no committed offset: it starts at the earliest
    rows = reader(spark, bootstrap, "grouped", startingOffsets="committed:readers").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, 4), (0, 5), (1, 0), (1, 1), (1, 2)]


def test_a_read_of_a_live_groups_committed_offsets_leaves_its_members_undisturbed(spark, bootstrap):
    from txlog import Consumer

    create(bootstrap, "subscribed", 2)
    produce(bootstrap, "subscribed", [f"s{i}" for i in range(4)], partition=0)
    revoked = []
    with Consumer(bootstrap, group_id="live-readers", session_timeout_ms=10_000) as member, Admin(bootstrap) as admin:
        member.subscribe(["subscribed"], on_revoke=revoked.append)

        def owns_both():
            member.poll(0.2)  # what runs the group's assignment steps in this thread
            return len(member.assignment()) == 2

        wait_until(owns_both, 30, "the member owning both partitions")
        member.commit({("subscribed", 0): 3})
        before = admin.describe_group("live-readers")
        rows = reader(spark, bootstrap, "subscribed", startingOffsets="committed:live-readers").collect()
        assert sorted((r.partition, r.offset) for r in rows) == [(0, 3)]
        member.poll(0.2)
        after = admin.describe_group("live-readers")
        assert [(m.member_id, m.member_epoch, m.assigned) for m in after.members] == \
            [(m.member_id, m.member_epoch, m.assigned) for m in before.members]
        assert after.state == "Stable" and revoked == []
        assert member.committed(("subscribed", 0)) == 3


def test_read_committed_returns_only_committed_records_below_the_lso(spark, bootstrap):
    create(bootstrap, "mixed", 1)
    produce(bootstrap, "mixed", ["plain-0"])
    with Producer(bootstrap, transactional_id="mixed-committer") as committer:
        committer.init_transactions()
        committer.begin_transaction()
        committer.send("mixed", "committed-0", partition=0)
        committer.commit_transaction()
        committer.begin_transaction()
        committer.send("mixed", "aborted-0", partition=0)
        committer.flush()
        committer.abort_transaction()
    opener = Producer(bootstrap, transactional_id="mixed-opener")
    try:
        opener.init_transactions()
        opener.begin_transaction()
        opener.send("mixed", "open-0", partition=0).result(timeout=30)  # holds the LSO here
        produce(bootstrap, "mixed", ["plain-after-open"])

        committed = [r.value.decode() for r in reader(spark, bootstrap, "mixed").orderBy("offset").collect()]
        assert committed == ["plain-0", "committed-0"]
        uncommitted = reader(spark, bootstrap, "mixed", isolation="read_uncommitted").orderBy("offset").collect()
        assert [r.value.decode() for r in uncommitted] == \
            ["plain-0", "committed-0", "aborted-0", "open-0", "plain-after-open"]
        opener.commit_transaction()
    finally:
        opener.close()
    committed = [r.value.decode() for r in reader(spark, bootstrap, "mixed").orderBy("offset").collect()]
    assert committed == ["plain-0", "committed-0", "open-0", "plain-after-open"]


def partition_failing_first_attempts(value):
    """Partition 0, except for one row in a task's first attempt: a partition the topic does
    not have, so that attempt's transaction fails after its other rows were sent."""
    return 99 if TaskContext.get().attemptNumber() == 0 and value.endswith("-150") else 0


def test_a_transactional_write_whose_first_attempts_fail_is_visible_exactly_once(spark, bootstrap):
    create(bootstrap, "written", 2)
    rows = [(f"task{t}-{i}",) for t in range(2) for i in range(200)]
    df = spark.createDataFrame(rows, "v string").repartition(2)
    partition = F.udf(partition_failing_first_attempts, IntegerType())
    (df.select(F.col("v").alias("value"), F.col("v").alias("key"), partition("v").alias("partition"))
     .write.format("txlog").option("bootstrap", bootstrap).option("topic", "written")
     .option("transactionalIdPrefix", "writer").mode("append").save())

    committed = read_all(bootstrap, "written")
    assert sorted(r.value.decode() for r in committed) == sorted(v for (v,) in rows)
    with Admin(bootstrap) as admin:
        listed = admin.list_transactions(prefix="writer/")
    states = collections.Counter(t.state for t in listed)
    # one transaction per attempt: the two that succeeded committed together; the two failed ones
    # were aborted (Empty when the failure came before the coordinator heard of their partitions)
    assert states["CompleteCommit"] == 2 and sum(states.values()) == 4, listed
    assert set(states) <= {"CompleteCommit", "CompleteAbort", "Empty"}, listed
    assert {t.transactional_id.rsplit(".", 2)[1] for t in listed if t.state == "CompleteCommit"} == {"p0", "p1"}


TRACED_WRITE = """
import sys
from spark_jobs import session
bootstrap, topic = sys.argv[1:]
spark = session.build("local[2]", "traced-write")
try:
    rows = spark.createDataFrame([(f"v{i}",) for i in range(40)], "value string").repartition(2)
    (rows.write.format("txlog").option("bootstrap", bootstrap).option("topic", topic)
     .option("transactionalIdPrefix", "traced").mode("append").save())
finally:
    spark.stop()
"""


def test_a_transactional_write_is_one_trace_from_the_driver_through_each_tasks_transaction_to_the_group_commit(bootstrap):
    create(bootstrap, "traced", 2)
    job = subprocess.run([sys.executable, "-c", TRACED_WRITE, bootstrap, "traced"], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": worker_pythonpath(), "TXLOG_OTEL_EXPORTER": "console"})
    assert job.returncode == 0, job.stderr[-3000:]
    assert sorted(r.value for r in read_all(bootstrap, "traced")) == sorted(f"v{i}".encode() for i in range(40))
    spans = [json.loads(line)["span"] for line in job.stderr.splitlines() if line.startswith('{"span"')]
    (write,) = [s for s in spans if s["name"] == "txlog.spark.write"]  # begun as Spark made the writer, recorded at its commit
    assert write["attributes"]["txlog.topic"] == "traced" and write["attributes"]["txlog.transactional_id_prefix"] == "traced"
    in_trace = [s for s in spans if s["context"]["trace_id"] == write["context"]["trace_id"]]
    tasks = [s for s in in_trace if s["name"] == "txlog.spark.write.task"]
    (commit,) = [s for s in in_trace if s["name"] == "txlog.spark.write.commit"]
    assert len(tasks) == 2 and all(s["parent_id"] == write["context"]["span_id"] for s in [*tasks, commit]), \
        "each task's transaction and the commit children of the write's span"
    assert write["start_time"] <= min(s["start_time"] for s in tasks) and write["end_time"] >= commit["end_time"]
    assert sorted(s["attributes"]["txlog.transactional_id"] for s in tasks) == sorted(commit["attributes"]["txlog.transactional_ids"])
    assert all(s["attributes"]["txlog.transactional_id"].startswith(f"traced/{write['attributes']['txlog.run']}.p") and
               s["attributes"]["txlog.producer_id"] >= 0 and s["attributes"]["txlog.producer_epoch"] >= 0 for s in tasks)
    task_ids = {s["context"]["span_id"] for s in tasks}
    prepares = [s for s in in_trace if s["name"].endswith("/PrepareTransaction")]
    assert len(prepares) >= 2 and all(s["parent_id"] in task_ids for s in prepares), "each task's prepare in its span"
    group_commits = [s for s in in_trace if s["name"].endswith("/CommitTransactionGroup")]
    assert group_commits and all(s["parent_id"] == commit["context"]["span_id"] for s in group_commits), \
        "the group commit in the commit's span, so the coordinator and the markers continue the trace"


def test_a_plain_write_goes_through_an_idempotent_producer(spark, bootstrap):
    create(bootstrap, "plain", 1)
    df = spark.createDataFrame([(f"k{i}", f"v{i}", 0) for i in range(20)], "key string, value string, partition int")
    df.write.format("txlog").option("bootstrap", bootstrap).option("topic", "plain").mode("append").save()
    # two tasks write to the one partition at once: their rows interleave
    assert sorted((r.key, r.value) for r in read_all(bootstrap, "plain")) == \
        sorted((f"k{i}".encode(), f"v{i}".encode()) for i in range(20))


def job_count(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup("bad-options"))


LIVE = "<the cluster's bootstrap>"


@pytest.mark.parametrize(("options", "message"), [
    ({"topic": "known"}, "option 'bootstrap' is required"),
    ({"bootstrap": "nohost", "topic": "known"}, "option 'bootstrap' must be host:port"),
    ({"bootstrap": LIVE, "topic": "nosuchtopic"}, "cannot read topic 'nosuchtopic'"),
    ({"bootstrap": LIVE, "topic": "known", "startingOffsets": "{not json"}, "option 'startingOffsets' is not valid JSON"),
    ({"bootstrap": LIVE, "topic": "known", "endingOffsets": '{"known": {"0": 99}}'}, "past the end of the partition"),
    ({"bootstrap": LIVE, "topic": "known", "startingOffsets": '{"known": {"7": 0}}'}, "partitions that do not exist"),
    ({"bootstrap": LIVE, "topic": "known", "isolation": "serializable"}, "option 'isolation' must be one of"),
])
def test_bad_read_options_fail_on_the_driver_before_any_task(spark, bootstrap, options, message):
    spark.sparkContext.setJobGroup("bad-options", "bad options")
    before = job_count(spark)
    read = spark.read.format("txlog")
    for name, value in options.items():
        read = read.option(name, bootstrap if value == LIVE else value)
    with pytest.raises(Exception, match=message):
        read.load().collect()
    assert job_count(spark) == before  # refused while planning: no Spark job ran


@pytest.mark.parametrize(("options", "columns", "mode", "message"), [
    ({"topic": "nosuchtopic"}, "value string", "append", "cannot write to topic 'nosuchtopic'"),
    ({"topic": "known"}, "value string", "overwrite", "append-only"),
    ({"topic": "known"}, "payload string", "append", "needs a 'value' column"),
    ({"topic": "known"}, "value string, extra int", "append", "column 'extra' is not written"),
    ({"topic": "known", "transactionalIdPrefix": "bad prefix"}, "value string", "append", "transactionalIdPrefix"),
])
def test_bad_write_options_fail_on_the_driver_before_any_task(spark, bootstrap, options, columns, mode, message):
    spark.sparkContext.setJobGroup("bad-options", "bad options")
    before = job_count(spark)
    width = len(columns.split(","))
    df = spark.createDataFrame([tuple(["x"] + [1] * (width - 1))], columns)
    write = df.write.format("txlog").option("bootstrap", bootstrap).mode(mode)
    for name, value in options.items():
        write = write.option(name, value)
    with pytest.raises(Exception, match=message):
        write.save()
    assert job_count(spark) == before
    assert read_all(bootstrap, "known") == []  # nothing was written


def test_spark_kafka_option_names_read_and_write_as_txlogs_do(spark, bootstrap):
    create(bootstrap, "kafka-named-a", 1)
    create(bootstrap, "kafka-named-b", 2)
    produce(bootstrap, "kafka-named-a", ["a0", "a1"], partition=0)
    produce(bootstrap, "kafka-named-b", ["b0"], partition=1)
    with Producer(bootstrap, transactional_id="kafka-named-aborter") as aborter:
        aborter.init_transactions()
        aborter.begin_transaction()
        aborter.send("kafka-named-a", "aborted", partition=0)
        aborter.flush()
        aborter.abort_transaction()

    def values(options: dict) -> list[str]:
        return sorted(r.value.decode() for r in spark.read.format("txlog").options(**options).load().collect())

    kafka_names = {"kafka.bootstrap.servers": bootstrap, "subscribe": "kafka-named-a,kafka-named-b"}
    assert values(kafka_names) == ["a0", "a1", "b0"]  # read_committed by default, as with txlog's names
    assert values({**kafka_names, "kafka.isolation.level": "read_uncommitted"}) == ["a0", "a1", "aborted", "b0"]
    assert values({**kafka_names, "topic": "kafka-named-a,kafka-named-b", "bootstrap": bootstrap}) == ["a0", "a1", "b0"]

    create(bootstrap, "kafka-named-out", 1)
    (spark.createDataFrame([("w0",), ("w1",)], "value string").write.format("txlog")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", "kafka-named-out").mode("append").save())
    assert sorted(r.value for r in read_all(bootstrap, "kafka-named-out")) == [b"w0", b"w1"]


@pytest.mark.parametrize(("option", "value", "message"), [
    ("maxOffsetsPerTrigger", 10, "txlog: option 'maxoffsetspertrigger' (txlog's 'maxRecordsPerTrigger') is a streaming "
                                 "read option: a batch read does not take it"),
    ("kafka.security.protocol", "SSL", "txlog: unknown option 'kafka.security.protocol' (a spark-sql-kafka option): "
                                       "txlog has no equivalent: txlog's client turns TLS on with 'tlsCa'"),
    ("startingOffset", "latest", "txlog: unknown option 'startingoffset': did you mean 'startingOffsets'?"),
    ("transactionalIdPrefix", "p", "txlog: option 'transactionalIdPrefix' is a write option: a read does not take it"),
])
def test_an_unknown_read_option_fails_on_the_driver_naming_it(spark, bootstrap, option, value, message):
    spark.sparkContext.setJobGroup("bad-options", "bad options")
    before = job_count(spark)
    read = spark.read.format("txlog").option("kafka.bootstrap.servers", bootstrap).option("subscribe", "known")
    with pytest.raises(Exception) as error:
        read.option(option, value).load().collect()
    assert message in str(error.value)
    assert job_count(spark) == before  # refused while planning: no Spark job ran


def test_a_kafka_name_and_txlogs_name_with_different_values_fail_naming_both(spark, bootstrap):
    spark.sparkContext.setJobGroup("bad-options", "bad options")
    before = job_count(spark)
    read = spark.read.format("txlog").option("bootstrap", bootstrap).option("topic", "known").option("subscribe", "other")
    with pytest.raises(Exception, match=r"txlog: options '(topic|subscribe)' and '(topic|subscribe)' both set 'topic', "
                                        r"to different values"):
        read.load().collect()
    assert job_count(spark) == before


def test_an_unknown_write_option_fails_on_the_driver_and_writes_nothing(spark, bootstrap):
    spark.sparkContext.setJobGroup("bad-options", "bad options")
    before = job_count(spark)
    write = (spark.createDataFrame([("x",)], "value string").write.format("txlog")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", "known").option("kafka.acks", "all"))
    with pytest.raises(Exception) as error:
        write.mode("append").save()
    assert ("txlog: unknown option 'kafka.acks' (a Kafka client setting): txlog has no equivalent; "
            "the write options are bootstrap, topic, transactionalIdPrefix") in str(error.value)
    assert job_count(spark) == before
    assert read_all(bootstrap, "known") == []
