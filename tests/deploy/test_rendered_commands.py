"""The chart's container commands, run here the way Kubernetes runs them.

Each workload's rendered command, args and environment are started as a real
process, with the downward API (pod name, namespace, IP) and Kubernetes'
$(VAR) expansion done by the test, against a real ZooKeeper. Only what a
pod has and this machine has not is replaced: the ZooKeeper address, the
listen ports, the data folder. Then the node id and address each instance
registered in ZooKeeper are the ones the chart promises: StatefulSet pods use
their ordinal and their headless-service name, producer_id_svc pods an id
derived from their IP (IPv4 and IPv6) and, with TLS (the chart's default),
their pod DNS name; the image's health check passes on the plaintext health
port; each serves its metrics on the metrics port (names the chart's
dashboard and alerts know); and SIGTERM ends each one with status 0 within the pod's termination
grace. The mounted certificate Secret is replaced by certificates of a CA
made here (with TLS, the health port too: it is a fixed port). And the ACL
hook Job's script runs under sh against a cluster with mutual TLS and the
authorizer, twice, adding the bindings it renders.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import metrics_contract
import pytest
from chart_render import (
    NAMESPACE,
    NO_TLS,
    REPO,
    acl_bindings,
    container,
    env_of,
    expand_kubernetes_vars,
    pod_spec,
    render,
)
from prometheus_client.parser import text_string_to_metric_families

from services.coordination import zk
from services.security import certs
from services.tooling.cluster import LocalCluster, free_port, health_serving
from txlog import Admin

HEALTHCHECK = REPO / "docker" / "healthcheck.py"
START_TIMEOUT_S = 60.0


def pod_environment(c: dict, pod_name: str, pod_ip: str) -> dict[str, str]:
    downward = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE, "status.podIP": pod_ip}
    resolved: dict[str, str] = {}
    for entry in c["env"]:
        if "valueFrom" in entry:
            resolved[entry["name"]] = downward[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            resolved[entry["name"]] = expand_kubernetes_vars(entry["value"], resolved)
    return resolved


class Pod:
    """One rendered container started as a process of this machine."""

    def __init__(self, workload: dict, pod_name: str, pod_ip: str, zookeeper: str, workdir: Path, tls_dir: Path | None = None):
        c = container(workload)
        self.name = pod_name
        self.service = workload["metadata"]["labels"]["app.kubernetes.io/component"].replace("-", "_")
        self.grace_s = pod_spec(workload)["terminationGracePeriodSeconds"]
        self.port = free_port()
        self.rendered_env = pod_environment(c, pod_name, pod_ip)
        env = {
            **self.rendered_env,
            "TXLOG_ZOOKEEPER": zookeeper,
            "TXLOG_LISTEN": f"127.0.0.1:{self.port}",
            # `python` in the rendered commands is the image's; here, this virtualenv's.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(workdir),
        }
        if "TXLOG_DATA_DIR" in env:
            env["TXLOG_DATA_DIR"] = str(workdir / "data")
        self.health_port = None
        if "TXLOG_HEALTH_LISTEN" in env:
            self.health_port = free_port()
            env["TXLOG_HEALTH_LISTEN"] = f"127.0.0.1:{self.health_port}"
        self.metrics_port = None
        if "TXLOG_METRICS_LISTEN" in env:  # a fixed port too
            self.metrics_port = free_port()
            env["TXLOG_METRICS_LISTEN"] = f"127.0.0.1:{self.metrics_port}"
        for name, file in (("TXLOG_TLS_CA", "ca.pem"), ("TXLOG_TLS_CERT", "services.pem"), ("TXLOG_TLS_KEY", "services-key.pem"),
                           ("TXLOG_ZOOKEEPER_AUTH_FILE", "zookeeper-identity")):
            if name in env:
                assert env[name].startswith("/etc/txlog/"), env[name]  # a Secret's mount
                env[name] = str(tls_dir / file)
        self.env = env
        command = [expand_kubernetes_vars(part, self.rendered_env) for part in c["command"] + c.get("args", [])]
        self.log = workdir / "pod.log"
        with open(self.log, "wb") as log_file:
            self.process = subprocess.Popen(command, env=env, cwd=workdir, stdout=log_file, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def health_address(self) -> str:
        return f"127.0.0.1:{self.health_port}" if self.health_port else self.address

    def wait_serving(self, deadline_s: float) -> None:
        while not health_serving(self.health_address):
            assert self.process.poll() is None, f"{self.name} exited with {self.process.returncode}:\n{self.log.read_text()}"
            assert time.monotonic() < deadline_s, f"{self.name} never answered SERVING:\n{self.log.read_text()}"
            time.sleep(0.1)

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=self.grace_s)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.mark.parametrize("tls", [True, False])
def test_rendered_commands_register_the_node_ids_and_addresses_the_chart_promises(cluster, tmp_path, tls):
    rendered = render({} if tls else NO_TLS)
    tls_dir = tmp_path / "tls"
    certs.create_ca(tls_dir)
    # the chart's services Certificate: CN <fullname>-services, the super user the authorizer is given
    certs.issue(tls_dir, "services", server=True, common_name="txlog-services")
    (tls_dir / "zookeeper-identity").write_text("txlog:rendered-commands-test\n")
    partition = rendered.get("StatefulSet", "txlog-partition-svc")
    coordinator = rendered.get("StatefulSet", "txlog-coordinator-svc")
    producer_ids = rendered.get("Deployment", "txlog-producer-id-svc")
    wanted = [
        (partition, "txlog-partition-svc-2", "10.8.0.12"),
        (coordinator, "txlog-coordinator-svc-1", "10.8.0.13"),
        (producer_ids, "txlog-producer-id-svc-7d4b9c-x2lzq", "10.1.2.3"),
        (producer_ids, "txlog-producer-id-svc-7d4b9c-q8kfn", "fd00::a:5"),
    ]
    pods = []
    try:
        for i, (workload, pod_name, pod_ip) in enumerate(wanted):
            workdir = tmp_path / f"pod-{i}"
            workdir.mkdir()
            pods.append(Pod(workload, pod_name, pod_ip, cluster.state.zookeeper, workdir, tls_dir))
        deadline_s = time.monotonic() + START_TIMEOUT_S
        for pod in pods:
            pod.wait_serving(deadline_s)
        # with TLS they run the ACL authorizer (a bad super-user list or mapping rule would have stopped them)
        for pod in pods:
            assert (pod.env.get("TXLOG_AUTHORIZER"), pod.env.get("TXLOG_SUPER_USERS")) == \
                (("acl", "User:txlog-services") if tls else (None, None))

        zookeeper_root = env_of(container(partition))["TXLOG_ZOOKEEPER_ROOT"]["value"]
        assert zookeeper_root == "/txlog"
        client = zk.connect(cluster.state.zookeeper)
        try:
            registry = zk.ServiceRegistry(client, zookeeper_root)
            assert registry.live("partition_svc") == {
                2: f"txlog-partition-svc-2.txlog-partition-svc-headless.{NAMESPACE}.svc.cluster.local:7300"}
            assert registry.live("coordinator_svc") == {
                1: f"txlog-coordinator-svc-1.txlog-coordinator-svc-headless.{NAMESPACE}.svc.cluster.local:7200"}
            assert registry.live("producer_id_svc") == ({
                int(ipaddress.ip_address("10.1.2.3")): f"10-1-2-3.{NAMESPACE}.pod.cluster.local:7100",
                int(ipaddress.ip_address("fd00::a:5")): f"fd00--a-5.{NAMESPACE}.pod.cluster.local:7100",
            } if tls else {
                int(ipaddress.ip_address("10.1.2.3")): "10.1.2.3:7100",
                int(ipaddress.ip_address("fd00::a:5")): "[fd00::a:5]:7100",
            })
        finally:
            client.stop()
            client.close()
        # partition_svc keeps its RocksDB under the data dir, per node id: on the volume.
        assert (Path(pods[0].env["TXLOG_DATA_DIR"]) / "node-2").is_dir()

        for pod in pods:
            check_env = {**os.environ, "TXLOG_LISTEN": f"0.0.0.0:{pod.port}"}
            if pod.health_port:
                check_env["TXLOG_HEALTH_LISTEN"] = f"0.0.0.0:{pod.health_port}"
            check = subprocess.run([sys.executable, str(HEALTHCHECK)], capture_output=True, text=True, timeout=30, env=check_env)
            assert check.returncode == 0, check.stderr

        # the metrics endpoint the chart turns on: every sample one the chart's dashboard and alerts know
        for pod in pods:
            assert pod.rendered_env["TXLOG_METRICS_LISTEN"] == "0.0.0.0:9464"
            with urllib.request.urlopen(f"http://127.0.0.1:{pod.metrics_port}/metrics", timeout=10) as response:
                text = response.read().decode()
            samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
                       if family.name != "target_info"}
            assert set(samples) <= set(metrics_contract.EXPOSED[pod.service]), (pod.name, set(samples))
            assert samples["txlog_zookeeper_connected"] == 1

        for pod in pods:
            assert pod.terminate() == 0, pod.log.read_text()
    finally:
        for pod in pods:
            pod.kill()


def test_healthcheck_fails_where_no_service_answers():
    port = free_port()
    check = subprocess.run([sys.executable, str(HEALTHCHECK), f"127.0.0.1:{port}"], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 1
    assert f"127.0.0.1:{port}: UNAVAILABLE" in check.stderr


@pytest.mark.parametrize("environ, expected", [
    ({"TXLOG_LISTEN": "0.0.0.0:7300"}, ["127.0.0.1:7300"]),
    ({"TXLOG_LISTEN": "0.0.0.0:7300", "TXLOG_HEALTH_LISTEN": "0.0.0.0:7900"}, ["127.0.0.1:7900"]),
    ({"TXLOG_LISTEN": "10.0.0.5:7200"}, ["10.0.0.5:7200"]),
    ({}, ["127.0.0.1:7100", "127.0.0.1:7200", "127.0.0.1:7300"]),
])
def test_healthcheck_asks_the_listen_address_or_every_default_port(environ, expected):
    spec = importlib.util.spec_from_file_location("healthcheck", HEALTHCHECK)
    healthcheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(healthcheck)
    assert healthcheck.addresses([], environ) == expected
    assert healthcheck.addresses(["partition-svc-0:7300"], environ) == ["partition-svc-0:7300"]


def test_the_acl_hook_job_adds_its_bindings_and_may_run_again(tmp_path):
    """The hook Job's script, run by sh against a cluster with mutual TLS and
    the authorizer, as a super user (the mounted Secret: here the local
    cluster's admin certificate): the bindings it renders are the cluster's
    afterwards, and a second run (every upgrade) changes nothing."""
    acls = [{"allow": "User:reporting", "operations": ["Read", "Describe"], "topic": "event-counts"},
            {"deny": "User:*", "operations": ["Delete"], "group": "it's-", "prefixed": True}]
    job = render({"sparkJob": {"inputTopic": "page-views,clicks"}, "authorizer": {"acls": acls}}).get("Job", "txlog-acls")
    expected = sorted(acl_bindings(job))
    assert len(expected) == 9
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=1, coordinator_svcs=0, tls=True)
    try:
        admin_tls = local.client_tls()
        secret = tmp_path / "secret"
        secret.mkdir()
        for key, file in (("tls_ca", "ca.crt"), ("tls_cert", "tls.crt"), ("tls_key", "tls.key")):
            shutil.copy(admin_tls[key], secret / file)
        c = container(job)
        assert c["command"][:2] == ["sh", "-c"]
        script = c["command"][2].replace("/etc/txlog/tls/", f"{secret}/")
        env = {**os.environ, "TXLOG_BOOTSTRAP": local.state.bootstrap, "HOME": str(tmp_path),
               # `txlog` in the image's PATH; here, this virtualenv's
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        for _ in range(2):
            done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
            assert len(done.stdout.splitlines()) == len(expected)  # one line per binding added
            with Admin(local.state.bootstrap, **admin_tls) as admin:
                found = sorted((b.permission, b.principal, b.operation, b.resource_type, b.pattern_type, b.resource_name, b.host)
                               for b in admin.describe_acls())
            assert found == expected
    finally:
        local.down(grace_s=5)
