"""The Helm chart's workloads run from the built images under podman (`make
chart-smoke`, and test_chart_podman.py): a test harness for the chart's
wiring, not an orchestrator.

The chart is rendered by Helm's engine (as the other deployment tests do),
with its default values except the image names (the images `make image`
built). Then every rendered workload is started the way the kubelet would
start it, from exactly what was rendered: each StatefulSet's replicas under
their pod names, the Deployment's pod, the ACL hook Job and the CronJob's job
template, with the rendered command, args, environment (the downward API and
Secret references resolved, `$(VAR)` expanded), ports, mounted Secrets,
ConfigMaps, emptyDirs and volume claims (host folders with the pod's fsGroup,
kept across a pod's replacement), user, groups, read-only root and dropped
capabilities. All run on one podman network where the Services' names
(`<service>.<namespace>.svc.<domain>`), the StatefulSet pods' names
(`<pod>.<headless service>.<namespace>.svc.<domain>`) and the pods' IP names
(`<a-b-c-d>.<namespace>.pod.<domain>`) resolve. The harness plays
cert-manager: each rendered Certificate becomes its Secret (tls.crt, tls.key,
ca.crt), issued with the Certificate's names by a CA made here.

Each probe runs as the kubelet runs it (gRPC health, TCP or exec; its
initial delay, period, timeout and failure threshold): a startup or liveness
probe that fails its threshold, or a readiness probe that never passes, is a
failed probe. After the services are ready: the ACL hook Job (post-install),
the topics and sample events an operator would make, the CronJob's job;
then the chaos workload (in a container on the network, with the services'
certificate) while one pod of each StatefulSet and the Deployment's pod are
killed (SIGKILL) and replaced as their controllers would (a StatefulSet pod
under the same name with the same claim, the Deployment's under a new name;
both on a new IP), and the checker's verdict.

    python tests/deploy/chart_smoke.py [--seconds N] [--seed N] [--keep]

The last line printed is one JSON object: workloads_started, pods_started,
probes_passed, probes_failed, jobs_succeeded, anomalies (the sum of every
anomaly count), faults, and the checker's other figures.

Not shown here (only a Kubernetes cluster does it): scheduling, affinity and
disruption budgets, volume provisioning, cert-manager itself, NetworkPolicy
enforcement, the ClusterIP Services' virtual IPs (their names resolve to the
pods' IPs here), resource limits (podman on cgroupfs does not enforce them
here), the CronJob's schedule.
"""

from __future__ import annotations

import base64
import concurrent.futures
import ipaddress
import json
import random
import secrets
import shutil
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # services, when run as a script (make chart-smoke)
import grpc  # noqa: E402
from chart_render import NAMESPACE, container, expand_kubernetes_vars, pod_spec, render  # noqa: E402
from containers import (  # noqa: E402
    SERVICE_IMAGE,
    SPARK_IMAGE,
    ZOOKEEPER_IMAGE,
    Workload,
    build_images,
    harness_main,
    inject_faults,
    run,
)
from containers import log as harness_log  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from services.security import certs  # noqa: E402

PROJECT = "txlog-chart-smoke"
SUBNET = ipaddress.ip_network("10.89.77.0/24")
POD_ADDRESSES = ipaddress.ip_network("10.89.77.0/25")  # the pods' (each given its own); podman's IPAM hands out the rest
OTHER_ADDRESSES = ipaddress.ip_network("10.89.77.128/25")  # to the operator's one-off containers
DOMAIN = "cluster.local"
READY_TIMEOUT_S = 300.0
EVENTS = 5000


def image_values() -> dict:
    """The chart's defaults but for the images: the ones `make image` built, never pulled."""
    def image(reference: str) -> dict:
        repository, tag = reference.rsplit(":", 1)
        return {"repository": repository, "tag": tag, "pullPolicy": "Never"}

    return {"image": image(SERVICE_IMAGE), "sparkJob": {"image": image(SPARK_IMAGE)},
            "zookeeper": {"image": image(ZOOKEEPER_IMAGE)}}


def log(message: str) -> None:
    harness_log("chart-smoke", message)


def random_suffix(length: int) -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length))


# --- the objects the pods mount -----------------------------------------------------------

