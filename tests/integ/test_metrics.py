"""Metrics through the real services (issue 17): every service serves
Prometheus text at http://<metrics_address>/metrics (cluster.json names the
address), and the numbers match what was done: transactions committed and
aborted, records produced and fetched, calls and the errors they were refused
with, producer-id blocks, partitions led."""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer, Producer, TopicPartition
from txlog.errors import ClientError
from txlog.two_phase import wait_until

COMMITTED, ABORTED, PARTITIONS = 3, 2, 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("metrics") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=1)
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)


def scrape(address: str) -> dict[str, list[tuple[dict, float]]]:
    """{sample name: [(labels, value)]} of one endpoint."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def total(cluster, kind: str, name: str, **labels) -> float:
    """The sum of a sample over every instance of ``kind``, over the series whose labels include ``labels``."""
    found = 0.0
    for info in cluster.state.services.values():
        if info.kind == kind:
            found += sum(value for got, value in scrape(info.metrics_address).get(name, [])
                         if all(got.get(k) == str(v) for k, v in labels.items()))
    return found


def test_cluster_json_names_every_services_metrics_address(cluster):
    recorded = json.loads((Path(cluster.state.dir) / "cluster.json").read_text())["services"]
    services = {name: info for name, info in recorded.items() if info["kind"] != "zookeeper"}
    assert len(services) == 4
    for info in services.values():
        assert scrape(info["metrics_address"])["txlog_zookeeper_connected"][0][1] == 1


def test_the_numbers_match_what_was_done(cluster):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("measured", PARTITIONS, 2)])
    with Producer(bootstrap, transactional_id="measured-txn") as producer:
        producer.init_transactions(timeout_s=60)
        for i in range(COMMITTED + ABORTED):
            producer.begin_transaction()
            for p in range(PARTITIONS):
                producer.send("measured", value=f"v{i}-{p}".encode(), partition=p)
            producer.flush()  # an abort drops what was not sent yet: these reach the leaders first
            if i < COMMITTED:
                producer.commit_transaction(timeout_s=60)
            else:
                producer.abort_transaction(timeout_s=60)
    records = (COMMITTED + ABORTED) * PARTITIONS
    # the last transaction completes (markers, then CompleteCommit/Abort) after its commit or abort answered
    completed = {"committed": COMMITTED, "aborted": ABORTED}
    wait_until(lambda: {o: total(cluster, "coordinator_svc", "txlog_transactions_completed_total", outcome=o) for o in completed}
               == completed, 30, f"the coordinator counting {completed}")
    assert total(cluster, "coordinator_svc", "txlog_transactions_begun_total") == COMMITTED + ABORTED
    assert total(cluster, "coordinator_svc", "txlog_transactions_open", state="Ongoing") == 0
    assert total(cluster, "coordinator_svc", "txlog_transactions_oldest_open_age_seconds") == 0
    assert total(cluster, "partition_svc", "txlog_produce_records_total", topic="measured") == records

    with Consumer(bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition("measured", p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        seen = []
        wait_until(lambda: seen.extend(consumer.poll(timeout_s=0.5)) or len(seen) >= COMMITTED * PARTITIONS, 60,
                   "every committed record read")
    assert len(seen) == COMMITTED * PARTITIONS
    # read_committed returns the aborted records' batches too (the client drops them), so the
    # leaders count what they returned: at least every committed record, at most everything written
    fetched = total(cluster, "partition_svc", "txlog_fetch_records_total", topic="measured")
    assert COMMITTED * PARTITIONS <= fetched <= records
    assert total(cluster, "partition_svc", "txlog_partition_high_watermark", topic="measured") == records + (COMMITTED + ABORTED) * PARTITIONS
    assert total(cluster, "partition_svc", "txlog_partition_lso_lag", topic="measured") == 0
    assert total(cluster, "producer_id_svc", "txlog_producer_id_blocks_total") >= 1
    # the producer is remembered by each replica of each partition it wrote to (leader and follower)
    wait_until(lambda: total(cluster, "partition_svc", "txlog_producer_ids") >= PARTITIONS * 2, 30, "the producer remembered")


def test_the_sdk_consumer_reads_by_fetch_stream(cluster):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("streamed", 1, 2)])
    with Producer(bootstrap) as producer:
        for i in range(50):
            producer.send("streamed", value=f"v{i}".encode(), partition=0)

    def calls(method: str) -> float:
        return total(cluster, "partition_svc", "rpc_server_duration_milliseconds_count", rpc_method=method)

    streams, fetches = calls("FetchStream"), calls("Fetch")
    with Consumer(bootstrap) as consumer:
        consumer.assign([TopicPartition("streamed", 0)])
        consumer.seek_to_beginning()
        seen = []
        wait_until(lambda: seen.extend(consumer.poll(timeout_s=0.5)) or len(seen) >= 50, 60, "every record read")
    assert [r.value for r in seen] == [f"v{i}".encode() for i in range(50)] and [r.offset for r in seen] == list(range(50))
    assert calls("FetchStream") > streams and calls("Fetch") == fetches


def test_calls_are_counted_by_method_and_status_and_refusals_by_error_code(cluster):
    def refusals():
        return total(cluster, "partition_svc", "txlog_rpc_errors_total", rpc_method="DeleteGroupOffsets", error_code="INVALID_REQUEST")

    def calls():
        return total(cluster, "partition_svc", "rpc_server_duration_milliseconds_count", rpc_method="DeleteGroupOffsets")

    refused_before, calls_before = refusals(), calls()
    with Admin(cluster.state.bootstrap) as admin:
        for _ in range(2):
            with pytest.raises(ClientError, match="INVALID_REQUEST"):
                admin.delete_group_offsets("measured-readers", [TopicPartition("measured", -1)])
    assert refusals() - refused_before == 2
    assert calls() - calls_before == 2
    statuses = {labels["rpc_grpc_status_code"] for info in cluster.state.services.values() if info.kind == "partition_svc"
                for labels, _ in scrape(info.metrics_address)["rpc_server_duration_milliseconds_count"]
                if labels["rpc_method"] == "DeleteGroupOffsets"}
    assert statuses == {str(grpc.StatusCode.INVALID_ARGUMENT.value[0])}, "a refused call is counted with its gRPC status"
    answered = total(cluster, "partition_svc", "rpc_server_duration_milliseconds_count", rpc_method="Metadata", rpc_grpc_status_code=0)
    assert answered > 0


def test_a_groups_lag_is_the_lso_minus_its_committed_offset(cluster):
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("lagging", 1, 2)])
    with Producer(bootstrap) as producer:
        for i in range(10):
            producer.send("lagging", value=b"r%d" % i, partition=0)
        producer.flush()
    with Admin(bootstrap) as admin:
        admin.alter_group_offsets("lag-readers", {TopicPartition("lagging", 0): 4})

    def lag() -> float | None:
        lso = total(cluster, "partition_svc", "txlog_partition_last_stable_offset", topic="lagging", partition=0)
        committed = [value for info in cluster.state.services.values() if info.kind == "partition_svc"
                     for labels, value in scrape(info.metrics_address).get("txlog_group_committed_offset", [])
                     if labels.get("group") == "lag-readers" and labels.get("topic") == "lagging"]
        return lso - committed[0] if len(committed) == 1 else None

    assert lag() == 6, "committed 4 of 10: exactly one coordinator reports it"


def test_a_partitions_refusal_inside_an_answered_call_is_counted_by_topic_and_code(cluster):
    def refusals(topic: str) -> float:
        return total(cluster, "partition_svc", "txlog_partition_errors_total", rpc_method="Produce", topic=topic,
                     error_code="NOT_LEADER")

    before = refusals("measured")
    with Admin(cluster.state.bootstrap) as admin:
        (described,) = admin.describe_topics(["measured"])
    leader = described.partitions[0].leader_id
    follower = next(n for n in described.partitions[0].replicas if n != leader)
    # partition 0 asked of a replica that does not lead it: the call is answered, the partition refused
    reply = raw_produce(cluster.address(f"partition_svc-{follower}"), "measured", 0)
    assert reply.results[0].error.code != 0
    assert refusals("measured") - before == 1
    unknown_before = total(cluster, "partition_svc", "txlog_partition_errors_total", topic="(unknown)")
    raw_produce(cluster.address(f"partition_svc-{follower}"), "no-such-topic-ever", 0)
    assert total(cluster, "partition_svc", "txlog_partition_errors_total", topic="(unknown)") - unknown_before == 1
    assert total(cluster, "partition_svc", "txlog_partition_errors_total", topic="no-such-topic-ever") == 0


def raw_produce(address: str, topic: str, partition: int):
    from txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        batch = common_pb2.RecordBatch(records=[common_pb2.Record(value=b"x")])
        return partition_pb2_grpc.PartitionServiceStub(channel).Produce(partition_pb2.ProduceRequest(
            acks=1, batches=[partition_pb2.PartitionBatch(topic=topic, partition=partition, batch=batch)]), timeout=30)


def test_a_long_poll_counts_only_the_records_of_its_answer(cluster):
    # found in review: each pass of a long poll counted what it read, the passes thrown away too
    from txlog.v1 import common_pb2, partition_pb2, partition_pb2_grpc

    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([(f"poll-{i}", 1, 1) for i in range(6)])
        by_leader = defaultdict(list)
        for described in admin.describe_topics([f"poll-{i}" for i in range(6)]):
            by_leader[described.partitions[0].leader_id].append(described.name)
    leader, (full, empty, *_) = next((node, names) for node, names in by_leader.items() if len(names) >= 2)
    raw_produce(cluster.address(f"partition_svc-{leader}"), full, 0)
    before = total(cluster, "partition_svc", "txlog_fetch_records_total", topic=full)
    with grpc.insecure_channel(cluster.address(f"partition_svc-{leader}")) as channel:
        # the first pass reads the one record, too few bytes: it waits on the empty partition until the deadline
        reply = partition_pb2_grpc.PartitionServiceStub(channel).Fetch(partition_pb2.FetchRequest(
            isolation_level=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED, max_wait_ms=300, min_bytes=1_000_000,
            partitions=[partition_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=0) for topic in (full, empty)]),
            timeout=30)
    returned = sum(len(b.records) for r in reply.results for b in r.batches)
    assert returned == 1
    assert total(cluster, "partition_svc", "txlog_fetch_records_total", topic=full) - before == returned
