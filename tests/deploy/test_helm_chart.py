"""The Helm chart, rendered by Helm's own engine and checked against the
Kubernetes schemas, with no cluster: helm lint, every manifest of four value
sets validated strictly (unknown fields fail), and the fields a running
release depends on asserted."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess

import cert_manager_schema
import helm_python
import jsonschema
import kubernetes_validate
import metrics_contract
import prometheus_operator_schema
import pytest
import yaml
from chart_render import (
    CHART_DIR,
    KUBE_VERSION,
    MINIMAL_VALUES,
    NAMESPACE,
    NO_TLS,
    POD_MONITOR_VALUES,
    PRODUCTION_VALUES,
    REPO,
    VALUE_SETS,
    Rendered,
    acl_bindings,
    acl_commands,
    container,
    env_of,
    pod_spec,
    render,
    settings_read_by,
)

TXLOG_COMPONENTS = ("producer-id-svc", "partition-svc", "coordinator-svc")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@pytest.fixture(scope="module")
def defaults() -> Rendered:
    return render({})


@pytest.fixture(scope="module")
def production() -> Rendered:
    return render(PRODUCTION_VALUES)


@pytest.fixture(scope="module")
def minimal() -> Rendered:
    return render(MINIMAL_VALUES)


@pytest.fixture(scope="module")
def pod_monitor() -> Rendered:
    return render(POD_MONITOR_VALUES)


def bootstrap_for(release_fullname: str, replicas: int, namespace: str, domain: str) -> str:
    headless = f"{release_fullname}-partition-svc-headless"
    return ",".join(f"{release_fullname}-partition-svc-{i}.{headless}.{namespace}.svc.{domain}:7300" for i in range(replicas))


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --- Helm's lint and the Kubernetes schemas ------------------------------------------------------


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_strict_finds_nothing_above_info(value_set):
    report = helm_python.lint(CHART_DIR, VALUE_SETS[value_set], strict=True, namespace=NAMESPACE,
                              kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["total_charts_linted"] == 1


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_manifest_is_valid_against_the_kubernetes_schemas(value_set):
    rendered = render(VALUE_SETS[value_set])
    assert len(rendered.docs) >= 8
    for doc in rendered.docs:
        if doc["apiVersion"].startswith("cert-manager.io/"):
            cert_manager_schema.validate(doc)  # cert-manager's kinds, as strictly
            continue
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            prometheus_operator_schema.validate(doc)  # the Prometheus Operator's, as strictly
            continue
        # strict: a field Kubernetes does not know (a typo, a wrong indent) fails.
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_the_schema_validation_is_strict_enough_to_catch_a_misplaced_field(defaults):
    statefulset = copy.deepcopy(defaults.get("StatefulSet", "txlog-partition-svc"))
    statefulset["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {"grpc": {"port": 7300}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, KUBE_VERSION, strict=True)


def test_each_value_set_renders_the_objects_it_asks_for(defaults, production, minimal, pod_monitor):
    def kinds(rendered: Rendered) -> dict[str, int]:
        counts: dict[str, int] = {}
        for doc in rendered.docs:
            counts[doc["kind"]] = counts.get(doc["kind"], 0) + 1
        return counts

    # TLS by default: the release's CA (a self-signed Issuer, the CA Certificate, a CA Issuer), the services'
    # and the Spark job's certificates; NetworkPolicies for the services and the built-in ZooKeeper.
    # The ACL authorizer: the hook Job granting the Spark job its ACLs.
    assert kinds(defaults) == {"StatefulSet": 3, "Deployment": 1, "Service": 4, "CronJob": 1,
                               "PodDisruptionBudget": 3, "ServiceAccount": 1, "Issuer": 2, "Certificate": 3,
                               "NetworkPolicy": 2, "Secret": 1, "Job": 1}
    # External ZooKeeper: no ZooKeeper StatefulSet nor its two Services, nor its NetworkPolicy; the operator's issuer.
    # The ServiceMonitor with its metrics Service, the alert rules and the dashboard's ConfigMap.
    assert kinds(production) == {"StatefulSet": 2, "Deployment": 1, "Service": 3, "CronJob": 1,
                                 "PodDisruptionBudget": 3, "ServiceAccount": 1, "Certificate": 2, "NetworkPolicy": 1,
                                 "Secret": 1, "Job": 1, "ServiceMonitor": 1, "PrometheusRule": 1, "ConfigMap": 1}
    assert kinds(minimal) == {"StatefulSet": 3, "Deployment": 1, "Service": 4}
    # The defaults, and a PodMonitor (no Service) with the alert rules.
    assert kinds(pod_monitor) == {**kinds(defaults), "PodMonitor": 1, "PrometheusRule": 1}


# --- workloads ---------------------------------------------------------------------------------------


def test_partition_svc_is_a_statefulset_with_a_volume_claim_for_rocksdb_on_its_data_dir(defaults, production):
    for rendered, replicas, size, storage_class in ((defaults, 3, "10Gi", None), (production, 5, "200Gi", "fast-ssd")):
        sts = rendered.get("StatefulSet", "txlog-partition-svc")
        assert sts["spec"]["replicas"] == replicas
        [claim] = sts["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data"
        assert claim["spec"]["resources"]["requests"]["storage"] == size
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert claim["spec"].get("storageClassName") == storage_class
        # The only copy of the log: the claims outlive pods, scale-downs and the release.
        assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
        c = container(sts)
        [mount] = [m for m in c["volumeMounts"] if m["name"] == "data"]
        data_dir = env_of(c)["TXLOG_DATA_DIR"]["value"]
        assert data_dir.startswith(mount["mountPath"].rstrip("/") + "/")


@pytest.mark.parametrize("component", ["partition-svc", "coordinator-svc"])
def test_statefulset_node_ids_are_pod_ordinals_and_addresses_go_through_the_headless_service(defaults, component):
    sts = defaults.get("StatefulSet", f"txlog-{component}")
    headless = defaults.get("Service", f"txlog-{component}-headless")
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert selects(headless["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
    c = container(sts)
    script = " ".join(c["command"])
    module = component.replace("-", "_")
    assert f"python -m {module} --node-id \"${{POD_NAME##*-}}\"" in script
    env = env_of(c)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert env["TXLOG_ADVERTISED_ADDRESS"]["value"] == \
        f"$(POD_NAME).txlog-{component}-headless.$(POD_NAMESPACE).svc.cluster.local:{port}"
    assert env["TXLOG_LISTEN"]["value"] == f"0.0.0.0:{port}"
    # Kubernetes expands $(VAR) only from variables defined before the reference.
    names = [e["name"] for e in c["env"]]
    assert names.index("POD_NAME") < names.index("TXLOG_ADVERTISED_ADDRESS")
    assert names.index("POD_NAMESPACE") < names.index("TXLOG_ADVERTISED_ADDRESS")


def test_replica_counts_follow_the_values(defaults, production, minimal):
    for rendered, prefix, (pid, part, coord) in ((defaults, "txlog", (1, 3, 2)), (production, "txlog", (2, 5, 3)),
                                                  (minimal, "tx", (1, 1, 1))):
        assert rendered.get("Deployment", f"{prefix}-producer-id-svc")["spec"]["replicas"] == pid
        assert rendered.get("StatefulSet", f"{prefix}-partition-svc")["spec"]["replicas"] == part
        assert rendered.get("StatefulSet", f"{prefix}-coordinator-svc")["spec"]["replicas"] == coord


def test_producer_id_svc_is_a_deployment_whose_node_id_is_unique_per_pod(defaults):
    deployment = defaults.get("Deployment", "txlog-producer-id-svc")
    c = container(deployment)
    env = env_of(c)
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert c["command"][:2] == ["python", "-c"]
    assert 'os.environ["POD_IP"]' in c["command"][2] and '"--node-id"' in c["command"][2]
    # The new pod serves before the old one stops: callers always find one.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize("tls", [True, False])
def test_every_txlog_service_has_native_grpc_probes_on_its_health_port(tls):
    """The kubelet's gRPC probes cannot do TLS: with TLS they ask the plaintext health-only port."""
    rendered = render({} if tls else NO_TLS)
    for kind, name, port in (("Deployment", "txlog-producer-id-svc", 7100), ("StatefulSet", "txlog-coordinator-svc", 7200),
                             ("StatefulSet", "txlog-partition-svc", 7300)):
        c = container(rendered.get(kind, name))
        health = [{"name": "health", "containerPort": 7900, "protocol": "TCP"}] if tls else []
        metrics = [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
        assert c["ports"] == [{"name": "grpc", "containerPort": port, "protocol": "TCP"}, *health, *metrics]
        for probe in PROBES:
            assert c[probe]["grpc"] == {"port": 7900 if tls else port}, (name, probe)
            assert c[probe]["failureThreshold"] >= 1
        # A ZooKeeper blip turns health NOT_SERVING: liveness must wait longer than readiness.
        liveness_s = c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"]
        readiness_s = c["readinessProbe"]["periodSeconds"] * c["readinessProbe"]["failureThreshold"]
        assert liveness_s > readiness_s


def test_image_and_environment_follow_the_values(defaults, production):
    for name in ("txlog-producer-id-svc", "txlog-partition-svc", "txlog-coordinator-svc"):
        kind = "Deployment" if "producer-id" in name else "StatefulSet"
        c = container(defaults.get(kind, name))
        assert c["image"] == "txlog:0.1.0"  # the chart's appVersion
        env = env_of(c)
        assert env["TXLOG_ZOOKEEPER"]["value"] == f"txlog-zookeeper.{NAMESPACE}.svc.cluster.local:2181"
        assert env["TXLOG_ZOOKEEPER_ROOT"]["value"] == "/txlog"
        assert env["TXLOG_OTEL_EXPORTER"]["value"] == "none"
        assert env["TXLOG_SHUTDOWN_GRACE_S"]["value"] == "10"
        assert env["TXLOG_LOG_LEVEL"]["value"] == "INFO"

        c = container(production.get(kind, name))
        assert c["image"] == "registry.example.com/txlog:1.2.3"
        assert c["imagePullPolicy"] == "Always"
        env = env_of(c)
        assert env["TXLOG_ZOOKEEPER"]["value"] == "zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181"
        assert env["TXLOG_ZOOKEEPER_ROOT"]["value"] == "/prod/txlog"
        assert env["TXLOG_OTEL_EXPORTER"]["value"] == "otlp"
        assert env["TXLOG_OTEL_ENDPOINT"]["value"] == "http://collector.tracing:4317"
        assert env["TXLOG_SHUTDOWN_GRACE_S"]["value"] == "20"
        assert env["TXLOG_LOG_LEVEL"]["value"] == "WARNING"
        assert pod_spec(production.get(kind, name))["imagePullSecrets"] == [{"name": "registry-credentials"}]
    partition = container(production.get("StatefulSet", "txlog-partition-svc"))
    assert env_of(partition)["TXLOG_FSYNC"]["value"] == "false"
    assert env_of(partition)["TXLOG_RETENTION_CHECK_INTERVAL_MS"]["value"] == "10000"
    assert env_of(partition)["TXLOG_ADVERTISED_ADDRESS"]["value"].endswith(".svc.corp.internal:7300")
    coordinator = container(production.get("StatefulSet", "txlog-coordinator-svc"))
    assert coordinator["args"] == ["--transaction-timeout-ms-max", "300000"]


@pytest.mark.parametrize("value_set", ["defaults", "production"])
def test_every_txlog_variable_given_is_a_setting_the_process_reads(value_set):
    rendered = render(VALUE_SETS[value_set])
    modules = {"producer-id-svc": "producer_id_svc", "partition-svc": "partition_svc",
               "coordinator-svc": "coordinator_svc", "windowed-counts": "spark_jobs.windowed_counts"}
    checked = set()
    for doc in rendered.docs:
        component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
        if doc["kind"] in ("StatefulSet", "Deployment", "CronJob") and component in modules:
            given = {name for name in env_of(container(doc)) if name.startswith("TXLOG_")}
            assert given <= settings_read_by(modules[component]), (component, given - settings_read_by(modules[component]))
            checked.add(component)
    assert checked == set(modules)


def test_termination_grace_exceeds_the_services_shutdown_grace(defaults, production):
    for rendered in (defaults, production):
        for doc in rendered.docs:
            if doc["kind"] in ("StatefulSet", "Deployment") and doc["metadata"]["labels"]["app.kubernetes.io/component"] in TXLOG_COMPONENTS:
                grace_s = float(env_of(container(doc))["TXLOG_SHUTDOWN_GRACE_S"]["value"])
                assert pod_spec(doc)["terminationGracePeriodSeconds"] > grace_s


def test_pods_run_as_non_root_with_a_read_only_root_and_writable_tmp(defaults):
    workloads = [d for d in defaults.docs if d["kind"] in ("StatefulSet", "Deployment", "CronJob", "Job")]
    assert len(workloads) == 6
    for workload in workloads:
        pod, c = pod_spec(workload), container(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        assert pod["serviceAccountName"] == "txlog"
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        if workload["metadata"]["name"] == "txlog-zookeeper":
            continue  # the official image writes its config into its own /conf
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        [tmp] = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    account = defaults.get("ServiceAccount", "txlog")
    assert account["automountServiceAccountToken"] is False


def test_every_container_has_cpu_and_memory_requests_and_limits(defaults, production):
    for rendered in (defaults, production):
        for doc in rendered.docs:
            if doc["kind"] in ("StatefulSet", "Deployment", "CronJob", "Job"):
                resources = container(doc)["resources"]
                for bound in ("requests", "limits"):
                    assert set(resources[bound]) >= {"cpu", "memory"}, (doc["metadata"]["name"], bound)
    partition = container(production.get("StatefulSet", "txlog-partition-svc"))
    assert partition["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}


def test_pod_disruption_budgets_select_their_components_pods(defaults, minimal):
    workloads = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
                 for d in defaults.docs if d["kind"] in ("StatefulSet", "Deployment")}
    budgets = defaults.of_kind("PodDisruptionBudget")
    assert sorted(b["metadata"]["labels"]["app.kubernetes.io/component"] for b in budgets) == sorted(TXLOG_COMPONENTS)
    for budget in budgets:
        assert budget["spec"]["maxUnavailable"] == 1
        selected = [name for name, w in workloads.items()
                    if selects(budget["spec"]["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])]
        assert selected == [budget["metadata"]["labels"]["app.kubernetes.io/component"]]
    assert minimal.of_kind("PodDisruptionBudget") == []


def test_every_service_selects_exactly_its_own_pods(defaults):
    workloads = [d for d in defaults.docs if d["kind"] in ("StatefulSet", "Deployment")]
    for service in defaults.of_kind("Service"):
        selected = [w["metadata"]["name"] for w in workloads
                    if selects(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        assert len(selected) == 1, (service["metadata"]["name"], selected)


def test_built_in_zookeeper_is_a_single_node_statefulset_of_the_official_image_with_its_data_on_a_volume(defaults):
    sts = defaults.get("StatefulSet", "txlog-zookeeper")
    assert sts["spec"]["replicas"] == 1
    c = container(sts)
    assert c["image"] == "zookeeper:3.8.4"
    assert {m["mountPath"] for m in c["volumeMounts"] if m["name"] == "data"} == {"/data", "/datalog"}
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert c["readinessProbe"]["exec"]["command"] == ["zkServer.sh", "status"]
    client = defaults.get("Service", "txlog-zookeeper")
    assert client["spec"]["ports"][0]["port"] == 2181


def test_cronjob_runs_the_exactly_once_job_on_the_schedule_against_every_partition_svc(defaults, production):
    job = defaults.get("CronJob", "txlog-windowed-counts")
    assert job["spec"]["schedule"] == "*/5 * * * *"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert "timeZone" not in job["spec"]
    c = container(job)
    assert c["image"] == "txlog-spark:0.1.0"
    assert c["command"] == ["python", "-m", "spark_jobs.windowed_counts", "--once"]
    env = {k: v["value"] for k, v in env_of(c).items()}
    assert env["TXLOG_BOOTSTRAP"] == bootstrap_for("txlog", 3, NAMESPACE, "cluster.local")
    assert (env["TXLOG_INPUT_TOPIC"], env["TXLOG_OUTPUT_TOPIC"], env["TXLOG_GROUP"], env["TXLOG_SPARK_MASTER"]) == \
        ("events", "event-counts", "windowed-counts", "local[2]")
    # Spark and the JVM write scratch files; with a read-only root they go to the emptyDir.
    assert env["HOME"].startswith("/tmp") and env["SPARK_LOCAL_DIRS"].startswith("/tmp")
    pod = pod_spec(job)
    assert pod["restartPolicy"] == "Never"
    assert next(v for v in pod["volumes"] if v["name"] == "tmp")["emptyDir"]["sizeLimit"] == "4Gi"

    job = production.get("CronJob", "txlog-windowed-counts")
    assert job["spec"]["schedule"] == "0 * * * *"
    assert job["spec"]["timeZone"] == "Europe/Paris"
    c = container(job)
    assert c["image"] == "registry.example.com/txlog-spark:1.2.3"
    env = {k: v["value"] for k, v in env_of(c).items()}
    assert env["TXLOG_BOOTSTRAP"] == bootstrap_for("txlog", 5, NAMESPACE, "corp.internal")
    assert (env["TXLOG_INPUT_TOPIC"], env["TXLOG_OUTPUT_TOPIC"], env["TXLOG_GROUP"], env["TXLOG_SPARK_MASTER"]) == \
        ("page-views", "page-view-counts", "hourly-counts", "local[4,3]")


def test_bootstrap_addresses_are_the_advertised_addresses_of_the_partition_pods(defaults):
    """What the CronJob dials must be what each partition_svc pod advertises
    (after Kubernetes fills in the pod's name and namespace)."""
    sts = defaults.get("StatefulSet", "txlog-partition-svc")
    template = env_of(container(sts))["TXLOG_ADVERTISED_ADDRESS"]["value"]
    advertised = [template.replace("$(POD_NAME)", f"txlog-partition-svc-{i}").replace("$(POD_NAMESPACE)", NAMESPACE)
                  for i in range(sts["spec"]["replicas"])]
    bootstrap = env_of(container(defaults.get("CronJob", "txlog-windowed-counts")))["TXLOG_BOOTSTRAP"]["value"]
    assert bootstrap.split(",") == advertised


def test_service_account_can_be_an_existing_one(minimal):
    assert minimal.of_kind("ServiceAccount") == []
    for doc in minimal.docs:
        if doc["kind"] in ("StatefulSet", "Deployment"):
            assert pod_spec(doc)["serviceAccountName"] == "platform-runner"
            assert pod_spec(doc)["affinity"] == MINIMAL_VALUES["affinity"]


def test_notes_tell_the_bootstrap_and_the_zookeeper(defaults, production):
    assert bootstrap_for("txlog", 3, NAMESPACE, "cluster.local") in defaults.notes
    assert "mutual TLS" in defaults.notes and "txlog-client" in defaults.notes
    assert "single node" in defaults.notes
    assert "zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181" in production.notes
    assert "http://collector.tracing:4317" in production.notes


# --- values that must be refused ------------------------------------------------------------------


@pytest.mark.parametrize("values, message", [
    ({"partitionSvc": {"replicas": "three"}}, "/partitionSvc/replicas"),
    ({"partitionSvc": {"replicas": 0}}, "/partitionSvc/replicas"),
    ({"telemetry": {"exporter": "jaeger"}}, "/telemetry/exporter"),
    ({"logLevel": "TRACE"}, "/logLevel"),
    ({"partitionSvc": {"replica": 3}}, "replica"),
    ({"zookeeper": {"enabled": False, "external": "zk-0 zk-1"}}, "/zookeeper/external"),
    ({"sparkJob": {"schedule": "every five minutes"}}, "/sparkJob/schedule"),
    ({"tls": {"clientAuth": "optional"}}, "/tls/clientAuth"),
    ({"tls": {"certManager": {"issuerRef": {"name": "ca", "kind": "Secret"}}}}, "/tls/certManager/issuerRef/kind"),
])
def test_values_schema_refuses_bad_values(values, message):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize("values, message", [
    ({"shutdownGraceSeconds": 30, "terminationGracePeriodSeconds": 30}, "must exceed shutdownGraceSeconds"),
    ({"zookeeper": {"enabled": False}}, "zookeeper.external is required"),
    ({"zookeeper": {"enabled": True, "external": "zk:2181"}}, "not both"),
    ({"tls": {"existingSecret": "corp-tls"}}, "tls.sparkJobSecret is required"),
])
def test_chart_refuses_values_that_would_render_but_not_work(values, message):
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render(values)


# --- the chart's documentation ------------------------------------------------------------------------


def _table_rows(readme: str) -> dict[str, str]:
    rows = {}
    for line in readme.splitlines():
        match = re.match(r"^\| `([A-Za-z0-9_.]+)` \| (.*?) \|", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def _leaves(values: dict, prefix: str = ""):
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, path + ".")
        yield path, value


def _as_documented(value) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return '`""`'
    if isinstance(value, list | dict):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def test_chart_readme_documents_every_value_with_its_default():
    readme = (CHART_DIR / "README.md").read_text()
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    rows = _table_rows(readme)
    leaves = dict(_leaves(values))
    # Every row names a value or a group of them; every value is a row or lies under one.
    assert set(rows) <= set(leaves), set(rows) - set(leaves)
    for path, value in leaves.items():
        if isinstance(value, dict) and value:
            continue  # documented through its own keys
        assert any(path == row or path.startswith(row + ".") for row in rows), f"{path} is not in the README table"
    for row, default in rows.items():
        value = leaves[row]
        if not isinstance(value, dict) or not value:
            assert default == _as_documented(value), row


def test_default_values_pass_the_values_schema():
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(chart.values)
        assert chart.schema["additionalProperties"] is False
        assert chart.metadata["appVersion"] == "0.1.0"


# --- TLS and network policy -------------------------------------------------------------------------


def tls_env(c: dict) -> dict[str, str]:
    return {name: e["value"] for name, e in env_of(c).items() if name.startswith("TXLOG_TLS") or name == "TXLOG_HEALTH_LISTEN"}


def test_by_default_every_service_and_the_job_use_mutual_tls_from_cert_manager_certificates(defaults):
    for kind, name in (("Deployment", "txlog-producer-id-svc"), ("StatefulSet", "txlog-coordinator-svc"),
                       ("StatefulSet", "txlog-partition-svc")):
        workload = defaults.get(kind, name)
        c = container(workload)
        assert tls_env(c) == {"TXLOG_TLS_CA": "/etc/txlog/tls/ca.crt", "TXLOG_TLS_CERT": "/etc/txlog/tls/tls.crt",
                              "TXLOG_TLS_KEY": "/etc/txlog/tls/tls.key", "TXLOG_TLS_CLIENT_AUTH": "required",
                              "TXLOG_HEALTH_LISTEN": "0.0.0.0:7900"}
        assert {"name": "tls", "mountPath": "/etc/txlog/tls", "readOnly": True} in c["volumeMounts"]
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "txlog-services-tls"
    job = defaults.get("CronJob", "txlog-windowed-counts")
    assert set(tls_env(container(job))) == {"TXLOG_TLS_CA", "TXLOG_TLS_CERT", "TXLOG_TLS_KEY"}
    assert {v["name"]: v for v in pod_spec(job)["volumes"]}["tls"]["secret"]["secretName"] == "txlog-spark-job-tls"

    services = defaults.get("Certificate", "txlog-services")["spec"]
    assert services["secretName"] == "txlog-services-tls"
    assert {"server auth", "client auth"} <= set(services["usages"])
    # the names the services advertise: the headless services' pods, and producer_id_svc's pod DNS names
    assert services["dnsNames"] == [f"*.txlog-partition-svc-headless.{NAMESPACE}.svc.cluster.local",
                                    f"*.txlog-coordinator-svc-headless.{NAMESPACE}.svc.cluster.local",
                                    f"*.{NAMESPACE}.pod.cluster.local"]
    assert services["issuerRef"] == {"name": "txlog-ca", "kind": "Issuer", "group": "cert-manager.io"}
    job_certificate = defaults.get("Certificate", "txlog-spark-job")["spec"]
    assert job_certificate["secretName"] == "txlog-spark-job-tls" and job_certificate["usages"][-1] == "client auth"
    assert defaults.get("Certificate", "txlog-ca")["spec"]["isCA"] is True
    assert defaults.get("Issuer", "txlog-ca")["spec"] == {"ca": {"secretName": "txlog-ca"}}


def test_tls_can_use_an_existing_secret_or_an_issuer_of_the_operator_or_be_off():
    existing = render({"tls": {"existingSecret": "corp-txlog-tls", "sparkJobSecret": "corp-spark-tls"},
                       "authorizer": {"servicesPrincipal": "User:corp-txlog", "sparkJobPrincipal": "User:corp-spark"}})
    assert existing.of_kind("Certificate") == [] and existing.of_kind("Issuer") == []
    volumes = {v["name"]: v for v in pod_spec(existing.get("StatefulSet", "txlog-partition-svc"))["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "corp-txlog-tls"
    job_volumes = {v["name"]: v for v in pod_spec(existing.get("CronJob", "txlog-windowed-counts"))["volumes"]}
    assert job_volumes["tls"]["secret"]["secretName"] == "corp-spark-tls"

    issuer = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    operator = render({"tls": {"certManager": {"issuerRef": issuer, "duration": "720h", "renewBefore": "240h"}}})
    assert operator.of_kind("Issuer") == []
    assert [c["spec"]["issuerRef"] for c in operator.of_kind("Certificate")] == [issuer, issuer]

    off = render(NO_TLS)
    assert off.of_kind("Certificate") == []
    for workload in (*off.of_kind("StatefulSet"), *off.of_kind("Deployment"), *off.of_kind("CronJob")):
        c = container(workload)
        assert tls_env(c) == {} and all(m["name"] != "tls" for m in c.get("volumeMounts", []))


def test_the_network_policies_let_only_the_release_and_client_pods_reach_the_services(defaults):
    policy = defaults.get("NetworkPolicy", "txlog-services")["spec"]
    selected = policy["podSelector"]["matchExpressions"]
    assert {"key": "app.kubernetes.io/component", "operator": "In",
            "values": ["producer-id-svc", "partition-svc", "coordinator-svc"]} in selected
    grpc_rule, health_rule, metrics_rule = policy["ingress"]
    assert grpc_rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "txlog", "app.kubernetes.io/instance": "txlog"}}},
        {"podSelector": {"matchLabels": {"txlog-client": "true"}}},
    ]
    assert sorted(p["port"] for p in grpc_rule["ports"]) == [7100, 7200, 7300]
    assert health_rule == {"ports": [{"port": 7900, "protocol": "TCP"}]}
    # the metrics port: any pod in any namespace by default (metrics.allowFrom)
    assert metrics_rule == {"from": [{"namespaceSelector": {}, "podSelector": {}}], "ports": [{"port": 9464, "protocol": "TCP"}]}
    zookeeper = defaults.get("NetworkPolicy", "txlog-zookeeper")["spec"]
    assert zookeeper["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "txlog", "app.kubernetes.io/instance": "txlog"}}}]}]
    # the Spark job's pods carry the release labels: the services let it in
    job_labels = defaults.get("CronJob", "txlog-windowed-counts")["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert selects(grpc_rule["from"][0]["podSelector"]["matchLabels"], job_labels)
    elsewhere = render({"networkPolicy": {"clientNamespaceSelector": {"matchLabels": {"team": "data"}}}})
    assert elsewhere.get("NetworkPolicy", "txlog-services")["spec"]["ingress"][0]["from"][1]["namespaceSelector"] == {
        "matchLabels": {"team": "data"}}


def test_the_services_authenticate_to_zookeeper_with_a_secret_made_once(defaults):
    secret = defaults.get("Secret", "txlog-zookeeper-auth")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # its identity is in every znode's ACL
    user, _, password = base64.b64decode(secret["data"]["identity"]).decode().partition(":")
    assert user == "txlog" and len(password) == 32
    for kind, name in (("Deployment", "txlog-producer-id-svc"), ("StatefulSet", "txlog-coordinator-svc"),
                       ("StatefulSet", "txlog-partition-svc")):
        workload = defaults.get(kind, name)
        c = container(workload)
        assert env_of(c)["TXLOG_ZOOKEEPER_AUTH_FILE"]["value"] == "/etc/txlog/zookeeper/identity"
        assert {"name": "zookeeper-auth", "mountPath": "/etc/txlog/zookeeper", "readOnly": True} in c["volumeMounts"]
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes["zookeeper-auth"]["secret"]["secretName"] == "txlog-zookeeper-auth"
    given = render({"zookeeper": {"auth": {"enabled": True, "existingSecret": "corp-zk-identity"}}})
    assert given.of_kind("Secret") == []
    volumes = {v["name"]: v for v in pod_spec(given.get("StatefulSet", "txlog-partition-svc"))["volumes"]}
    assert volumes["zookeeper-auth"]["secret"]["secretName"] == "corp-zk-identity"


# --- the ACL authorizer -------------------------------------------------------------------------------


def authorizer_env(c: dict) -> dict[str, str]:
    names = ("TXLOG_AUTHORIZER", "TXLOG_SUPER_USERS", "TXLOG_PRINCIPAL_MAPPING_RULES")
    return {name: e["value"] for name, e in env_of(c).items() if name in names}


SERVICE_WORKLOADS = (("Deployment", "producer-id-svc"), ("StatefulSet", "coordinator-svc"), ("StatefulSet", "partition-svc"))


def test_by_default_every_service_runs_the_acl_authorizer_with_its_own_principal_as_super_user(defaults, production):
    for rendered in (defaults, production):
        # the principal of the services' certificate (CN=<fullname>-services under the default mapping rule)
        services_principal = f"User:{defaults.get('Certificate', 'txlog-services')['spec']['commonName']}"
        assert services_principal == "User:txlog-services"
        for kind, component in SERVICE_WORKLOADS:
            assert authorizer_env(container(rendered.get(kind, f"txlog-{component}"))) == {
                "TXLOG_AUTHORIZER": "acl", "TXLOG_SUPER_USERS": services_principal,
                "TXLOG_PRINCIPAL_MAPPING_RULES": "RULE:^CN=([^,]+)$/$1/,DEFAULT"}
    # the job's principal is its certificate's
    assert defaults.get("Certificate", "txlog-spark-job")["spec"]["commonName"] == "txlog-spark-job"


def test_more_super_users_and_mapping_rules_reach_every_service():
    rendered = render({"fullnameOverride": "tx", "authorizer": {
        "superUsers": ["User:ops", "User:tx-services", "User:break glass"],
        "principalMappingRules": "RULE:^CN=([^,]+),OU=txlog$/$1/L,DEFAULT"}})
    for kind, component in SERVICE_WORKLOADS:
        env = authorizer_env(container(rendered.get(kind, f"tx-{component}")))
        # the services' own principal first, once
        assert env["TXLOG_SUPER_USERS"] == "User:tx-services;User:ops;User:break glass"
        assert env["TXLOG_PRINCIPAL_MAPPING_RULES"] == "RULE:^CN=([^,]+),OU=txlog$/$1/L,DEFAULT"
    # the values the services parse: what the authorizer is given
    from services.security import authorizer
    from txlog.net import tls

    assert authorizer.parse_super_users(env["TXLOG_SUPER_USERS"]) == {"User:tx-services", "User:ops", "User:break glass"}
    tls.parse_mapping_rules(env["TXLOG_PRINCIPAL_MAPPING_RULES"])


def test_without_the_authorizer_the_services_let_every_call_through_and_no_job_runs():
    rendered = render({"authorizer": {"enabled": False}})
    for kind, component in SERVICE_WORKLOADS:
        assert authorizer_env(container(rendered.get(kind, f"txlog-{component}"))) == {}
    assert rendered.of_kind("Job") == []
    assert "ACL authorizer" not in rendered.notes


def test_with_an_existing_secret_the_principals_are_the_ones_given():
    rendered = render({"tls": {"existingSecret": "corp-txlog-tls", "sparkJobSecret": "corp-spark-tls"},
                       "authorizer": {"servicesPrincipal": "User:corp-txlog", "sparkJobPrincipal": "User:corp-spark"}})
    env = authorizer_env(container(rendered.get("StatefulSet", "txlog-partition-svc")))
    assert env["TXLOG_SUPER_USERS"] == "User:corp-txlog"
    job = rendered.get("Job", "txlog-acls")
    assert {principal for _, principal, *_ in acl_bindings(job)} == {"User:corp-spark"}
    assert {v["name"]: v for v in pod_spec(job)["volumes"]}["tls"]["secret"]["secretName"] == "corp-txlog-tls"


def test_the_acl_hook_job_runs_after_install_and_upgrade_as_the_services(defaults, production):
    job = defaults.get("Job", "txlog-acls")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert job["spec"]["backoffLimit"] >= 10  # the services may not serve yet
    pod, c = pod_spec(job), container(job)
    assert pod["restartPolicy"] == "Never"
    assert c["image"] == "txlog:0.1.0" and c["command"][:2] == ["sh", "-c"]
    # the services' certificate: a super user's, which may add ACLs
    assert {v["name"]: v for v in pod_spec(job)["volumes"]}["tls"]["secret"]["secretName"] == "txlog-services-tls"
    assert {"name": "tls", "mountPath": "/etc/txlog/tls", "readOnly": True} in c["volumeMounts"]
    assert env_of(c)["TXLOG_BOOTSTRAP"]["value"] == bootstrap_for("txlog", 3, NAMESPACE, "cluster.local")
    for argv in acl_commands(job):
        assert argv[argv.index("--bootstrap") + 1] == "$TXLOG_BOOTSTRAP"
        assert [argv[argv.index(flag) + 1] for flag in ("--tls-ca", "--tls-cert", "--tls-key")] == [
            "/etc/txlog/tls/ca.crt", "/etc/txlog/tls/tls.crt", "/etc/txlog/tls/tls.key"]
    # the NetworkPolicy lets its pod reach the client ports: it carries the release's labels
    grpc_rule = defaults.get("NetworkPolicy", "txlog-services")["spec"]["ingress"][0]
    assert selects(grpc_rule["from"][0]["podSelector"]["matchLabels"], job["spec"]["template"]["metadata"]["labels"])
    production_job = production.get("Job", "txlog-acls")
    assert pod_spec(production_job)["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert container(production_job)["image"] == "registry.example.com/txlog:1.2.3"


def test_the_acl_hook_job_grants_the_spark_job_what_it_needs_and_nothing_else(defaults):
    job = defaults.get("Job", "txlog-acls")
    principal = "User:txlog-spark-job"
    assert sorted(acl_bindings(job)) == sorted([
        ("Allow", principal, "Read", "Topic", "LITERAL", "events", "*"),
        ("Allow", principal, "Write", "Topic", "LITERAL", "event-counts", "*"),
        ("Allow", principal, "Read", "Group", "LITERAL", "windowed-counts", "*"),
        # its transactional ids: <name>:<topic>:<partition> per task, <name>/... per run (its name is its group)
        ("Allow", principal, "Write", "TransactionalId", "PREFIXED", "windowed-counts:", "*"),
        ("Allow", principal, "Write", "TransactionalId", "PREFIXED", "windowed-counts/", "*"),
    ])
    # every transactional id the job uses lies under a granted prefix
    from spark_jobs import planning, windowed_counts
    from txlog.two_phase import task_transactional_id

    env = {k: v["value"] for k, v in env_of(container(defaults.get("CronJob", "txlog-windowed-counts"))).items()}
    settings = windowed_counts.config.load("job", windowed_counts.SETTINGS, [
        "--input-topic", env["TXLOG_INPUT_TOPIC"], "--output-topic", env["TXLOG_OUTPUT_TOPIC"], "--group", env["TXLOG_GROUP"]])
    spark_job = windowed_counts.job_from(settings)
    prefixes = [name for *_, kind, _, name, _ in acl_bindings(job) if kind == "TransactionalId"]
    used = [spark_job.transactional_id(planning.OffsetRange("events", 3, 0, 10)), spark_job.offsets_transactional_id,
            task_transactional_id(spark_job.name, "r1-abc", 0, 7)]
    for tid in used:
        assert any(tid.startswith(prefix) for prefix in prefixes), tid


def test_each_comma_separated_input_topic_gets_its_own_read_binding():
    rendered = render({"sparkJob": {"inputTopic": "page-views,clicks", "outputTopic": "counts", "group": "hourly"}})
    bindings = acl_bindings(rendered.get("Job", "txlog-acls"))
    assert [(op, name) for _, _, op, kind, _, name, _ in bindings if kind == "Topic"] == [
        ("Read", "page-views"), ("Read", "clicks"), ("Write", "counts")]
    assert [name for *_, kind, _, name, _ in bindings if kind == "TransactionalId"] == ["hourly:", "hourly/"]


def test_the_operators_acls_are_added_by_the_hook_job():
    acls = [
        {"allow": "User:reporting", "operations": ["Read", "Describe"], "topic": "event-counts"},
        {"allow": "User:reporting", "operations": ["Read"], "group": "reporting-", "prefixed": True},
        {"allow": "User:loader", "operations": ["Write"], "transactionalId": "loader", "host": "10.0.0.7"},
        {"deny": "User:*", "operations": ["Delete"], "topic": "it's-quoted"},
        {"allow": "User:ops", "operations": ["Describe", "DescribeConfigs"], "cluster": True},
    ]
    rendered = render({"authorizer": {"acls": acls}})
    bindings = acl_bindings(rendered.get("Job", "txlog-acls"))
    assert bindings[5:] == [
        ("Allow", "User:reporting", "Read", "Topic", "LITERAL", "event-counts", "*"),
        ("Allow", "User:reporting", "Describe", "Topic", "LITERAL", "event-counts", "*"),
        ("Allow", "User:reporting", "Read", "Group", "PREFIXED", "reporting-", "*"),
        ("Allow", "User:loader", "Write", "TransactionalId", "LITERAL", "loader", "10.0.0.7"),
        ("Deny", "User:*", "Delete", "Topic", "LITERAL", "it's-quoted", "*"),
        ("Allow", "User:ops", "Describe", "Cluster", "LITERAL", "txlog-cluster", "*"),
        ("Allow", "User:ops", "DescribeConfigs", "Cluster", "LITERAL", "txlog-cluster", "*"),
    ]
    # without the Spark job's grants: only the operator's
    alone = render({"authorizer": {"acls": acls[:1], "grantSparkJob": False}})
    assert [b[1] for b in acl_bindings(alone.get("Job", "txlog-acls"))] == ["User:reporting", "User:reporting"]
    assert len(acl_bindings(render({"sparkJob": {"enabled": False}, "authorizer": {"acls": acls[:1]}}).get(
        "Job", "txlog-acls"))) == 2
    # nothing to add: no Job
    assert render({"authorizer": {"grantSparkJob": False}}).of_kind("Job") == []


def test_the_values_schema_knows_every_acl_operation():
    from txlog.protocol import acls

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    item = schema["properties"]["authorizer"]["properties"]["acls"]["items"]
    assert set(item["properties"]["operations"]["items"]["enum"]) == set(acls.OPERATIONS)


@pytest.mark.parametrize("values, message", [
    ({"authorizer": {"enable": True}}, "additional properties 'enable' not allowed"),
    ({"authorizer": {"job": {"backoff": 3}}}, "additional properties 'backoff' not allowed"),
    ({"authorizer": {"superUsers": ["admin"]}}, "/authorizer/superUsers/0"),
    ({"authorizer": {"servicesPrincipal": "txlog-services"}}, "/authorizer/servicesPrincipal"),
    ({"authorizer": {"acls": [{"allow": "User:a", "operations": ["Read"], "topic": "t", "pattern": "x"}]}},
     "additional properties 'pattern' not allowed"),
    ({"authorizer": {"acls": [{"allow": "User:a", "operations": ["Reed"], "topic": "t"}]}}, "/authorizer/acls/0/operations/0"),
    ({"authorizer": {"acls": [{"allow": "User:a", "deny": "User:b", "operations": ["Read"], "topic": "t"}]}},
     "/authorizer/acls/0"),
    ({"authorizer": {"acls": [{"allow": "User:a", "operations": ["Read"], "topic": "t", "group": "g"}]}},
     "/authorizer/acls/0"),
    ({"authorizer": {"acls": [{"allow": "User:a", "operations": ["Read"]}]}}, "/authorizer/acls/0"),
    ({"authorizer": {"acls": [{"allow": "User:a", "operations": [], "topic": "t"}]}}, "/authorizer/acls/0/operations"),
])
def test_values_schema_refuses_bad_authorizer_values(values, message):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize("values, message", [
    ({"tls": {"enabled": False}}, "authorizer.enabled needs tls.enabled"),
    ({"tls": {"existingSecret": "corp-tls", "sparkJobSecret": "corp-spark"}}, "authorizer.servicesPrincipal is required"),
    ({"tls": {"existingSecret": "corp-tls", "sparkJobSecret": "corp-spark"},
      "authorizer": {"servicesPrincipal": "User:corp"}}, "authorizer.sparkJobPrincipal is required"),
    ({"authorizer": {"acls": [{"allow": "User:a", "operations": ["Alter"], "cluster": True, "prefixed": True}]}},
     "authorizer.acls[0]: the Cluster resource cannot be prefixed"),
])
def test_chart_refuses_authorizer_values_that_would_render_but_not_work(values, message):
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render(values)


# --- metrics: the port, the Prometheus Operator's objects, the alerts and the dashboard ------------------

SERVICE_KINDS = {"producer-id-svc": "Deployment", "partition-svc": "StatefulSet", "coordinator-svc": "StatefulSet"}
SERIES = f'namespace="{NAMESPACE}",job="txlog"'  # what the chart's monitors give the series: the rules' selector
ALERTS = {"TxlogStuckLSO", "TxlogHangingTransaction", "TxlogOfflinePartitions", "TxlogUnderReplicatedPartitions",
          "TxlogZooKeeperSessionLost", "TxlogServerErrors", "TxlogRocksDBWritesStopped"}


def pod_templates(rendered: Rendered) -> dict[str, dict]:
    """{workload name: its pods' labels}, of every workload (CronJob and hook Job included)."""
    templates = {}
    for doc in rendered.docs:
        if doc["kind"] in ("StatefulSet", "Deployment", "Job"):
            templates[doc["metadata"]["name"]] = doc["spec"]["template"]["metadata"]["labels"]
        elif doc["kind"] == "CronJob":
            templates[doc["metadata"]["name"]] = doc["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return templates


def alert_rules(rendered: Rendered) -> dict[str, dict]:
    [rule_object] = rendered.of_kind("PrometheusRule")
    return {rule["alert"]: rule for group in rule_object["spec"]["groups"] for rule in group["rules"]}


def dashboard_of(rendered: Rendered) -> dict:
    return json.loads(rendered.get("ConfigMap", "txlog-dashboard")["data"]["txlog.json"])


def dashboard_queries(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def assert_uses_only_exposed_names(expr: str) -> set[str]:
    """Every metric the expression names is one the services expose, and every
    label it matches or groups by is one of those metrics' or a target label."""
    metrics, labels = metrics_contract.promql_names(expr)
    assert metrics, expr
    assert metrics <= set(metrics_contract.METRICS), (sorted(metrics - set(metrics_contract.METRICS)), expr)
    known = set().union(*(metrics_contract.METRICS[m] for m in metrics)) | metrics_contract.TARGET_LABELS
    assert labels <= known, (sorted(labels - known), expr)
    return metrics


def test_the_metrics_names_the_chart_uses_are_what_the_services_export():
    """The list the dashboard and the alerts are checked against is what each
    service's own instruments export: a renamed metric or label fails here."""
    assert metrics_contract.exported_by_the_services() == metrics_contract.EXPOSED


def test_every_service_serves_metrics_on_a_named_port(defaults, production, minimal):
    for rendered, prefix, port in ((defaults, "txlog", 9464), (production, "txlog", 9500), (minimal, "tx", None)):
        for component, kind in SERVICE_KINDS.items():
            workload = rendered.get(kind, f"{prefix}-{component}")
            c = container(workload)
            ports = {p["name"]: p for p in c["ports"]}
            labels = workload["spec"]["template"]["metadata"]["labels"]
            if port is None:  # metrics.enabled=false
                assert "TXLOG_METRICS_LISTEN" not in env_of(c) and "metrics" not in ports
                assert "txlog-metrics" not in labels
                continue
            assert env_of(c)["TXLOG_METRICS_LISTEN"]["value"] == f"0.0.0.0:{port}"
            assert ports["metrics"] == {"name": "metrics", "containerPort": port, "protocol": "TCP"}
            assert labels["txlog-metrics"] == "true"
    assert "9464/metrics" in defaults.notes and "ServiceMonitor txlog" in production.notes


def test_monitors_rules_and_dashboard_are_absent_by_default(defaults):
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"):
        assert defaults.of_kind(kind) == [], kind
    assert "txlog-metrics" not in [s["metadata"]["name"] for s in defaults.of_kind("Service")]
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["metrics"]
    assert values["enabled"] is True  # the endpoint itself is on
    assert [values[k]["enabled"] for k in ("serviceMonitor", "podMonitor", "prometheusRule", "grafanaDashboard")] == [False] * 4


def test_the_service_monitor_scrapes_exactly_the_service_pods_through_a_headless_metrics_service(production):
    rendered = render({"metrics": {"serviceMonitor": {"enabled": True}}})  # the built-in ZooKeeper too
    for r, port in ((rendered, 9464), (production, 9500)):
        service = r.get("Service", "txlog-metrics")
        spec = service["spec"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True  # unready pods are scraped
        assert spec["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP",
                                  "appProtocol": "http"}]
        selected = sorted(name for name, labels in pod_templates(r).items() if selects(spec["selector"], labels))
        assert selected == sorted(f"txlog-{component}" for component in SERVICE_KINDS)
        for name in selected:  # each has the port the Service targets
            kind = next(k for c, k in SERVICE_KINDS.items() if name.endswith(c))
            assert "metrics" in [p["name"] for p in container(r.get(kind, name))["ports"]]
        monitor = r.get("ServiceMonitor", "txlog")
        matched = [s["metadata"]["name"] for s in r.of_kind("Service")
                   if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert matched == ["txlog-metrics"]
        [endpoint] = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
        assert endpoint["relabelings"] == [{"action": "replace", "targetLabel": "job", "replacement": "txlog"}]
    assert pod_templates(rendered).keys() >= {"txlog-zookeeper", "txlog-windowed-counts", "txlog-acls"}
    monitor = production.get("ServiceMonitor", "txlog")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (monitor["spec"]["endpoints"][0]["interval"], monitor["spec"]["endpoints"][0]["scrapeTimeout"]) == ("15s", "10s")


def test_the_pod_monitor_scrapes_exactly_the_service_pods(pod_monitor):
    monitor = pod_monitor.get("PodMonitor", "txlog")
    assert monitor["metadata"]["labels"]["team"] == "streaming"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "txlog"
    selected = sorted(name for name, labels in pod_templates(pod_monitor).items()
                      if selects(monitor["spec"]["selector"]["matchLabels"], labels))
    assert selected == sorted(f"txlog-{component}" for component in SERVICE_KINDS)
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("metrics", "/metrics", "1m", "30s")
    assert endpoint["relabelings"] == [{"action": "replace", "targetLabel": "job", "replacement": "txlog"}]
    assert "txlog-metrics" not in [s["metadata"]["name"] for s in pod_monitor.of_kind("Service")]


def test_the_network_policy_admits_the_metrics_port_from_the_selected_scrapers(production):
    [*_, metrics_rule] = production.get("NetworkPolicy", "txlog-services")["spec"]["ingress"]
    assert metrics_rule == {"from": [PRODUCTION_VALUES["metrics"]["allowFrom"]], "ports": [{"port": 9500, "protocol": "TCP"}]}
    off = render({"metrics": {"enabled": False}})
    ports = [p["port"] for rule in off.get("NetworkPolicy", "txlog-services")["spec"]["ingress"] for p in rule["ports"]]
    assert 9464 not in ports


def test_the_prometheus_operator_schemas_catch_a_misplaced_field(production):
    checks = []
    monitor = copy.deepcopy(production.get("ServiceMonitor", "txlog"))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    checks.append(monitor)
    monitor = copy.deepcopy(production.get("ServiceMonitor", "txlog"))
    monitor["spec"]["endpoints"][0]["interval"] = "30 s"
    checks.append(monitor)
    rules = copy.deepcopy(production.get("PrometheusRule", "txlog"))
    rules["spec"]["groups"][0]["rules"][0]["for_"] = "1m"
    checks.append(rules)
    rules = copy.deepcopy(production.get("PrometheusRule", "txlog"))
    rules["spec"]["groups"].append(copy.deepcopy(rules["spec"]["groups"][0]))
    checks.append(rules)
    monitor = copy.deepcopy(render(POD_MONITOR_VALUES).get("PodMonitor", "txlog"))
    monitor["spec"]["endpoints"] = monitor["spec"].pop("podMetricsEndpoints")  # a ServiceMonitor's field
    checks.append(monitor)
    for doc in checks:
        with pytest.raises(jsonschema.ValidationError):
            prometheus_operator_schema.validate(doc)


def test_every_alert_names_only_exposed_metrics_of_the_releases_series(production, pod_monitor):
    for rendered in (production, pod_monitor):
        rules = alert_rules(rendered)
        assert set(rules) == ALERTS
        for name, rule in rules.items():
            for metric in assert_uses_only_exposed_names(rule["expr"]):
                # every selector of it is scoped to the release's series
                assert len(re.findall(rf"\b{metric}\b", rule["expr"])) == \
                    len(re.findall(rf"\b{metric}\{{{re.escape(SERIES)}[,}}]", rule["expr"])), (name, metric)
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert {"summary", "description"} <= set(rule["annotations"])
    # the thresholds follow the values
    rules, defaults = alert_rules(production), alert_rules(pod_monitor)
    assert "[10m]" in rules["TxlogStuckLSO"]["expr"] and "offset 10m" in rules["TxlogStuckLSO"]["expr"]
    assert "[20m]" in defaults["TxlogStuckLSO"]["expr"] and "offset 20m" in defaults["TxlogStuckLSO"]["expr"]
    assert rules["TxlogHangingTransaction"]["expr"].endswith("> 600")
    assert defaults["TxlogHangingTransaction"]["expr"].endswith("> 1200")
    assert (rules["TxlogUnderReplicatedPartitions"]["for"], defaults["TxlogUnderReplicatedPartitions"]["for"]) == ("15m", "5m")
    assert rules["TxlogServerErrors"]["expr"].endswith("> 0.05") and defaults["TxlogServerErrors"]["expr"].endswith("> 0.01")
    assert production.get("PrometheusRule", "txlog")["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_dashboard_configmap_carries_the_charts_dashboard_using_only_exposed_metrics(production):
    configmap = production.get("ConfigMap", "txlog-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Streaming"}
    assert configmap["data"]["txlog.json"] == (CHART_DIR / "dashboards" / "txlog.json").read_text().rstrip("\n")
    dashboard = dashboard_of(production)
    assert dashboard["uid"] == "txlog" and dashboard["title"] == "txlog"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job"):
        metric = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?, (\w+)\)", variables[name]["definition"])
        assert metric and metric.group(1) in metrics_contract.METRICS and metric.group(3) == name
    used = set()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert 'namespace="$namespace",job="$job"' in target["expr"], target["expr"]
            used |= assert_uses_only_exposed_names(target["expr"])
    # every metric the services expose is on it (a histogram's sum aside: the latency panel reads the buckets)
    assert used == set(metrics_contract.METRICS) - {"rpc_server_duration_milliseconds_sum"}
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Calls by method", "Latency p99 by method", "Errors by code", "Bytes produced per topic",
            "Bytes fetched per topic", "Transactions", "Open transactions by state", "Oldest open transaction age",
            "LSO lag (top 10 partitions)", "Under-replicated and offline partitions", "ZooKeeper session",
            "RocksDB pending compaction"} <= titles


def test_the_dashboard_file_is_packaged_with_the_chart(tmp_path):
    with helm_python.Chart.load(CHART_DIR) as chart:
        assert "dashboards/txlog.json" in [f["name"] for f in chart.files]
    archive = helm_python.package(CHART_DIR, destination=tmp_path)
    with helm_python.Chart.load(archive) as packaged:
        assert "dashboards/txlog.json" in [f["name"] for f in packaged.files]
        assert "txlog-dashboard" in "".join(packaged.render(
            {"metrics": {"grafanaDashboard": {"enabled": True}}}, name="txlog", namespace=NAMESPACE).values())


def promtool(*args: str, cwd) -> None:
    """promtool, from Debian's prometheus package (scripts/setup.sh installs it)."""
    found = shutil.which("promtool")
    assert found is not None, "promtool is missing: scripts/setup.sh installs Debian's prometheus package"
    done = subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("value_set", ["production", "pod-monitor"])
def test_promtool_accepts_the_alert_rules(value_set, tmp_path):
    spec = render(VALUE_SETS[value_set]).get("PrometheusRule", "txlog")["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    promtool("check", "rules", "rules.yaml", cwd=tmp_path)


def test_promtool_accepts_every_dashboard_query(production, tmp_path):
    substitutions = {"$__rate_interval": "2m", "$namespace": NAMESPACE, "$job": "txlog"}
    rules = []
    for i, expr in enumerate(dashboard_queries(dashboard_of(production))):
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool("check", "rules", "queries.yaml", cwd=tmp_path)


def _series(metric: str, values: str, **labels: str) -> dict:
    labels = {"namespace": NAMESPACE, "job": "txlog", "otel_scope_name": "txlog", **labels}
    return {"series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def _fired(alert: str, at: str, *expected: dict) -> dict:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": {"namespace": NAMESPACE, "job": "txlog", **labels}} for labels in expected]}


def test_the_alerts_fire_when_they_should_and_only_then(pod_monitor, tmp_path):
    """promtool's rule unit tests on made-up series (one sample a minute) with the default thresholds."""
    spec = copy.deepcopy(pod_monitor.get("PrometheusRule", "txlog")["spec"])
    for group in spec["groups"]:
        for rule in group["rules"]:
            del rule["annotations"]  # promtool would compare them too; `check rules` reads them above
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    lso, hw = "txlog_partition_lso_lag", "txlog_partition_high_watermark"
    series = [
        # 0: stuck for the whole run; 1: lagging but its LSO moves; 2: idle until a transaction began at 25m;
        # 3: stuck, its leader moving from p0 to p1 at 16m
        _series(lso, "5x40", pod="p0", topic="t", partition="0"), _series(hw, "100x40", pod="p0", topic="t", partition="0"),
        _series(lso, "5x40", pod="p0", topic="t", partition="1"), _series(hw, "100+10x40", pod="p0", topic="t", partition="1"),
        _series(lso, "0x24 3x15", pod="p0", topic="t", partition="2"),
        _series(hw, "100x24 103x15", pod="p0", topic="t", partition="2"),
        _series(lso, "5x15 stale", pod="p0", topic="t", partition="3"), _series(hw, "100x15 stale", pod="p0", topic="t", partition="3"),
        _series(lso, "_x16 5x24", pod="p1", topic="t", partition="3"), _series(hw, "_x16 100x24", pod="p1", topic="t", partition="3"),
        # another release's stuck partition is not this one's alert
        _series(lso, "5x40", job="other", pod="p0", topic="t", partition="0"),
        _series(hw, "100x40", job="other", pod="p0", topic="t", partition="0"),
        # the oldest open transaction of c0 ages, c1's does not
        _series("txlog_transactions_oldest_open_age_seconds", "0+60x40", pod="c0"),
        _series("txlog_transactions_oldest_open_age_seconds", "0x40", pod="c1"),
        _series("txlog_partitions_offline", "0x5 2x35", pod="p0"),
        _series("txlog_partitions_under_replicated", "1x40", pod="p0"),
        _series("txlog_partitions_under_replicated", "0x40", pod="p1"),
        _series("txlog_zookeeper_connected", "1 1 0x38", pod="p0"),
        _series("txlog_zookeeper_connected", "1x40", pod="p1"),
        _series("txlog_zookeeper_connected", "0x40", job="other", pod="p0"),
        # Produce: 5 of 105 calls a minute INTERNAL; Metadata: half UNAVAILABLE (the caller's to retry), no alert
        *[_series("rpc_server_duration_milliseconds_count", values, pod="p0", rpc_system="grpc",
                  rpc_service="txlog.v1.PartitionService", rpc_method=method, rpc_grpc_status_code=status)
          for method, status, values in (("Produce", "0", "0+100x40"), ("Produce", "13", "0+5x40"),
                                         ("Metadata", "0", "0+50x40"), ("Metadata", "14", "0+50x40"),
                                         ("Fetch", "0", "0+100x40"))],
        _series("txlog_rocksdb", "0 0 1x38", pod="p0", property="write_stopped"),
        _series("txlog_rocksdb", "1e9x40", pod="p1", property="pending_compaction_bytes"),
        _series("txlog_rocksdb", "0x40", pod="p1", property="write_stopped"),
    ]
    warning, critical = {"severity": "warning"}, {"severity": "critical"}
    checks = [
        _fired("TxlogStuckLSO", "15m"),
        _fired("TxlogStuckLSO", "30m", {**warning, "topic": "t", "partition": "0"}, {**warning, "topic": "t", "partition": "3"}),
        _fired("TxlogHangingTransaction", "20m"),
        _fired("TxlogHangingTransaction", "25m", {**warning, "pod": "c0"}),
        _fired("TxlogOfflinePartitions", "6m"),
        _fired("TxlogOfflinePartitions", "10m", critical),
        _fired("TxlogUnderReplicatedPartitions", "3m"),
        _fired("TxlogUnderReplicatedPartitions", "10m", warning),
        _fired("TxlogZooKeeperSessionLost", "2m"),
        _fired("TxlogZooKeeperSessionLost", "5m", {**critical, "pod": "p0"}),
        _fired("TxlogServerErrors", "5m"),
        _fired("TxlogServerErrors", "20m", {**warning, "rpc_service": "txlog.v1.PartitionService", "rpc_method": "Produce"}),
        _fired("TxlogRocksDBWritesStopped", "5m"),
        _fired("TxlogRocksDBWritesStopped", "10m", {**critical, "pod": "p0"}),
    ]
    assert {check["alertname"] for check in checks} == ALERTS
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}]}))
    promtool("test", "rules", "tests.yaml", cwd=tmp_path)


@pytest.mark.parametrize("values, message", [
    ({"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}, "not both"),
    ({"metrics": {"enabled": False, "podMonitor": {"enabled": True}}}, "need metrics.enabled"),
    ({"metrics": {"port": 7300}}, "metrics.port (7300) is also partitionSvc.port"),
    ({"metrics": {"port": 7900}}, "metrics.port (7900) is also tls.healthPort"),
])
def test_chart_refuses_metrics_values_that_would_render_but_not_work(values, message):
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize("values, message", [
    ({"metrics": {"serviceMonitor": {"interval": "30 seconds"}}}, "/metrics/serviceMonitor/interval"),
    ({"metrics": {"podMonitor": {"scrapeTimeout": ""}}}, "/metrics/podMonitor/scrapeTimeout"),
    ({"metrics": {"prometheusRule": {"serverErrorRatio": 0}}}, "/metrics/prometheusRule/serverErrorRatio"),
    ({"metrics": {"prometheusRule": {"stuckLsoMinutes": 0}}}, "/metrics/prometheusRule/stuckLsoMinutes"),
    ({"metrics": {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}}, "/metrics/grafanaDashboard/labels/grafana_dashboard"),
    ({"metrics": {"allowFrom": {"podSelector": {"matchLabel": {"app": "prometheus"}}}}}, "matchLabel"),
    ({"metrics": {"serviceMonitor": {"enable": True}}}, "additional properties 'enable' not allowed"),
])
def test_values_schema_refuses_bad_metrics_values(values, message):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(message)):
        render(values)


# --- the web console ------------------------------------------------------------------------------------

CONSOLE = {"console": {"enabled": True}}
CONSOLE_ALLOW_FROM = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}},
                       "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ingress-nginx"}}}]