def secret_files(rendered, directory: Path) -> dict[str, dict[str, bytes]]:
    """Every Secret a pod may mount, by name: the rendered ones, and one per
    Certificate as cert-manager would write it (tls.crt, tls.key, ca.crt),
    signed by a CA made here (the rendered CA Certificate's Secret holds it)."""
    found = {s["metadata"]["name"]: {k: base64.b64decode(v) for k, v in s.get("data", {}).items()}
             | {k: v.encode() for k, v in s.get("stringData", {}).items()} for s in rendered.of_kind("Secret")}
    ca_dir = directory / "ca"
    ca = certs.create_ca(ca_dir)
    ca_key = ca_dir / "ca-key.pem"
    for certificate in rendered.of_kind("Certificate"):
        spec = certificate["spec"]
        if spec.get("isCA"):
            found[spec["secretName"]] = {"tls.crt": ca.read_bytes(), "tls.key": ca_key.read_bytes(), "ca.crt": ca.read_bytes()}
            continue
        server = "server auth" in spec.get("usages", [])
        cert, key = certs.issue(ca_dir, certificate["metadata"]["name"], server=server, hosts=tuple(spec.get("dnsNames", ())),
                                common_name=spec.get("commonName"))
        found[spec["secretName"]] = {"tls.crt": cert.read_bytes(), "tls.key": key.read_bytes(), "ca.crt": ca.read_bytes()}
    return found


def config_maps(rendered) -> dict[str, dict[str, bytes]]:
    return {c["metadata"]["name"]: {k: v.encode() for k, v in c.get("data", {}).items()} for c in rendered.of_kind("ConfigMap")}


