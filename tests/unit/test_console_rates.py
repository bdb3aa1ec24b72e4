"""txlog/console/rates.py: the overview's live rates from the services'
Prometheus text, on a clock and endpoints the test controls."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from txlog.console.rates import Rates, firing, totals_of


def parsed(text: str) -> list:
    return list(text_string_to_metric_families(text))


def exposition(produced: float, committed: float, internal: float = 0.0) -> str:
    return (
        "# TYPE txlog_produce_bytes_total counter\n"
        f'txlog_produce_bytes_total{{topic="orders"}} {produced}\n'
        f'txlog_produce_bytes_total{{topic="__transaction_state"}} {internal}\n'
        "# TYPE txlog_transactions_completed_total counter\n"
        f'txlog_transactions_completed_total{{outcome="committed"}} {committed}\n'
        'txlog_transactions_completed_total{outcome="aborted"} 3\n'
    )


def test_the_workloads_counters_are_summed_and_internal_topics_left_out():
    assert totals_of(parsed(exposition(1000, 7, internal=500))) == {"produce_bytes": 1000, "fetch_bytes": 0, "committed": 7,
                                                             "aborted": 3}


def test_rates_are_per_second_since_the_last_sample_and_a_restart_counts_from_zero():
    pages = {"a": exposition(1000, 10), "b": exposition(0, 0)}
    clock = [100.0]
    rates = Rates(["a", "b"], read=lambda url: pages[url], clock=lambda: clock[0])
    assert rates.sample()["rates"]["produce_bytes"] is None, "one sample is no rate"
    pages["a"], pages["b"] = exposition(3000, 14), exposition(500, 2)
    clock[0] = 102.0
    assert rates.sample()["rates"] == {"produce_bytes": pytest.approx(1250), "fetch_bytes": 0, "committed": 3,
                                       "aborted": 0}
    pages["b"] = exposition(100, 1)  # b restarted: its counters began again
    clock[0] = 104.0
    assert rates.sample()["rates"]["produce_bytes"] == pytest.approx(50)


def test_an_endpoint_that_does_not_answer_is_named():
    def read(url):
        if url == "down":
            raise OSError("connection refused")
        return exposition(0, 0)

    assert Rates(["up", "down"], read=read).sample()["unreachable"] == ["down"]


def test_the_charts_alerts_fire_on_what_one_scrape_shows():
    calm = ("# TYPE txlog_partitions_offline gauge\ntxlog_partitions_offline 0\n"
            "# TYPE txlog_zookeeper_connected gauge\ntxlog_zookeeper_connected 1\n"
            "# TYPE txlog_rocksdb gauge\ntxlog_rocksdb{property=\"write_stopped\"} 0\n"
            "txlog_rocksdb{property=\"pending_compaction_bytes\"} 5000\n")
    assert firing([parsed(calm)]) == []
    troubled = ("# TYPE txlog_partitions_offline gauge\ntxlog_partitions_offline 2\n"
                "# TYPE txlog_zookeeper_connected gauge\ntxlog_zookeeper_connected 0\n"
                "# TYPE txlog_transactions_oldest_open_age_seconds gauge\ntxlog_transactions_oldest_open_age_seconds 1500\n")
    fired = {a["alert"]: a for a in firing([parsed(calm), parsed(troubled)])}
    assert set(fired) == {"TxlogOfflinePartitions", "TxlogZooKeeperSessionLost", "TxlogHangingTransaction"}
    assert fired["TxlogOfflinePartitions"]["summary"] == "2 partitions have no live leader"

    pages = {"up": calm, "troubled": troubled}
    reads = []

    def read(url):
        reads.append(url)
        if url == "down":
            raise OSError("refused")
        return pages[url]

    rates = Rates(["up", "down"], read=read)
    sample = rates.sample()
    assert (sample["alerts"], sample["unreachable"], sample["answered"]) == ([], ["down"], 1)
    assert reads == ["up", "down"], "one sample reads each endpoint once, for its rates and its alerts"
    assert {a["alert"] for a in Rates(["up", "troubled"], read=read).sample()["alerts"]} == set(fired)


def test_endpoints_are_read_side_by_side():
    import threading

    started = threading.Barrier(3, timeout=10)  # three reads at once, or none finishes

    def read(url):
        started.wait()
        return "# TYPE txlog_partitions_offline gauge\ntxlog_partitions_offline 0\n"

    sample = Rates(["a", "b", "c"], read=read).sample()
    assert (sample["answered"], sample["unreachable"]) == (3, [])
