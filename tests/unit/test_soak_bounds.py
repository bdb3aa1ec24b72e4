"""The soak's judgement of series that fill to a limit by design (bench/soak_bounds.py):
within the limit a rising series is ``bounded``, past it ``over_bound`` counts the
samples, and the /metrics labels it accepts are the ones the services export."""

from __future__ import annotations

from bench.soak import fitted
from bench.soak_bounds import ENUMERATED_LABELS, WORKLOAD_LABELS, labels_within_domains, process_caps
from tests.deploy.metrics_contract import METRICS, OTEL_SCOPE_LABELS

HOURS = [i / 60 for i in range(40)]
FILLING = [min(2.0 + i * 0.25, 8.0) for i in range(40)]  # a cache filling to 8 and staying there, after a warm-up


def test_a_series_filling_within_its_limit_is_bounded_and_one_past_it_is_not():
    judged = fitted(FILLING, HOURS, warmup=4, caps=[8.5] * 40)
    assert judged["verdict"] == "bounded" and judged["over_bound"] == 0 and judged["max_value"] == 8.0
    past = fitted(FILLING, HOURS, warmup=4, caps=[7.0] * 40)
    assert past["verdict"] != "bounded" and past["over_bound"] == sum(1 for v in FILLING[4:] if v > 7.0)
    assert fitted(FILLING, HOURS, warmup=4)["verdict"] not in ("bounded", "flat")  # no limit: judged by its slope


def test_a_flat_series_stays_flat_and_an_unknown_limit_leaves_the_slope_verdict():
    assert fitted([5.0] * 40, HOURS, warmup=4, caps=[8.0] * 40)["verdict"] == "flat"
    assert fitted(FILLING, HOURS, warmup=4, caps=[8.5] * 39 + [None])["verdict"] not in ("bounded", "flat")


def test_threads_are_limited_per_incarnation_by_the_default_executor():
    rows = [{"threads": 17}, {"threads": 20}, {"threads": 12}, {"threads": 15}]
    caps = process_caps("threads", rows, [1, 1, 2, 2], {"executor_threads": 6}, {})
    assert caps == [23, 23, 18, 18]  # each process's first sample plus the pool


def test_metrics_labels_are_bounded_only_within_the_enumerations_and_the_workloads_names():
    workload = {"topics": ["a", "__consumer_offsets"], "groups": ["g"]}
    row = {"metrics_label_keys": ["rpc_method", "topic", "group"], "metrics_topics": ["a"], "metrics_groups": ["g"]}
    assert labels_within_domains(row, workload) is True
    assert labels_within_domains({**row, "metrics_label_keys": ["producer_id"]}, workload) is False
    assert labels_within_domains({**row, "metrics_topics": ["a", "gone"]}, workload) is False
    assert labels_within_domains({"metrics_series": 10}, workload) is None  # sampled before labels were


def test_every_label_the_services_export_is_one_the_soak_knows():
    exported = set().union(*METRICS.values()) | OTEL_SCOPE_LABELS
    assert exported <= ENUMERATED_LABELS | set(WORKLOAD_LABELS), exported - ENUMERATED_LABELS - set(WORKLOAD_LABELS)
