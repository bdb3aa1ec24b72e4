"""One trace follows a transaction (issue 17): from the client's span through
the coordinator (EndTxn) to the markers it writes on every partition, each
span naming what it touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.tooling.cluster import LocalCluster
from txlog import Admin, Producer
from txlog.net import telemetry
from txlog.two_phase import wait_until

TRACED = ["--otel-exporter", "console"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("tracing") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=1,
             service_args={"partition_svc": TRACED, "coordinator_svc": TRACED})
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)


def spans_of(cluster, kind: str, trace_id: str) -> list[dict]:
    found = []
    for info in cluster.state.services.values():
        if info.kind == kind:
            for line in Path(info.log).read_text().splitlines():
                if line.startswith('{"span"'):
                    span = json.loads(line)["span"]
                    if span["context"]["trace_id"] == "0x" + trace_id:
                        found.append(span)
    return found


def test_a_transactions_trace_runs_from_the_client_through_the_coordinator_to_its_markers(cluster):
    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([("traced", 2, 2)])
    client_spans = InMemorySpanExporter()
    provider = telemetry.tracer_provider("test-client", span_exporter=client_spans)
    with Producer(cluster.state.bootstrap, transactional_id="traced-txn", tracer_provider=provider) as producer:
        producer.init_transactions(timeout_s=60)
        producer.begin_transaction()
        for p in range(2):
            producer.send("traced", value=b"v", partition=p)
        producer.flush()
        with provider.get_tracer("test").start_as_current_span("commit") as commit:
            producer.commit_transaction(timeout_s=60)
        trace_id = format(commit.get_span_context().trace_id, "032x")

    def markers():
        return [s for s in spans_of(cluster, "partition_svc", trace_id) if s["name"].endswith("/WriteTxnMarkers")]

    wait_until(lambda: {p for s in markers() for p in s["attributes"].get("txlog.partitions", ())} >= {"traced-0", "traced-1"},
               30, "the commit's markers in its trace")
    (end_txn,) = [s for s in spans_of(cluster, "coordinator_svc", trace_id) if s["name"].endswith("/EndTxn")]
    assert end_txn["attributes"]["txlog.transactional_id"] == "traced-txn"
    assert end_txn["attributes"]["txlog.producer_epoch"] == 0
    assert all(s["attributes"]["txlog.topics"] for s in markers())


def test_a_refused_call_s_span_carries_our_error_code(cluster):
    client_spans = InMemorySpanExporter()
    provider = telemetry.tracer_provider("test-client", span_exporter=client_spans)
    with provider.get_tracer("test").start_as_current_span("bad") as bad, \
            Admin(cluster.state.bootstrap, tracer_provider=provider) as admin:
        with pytest.raises(Exception, match="INVALID_REQUEST"):
            admin.delete_group_offsets("traced-group", [("traced", -1)])
    trace_id = format(bad.get_span_context().trace_id, "032x")
    wait_until(lambda: any(s["attributes"].get("txlog.error_code") == "INVALID_REQUEST"
                           for s in spans_of(cluster, "partition_svc", trace_id)), 30, "the refusal's span")
