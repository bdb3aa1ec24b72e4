"""The metrics the txlog services expose, as the chart's dashboard and alerts
name them: the Prometheus sample names with their labels (the list below),
what the services' own instruments export (read in-process through the
OpenTelemetry Prometheus exporter, so a renamed metric or label shows), and a
reader of the metric and label names a PromQL expression uses."""

from __future__ import annotations

import re

# Every sample name each service exposes, with its labels (beside otel_scope_name,
# otel_scope_version and otel_scope_schema_url, which every one carries).
_RPC = {"rpc_system", "rpc_service", "rpc_method", "rpc_grpc_status_code"}
_PARTITION = {"topic", "partition"}
EVERY_SERVICE = {
    "rpc_server_duration_milliseconds_bucket": _RPC | {"le"},
    "rpc_server_duration_milliseconds_count": _RPC,
    "rpc_server_duration_milliseconds_sum": _RPC,
    "txlog_rpc_errors_total": {"rpc_method", "error_code"},
    "txlog_rpc_in_flight": set(),
    "txlog_rpc_in_flight_bytes": set(),
    "txlog_rpc_refused_total": set(),
    "txlog_zookeeper_connected": set(),
    "txlog_process_malloc_bytes": {"state"},
    "txlog_python_allocated_blocks": set(),
}
EXPOSED: dict[str, dict[str, set[str]]] = {
    "producer_id_svc": {
        **EVERY_SERVICE,
        "txlog_producer_id_blocks_total": set(),
        "txlog_producer_id_ids_total": set(),
    },
    "coordinator_svc": {
        **EVERY_SERVICE,
        "txlog_transactions_begun_total": set(),
        "txlog_transactions_completed_total": {"outcome"},
        "txlog_transactions_timed_out_total": set(),
        "txlog_transactions_fenced_total": set(),
        "txlog_transactions_open": {"state"},
        "txlog_transactions_oldest_open_age_seconds": set(),
    },
    "partition_svc": {
        **EVERY_SERVICE,
        "txlog_produce_records_total": {"topic"},
        "txlog_produce_bytes_total": {"topic"},
        "txlog_fetch_records_total": {"topic"},
        "txlog_fetch_bytes_total": {"topic"},
        "txlog_partition_high_watermark": _PARTITION,
        "txlog_partition_lso_lag": _PARTITION,
        "txlog_partition_last_stable_offset": _PARTITION,
        "txlog_partition_errors_total": {"rpc_method", "topic", "error_code"},
        "txlog_group_committed_offset": _PARTITION | {"group"},
        "txlog_partition_in_sync_replicas": _PARTITION,
        "txlog_partition_aborted_transactions": _PARTITION,
        "txlog_partitions_led": set(),
        "txlog_partitions_under_replicated": set(),
        "txlog_partitions_offline": set(),
        "txlog_rocksdb": {"property"},
        "txlog_producer_ids": set(),
    },
}
METRICS: dict[str, set[str]] = {}
for _metrics in EXPOSED.values():
    for _name, _labels in _metrics.items():
        METRICS.setdefault(_name, set()).update(_labels)
OTEL_SCOPE_LABELS = {"otel_scope_name", "otel_scope_version", "otel_scope_schema_url"}
# What Prometheus and the operator add to every series they scrape (job is the
# release's full name through the chart's relabeling).
TARGET_LABELS = {"namespace", "job", "instance", "pod", "container", "service", "endpoint"}


def exported_by_the_services() -> dict[str, dict[str, set[str]]]:
    """{service: {sample name: labels}} as each service's own instruments
    export them (see ``expositions``)."""
    from prometheus_client.parser import text_string_to_metric_families

    exported = {}
    for service, text in expositions().items():
        samples: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "target_info":  # the resource, not a measurement
                continue
            for sample in family.samples:
                samples.setdefault(sample.name, set()).update(set(sample.labels) - OTEL_SCOPE_LABELS)
        exported[service] = samples
    return exported