# Writable, on another port, let in from an ingress controller, with the production values (the operator's
# issuer, pull secrets, node selector and tolerations, narrowed metrics scrapers).
CONSOLE_PRODUCTION = {**PRODUCTION_VALUES, "console": {
    "enabled": True, "readOnly": False, "port": 9090, "hangingAfterMs": 600000, "allowFrom": CONSOLE_ALLOW_FROM,
    "extraArgs": ["--timeout-s", "10"], "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}}}
CONSOLE_NO_TLS = {**NO_TLS, **CONSOLE, "networkPolicy": {"enabled": False}, "metrics": {"enabled": False}}
CONSOLE_VALUE_SETS = {"console": CONSOLE, "console-production": CONSOLE_PRODUCTION, "console-no-tls": CONSOLE_NO_TLS}
CONSOLE_STATIC = REPO / "txlog" / "console" / "static"


@pytest.fixture(scope="module")
def console() -> Rendered:
    return render(CONSOLE)


@pytest.fixture(scope="module")
def console_production() -> Rendered:
    return render(CONSOLE_PRODUCTION)


def console_argv(rendered: Rendered, prefix: str = "txlog") -> list[str]:
    c = container(rendered.get("Deployment", f"{prefix}-console"))
    return [*c["command"], *c.get("args", [])]


def console_args(rendered: Rendered, prefix: str = "txlog"):
    """The rendered command line as the `txlog` command parses it."""
    from txlog.cli import program as cli

    argv = console_argv(rendered, prefix)
    assert argv[:2] == ["txlog", "console"], argv  # the image's `txlog` entry point
    return cli.parse(argv[1:])


def console_bindings(rendered: Rendered) -> list[tuple[str, ...]]:
    return [b for b in acl_bindings(rendered.get("Job", "txlog-acls")) if b[1] == "User:txlog-console"]


def test_nothing_of_the_console_is_rendered_by_default(defaults, production, minimal):
    for rendered in (defaults, production, minimal):
        assert not [d["metadata"]["name"] for d in rendered.docs if "console" in d["metadata"]["name"]]
        assert "port-forward" not in rendered.notes
    assert [b for b in acl_bindings(defaults.get("Job", "txlog-acls")) if "console" in b[1]] == []
    assert yaml.safe_load((CHART_DIR / "values.yaml").read_text())["console"]["enabled"] is False


@pytest.mark.parametrize("value_set", CONSOLE_VALUE_SETS)
def test_helm_lint_and_the_kubernetes_schemas_accept_the_console(value_set):
    values = CONSOLE_VALUE_SETS[value_set]
    report = helm_python.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    rendered = render(values)
    assert rendered.get("Deployment", "txlog-console")
    for doc in rendered.docs:
        if doc["apiVersion"].startswith("cert-manager.io/"):
            cert_manager_schema.validate(doc)
        elif doc["apiVersion"].startswith("monitoring.coreos.com/"):
            prometheus_operator_schema.validate(doc)
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_the_console_runs_txlog_console_on_the_charts_bootstrap_read_only(console, console_production):
    from txlog.cli import program as cli
    from txlog.console.app import WILDCARD_HOSTS

    deployment = console.get("Deployment", "txlog-console")
    assert deployment["spec"]["replicas"] == 1
    args = console_args(console)
    assert args.run is cli._console
    assert args.bootstrap == bootstrap_for("txlog", 3, NAMESPACE, "cluster.local")
    # the same list the Spark job starts from
    assert args.bootstrap == env_of(container(console.get("CronJob", "txlog-windowed-counts")))["TXLOG_BOOTSTRAP"]["value"]
    assert args.listen == "0.0.0.0:8080"
    # every Host header is accepted on a wildcard address: the probes' (the pod IP) and a port-forward's (localhost)
    assert args.listen.rpartition(":")[0] in WILDCARD_HOSTS
    assert args.read_only is True and "--read-only" in console_argv(console)
    assert args.hanging_after_ms == 900000
    assert container(deployment)["image"] == "txlog:0.1.0"  # the service image: it has the console extra

    args = console_args(console_production)
    assert args.bootstrap == bootstrap_for("txlog", 5, NAMESPACE, "corp.internal")
    assert args.listen == "0.0.0.0:9090"
    assert args.read_only is False and "--read-only" not in console_argv(console_production)
    assert args.hanging_after_ms == 600000
    assert args.timeout_s == 10  # console.extraArgs
    c = container(console_production.get("Deployment", "txlog-console"))
    assert c["image"] == "registry.example.com/txlog:1.2.3" and c["imagePullPolicy"] == "Always"
    assert env_of(c)["TZ"]["value"] == "UTC"
    assert c["resources"] == CONSOLE_PRODUCTION["console"]["resources"]


def test_the_console_reads_the_rates_from_the_statefulset_pods_metrics_ports(console, console_production):
    from txlog.cli import program as cli

    for rendered, port in ((console, 9464), (console_production, 9500)):
        expected = []
        for component in ("partition-svc", "coordinator-svc"):
            sts = rendered.get("StatefulSet", f"txlog-{component}")
            assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container(sts)["ports"]
            domain = "corp.internal" if rendered is console_production else "cluster.local"
            expected += [f"http://txlog-{component}-{i}.{sts['spec']['serviceName']}.{NAMESPACE}.svc.{domain}:{port}/metrics"
                         for i in range(sts["spec"]["replicas"])]
        assert cli._metrics_urls(console_args(rendered), admin=None) == expected
    assert "--metrics" not in console_argv(render(CONSOLE_NO_TLS))  # no metrics endpoints to read


def test_the_console_pod_follows_the_charts_pod_conventions(console, console_production):
    deployment = console.get("Deployment", "txlog-console")
    pod, c = pod_spec(deployment), container(deployment)
    assert deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "console"
    assert "txlog-metrics" not in deployment["spec"]["template"]["metadata"]["labels"]  # it serves no /metrics
    assert pod["serviceAccountName"] == "txlog" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    [tmp] = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert env_of(c)["HOME"]["value"] == "/tmp"
    assert set(c["resources"]["requests"]) >= {"cpu", "memory"} and set(c["resources"]["limits"]) >= {"cpu", "memory"}
    pod = pod_spec(console_production.get("Deployment", "txlog-console"))
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["nodeSelector"] == {"pool": "streaming"}
    assert pod["tolerations"] == PRODUCTION_VALUES["tolerations"]


def test_the_console_service_selects_the_console_pods_and_exposes_its_port(console, console_production):
    for rendered, port in ((console, 8080), (console_production, 9090)):
        service = rendered.get("Service", "txlog-console")
        assert service["spec"]["type"] == "ClusterIP"
        workloads = [d for d in rendered.docs if d["kind"] in ("StatefulSet", "Deployment")]
        selected = [w["metadata"]["name"] for w in workloads
                    if selects(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        assert selected == ["txlog-console"]
        [service_port] = service["spec"]["ports"]
        assert service_port["port"] == port
        [container_port] = container(rendered.get("Deployment", "txlog-console"))["ports"]
        assert container_port == {"name": service_port["targetPort"], "containerPort": port, "protocol": "TCP"}
        assert console_args(rendered).listen == f"0.0.0.0:{port}"
    assert "port-forward svc/txlog-console 8080" in console.notes and "read-only" in console.notes
    assert "NOT read-only" in console_production.notes and "User:txlog-console" in console_production.notes


def _asgi_get(app, path: str, host: str) -> int:
    """One GET through the ASGI app, as uvicorn would pass it: the status answered."""
    import asyncio

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", host.encode()), (b"user-agent", b"kube-probe/1.33")],
             "client": ("10.0.0.1", 40000), "server": ("10.1.2.3", 8080)}
    asyncio.run(app(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def test_the_console_probes_fetch_a_static_file_that_asks_nothing_of_the_cluster(console):
    from txlog.console.app import create_app

    class NoCluster:
        def __getattr__(self, name):
            raise AssertionError(f"a probe asked the cluster ({name})")

    c = container(console.get("Deployment", "txlog-console"))
    host = console_args(console).listen.rpartition(":")[0]
    app = create_app(NoCluster(), read_only=True, listen_host=host)
    for probe in PROBES:
        get = c[probe]["httpGet"]
        assert get["port"] == "http" and [p["name"] for p in c["ports"]] == ["http"]
        assert get["path"].startswith("/static/") and (CONSOLE_STATIC / get["path"].removeprefix("/static/")).is_file()
        # the kubelet's Host header is the pod's IP: answered on the wildcard address
        assert _asgi_get(app, get["path"], "10.1.2.3:8080") == 200, probe
        assert c[probe]["failureThreshold"] >= 1
    # on a loopback address the same probe would be refused (the console's DNS-rebinding guard)
    assert _asgi_get(create_app(NoCluster(), listen_host="127.0.0.1"), c["readinessProbe"]["httpGet"]["path"],
                     "10.1.2.3:8080") == 400


def test_with_tls_the_console_has_its_own_client_certificate_and_passes_it_as_flags(console, console_production):
    """The CLI reads no TLS setting from the environment: the mounted files must be its flags."""
    from txlog.cli import program as cli

    for rendered in (console, console_production):
        deployment = rendered.get("Deployment", "txlog-console")
        c = container(deployment)
        assert {"name": "tls", "mountPath": "/etc/txlog/tls", "readOnly": True} in c["volumeMounts"]
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "txlog-console-tls"
        target = cli._bootstrap(console_args(rendered))
        assert (target.tls_ca, target.tls_cert, target.tls_key) == (
            "/etc/txlog/tls/ca.crt", "/etc/txlog/tls/tls.crt", "/etc/txlog/tls/tls.key")
        certificate = rendered.get("Certificate", "txlog-console")["spec"]
        assert certificate["secretName"] == "txlog-console-tls" and certificate["commonName"] == "txlog-console"
        assert certificate["usages"] == ["digital signature", "key encipherment", "client auth"]
        # signed by the issuer that signs the services' certificate, so they accept it
        assert certificate["issuerRef"] == rendered.get("Certificate", "txlog-services")["spec"]["issuerRef"]
    assert "TXLOG_TLS_CA" not in env_of(container(console.get("Deployment", "txlog-console")))

    off = render(CONSOLE_NO_TLS)
    c = container(off.get("Deployment", "txlog-console"))
    target = cli._bootstrap(console_args(off))
    assert (target.tls_ca, target.tls_cert, target.tls_key) == (None, None, None)
    assert all(m["name"] != "tls" for m in c["volumeMounts"]) and off.of_kind("Certificate") == []

    existing = render({**CONSOLE, "tls": {"existingSecret": "corp-txlog-tls", "sparkJobSecret": "corp-spark-tls",
                                          "consoleSecret": "corp-console-tls"},
                       "authorizer": {"servicesPrincipal": "User:corp-txlog", "sparkJobPrincipal": "User:corp-spark",
                                      "consolePrincipal": "User:corp-console"}})
    volumes = {v["name"]: v for v in pod_spec(existing.get("Deployment", "txlog-console"))["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "corp-console-tls"
    assert existing.of_kind("Certificate") == []
    assert {b[1] for b in acl_bindings(existing.get("Job", "txlog-acls"))} == {"User:corp-spark", "User:corp-console"}


class _Caller:
    """A principal's permissions under some bindings, as services/security/authorizer.py answers them."""

    def __init__(self, bindings: list[tuple[str, ...]], principal: str):
        from txlog.protocol import acls

        self.principal = principal
        self.bindings = [acls.AclBinding(kind, pattern, name, who, host, operation, permission).check()
                         for permission, who, operation, kind, pattern, name, host in bindings]

    def may(self, resource_type: str, name: str, operation: str) -> bool:
        from txlog.protocol import acls

        return acls.authorized(self.bindings, self.principal, "10.0.0.1", resource_type, name, operation)

    def may_on_any(self, resource_type: str, operation: str) -> bool:
        from txlog.protocol import acls

        return acls.allowed_on_any(self.bindings, self.principal, "10.0.0.1", resource_type, operation)


def _console_calls() -> dict[str, object]:
    """The RPCs the console's pages make (views.py through txlog.Admin), with requests naming a topic, group and
    transactional id of the workload's: what each needs is services/security/access.py's table."""
    from types import SimpleNamespace as Request

    from txlog.v1 import coordinator_pb2

    partitions = [Request(topic="events")]
    return {
        "Metadata": Request(transactional_ids=["orders-1"], group_ids=["billing"], describe_cluster=True),
        "DescribeAcls": Request(),
        "ListOffsets": Request(partitions=partitions),
        "DescribeProducers": Request(partitions=partitions),  # find_hanging
        "OffsetFetch": Request(group_id="billing", partitions=partitions),
        "DescribeGroups": Request(group_ids=["billing"]),
        "FindCoordinator": Request(key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION, key="orders-1"),
        "DescribeTransactions": Request(transactional_ids=["orders-1"]),
    }


def _action_calls() -> dict[str, object]:
    """The RPCs of the console's actions (actions.py): reset offsets, complete a prepared transaction."""
    from types import SimpleNamespace as Request

    return {"OffsetCommit": Request(group_id="billing", offsets=[Request(topic="events")]),
            "CompleteTransaction": Request(handle=Request(transactional_id="orders-1"))}


def test_the_acl_hook_job_grants_the_console_what_its_pages_read_and_no_more_when_read_only(console):
    from services.security import access

    principal = "User:txlog-console"
    every = "*"
    assert sorted(console_bindings(console)) == sorted([
        ("Allow", principal, "Describe", "Cluster", "LITERAL", "txlog-cluster", "*"),
        ("Allow", principal, "Describe", "Topic", "LITERAL", every, "*"),
        ("Allow", principal, "Read", "Topic", "LITERAL", every, "*"),  # DescribeProducers needs Read
        ("Allow", principal, "Describe", "Group", "LITERAL", every, "*"),
        ("Allow", principal, "Describe", "TransactionalId", "LITERAL", every, "*"),
    ])
    caller = _Caller(console_bindings(console), principal)
    for rpc, request in _console_calls().items():
        assert access.first_refused(caller, access.CHECKS[rpc](request, caller)) is None, rpc
    for rpc, request in _action_calls().items():
        assert access.first_refused(caller, access.CHECKS[rpc](request, caller)) is not None, rpc
    assert not caller.may("Cluster", "txlog-cluster", "Alter") and not caller.may("Topic", "events", "Write")
    # the certificate's subject maps to the principal granted
    assert f"User:{console.get('Certificate', 'txlog-console')['spec']['commonName']}" == principal


def test_a_writable_console_is_granted_its_actions_but_not_cluster_action(console_production):
    from services.security import access

    principal = "User:txlog-console"
    caller = _Caller(console_bindings(console_production), principal)
    for rpc, request in {**_console_calls(), **_action_calls()}.items():
        assert access.first_refused(caller, access.CHECKS[rpc](request, caller)) is None, rpc
    # aborting a hanging transaction is ClusterAction (the services' own right): left to authorizer.acls
    assert access.first_refused(caller, access.CHECKS["AbortTransaction"](None, caller)) == ("Cluster", "txlog-cluster", "ClusterAction")
    assert not caller.may("Topic", "events", "Write")
    # grantConsole=false: the operator grants it
    assert console_bindings(render({**CONSOLE, "authorizer": {"grantConsole": False}})) == []


def test_the_network_policies_let_the_console_reach_the_services_and_only_the_allowed_peers_reach_it(
        console, console_production):
    labels = console.get("Deployment", "txlog-console")["spec"]["template"]["metadata"]["labels"]
    grpc_rule, _, metrics_rule = console.get("NetworkPolicy", "txlog-services")["spec"]["ingress"]
    # the services' gRPC ports: the console is one of the release's pods, as the Spark job is
    assert any(selects(peer["podSelector"].get("matchLabels", {}), labels) and "namespaceSelector" not in peer
               for peer in grpc_rule["from"])
    # their metrics ports (the overview's rates), even when metrics.allowFrom is narrowed to Prometheus
    _, _, narrowed = console_production.get("NetworkPolicy", "txlog-services")["spec"]["ingress"]
    assert narrowed["from"][0] == PRODUCTION_VALUES["metrics"]["allowFrom"]
    for rule in (metrics_rule, narrowed):
        assert any(set(peer) == {"podSelector"} and selects(peer["podSelector"]["matchLabels"], labels)
                   for peer in rule["from"])
    without = render({"metrics": {"allowFrom": PRODUCTION_VALUES["metrics"]["allowFrom"]}})
    assert without.get("NetworkPolicy", "txlog-services")["spec"]["ingress"][2]["from"] == [
        PRODUCTION_VALUES["metrics"]["allowFrom"]]

    # the console's own port: no pod by default (port-forwarding and the kubelet's probes are not filtered)
    policy = console.get("NetworkPolicy", "txlog-console")["spec"]
    workloads = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
                 for d in console.docs if d["kind"] in ("StatefulSet", "Deployment")}
    assert [name for name, pod in workloads.items() if selects(policy["podSelector"]["matchLabels"], pod)] == ["txlog-console"]
    assert policy["policyTypes"] == ["Ingress"] and policy["ingress"] == []
    policy = console_production.get("NetworkPolicy", "txlog-console")["spec"]
    assert policy["ingress"] == [{"from": CONSOLE_ALLOW_FROM, "ports": [{"port": 9090, "protocol": "TCP"}]}]
    assert "txlog-console" not in [p["metadata"]["name"] for p in render(CONSOLE_NO_TLS).of_kind("NetworkPolicy")]


@pytest.mark.parametrize("values, message", [
    ({"console": {"enable": True}}, "additional properties 'enable' not allowed"),
    ({"console": {"enabled": True, "readonly": False}}, "additional properties 'readonly' not allowed"),
    ({"console": {"port": 0}}, "/console/port"),
    ({"console": {"readOnly": "no"}}, "/console/readOnly"),
    ({"console": {"hangingAfterMs": 0}}, "/console/hangingAfterMs"),
    ({"console": {"allowFrom": [{}]}}, "/console/allowFrom/0"),
    ({"console": {"allowFrom": [{"podSelector": {"matchLabel": {"a": "b"}}}]}}, "matchLabel"),
    ({"console": {"allowFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}}, "/console/allowFrom/0"),
    ({"authorizer": {"consolePrincipal": "txlog-console"}}, "/authorizer/consolePrincipal"),
])
def test_values_schema_refuses_bad_console_values(values, message):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize("values, message", [
    ({**CONSOLE, "tls": {"existingSecret": "corp-tls", "sparkJobSecret": "corp-spark"},
      "authorizer": {"servicesPrincipal": "User:corp", "sparkJobPrincipal": "User:corp-spark"}},
     "tls.consoleSecret is required"),
    ({**CONSOLE, "tls": {"existingSecret": "corp-tls", "sparkJobSecret": "corp-spark", "consoleSecret": "corp-console"},
      "authorizer": {"servicesPrincipal": "User:corp", "sparkJobPrincipal": "User:corp-spark"}},
     "authorizer.consolePrincipal is required"),
])
def test_chart_refuses_console_values_that_would_render_but_not_work(values, message):
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render(values)
