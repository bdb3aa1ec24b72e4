"""A local txlog cluster of real processes: ZooKeeper (Debian's package) and the
services, each in its own process group, with their data and logs in one folder.

``txlog cluster up|down|kill|start|status`` drive it, and the test fixtures use
the same class, so the faults tests inject (kill -9, restart with the same data
and address) are the ones users can inject.

``DIR/cluster.json`` holds, for each process by name (``zookeeper``,
``producer_id_svc-0``, ...), its kind, address, pid, command and log file, plus
``zookeeper`` (the connection string) and ``bootstrap`` (the comma-separated
partition_svc addresses clients start from). A cluster started with ``tls``
also has ``tls``: the CA (``DIR/tls/ca.pem``) and the super user's
certificate and key (``admin.pem``, ``admin-key.pem``) that clients of the
local cluster use by default; every service then has its own certificate
(``DIR/tls/<name>.pem``, principal ``User:txlog-service``) and requires
clients to present one (mutual TLS), runs the ACL authorizer with the admin
and the services as super users (anyone else needs ACLs: ``txlog acls``),
and authenticates to ZooKeeper with the digest identity in
``DIR/tls/zookeeper-auth``, so only the services can change txlog's znodes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.security import certs
from txlog.net import tls as tls_mod

ZOOKEEPER_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
ZOOKEEPER_ROOT = "/txlog"
STATE_FILE = "cluster.json"
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
DATA_DIR_KINDS = ("partition_svc",)  # services that keep data: each gets DIR/<name> as --data-dir
PEER_CALLER_KINDS = ("partition_svc", "coordinator_svc")  # services that call other instances (--peer-routes-file)
ADMIN = "admin"  # the local cluster's super user (User:admin)
SERVICE_PRINCIPAL_NAME = "txlog-service"  # every service's certificate names it: they call one another as super users


class ClusterError(RuntimeError):
    pass


PORT_RANGE_ENV = "TXLOG_PORT_RANGE"  # "LOW-HIGH": free_port hands out ports from it (HIGH excluded)
PORT_COUNTER_ENV = "TXLOG_PORT_COUNTER"  # a file: the next port, shared by every process that inherits both


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a service to bind soon after.

    By default the kernel picks one (bind to port 0, then release it). With
    TXLOG_PORT_RANGE and TXLOG_PORT_COUNTER set (the tests set them for each
    pytest-xdist worker, a range below the kernel's ephemeral ports), the
    ports are handed out in turn from the counter in that file, under a lock:
    the worker and every process it starts (the CLI, the chaos tool) share one
    sequence, so none is handed a port another picked and has not bound yet,
    or one a killed service will take again on restart, until the range wraps
    round; each is checked by bind, so a port still in use is skipped."""
    span, counter = os.environ.get(PORT_RANGE_ENV), os.environ.get(PORT_COUNTER_ENV)
    if not span or not counter:
        with socket.socket() as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    low, high = (int(bound) for bound in span.split("-"))
    with open(counter, "a+") as state:
        fcntl.flock(state, fcntl.LOCK_EX)  # released when the file closes
        state.seek(0)
        text = state.read().strip()
        port = int(text) if text and low <= int(text) < high else low
        for _ in range(high - low):
            candidate, port = port, low + (port + 1 - low) % (high - low)
            if _bindable(host, candidate):
                state.seek(0)
                state.truncate()
                state.write(str(port))
                return candidate
    raise ClusterError(f"no free port in {PORT_RANGE_ENV}={span}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def zookeeper_serving(address: str, timeout_s: float = 1.0) -> bool:
    """Whether ZooKeeper serves sessions: ``srvr`` names its mode only then. (``ruok``
    answers imok as soon as the process listens; a client connecting before the server
    has loaded its data is turned away, and on a loaded machine that lasted over 30 s.)"""
    try:
        return "\nMode: " in zookeeper_command(address, b"srvr", timeout_s)
    except OSError:
        return False


@contextlib.contextmanager
def zookeeper_session(hosts: str, timeout_s: float = 30.0):
    """A started kazoo client of ``hosts`` for the block; ClusterError naming
    them when none answers within ``timeout_s``."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=hosts)
    try:
        client.start(timeout=timeout_s)
    except KazooTimeoutError:
        client.close()
        raise ClusterError(f"no ZooKeeper answered at {hosts} within {timeout_s:.0f} s") from None
    try:
        yield client
    finally:
        client.stop()
        client.close()


def create_chroot(zookeeper: str) -> None:
    """The chroot a connection string ends with (``host:port/name``), made if missing:
    ZooKeeper refuses every request of a session whose chroot does not exist."""
    hosts, slash, chroot = zookeeper.partition("/")
    if not slash or not chroot:
        return
    with zookeeper_session(hosts) as client:
        client.ensure_path("/" + chroot)


def zookeeper_command(address: str, word: bytes, timeout_s: float = 10.0) -> str:
    """The answer to one of ZooKeeper's four-letter commands (``mntr``, ``cons``)."""
    host, port = address.partition("/")[0].split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(word)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer.decode()


def zookeeper_counters(address: str, timeout_s: float = 10.0) -> dict[str, int]:
    """ZooKeeper's ``mntr`` counters (zk_packets_received, zk_znode_count, ...),
    the numeric ones, as ints: what tests and benchmarks count requests with."""
    pairs = (line.split("\t", 1) for line in zookeeper_command(address, b"mntr", timeout_s).splitlines() if "\t" in line)
    return {key: int(value) for key, value in pairs if value.lstrip("-").isdigit()}


def zookeeper_session_requests(address: str, session: int) -> int:
    """Requests ZooKeeper received on one session's connection (``cons``:
    recved): one instance's load, apart from the rest of the cluster's."""
    answer = zookeeper_command(address, b"cons")
    for line in answer.splitlines():
        found = re.search(r"recved=(\d+).*sid=0x([0-9a-f]+)", line)
        if found and int(found.group(2), 16) == session:
            return int(found.group(1))
    raise LookupError(f"no connection of session {session:#x} in {answer!r}")


def registration_session(zookeeper: str, kind: str, node_id: int, root: str = ZOOKEEPER_ROOT) -> int:
    """The ZooKeeper session of a live instance (its registration's ephemeral owner)."""
    with zookeeper_session(zookeeper) as client:
        stat = client.exists(f"{root}/services/{kind}/{node_id}")
    if stat is None:
        raise LookupError(f"{kind} {node_id} is not registered under {root}")
    return stat.ephemeralOwner


def sync_channel(address: str, tls: dict | None = None) -> grpc.Channel:
    """A blocking channel to a service of the cluster, with the admin's
    certificate when the cluster runs TLS (``ClusterState.tls``)."""
    if not tls:
        return grpc.insecure_channel(address)
    read = lambda path: Path(path).read_bytes()  # noqa: E731
    credentials = grpc.ssl_channel_credentials(read(tls["ca"]), read(tls["key"]), read(tls["cert"]))
    if tls.get("token"):
        credentials = grpc.composite_channel_credentials(credentials, grpc.metadata_call_credentials(tls_mod.BearerToken(tls["token"])))
    return grpc.secure_channel(address, credentials)


def health_serving(address: str, timeout_s: float = 1.0, tls: dict | None = None) -> bool:
    with sync_channel(address, tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


@dataclass
class ProcessInfo:
    name: str
    kind: str
    address: str
    command: list[str]
    log: str
    pid: int = 0
    metrics_address: str = ""  # http://<this>/metrics: Prometheus text (services only)


@dataclass
class ClusterState:
    dir: str
    zookeeper: str
    zookeeper_root: str = ZOOKEEPER_ROOT
    bootstrap: str = ""
    services: dict[str, ProcessInfo] = field(default_factory=dict)
    # {"dir", "ca", "cert", "key", "zookeeper_auth"}: the CA and the admin's certificate; with tokens also
    # "token" (the admin's) and "jwks" (what the services verify tokens with)
    tls: dict[str, str] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        raw = json.loads(text)
        raw["services"] = {name: ProcessInfo(**info) for name, info in raw["services"].items()}
        return cls(**raw)


class LocalCluster:
    """The processes of one local cluster, described by ``DIR/cluster.json``."""

    def __init__(self, directory: str | Path, *, env: dict[str, str] | None = None,
                 zookeeper_route: Callable[[str, str], str] | None = None,
                 peer_routes_file: Callable[[str], str] | None = None):
        """``zookeeper_route(name, zookeeper)``: the ZooKeeper connection string
        the process ``name`` is given instead of the cluster's (a chaos run's
        own proxy on that path); None: the cluster's. ``peer_routes_file(name)``:
        the --peer-routes-file of the process ``name``, for the kinds that call
        other instances (a chaos run's own proxies between instances)."""
        self.zookeeper_route = zookeeper_route
        self.peer_routes_file = peer_routes_file
        self.dir = Path(directory).resolve()
        self.env = {**os.environ, **(env or {})}
        self._children: dict[int, subprocess.Popen] = {}
        self.state: ClusterState | None = None
        if (self.dir / STATE_FILE).exists():
            self.state = ClusterState.from_json((self.dir / STATE_FILE).read_text())

    # --- describing the processes -------------------------------------------------

    def _zookeeper_process(self, port: int) -> ProcessInfo:
        conf = self.dir / "zookeeper" / "conf"
        data = self.dir / "zookeeper" / "data"
        conf.mkdir(parents=True, exist_ok=True)
        data.mkdir(parents=True, exist_ok=True)
        (conf / "zoo.cfg").write_text(
            f"dataDir={data}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
            "tickTime=500\ninitLimit=10\nsyncLimit=5\nmaxSessionTimeout=60000\n"
            "admin.enableServer=false\n4lw.commands.whitelist=*\n"
            # old snapshots and transaction logs removed every hour (ZooKeeper's shortest interval), three kept:
            # a long-lived local cluster's data folder grew without bound (bench/soak.py)
            "autopurge.snapRetainCount=3\nautopurge.purgeInterval=1\n"
        )
        java = shutil.which("java")
        missing = [jar for jar in ZOOKEEPER_JARS if not os.path.exists(jar)]
        if java is None or missing:
            raise ClusterError(
                f"ZooKeeper needs java and {', '.join(ZOOKEEPER_JARS)} "
                f"(missing: {missing or 'java'}); install the Debian package: apt-get install -y zookeeper"
            )
        classpath = ":".join([str(conf), *ZOOKEEPER_JARS])
        # QuorumPeerMain, not ZooKeeperServerMain: only it runs the autopurge task (then serves standalone)
        command = [java, "-Xmx512m", "-cp", classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(conf / "zoo.cfg")]
        return ProcessInfo("zookeeper", "zookeeper", f"127.0.0.1:{port}", command, str(self.dir / "logs" / "zookeeper.log"))

    def _service_process(self, kind: str, node_id: int, port: int, extra: list[str] | None = None) -> ProcessInfo:
        name = f"{kind}-{node_id}"
        address = f"127.0.0.1:{port}"
        metrics_address = f"127.0.0.1:{free_port()}"
        command = [
            sys.executable, "-m", kind,
            "--listen", address,
            "--metrics-listen", metrics_address,
            "--node-id", str(node_id),
            "--zookeeper", self.zookeeper_route(name, self.state.zookeeper) if self.zookeeper_route else self.state.zookeeper,
            "--zookeeper-root", self.state.zookeeper_root,
            *self._tls_args(name),
            *(["--peer-routes-file", self.peer_routes_file(name)] if self.peer_routes_file and kind in PEER_CALLER_KINDS else []),
            *(extra or []),
        ]
        return ProcessInfo(name, kind, address, command, str(self.dir / "logs" / f"{name}.log"), metrics_address=metrics_address)

    def _tls_args(self, name: str) -> list[str]:
        if not self.state.tls:
            return []
        directory = Path(self.state.tls["dir"])
        cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
        if not cert.exists():
            certs.issue(directory, name, server=True, common_name=SERVICE_PRINCIPAL_NAME)
        args = ["--tls-ca", self.state.tls["ca"], "--tls-cert", str(cert), "--tls-key", str(key),
                "--zookeeper-auth-file", self.state.tls["zookeeper_auth"],
                "--authorizer", "acl", "--super-users", f"User:{ADMIN};User:{SERVICE_PRINCIPAL_NAME}"]
        if self.state.tls.get("jwks"):
            args += ["--tls-client-auth", "none", "--jwt-jwks-file", self.state.tls["jwks"], "--jwt-issuer", certs.TOKEN_ISSUER,
                     "--token-file", str(directory / f"{SERVICE_PRINCIPAL_NAME}.token")]
        return args

    def _enable_tokens(self) -> None:
        """Callers authenticate by bearer token instead of certificate: a
        signing key and its JWKS under DIR/tls, tokens for the admin and the
        services (the servers then ask for no client certificate)."""
        directory = Path(self.state.tls["dir"])
        self.state.tls["jwks"] = str(certs.create_token_key(directory))
        certs.issue_token(directory, SERVICE_PRINCIPAL_NAME)
        self.state.tls["token"] = str(certs.issue_token(directory, ADMIN))

    def _enable_tls(self) -> None:
        """A throwaway CA under DIR/tls, the super user's certificate for local
        clients, and the services' ZooKeeper digest identity (their znodes are
        then changeable by them only)."""
        directory = self.dir / "tls"
        ca = certs.create_ca(directory)
        cert, key = certs.issue(directory, ADMIN)
        zookeeper_auth = directory / "zookeeper-auth"
        if not zookeeper_auth.exists():
            zookeeper_auth.write_text(f"txlog:{secrets.token_urlsafe(24)}\n")
            zookeeper_auth.chmod(0o600)
        self.state.tls = {"dir": str(directory), "ca": str(ca), "cert": str(cert), "key": str(key),
                          "zookeeper_auth": str(zookeeper_auth)}

    def client_tls(self) -> dict[str, str]:
        """The SDK's tls_ca= / tls_cert= / tls_key= (or, with tokens, tls_ca=
        / token_file=) for the admin of this cluster ({} without TLS)."""
        if not self.state or not self.state.tls:
            return {}
        if self.state.tls.get("token"):
            return {"tls_ca": self.state.tls["ca"], "token_file": self.state.tls["token"]}
        return {"tls_ca": self.state.tls["ca"], "tls_cert": self.state.tls["cert"], "tls_key": self.state.tls["key"]}

    # --- lifecycle ------------------------------------------------------------------

    def up(
        self,
        *,
        producer_id_svcs: int = 1,
        partition_svcs: int = 2,
        coordinator_svcs: int = 2,
        service_args: dict[str, list[str]] | None = None,
        tls: bool = False,
        tokens: bool = False,
        zookeeper: str | None = None,
    ) -> ClusterState:
        """Starts ZooKeeper and the services; returns when every one is healthy.
        ``service_args`` adds flags per kind, e.g. {"partition_svc": ["--fsync", "false"]};
        ``tls``: mutual TLS on every port, with certificates from a throwaway CA;
        ``tokens`` (with tls): callers authenticate by bearer token instead;
        ``zookeeper``: a running ZooKeeper's connection string to use instead of
        starting one, with a chroot of this cluster's own (``host:port/name``,
        created if missing), so clusters sharing a ZooKeeper never meet."""
        if tokens and not tls:
            raise ClusterError("tokens are sent only over TLS: tokens=True needs tls=True")
        service_args = service_args or {}
        if self.state is not None and any(pid_alive(p.pid) for p in self.state.services.values()):
            raise ClusterError(f"a cluster is already running from {self.dir}; run `txlog cluster down --dir {self.dir}` first")
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        own_zookeeper = self._zookeeper_process(free_port()) if zookeeper is None else None
        if zookeeper is not None:
            create_chroot(zookeeper)
        self.state = ClusterState(dir=str(self.dir), zookeeper=own_zookeeper.address if own_zookeeper else zookeeper)
        if tls:
            self._enable_tls()
            if tokens:
                self._enable_tokens()
        try:
            if own_zookeeper is not None:
                self.state.services[own_zookeeper.name] = own_zookeeper
                self._launch(own_zookeeper)
                self._save()
                self.wait_ready(own_zookeeper.name)
            for node_id in range(producer_id_svcs):
                self.add_service("producer_id_svc", node_id, service_args.get("producer_id_svc"))
            for node_id in range(partition_svcs):
                self.add_service("partition_svc", node_id, service_args.get("partition_svc"))
            for node_id in range(coordinator_svcs):
                self.add_service("coordinator_svc", node_id, service_args.get("coordinator_svc"))
        except BaseException:
            self.down()
            raise
        return self.state

    def add_service(self, kind: str, node_id: int, extra_args: list[str] | None = None, *, wait: bool = True) -> ProcessInfo:
        """Starts one more service process (``kind`` is its package: producer_id_svc, ...)."""
        if kind in DATA_DIR_KINDS:
            extra_args = ["--data-dir", str(self.dir / f"{kind}-{node_id}"), *(extra_args or [])]
        info = self._service_process(kind, node_id, free_port(), extra_args)
        if info.name in self.state.services:
            raise ClusterError(f"{info.name} exists already")
        self.state.services[info.name] = info
        self.state.bootstrap = ",".join(p.address for p in self.state.services.values() if p.kind == "partition_svc")
        self._launch(info)
        self._save()
        if wait:
            self.wait_ready(info.name)
        return info

    def _launch(self, info: ProcessInfo) -> None:
        with open(info.log, "ab") as log_file:
            child = subprocess.Popen(
                info.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                env=self.env,
                start_new_session=True,  # outlives `txlog cluster up`; signals reach only it
            )
        self._children[child.pid] = child
        info.pid = child.pid

    def wait_ready(self, name: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        info = self.state.services[name]
        deadline = time.monotonic() + timeout_s
        tls = self.state.tls
        probe = zookeeper_serving if info.kind == "zookeeper" else lambda address: health_serving(address, tls=tls)
        while time.monotonic() < deadline:
            if not pid_alive(info.pid):
                raise ClusterError(f"{name} exited during start-up; see {info.log}:\n{tail(info.log)}")
            if probe(info.address):
                return
            time.sleep(0.1)
        raise ClusterError(f"{name} was not ready within {timeout_s:.0f} s; see {info.log}:\n{tail(info.log)}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Sends ``sig`` (default SIGKILL) to one process and, for a fatal
        signal, waits until it is gone."""
        info = self._info(name)
        if not pid_alive(info.pid):
            return
        os.kill(info.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self._wait_exit(info.pid, STOP_GRACE_S if sig == signal.SIGTERM else 10.0)

    def stop(self, name: str, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to one process, SIGKILL after the grace period; its exit status
        when it is a child of this process (None otherwise)."""
        info = self._info(name)
        child = self._children.get(info.pid)
        if pid_alive(info.pid):
            os.kill(info.pid, signal.SIGTERM)
        if child is not None:
            try:
                return child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait()
        self._wait_exit(info.pid, grace_s)
        return None

    def start(self, name: str, *, wait: bool = True) -> None:
        """Starts one process again with the same command, data and address."""
        info = self._info(name)
        if pid_alive(info.pid):
            raise ClusterError(f"{name} is still running (pid {info.pid})")
        self._launch(info)
        self._save()
        if wait:
            self.wait_ready(name)

    def wait_until_coordinators_settle(self, timeout_s: float = 60) -> None:
        """Until every __transaction_state partition is owned by the coordinator the
        balancing rule names (the first coordinator up takes them all, the others their
        share a moment later) and every coordinator answers for what it owns: before
        that, a transaction may meet a partition moving (retriable, but slow)."""
        import posixpath

        from services.coordination import coordinators, zk
        from txlog.protocol import TRANSACTION_STATE_TOPIC
        from txlog.v1 import coordinator_pb2, coordinator_pb2_grpc

        nodes = sorted(int(n.rsplit("-", 1)[1]) for n, p in self.state.services.items() if p.kind == "coordinator_svc")
        addresses = [p.address for p in self.state.services.values() if p.kind == "coordinator_svc"]
        client = zk.connect(self.state.zookeeper)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    owners_path = coordinators.owners_path(self.state.zookeeper_root)
                    topic = json.loads(client.get(posixpath.join(
                        self.state.zookeeper_root, "topics", TRANSACTION_STATE_TOPIC))[0])
                    owners = [coordinators.PartitionOwner.decode(client.get(posixpath.join(owners_path, str(i)))[0]).node_id
                              for i in range(topic["partitions"])]
                    if owners == [nodes[i % len(nodes)] for i in range(len(owners))]:
                        for address in addresses:
                            with sync_channel(address, self.state.tls) as channel:
                                coordinator_pb2_grpc.CoordinatorServiceStub(channel).ListTransactions(
                                    coordinator_pb2.ListTransactionsRequest(local_only=True), timeout=5)
                        return
                except Exception:  # not created, not owned, or still loading: look again
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError("the coordinators did not settle who owns which transaction log partition")
                time.sleep(0.2)
        finally:
            client.stop()
            client.close()

    def down(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to every process (services before ZooKeeper), SIGKILL after the grace period.
        The processes are those cluster.json names now: another LocalCluster of
        the same folder (a CLI call, a test) may have started some again."""
        if (self.dir / STATE_FILE).exists():
            self.state = ClusterState.from_json((self.dir / STATE_FILE).read_text())
        if self.state is None:
            return
        ordered = sorted(self.state.services.values(), key=lambda p: p.kind == "zookeeper")
        for info in ordered:
            if info.kind == "zookeeper":
                for other in ordered:
                    if other.kind != "zookeeper":
                        self._wait_exit(other.pid, grace_s)
            if pid_alive(info.pid):
                os.kill(info.pid, signal.SIGTERM)
        for info in ordered:
            self._wait_exit(info.pid, grace_s)

    def _wait_exit(self, pid: int, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while pid_alive(pid) and time.monotonic() < deadline:
            self._reap(pid)
            time.sleep(0.05)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            while pid_alive(pid):
                self._reap(pid)
                time.sleep(0.05)
        self._reap(pid)

    def _reap(self, pid: int) -> None:
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            self._children.pop(pid, None)

    def status(self) -> dict[str, dict]:
        return {
            name: {"kind": info.kind, "address": info.address, "pid": info.pid, "alive": pid_alive(info.pid),
                   **({"metrics_address": info.metrics_address} if info.metrics_address else {})}
            for name, info in self.state.services.items()
        }

    def _info(self, name: str) -> ProcessInfo:
        if self.state is None:
            raise ClusterError(f"no cluster in {self.dir} (no {STATE_FILE}); run `txlog cluster up --dir {self.dir}`")
        if name not in self.state.services:
            raise ClusterError(f"no process named {name!r}; known: {', '.join(self.state.services)}")
        return self.state.services[name]

    def _save(self) -> None:
        path = self.dir / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.state.to_json())
        os.replace(tmp, path)

    def address(self, name: str) -> str:
        return self._info(name).address


def tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")
    except OSError:
        return "(no log)"