def expositions() -> dict[str, str]:
    """{service: its /metrics text} with each of its instruments used once as
    the service does: its ServiceMetrics and the instruments its servicer adds,
    read through the Prometheus exporter (the docs' metrics page is made from it)."""
    import asyncio
    from types import SimpleNamespace

    from prometheus_client import generate_latest

    from coordinator_svc.transaction_metrics import TransactionMetrics
    from coordinator_svc.transaction_state import TransactionState
    from partition_svc.partition_metrics import PartitionMetrics
    from producer_id_svc.server import ProducerIdServicer
    from services.runtime.admission import Admission
    from services.runtime.metrics import ServiceMetrics
    from txlog.protocol import errors

    class Aborted(Exception):
        pass

    class Context:
        async def abort_with_status(self, status):
            raise Aborted(status)

        def code(self):
            return None

    async def calls(metrics: ServiceMetrics) -> None:
        async def answered(request, context):
            return request

        async def refused(request, context):
            await errors.abort(context, errors.TxlogError(errors.ErrorCode.Value("INVALID_REQUEST"), "refused"))

        await metrics.measured("txlog.v1.Service", "Answered", answered)(None, Context())
        try:
            await metrics.measured("txlog.v1.Service", "Refused", refused)(None, Context())
        except Aborted:
            pass

    def partition_svc(meter) -> None:
        partition = SimpleNamespace(is_leader=True, topic="events", index=0, high_watermark=10, last_stable_offset=7, producers={7: None}, aborted={7: [(1, 2)]},
                                    replica_set=SimpleNamespace(isr=[0]), replicas=[0, 1])
        recorder = PartitionMetrics(meter, lambda: [partition], lambda: 0,
                                    lambda: {"sst_bytes": 1, "pending_compaction_bytes": 0}, lambda: [("readers", "events", 0, 5)])
        recorder.produced("events", 1, 100)
        recorder.fetched("events", 1, 100)
        recorder.refused("Produce", "events", errors.ErrorCode.Value("NOT_LEADER"))

    def coordinator_svc(meter) -> None:
        transaction = SimpleNamespace(state=TransactionState.ONGOING, txn_start_ms=0)
        loaded = SimpleNamespace(loaded=True, transactions={"t": transaction}, open_ids={"t"})
        recorder = TransactionMetrics(meter, lambda: [loaded], lambda: 5_000)
        recorder.transitioned(TransactionState.EMPTY, TransactionState.ONGOING)
        recorder.transitioned(TransactionState.PREPARE_COMMIT, TransactionState.COMPLETE_COMMIT)
        recorder.timed_out.add(1)
        recorder.fenced.add(1)

    def producer_id_svc(meter) -> None:
        servicer = ProducerIdServicer(None, meter)
        servicer.blocks.add(1)
        servicer.ids.add(1000)

    exported = {}
    for service, use in (("producer_id_svc", producer_id_svc), ("coordinator_svc", coordinator_svc),
                         ("partition_svc", partition_svc)):
        metrics = ServiceMetrics(service, SimpleNamespace(metrics_listen="127.0.0.1:0", otel_exporter="none"), lambda: True)
        metrics.observe_admission(Admission.from_config(SimpleNamespace()))  # as the runtime does
        try:
            asyncio.run(calls(metrics))
            use(metrics.meter)
            exported[service] = generate_latest(metrics.registry).decode()
        finally:
            metrics.stop()
    return exported


# --- reading PromQL ----------------------------------------------------------------------------------

_TOKENS = re.compile(r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>(?:[0-9]+(?:ms|[smhdwy]))+\b)
  | (?P<number>[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},])
  | (?P<space>\s+)
""", re.VERBOSE)
_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses: names of series it
    selects, and labels it matches on or aggregates and joins by. Functions
    and aggregations (a name before "(", "by" or "without") are neither."""
    tokens = []
    position = 0
    while position < len(expr):
        match = _TOKENS.match(expr, position)
        if match is None:
            raise ValueError(f"cannot read {expr[position:position + 20]!r} in {expr!r}")
        if match.lastgroup != "space":
            tokens.append((match.lastgroup, match.group()))
        position = match.end()
    metrics: set[str] = set()
    labels: set[str] = set()
    braces = 0
    label_list = False  # inside by (...), on (...) and the like
    for i, (kind, text) in enumerate(tokens):
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if text == "{":
            braces += 1
        elif text == "}":
            braces -= 1
        elif text == ")" and label_list:
            label_list = False
        elif kind == "ident":
            if braces or label_list:
                labels.add(text)
            elif text in _LABEL_LISTS:
                label_list = following == "("
            elif text in _KEYWORDS or following in ("(", "by", "without"):
                continue  # an operator, a function, an aggregation (sum by (...) (...))
            else:
                metrics.add(text)
    return metrics, labels
