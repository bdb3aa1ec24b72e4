"""DeleteRecords through the real services (issue 17; Kafka's DeleteRecords and
kafka-delete-records.sh): three partition_svc processes, a topic with three
replicas. The leader moves its log start and answers once every in-sync
replica has moved its own; leaders are then killed one after the other, and
each new one answers the moved log start with nothing above it lost. An
offset past the last stable offset is refused with nothing changed. The CLI
does the same from flags and from Kafka's offsets JSON.

Every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from services.tooling.cluster import LocalCluster
from tests.integ.raw import Raw, plain_batch
from tests.integ.test_replication import FAST, wait_for
from txlog import Admin, TopicPartition
from txlog.errors import ClientError
from txlog.protocol.errors import ErrorCode
from txlog.v1 import partition_pb2

TIMEOUT_S = 60
OFFSET_OUT_OF_RANGE = ErrorCode.Value("OFFSET_OUT_OF_RANGE")
# refusals that append nothing (a follower behind on a loaded machine, a leader not elected yet): sent again
REFUSED_BEFORE_APPEND = {ErrorCode.Value(c) for c in ("NOT_ENOUGH_REPLICAS", "NOT_LEADER", "LEADER_NOT_AVAILABLE",
                                                       "UNKNOWN_TOPIC_OR_PARTITION")}


@pytest.fixture
def replicated(tmp_path):
    """ZooKeeper, producer_id_svc and three partition_svc."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=3, coordinator_svcs=0, service_args={"partition_svc": FAST})
    yield local
    for name in local.state.services:
        local.kill(name, signal.SIGCONT)
    local.down(grace_s=5)


def answer(probe, what: str):
    """``probe()``'s first truthy answer (a failed call counts as none), within TIMEOUT_S."""
    return wait_for(probe, TIMEOUT_S, what)


def produced(raw: Raw, topic: str, values: list[str], partition: int = 0) -> None:
    """One batch acknowledged by every in-sync replica (acks=all). A refusal in
    REFUSED_BEFORE_APPEND is sent again; any other answer fails (a batch sent
    again after one that may have been appended would be written twice)."""
    def attempt() -> bool:
        code = raw.produce(topic, partition, plain_batch(values)).error.code
        assert code == 0 or code in REFUSED_BEFORE_APPEND, ErrorCode.Name(code)
        return code == 0
    answer(attempt, f"{values} acknowledged")


def meta(raw: Raw, topic: str) -> partition_pb2.PartitionMetadata:
    return raw.metadata(partition_pb2.MetadataRequest(topics=[topic])).topics[0].partitions[0]


def earliest_and_values(raw: Raw, topic: str):
    """(EARLIEST, every value from it, the fetch error just below it) as the current leader answers, once it reads."""
    def probe():
        start = raw.list_offset(topic, 0, partition_pb2.OFFSET_SPEC_EARLIEST)
        if start.error.code != 0:
            return None
        below = raw.fetch(topic, 0, start.offset - 1) if start.offset > 0 else None
        return start.offset, [r.value.decode() for r in raw.read_all(topic, 0, start.offset)], below and below.error.code
    return answer(probe, f"a leader of {topic}-0 that reads")


def test_deleted_records_stay_deleted_on_every_replica_and_nothing_above_the_log_start_is_lost(replicated):
    raw = Raw(replicated)
    bootstrap = replicated.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("trimmed", 1, 3)], {"min.insync.replicas": "2"})
        answer(lambda: len(meta(raw, "trimmed").isr) == 3, "every replica in sync")
        for values in (["v0", "v1", "v2"], ["v3", "v4", "v5"], ["v6", "v7", "v8"]):  # batches at 0, 3 and 6
            produced(raw, "trimmed", values)
        tp = TopicPartition("trimmed", 0)
        assert admin.delete_records({tp: 4}, timeout_s=30) == {tp: 4}  # inside the batch at 3: it stays, trimmed
        assert earliest_and_values(raw, "trimmed") == (4, ["v4", "v5", "v6", "v7", "v8"], OFFSET_OUT_OF_RANGE)

        with pytest.raises(ClientError) as refused:  # past the last stable offset (the high watermark, 9)
            admin.delete_records({tp: 10}, timeout_s=30)
        assert refused.value.code == OFFSET_OUT_OF_RANGE
        assert admin.list_offsets({tp: "latest"})[tp].offset == 9
        assert earliest_and_values(raw, "trimmed") == (4, ["v4", "v5", "v6", "v7", "v8"], OFFSET_OUT_OF_RANGE)
        assert admin.delete_records({tp: 2}, timeout_s=30) == {tp: 4}  # below the log start: nothing changes

    # every in-sync replica moved before the answer: kill each leader in turn, the next one answers the same
    killed = []
    for _ in range(2):
        leader = answer(lambda: (m := meta(raw, "trimmed")).error.code == 0 and m.leader_id not in killed and m,
                        "a live leader").leader_id
        replicated.kill(f"partition_svc-{leader}")
        killed.append(leader)
        answer(lambda: (m := meta(raw, "trimmed")).error.code == 0 and m.leader_id not in killed, "a new leader")
        assert earliest_and_values(raw, "trimmed") == (4, ["v4", "v5", "v6", "v7", "v8"], OFFSET_OUT_OF_RANGE)
    raw.close()


def txlog(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "txlog.cli", *args], capture_output=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def test_cli_deletes_records_from_flags_and_from_kafkas_offsets_file(replicated, tmp_path):
    raw = Raw(replicated)
    where = ("--dir", str(replicated.dir))
    txlog("topics", "create", "cli-trimmed", "--partitions", "2", "--replication-factor", "3", *where)
    for partition in (0, 1):
        answer(lambda p=partition: raw.leaders("cli-trimmed")[p], "a leader")
        for values in (["a", "b"], ["c", "d"]):
            produced(raw, "cli-trimmed", values, partition)
    deleted = txlog("delete-records", "--topic", "cli-trimmed", "--partition", "0", "--offset", "1", *where)
    assert [json.loads(line) for line in deleted.stdout.splitlines()] == [{"topic": "cli-trimmed", "partition": 0, "low_watermark": 1}]

    plan = tmp_path / "offsets.json"
    plan.write_text(json.dumps({"partitions": [{"topic": "cli-trimmed", "partition": 0, "offset": 3},
                                               {"topic": "cli-trimmed", "partition": 1, "offset": -1}], "version": 1}))
    deleted = txlog("delete-records", "--from-file", str(plan), *where)
    assert [json.loads(line) for line in deleted.stdout.splitlines()] == [
        {"topic": "cli-trimmed", "partition": 0, "low_watermark": 3},
        {"topic": "cli-trimmed", "partition": 1, "low_watermark": 4}]  # -1: the last stable offset
    assert [r.value for r in raw.read_all("cli-trimmed", 0, 3)] == [b"d"]

    refused = txlog("delete-records", "--topic", "cli-trimmed", "--partition", "0", "--offset", "99", *where, check=False)
    assert refused.returncode == 1 and refused.stderr.decode().startswith("error: OFFSET_OUT_OF_RANGE")
    plan.write_text(json.dumps({"partitions": [{"topic": "cli-trimmed", "partition": 1, "offset": 0},
                                               {"topic": "cli-trimmed", "partition": 1, "offset": 1}], "version": 1}))
    refused = txlog("delete-records", "--from-file", str(plan), *where, check=False)
    assert refused.returncode == 1 and "named twice" in refused.stderr.decode()
    assert raw.list_offset("cli-trimmed", 0, partition_pb2.OFFSET_SPEC_EARLIEST).offset == 3
    raw.close()
