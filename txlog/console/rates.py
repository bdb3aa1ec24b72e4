"""Live rates and alerts for the console's overview, from the services'
Prometheus endpoints (each service's /metrics): bytes produced and fetched a
second (the workload's topics, internal ones left out), transactions
committed and aborted a second, and the chart's alerts one scrape shows.
Each sample reads every endpoint once, parses it once, and gives both: the
rates since the previous sample (a counter that went down, a restarted
service, counts from zero again) and the alerts firing now. An endpoint that
does not answer is named, not fatal."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 2.0
SCRAPES_AT_ONCE = 16
# rate name -> (counter family, which of its samples count)
SERIES: dict[str, tuple[str, Callable[[dict], bool]]] = {
    "produce_bytes": ("txlog_produce_bytes", lambda labels: not labels.get("topic", "").startswith("__")),
    "fetch_bytes": ("txlog_fetch_bytes", lambda labels: not labels.get("topic", "").startswith("__")),
    "committed": ("txlog_transactions_completed", lambda labels: labels.get("outcome") == "committed"),
    "aborted": ("txlog_transactions_completed", lambda labels: labels.get("outcome") == "aborted"),
}


def totals_of(families: list) -> dict[str, float]:
    """The counters' sums one endpoint's parsed exposition holds, by rate name."""
    totals = dict.fromkeys(SERIES, 0.0)
    for family in families:
        for name, (wanted, counted) in SERIES.items():
            if family.name == wanted:
                totals[name] += sum(s.value for s in family.samples if s.name.endswith("_total") and counted(s.labels))
    return totals


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
        return answer.read().decode()


class Rates:
    """Rates since the previous ``sample()``, and the alerts firing, over ``urls`` (http://host:port/metrics)."""

    def __init__(self, urls: Iterable[str], read: Callable[[str], str] = scrape, clock: Callable[[], float] = time.monotonic):
        self.urls = list(urls)
        self._read = read
        self._clock = clock
        self._last: dict[str, tuple[float, dict[str, float]]] = {}

    def _parsed(self, url: str) -> list | None:
        try:
            return list(text_string_to_metric_families(self._read(url)))
        except (OSError, ValueError):
            return None

    def sample(self) -> dict:
        """{"rates": {name: per second, None before two samples}, "alerts": [firing now, ...],
        "unreachable": [url, ...], "answered": how many endpoints answered}. The endpoints are read side by
        side, so one that does not answer costs its timeout once, not once per endpoint."""
        rates: dict[str, float | None] = dict.fromkeys(SERIES)
        unreachable, scraped = [], []
        with ThreadPoolExecutor(max(1, min(len(self.urls), SCRAPES_AT_ONCE))) as pool:
            answers = list(pool.map(self._parsed, self.urls))
        for url, families in zip(self.urls, answers, strict=True):
            if families is None:
                unreachable.append(url)
                continue
            scraped.append(families)
            totals = totals_of(families)
            now = self._clock()
            previous = self._last.get(url)
            self._last[url] = (now, totals)
            if previous is None or now <= previous[0]:
                continue
            for name, total in totals.items():
                gained = total - previous[1][name]
                gained = total if gained < 0 else gained  # the service restarted: its counter began again
                rates[name] = (rates[name] or 0.0) + gained / (now - previous[0])
        return {"rates": rates, "alerts": firing(scraped), "unreachable": unreachable, "answered": len(scraped)}


# The chart's PrometheusRule alerts whose condition one scrape shows (helm/txlog/templates/prometheusrule.yaml),
# with its default thresholds: (alert, severity, family, which samples, how they combine, firing when, summary).
# TxlogStuckLSO and TxlogServerErrors need the history only Prometheus keeps; their `for:` durations likewise:
# these fire at once.
ALERTS = (
    ("TxlogOfflinePartitions", "critical", "txlog_partitions_offline", max, lambda v: v > 0,
     "{value:.0f} partitions have no live leader"),
    ("TxlogUnderReplicatedPartitions", "warning", "txlog_partitions_under_replicated", sum, lambda v: v > 0,
     "{value:.0f} partitions have fewer in-sync replicas than replicas"),
    ("TxlogZooKeeperSessionLost", "critical", "txlog_zookeeper_connected", min, lambda v: v == 0,
     "a service has lost its ZooKeeper session"),
    ("TxlogHangingTransaction", "warning", "txlog_transactions_oldest_open_age_seconds", max, lambda v: v > 1200,
     "a transaction has been open for {value:.0f} s (more than 1200 s)"),
    ("TxlogRocksDBWritesStopped", "critical", "txlog_rocksdb", max, lambda v: v > 0,
     "RocksDB has stopped writes on an instance"),
)


def firing(scraped: Iterable[list]) -> list[dict]:
    """The ALERTS whose condition the endpoints' parsed expositions meet now."""
    values: dict[str, list[float]] = {}
    for families in scraped:
        for family in families:
            for sample in family.samples:
                if family.name == "txlog_rocksdb" and sample.labels.get("property") != "write_stopped":
                    continue
                values.setdefault(family.name, []).append(sample.value)
    fired = []
    for name, severity, family, combine, fires, summary in ALERTS:
        if values.get(family) and fires(combine(values[family])):
            fired.append({"alert": name, "severity": severity, "summary": summary.format(value=combine(values[family]))})
    return fired
