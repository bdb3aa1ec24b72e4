"""The coordinator's transaction metrics, read through a real OpenTelemetry
meter (an in-memory reader): the counters of transitions, and the gauges a
scrape reads while the event loop changes the transactions under it."""

from __future__ import annotations

from types import SimpleNamespace

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from coordinator_svc.transaction_metrics import TransactionMetrics
from coordinator_svc.transaction_state import TransactionState as S
from txlog.protocol import OPEN_TRANSACTION_STATES


def points(reader: InMemoryMetricReader) -> dict:
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found[(metric.name, tuple(sorted(point.attributes.items())))] = point.value
    return found


def meta(state: S, start_ms: int = 1_000) -> SimpleNamespace:
    return SimpleNamespace(state=state, txn_start_ms=start_ms)


def setup(partitions):
    reader = InMemoryMetricReader()
    metrics = TransactionMetrics(MeterProvider(metric_readers=[reader]).get_meter("test"), lambda: partitions, lambda: 5_000)
    return metrics, reader


def test_transitions_count_a_transaction_begun_once_and_each_outcome():
    metrics, reader = setup([])
    for before, after in [(S.EMPTY, S.ONGOING), (S.ONGOING, S.ONGOING), (S.ONGOING, S.PREPARE_COMMIT),
                          (S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (S.COMPLETE_COMMIT, S.ONGOING),
                          (S.ONGOING, S.PREPARE_ABORT), (S.PREPARE_ABORT, S.COMPLETE_ABORT)]:
        metrics.transitioned(before, after)
    found = points(reader)
    assert found[("txlog.transactions.begun", ())] == 2
    assert found[("txlog.transactions.completed", (("outcome", "committed"),))] == 1
    assert found[("txlog.transactions.completed", (("outcome", "aborted"),))] == 1


def partition_of(transactions: dict) -> SimpleNamespace:
    return SimpleNamespace(loaded=True, transactions=transactions,
                           open_ids={tid for tid, m in transactions.items() if m.state in OPEN_TRANSACTION_STATES})


def test_a_scrape_survives_transactions_added_while_it_reads_them():
    loaded = partition_of({"a": meta(S.ONGOING), "b": meta(S.PREPARE_COMMIT, 2_000)})
    metrics, reader = setup([loaded])
    walk = metrics._open_transactions()
    first = next(walk).state
    loaded.transactions["c"] = meta(S.ONGOING)  # the event loop, between two steps of the exporter's thread
    loaded.open_ids.add("c")
    assert sorted(s.value for s in [first, *(m.state for m in walk)]) == sorted([S.ONGOING.value, S.PREPARE_COMMIT.value])
    found = points(reader)
    assert found[("txlog.transactions.open", (("state", S.ONGOING.value),))] == 2
    assert found[("txlog.transactions.oldest_open_age", ())] == 4.0