def grpc_health(address: str, service: str, timeout_s: float) -> bool:
    """The kubelet's gRPC probe: grpc.health.v1 Check over plaintext, SERVING or it failed."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- pods ---------------------------------------------------------------------------------

@dataclass
class Pod:
    """One pod of a rendered workload, run as a podman container."""

    name: str
    workload: dict
    ip: str
    claims: dict[str, Path] = field(default_factory=dict)  # volume name -> its claim's folder (a StatefulSet's)
    started_s: float = 0.0  # time.monotonic() when its container started

    @property
    def container_name(self) -> str:
        return f"{PROJECT}_{self.name}"

    @property
    def spec(self) -> dict:
        return pod_spec(self.workload)

    @property
    def container(self) -> dict:
        return container(self.workload)

    @property
    def labels(self) -> dict:
        spec = self.workload["spec"]
        template = spec["jobTemplate"]["spec"]["template"] if self.workload["kind"] == "CronJob" else spec["template"]
        return template["metadata"].get("labels", {})

    def port(self, port) -> int:
        """A probe's port: a number, or the name of one of the container's ports."""
        if isinstance(port, int):
            return port
        return next(p["containerPort"] for p in self.container.get("ports", []) if p.get("name") == port)


class Cluster:
    """The rendered release's pods on one podman network."""

    def __init__(self, rendered, directory: Path):
        self.rendered, self.directory = rendered, directory
        self.network = PROJECT
        self.secrets = secret_files(rendered, directory)
        self.config_maps = config_maps(rendered)
        self.free_addresses = [str(ip) for ip in list(POD_ADDRESSES.hosts())[9:]]
        self.lock = threading.Lock()  # the probes' counts, kept by one thread per pod
        self.pods: dict[str, Pod] = {}
        self.probes_passed = 0
        self.probes_failed: list[str] = []
        self.faults: dict[str, int] = {}
        self.workloads_started: set[str] = set()
        self.pods_started = 0

    # --- the network and its names ----------------------------------------------------------

    def create_network(self) -> None:
        self.remove_everything()
        run(["podman", "network", "create", "--subnet", str(SUBNET), "--ip-range", str(OTHER_ADDRESSES), self.network])

    def remove_everything(self) -> None:
        names = run(["podman", "ps", "-aq", "--filter", f"label={PROJECT}"], check=False).stdout.split()
        if names:
            run(["podman", "rm", "-f", "-t", "0", *names], check=False, timeout=300)
        run(["podman", "network", "rm", "-f", self.network], check=False)

    def dns_names(self, pod: Pod) -> list[str]:
        """What resolves to this pod: its IP's name, its name under its
        StatefulSet's headless Service, and every Service that selects it."""
        names = [f"{pod.ip.replace('.', '-')}.{NAMESPACE}.pod.{DOMAIN}"]
        if pod.workload["kind"] == "StatefulSet":
            names.append(f"{pod.name}.{pod.workload['spec']['serviceName']}.{NAMESPACE}.svc.{DOMAIN}")
        for service in self.rendered.of_kind("Service"):
            if selects(service["spec"].get("selector", {}), pod.labels):
                name = service["metadata"]["name"]
                names += [f"{name}.{NAMESPACE}.svc.{DOMAIN}", f"{name}.{NAMESPACE}", name]
        return names

    # --- volumes ---------------------------------------------------------------------------

    def _volume(self, pod: Pod, volume: dict, fs_group: int | None) -> Path:
        """The host folder of one of the pod's volumes, made as the kubelet makes it."""
        name = volume["name"]
        if name in pod.claims:
            path = pod.claims[name]
            if not path.exists():
                path.mkdir(parents=True)
                if fs_group is not None:  # fsGroup on a claim: group-owned, group-writable, setgid
                    path.chmod(0o2775)
                    shutil.chown(path, 0, fs_group)
            return path
        path = self.directory / "pods" / pod.name / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        if "emptyDir" in volume:
            path.chmod(0o777)
            return path
        if "secret" in volume:
            source, data = volume["secret"], self.secrets.get(volume["secret"]["secretName"])
            what = f"Secret {source['secretName']}"
        elif "configMap" in volume:
            source, data = volume["configMap"], self.config_maps.get(volume["configMap"]["name"])
            what = f"ConfigMap {source['name']}"
        else:
            raise AssertionError(f"pod {pod.name}: volume {name} of a kind this harness does not mount: {volume}")
        if data is None:
            if source.get("optional"):
                return path
            raise AssertionError(f"pod {pod.name} mounts {what}, which the release does not create")
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            file = path / item["path"]
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(data[item["key"]])
            file.chmod(item.get("mode", source.get("defaultMode", 0o644)))
            if fs_group is not None:
                shutil.chown(file, 0, fs_group)
        path.chmod(0o755)
        return path

    def secret_folder(self, name: str) -> Path:
        """The Secret's keys as files, for a container of the operator's (run as root)."""
        path = self.directory / "operator" / name
        path.mkdir(parents=True, exist_ok=True)
        for key, value in self.secrets[name].items():
            (path / key).write_bytes(value)
        return path

    def _env(self, pod: Pod) -> dict[str, str]:
        downward = {"metadata.name": pod.name, "metadata.namespace": NAMESPACE, "status.podIP": pod.ip,
                    "spec.serviceAccountName": pod.spec.get("serviceAccountName", "default")}
        resolved: dict[str, str] = {}
        for entry in pod.container.get("env", []):
            source = entry.get("valueFrom")
            if source is None:
                resolved[entry["name"]] = expand_kubernetes_vars(entry.get("value", ""), resolved)
            elif "fieldRef" in source:
                resolved[entry["name"]] = downward[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                resolved[entry["name"]] = self.secrets[ref["name"]][ref["key"]].decode()
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                resolved[entry["name"]] = self.config_maps[ref["name"]][ref["key"]].decode()
            else:
                raise AssertionError(f"pod {pod.name}: env {entry['name']} from a source this harness does not know: {source}")
        return resolved

    def podman_run(self, pod: Pod) -> list[str]:
        """`podman run` for the pod's one container, from its rendered spec."""
        spec, c = pod.spec, pod.container
        pod_security, security = spec.get("securityContext", {}), c.get("securityContext", {})
        user, group = security.get("runAsUser", pod_security.get("runAsUser")), security.get("runAsGroup", pod_security.get("runAsGroup"))
        fs_group = pod_security.get("fsGroup")
        if security.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
            assert user not in (None, 0), f"pod {pod.name}: runAsNonRoot without a non-root runAsUser"
        args = ["podman", "run", "-d", "--name", pod.container_name, "--label", PROJECT, "--pull", "never", "--no-healthcheck",
                "--network", self.network, "--ip", pod.ip, "--hostname", pod.name]
        for name in self.dns_names(pod):
            args += ["--network-alias", name]
        if user is not None:
            args += ["--user", f"{user}:{group if group is not None else user}"]
        if fs_group is not None:
            args += ["--group-add", str(fs_group)]
        if security.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]  # writable only where the pod mounts a volume
        for capability in security.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop", capability]
        if security.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        env = self._env(pod)
        for name, value in env.items():
            args += ["--env", f"{name}={value}"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in c.get("volumeMounts", []):
            volume = volumes.get(mount["name"]) or {"name": mount["name"]}
            assert mount["name"] in volumes or mount["name"] in pod.claims, f"pod {pod.name}: mount of unknown volume {mount['name']}"
            source = self._volume(pod, volume, fs_group)
            if mount.get("subPath"):
                source = source / mount["subPath"]
                source.mkdir(exist_ok=True)
                if fs_group is not None and mount["name"] in pod.claims:
                    source.chmod(0o2775)
                    shutil.chown(source, 0, fs_group)
            args += ["--volume", f"{source}:{mount['mountPath']}{':ro' if mount.get('readOnly') else ''}"]
        command = [expand_kubernetes_vars(part, env) for part in c.get("command", [])]
        if command:
            args += ["--entrypoint", json.dumps(command)]
        return [*args, c["image"], *(expand_kubernetes_vars(part, env) for part in c.get("args", []))]

    # --- starting pods and probing them -----------------------------------------------------

    def start(self, workload: dict, name: str, claims: dict[str, Path] | None = None) -> Pod:
        with self.lock:
            address = self.free_addresses.pop(0)
        pod = Pod(name, workload, address, claims or {})
        run(self.podman_run(pod), timeout=300)
        pod.started_s = time.monotonic()
        self.pods[name] = pod
        self.pods_started += 1
        self.workloads_started.add(f"{workload['kind']}/{workload['metadata']['name']}")
        return pod

    def start_statefulset(self, workload: dict) -> list[Pod]:
        base = workload["metadata"]["name"]
        pods = []
        for ordinal in range(workload["spec"].get("replicas", 1)):
            name = f"{base}-{ordinal}"
            claims = {t["metadata"]["name"]: self.directory / "claims" / f"{t['metadata']['name']}-{name}"
                      for t in workload["spec"].get("volumeClaimTemplates", [])}
            pods.append(self.start(workload, name, claims))
        return pods

    def start_deployment(self, workload: dict, replicas: int | None = None) -> list[Pod]:
        template_hash = random_suffix(10)
        return [self.start(workload, f"{workload['metadata']['name']}-{template_hash}-{random_suffix(5)}")
                for _ in range(workload["spec"].get("replicas", 1) if replicas is None else replicas)]

    def running(self, pod: Pod) -> bool:
        state = run(["podman", "inspect", "--format", "{{.State.Running}}", pod.container_name], check=False)
        return state.stdout.strip() == "true"

    def probe_once(self, pod: Pod, probe: dict) -> bool:
        timeout_s = probe.get("timeoutSeconds", 1)
        if "grpc" in probe:
            return grpc_health(f"{pod.ip}:{pod.port(probe['grpc']['port'])}", probe["grpc"].get("service", ""), timeout_s)
        if "tcpSocket" in probe:
            try:
                with socket.create_connection((pod.ip, pod.port(probe["tcpSocket"]["port"])), timeout=timeout_s):
                    return True
            except OSError:
                return False
        if "exec" in probe:
            try:
                done = run(["podman", "exec", pod.container_name, *probe["exec"]["command"]], check=False, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return done.returncode == 0
        raise AssertionError(f"pod {pod.name}: a probe of a kind this harness does not run: {probe}")

    def probe(self, pod: Pod, kind: str, deadline_s: float) -> None:
        """The pod's ``kind`` probe on the kubelet's schedule until it passes:
        the first after the initial delay (from the container's start, or at
        once when an earlier probe of the pod held it back), then one per
        period, each within its timeout. A startup or liveness probe fails at
        its failure threshold, a readiness probe at the deadline (the kubelet
        would go on, the pod unready); any fails when the container exits."""
        probe = pod.container.get(f"{kind}Probe")
        if probe is None:
            return
        period_s, threshold = probe.get("periodSeconds", 10), probe.get("failureThreshold", 3)
        due_s = max(pod.started_s + probe.get("initialDelaySeconds", 0), time.monotonic())
        failures = 0
        while True:
            time.sleep(max(0.0, due_s - time.monotonic()))  # the kubelet's schedule: it probes no sooner
            if self.probe_once(pod, probe):
                with self.lock:
                    self.probes_passed += 1
                return
            failures += 1
            ended = not self.running(pod)
            if ended or (kind != "readiness" and failures >= threshold) or time.monotonic() > deadline_s:
                tail = run(["podman", "logs", "--tail", "40", pod.container_name], check=False)
                with self.lock:
                    self.probes_failed.append(f"{pod.name} {kind}" + (" (the container exited)" if ended else ""))
                log(f"{pod.name}: {kind} probe failed {failures} times; its log ends:\n{tail.stdout[-3000:]}{tail.stderr[-3000:]}")
                return
            due_s += period_s

    def wait_ready(self, pods: list[Pod]) -> None:
        """Each pod's startup probe, then its readiness and liveness probes;
        the pods side by side, each on its own schedule, as the kubelet does."""
        deadline_s = time.monotonic() + READY_TIMEOUT_S

        def probes(pod: Pod) -> None:
            for kind in ("startup", "readiness", "liveness"):
                self.probe(pod, kind, deadline_s)

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(pods)) as pool:
            list(pool.map(probes, pods))

    # --- jobs ------------------------------------------------------------------------------

    def run_job(self, workload: dict) -> dict:
        """The Job's pod to completion, a new pod after a failure up to its
        backoff limit (restartPolicy Never); the last pod's exit and output."""
        spec = workload["spec"]["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else workload["spec"]
        base = workload["metadata"]["name"] + (f"-{int(time.time()) // 60}" if workload["kind"] == "CronJob" else "")
        deadline_s = time.monotonic() + spec.get("activeDeadlineSeconds", 3600)
        for attempt in range(spec.get("backoffLimit", 6) + 1):
            pod = self.start(workload, f"{base}-{random_suffix(5)}")
            waited = run(["podman", "wait", pod.container_name], check=False, timeout=max(1.0, deadline_s - time.monotonic()))
            output = run(["podman", "logs", pod.container_name], check=False)
            status = int(waited.stdout.strip() or -1)
            log(f"{pod.name} (attempt {attempt + 1}) exited {status}")
            if status == 0:
                return {"pod": pod.name, "status": 0, "stdout": output.stdout, "stderr": output.stderr[-3000:]}
        return {"pod": pod.name, "status": status, "stdout": output.stdout, "stderr": output.stderr[-3000:]}

    # --- faults -------------------------------------------------------------------------------

    def replace(self, pod: Pod) -> Pod:
        """SIGKILL, then the pod its controller makes instead: a StatefulSet's
        under the same name with the same claims, a Deployment's under a new
        name; each on a new IP, as in a cluster."""
        run(["podman", "kill", "--signal", "KILL", pod.container_name], check=False)
        run(["podman", "rm", "-f", "-t", "0", pod.container_name], check=False)
        del self.pods[pod.name]
        self.free_addresses.append(pod.ip)  # last in line: the next pods get other addresses first
        if pod.workload["kind"] == "StatefulSet":
            new = self.start(pod.workload, pod.name, pod.claims)
        else:
            (new,) = self.start_deployment(pod.workload, replicas=1)
        component = pod.labels.get("app.kubernetes.io/component", pod.workload["metadata"]["name"])
        self.faults[f"kill_{component}"] = self.faults.get(f"kill_{component}", 0) + 1
        self.wait_ready([new])
        return new

    def of(self, workload: dict) -> list[Pod]:
        """The workload's pods running now (replacements included)."""
        return [p for p in self.pods.values() if p.workload is workload]

    def one_off(self, image: str, *command: str, volumes: tuple[str, ...] = (), detach: bool = False,
                timeout: float = 900) -> subprocess.CompletedProcess:
        """``command`` in a container on the release's network (an operator's, not a pod of the release)."""
        mounts = [arg for v in volumes for arg in ("-v", v)]
        return run(["podman", "run", *(["-d"] if detach else ["--rm"]), "--label", PROJECT, "--pull", "never",
                    "--network", self.network, "--user", "0", *mounts, image, *command], timeout=timeout)


# --- the run ----------------------------------------------------------------------------------

def workloads(rendered) -> dict[str, list[dict]]:
    kinds = {kind: rendered.of_kind(kind) for kind in ("StatefulSet", "Deployment", "Job", "CronJob")}
    hooks = [j for j in kinds["Job"] if "helm.sh/hook" in j["metadata"].get("annotations", {})]
    return {**kinds, "hooks": hooks, "Job": [j for j in kinds["Job"] if j not in hooks]}


def smoke(seconds: float = 60, seed: int = 1, keep: bool = False) -> dict:
    build_images()
    rendered = render(image_values())
    directory = Path(tempfile.mkdtemp(prefix="txlog-chart-smoke-"))
    cluster = Cluster(rendered, directory)
    found = workloads(rendered)
    rng = random.Random(seed)
    started = time.monotonic()
    jobs_succeeded, job_report, verdict = 0, None, {}
    try:
        cluster.create_network()
        services = [p for w in found["StatefulSet"] for p in cluster.start_statefulset(w)]
        services += [p for w in found["Deployment"] for p in cluster.start_deployment(w)]
        log(f"started {len(services)} pods: {', '.join(p.name for p in services)}")
        cluster.wait_ready(services)
        log(f"probes: {cluster.probes_passed} passed, failed: {cluster.probes_failed}")
        for job in found["hooks"] + found["Job"]:  # post-install hooks: after the release's objects exist
            jobs_succeeded += cluster.run_job(job)["status"] == 0
        # an operator's tools (topics, sample events, the chaos workload) use the services' certificate, as the
        # ACL hook Job does: a super user
        tls_mount = f"{cluster.secret_folder(tls_secret_name(found))}:/etc/txlog/tls:ro"
        tls_args = ("--tls-ca", "/etc/txlog/tls/ca.crt", "--tls-cert", "/etc/txlog/tls/tls.crt", "--tls-key", "/etc/txlog/tls/tls.key")
        bootstrap = cronjob_bootstrap(found)
        for cronjob in found["CronJob"]:
            operator_setup(cluster, cronjob, bootstrap, tls_args, tls_mount)
            report = cluster.run_job(cronjob)
            jobs_succeeded += report["status"] == 0
            runs = [json.loads(line) for line in report["stdout"].splitlines() if line.startswith('{"run"')]
            job_report = runs[-1]["run"] if runs else {"status": report["status"], "stderr": report["stderr"]}
            log(f"{cronjob['metadata']['name']}: {job_report}")
        workload = Workload(directory / "chaos", bootstrap, seed,
                            lambda *command, volumes=(), **kw: cluster.one_off(SERVICE_IMAGE, *command,
                                                                               volumes=(*volumes, tls_mount), **kw),
                            extra_args=tls_args)
        workload.start()
        try:
            victims = [lambda w=w: cluster.replace(rng.choice(cluster.of(w))) for w in found["StatefulSet"] + found["Deployment"]]
            inject_faults(victims, lambda: None, seconds, rng)  # each replacement waits for its pod's probes
        finally:
            workload.stop()
        for pod in list(cluster.pods.values()):
            if pod.workload["kind"] in ("StatefulSet", "Deployment"):
                cluster.probe(pod, "liveness", time.monotonic() + READY_TIMEOUT_S)
        verdict = workload.check()
    finally:
        if not keep:
            cluster.remove_everything()
    summary = {"workloads_started": len(cluster.workloads_started), "pods_started": cluster.pods_started,
               "probes_passed": cluster.probes_passed, "probes_failed": len(cluster.probes_failed),
               "failed_probes": cluster.probes_failed, "jobs_succeeded": jobs_succeeded,
               "jobs_run": len(found["hooks"]) + len(found["Job"]) + len(found["CronJob"]), "spark_job": job_report,
               "anomalies": verdict.get("anomalies", -1), **verdict, "faults": cluster.faults,
               "seconds": round(time.monotonic() - started), "dir": str(directory) if keep else None}
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
    return summary


def tls_secret_name(found: dict[str, list[dict]]) -> str:
    """The Secret the services mount their certificate from."""
    volumes = pod_spec(found["StatefulSet"][0]).get("volumes", [])
    return next(v["secret"]["secretName"] for v in volumes if v["name"] == "tls")


def cronjob_bootstrap(found: dict[str, list[dict]]) -> str:
    env = {e["name"]: e.get("value") for e in container(found["CronJob"][0]).get("env", [])}
    return env["TXLOG_BOOTSTRAP"]


def operator_setup(cluster: Cluster, cronjob: dict, bootstrap: str, tls_args: tuple[str, ...], tls_mount: str) -> None:
    """What an operator does before the first scheduled run: the job's topics, and events in its input."""
    env = {e["name"]: e.get("value") for e in container(cronjob).get("env", [])}
    for topic, partitions in ((env["TXLOG_INPUT_TOPIC"], 4), (env["TXLOG_OUTPUT_TOPIC"], 2)):
        cluster.one_off(SERVICE_IMAGE, "txlog", "topics", "create", topic, "--partitions", str(partitions), "--bootstrap",
                        bootstrap, *tls_args, volumes=(tls_mount,))
    cluster.one_off(SPARK_IMAGE, "python", "-m", "spark_jobs.sample_events", "--bootstrap", bootstrap, "--topic",
                    env["TXLOG_INPUT_TOPIC"], "--count", str(EVENTS), *tls_args, volumes=(tls_mount,))


def main(argv: list[str] | None = None) -> int:
    return harness_main(argv, __doc__.splitlines()[0], smoke, "the pods", lambda s: s["anomalies"] == 0 and s["probes_failed"] == 0
                        and s["jobs_succeeded"] == s["jobs_run"])


if __name__ == "__main__":
    sys.exit(main())
