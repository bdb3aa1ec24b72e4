"""Rendering helpers and value sets shared by the deployment tests (the chart is
rendered by Helm's own engine, from the helm-python-sdk package, offline)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "txlog"
KUBE_VERSION = "1.33.0"
RELEASE = "txlog"
NAMESPACE = "streaming"

# Four value sets: the defaults; a production-like install on an external
# ZooKeeper ensemble with more of everything (the Prometheus Operator's
# ServiceMonitor, the alert rules and the Grafana dashboard included); a
# minimal one with the optional objects turned off; and the PodMonitor.
PRODUCTION_VALUES = {
    "image": {"repository": "registry.example.com/txlog", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "clusterDomain": "corp.internal",
    "tls": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"},
                            "duration": "720h", "renewBefore": "240h"}},
    "networkPolicy": {"clientNamespaceSelector": {"matchLabels": {"txlog-clients": "allowed"}}},
    "logLevel": "WARNING",
    "telemetry": {"exporter": "otlp", "endpoint": "http://collector.tracing:4317"},
    "shutdownGraceSeconds": 20,
    "terminationGracePeriodSeconds": 60,
    "nodeSelector": {"pool": "streaming"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "streaming", "effect": "NoSchedule"}],
    "zookeeper": {"enabled": False, "external": "zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181", "root": "/prod/txlog"},
    "producerIdSvc": {"replicas": 2},
    "partitionSvc": {
        "replicas": 5,
        "fsync": False,
        "persistence": {"size": "200Gi", "storageClassName": "fast-ssd"},
        "extraEnv": [{"name": "TXLOG_RETENTION_CHECK_INTERVAL_MS", "value": "10000"}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
    },
    "coordinatorSvc": {"replicas": 3, "extraArgs": ["--transaction-timeout-ms-max", "300000"]},
    "metrics": {
        "port": 9500,
        "allowFrom": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                      "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        "serviceMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "10s",
                           "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, "stuckLsoMinutes": 10,
                           "hangingTransactionSeconds": 600, "underReplicatedMinutes": 15, "serverErrorRatio": 0.05},
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Streaming"}},
    },
    "sparkJob": {
        "schedule": "0 * * * *",
        "timeZone": "Europe/Paris",
        "image": {"repository": "registry.example.com/txlog-spark", "tag": "1.2.3", "pullPolicy": "Always"},
        "inputTopic": "page-views",
        "outputTopic": "page-view-counts",
        "group": "hourly-counts",
        "master": "local[4,3]",
    },
}
MINIMAL_VALUES = {
    "fullnameOverride": "tx",
    "tls": {"enabled": False},
    "authorizer": {"enabled": False},  # it needs TLS: principals are certificate subjects
    "networkPolicy": {"enabled": False},
    "zookeeper": {"auth": {"enabled": False, "existingSecret": ""}},
    "serviceAccount": {"create": False, "name": "platform-runner"},
    "telemetry": {"exporter": "console", "endpoint": "http://unused:4317"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "partitionSvc": {"replicas": 1, "podDisruptionBudget": {"enabled": False, "maxUnavailable": 1}},
    "coordinatorSvc": {"replicas": 1, "podDisruptionBudget": {"enabled": False, "maxUnavailable": 1}},
    "producerIdSvc": {"podDisruptionBudget": {"enabled": False, "maxUnavailable": 1}},
    "sparkJob": {"enabled": False},
    "metrics": {"enabled": False},
}
POD_MONITOR_VALUES = {"metrics": {
    "podMonitor": {"enabled": True, "interval": "1m", "scrapeTimeout": "30s", "labels": {"team": "streaming"}},
    "prometheusRule": {"enabled": True}}}
VALUE_SETS = {"defaults": {}, "production": PRODUCTION_VALUES, "minimal": MINIMAL_VALUES, "pod-monitor": POD_MONITOR_VALUES}
# TLS off: the authorizer, which needs it, too.
NO_TLS = {"tls": {"enabled": False}, "authorizer": {"enabled": False}}


@dataclass
class Rendered:
    """A rendered release: each template's text and every manifest in it."""

    files: dict[str, str]
    docs: list[dict]

    def of_kind(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        found = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {[d['metadata']['name'] for d in self.of_kind(kind)]}"
        return found[0]

    @property
    def notes(self) -> str:
        return next(text for path, text in self.files.items() if path.endswith("NOTES.txt"))


def render(values: dict, *, name: str = RELEASE, namespace: str = NAMESPACE) -> Rendered:
    with helm_python.Chart.load(CHART_DIR) as chart:
        files = chart.render(values, name=name, namespace=namespace)
    docs = []
    for path, text in files.items():
        if path.endswith(".txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return Rendered(files, docs)


def container(workload: dict) -> dict:
    """The one container of a workload's pod template (CronJobs included)."""
    spec = workload["spec"]
    pod = spec["jobTemplate"]["spec"]["template"]["spec"] if workload["kind"] == "CronJob" else spec["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def pod_spec(workload: dict) -> dict:
    spec = workload["spec"]
    return spec["jobTemplate"]["spec"]["template"]["spec"] if workload["kind"] == "CronJob" else spec["template"]["spec"]


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def expand_kubernetes_vars(text: str, resolved: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in env values and commands: a reference to
    a variable defined earlier is replaced, anything else is left as it is."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: resolved.get(m.group(1), m.group(0)), text)


def settings_read_by(module: str) -> set[str]:
    """The TXLOG_* variables a process started as ``python -m <module>`` reads:
    a variable it does not read is silently ignored, so a misspelt one in a
    manifest would go unnoticed."""
    import importlib

    from services.runtime import config, server

    if module == "spark_jobs.windowed_counts":
        return {s.env for s in importlib.import_module(module).SETTINGS}
    service = importlib.import_module(f"{module}.server")
    return {s.env for s in (*config.COMMON_SETTINGS, *server.SERVER_SETTINGS, *service.SETTINGS)}


def acl_commands(job: dict) -> list[list[str]]:
    """The argv of each `txlog acls add` the ACL hook Job's script runs (as sh would split it)."""
    import shlex

    script = container(job)["command"][2]
    return [shlex.split(line)[1:] for line in script.splitlines() if line.startswith("retry txlog acls add ")]


def acl_bindings(job: dict) -> list[tuple[str, ...]]:
    """The bindings those commands add, read by the CLI's own parser:
    (permission, principal, operation, resource type, pattern type, name, host)."""
    from txlog.cli import program as cli
    from txlog.protocol import acls

    bindings = []
    for argv in acl_commands(job):
        assert argv[:3] == ["txlog", "acls", "add"], argv
        args = cli.parser().parse_args(argv[1:])
        resource = cli._acl_resource(args)
        assert resource is not None, argv
        pattern = acls.PREFIXED if args.prefixed else acls.LITERAL
        bindings += [(permission, principal, operation, *resource[:1], pattern, resource[1], args.host or "*")
                     for permission, principal in cli._acl_principals(args) for operation in args.operation]
    return bindings
