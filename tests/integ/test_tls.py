"""Mutual TLS on every port through the real services (issue 15, first part):
a cluster started with ``tls=True`` (what ``txlog cluster up --tls`` does)
serves only clients with a certificate its CA signed, its services talk to
each other over TLS (transactions go coordinator -> partition_svc, replicas
fetch from leaders), and a rotated server certificate is used for new
connections without a restart."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from services.security import certs
from services.tooling.cluster import SERVICE_PRINCIPAL_NAME, LocalCluster, free_port
from txlog import Admin, Consumer, Producer, TopicPartition
from txlog.cli import program as cli
from txlog.errors import ClientError
from txlog.two_phase import wait_until
from txlog.v1 import producer_id_pb2, producer_id_pb2_grpc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("tls") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=1, tls=True,
             service_args={"producer_id_svc": ["--health-listen", f"127.0.0.1:{free_port()}"]})
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)


def check(address: str, credentials: grpc.ChannelCredentials | None) -> str:
    """The health answer of ``address`` over a fresh connection, or the failure's status code name."""
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def credentials(ca: Path, cert: Path | None = None, key: Path | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes() if key else None, cert.read_bytes() if cert else None)


def test_transactions_and_replication_work_over_mutual_tls(cluster):
    tls = cluster.client_tls()
    with Admin(cluster.state.bootstrap, **tls) as admin:
        admin.create_topics([("secure", 2, 2)])
    with Producer(cluster.state.bootstrap, transactional_id="tls-tx", **tls) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send("secure", f"v{i}".encode(), partition=i % 2)
        producer.commit_transaction()
    with Consumer(cluster.state.bootstrap, isolation_level="read_committed", **tls) as consumer:
        consumer.assign([TopicPartition("secure", 0), TopicPartition("secure", 1)])
        read = []
        wait_until(lambda: read.extend(r.value for r in consumer.poll(0.5)) or len(read) >= 10, 60, "the committed records")
    assert sorted(read) == sorted(f"v{i}".encode() for i in range(10))
    with Admin(cluster.state.bootstrap, **tls) as admin:  # followers fetch from their leaders over TLS
        wait_until(lambda: all(len(p.isr) == 2 for p in admin.describe_topics(["secure"])[0].partitions), 60,
                   "both replicas of each partition in sync")


def test_clients_without_a_certificate_of_the_cluster_ca_cannot_connect(cluster, tmp_path):
    address = cluster.state.bootstrap.split(",")[0]
    ca = Path(cluster.state.tls["ca"])
    stranger_ca = certs.create_ca(tmp_path / "other")
    stranger_cert, stranger_key = certs.issue(tmp_path / "other", "mallory")
    assert check(address, credentials(ca, Path(cluster.state.tls["cert"]), Path(cluster.state.tls["key"]))) == "SERVING"
    assert check(address, None) == "UNAVAILABLE"  # plaintext
    assert check(address, credentials(ca)) == "UNAVAILABLE"  # TLS without a client certificate
    assert check(address, credentials(ca, stranger_cert, stranger_key)) == "UNAVAILABLE"  # signed by another CA
    assert check(address, credentials(stranger_ca, Path(cluster.state.tls["cert"]), Path(cluster.state.tls["key"]))) == "UNAVAILABLE"
    with pytest.raises(ClientError) as refused, Admin(cluster.state.bootstrap, default_api_timeout_ms=3000) as admin:
        admin.list_topics()
    assert "UNAVAILABLE" in str(refused.value) and "a cluster that runs TLS needs tls_ca" in str(refused.value)
    with pytest.raises(ClientError) as refused, Admin(cluster.state.bootstrap, default_api_timeout_ms=3000,
                                                      tls_ca=str(ca)) as admin:
        admin.list_topics()
    assert "accept its tls_cert when they require one" in str(refused.value)


def test_the_cli_issues_a_client_certificate_that_connects(cluster):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["tls", "issue", "--dir", cluster.state.dir, "alice"]) == 0
    tls_dir = Path(cluster.state.tls["dir"])
    assert '"principal": "User:alice"' in out.getvalue()
    alice = ["--bootstrap", cluster.state.bootstrap, "--tls-ca", str(tls_dir / "ca.pem"),
             "--tls-cert", str(tls_dir / "alice.pem"), "--tls-key", str(tls_dir / "alice-key.pem")]

    def listed_by_alice() -> str:
        with contextlib.redirect_stdout(io.StringIO()) as listed:
            assert cli.main(["topics", "list", *alice]) == 0
        return listed.getvalue()

    # connected, and authenticated as User:alice: the authorizer (on with --tls) lists her no topic until an ACL allows
    assert listed_by_alice() == ""
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["acls", "add", "--dir", cluster.state.dir, "--allow", "User:alice", "--operation", "Describe",
                         "--topic", "__transaction_state"]) == 0
    wait_until(lambda: listed_by_alice() == "__transaction_state\n", 30, "alice allowed to describe __transaction_state")
    # describing the controller and the instances needs Describe on the Cluster: without it, the rest is printed
    with contextlib.redirect_stdout(io.StringIO()) as described:
        assert cli.main(["cluster", "describe", *alice]) == 0
    cluster_view = json.loads(described.getvalue())
    assert cluster_view["controller_id"] is None and cluster_view["instances"] is None
    assert cluster_view["cluster_error"].startswith("CLUSTER_AUTHORIZATION_FAILED") and cluster_view["partition_svcs"]


def test_a_rotated_server_certificate_serves_new_connections_without_a_restart(cluster, tmp_path):
    """partition_svc-1's certificate files are replaced by one a new CA signed:
    new connections get it at once (clients trusting only the old CA are
    refused, clients trusting the new one connect), and the process is the
    same one."""
    name = "partition_svc-1"
    address, pid = cluster.state.services[name].address, cluster.state.services[name].pid
    tls_dir = Path(cluster.state.tls["dir"])
    admin_cert, admin_key = tls_dir / "admin.pem", tls_dir / "admin-key.pem"
    old_ca = tls_dir / "ca.pem"
    new_ca = certs.create_ca(tmp_path / "rotated")
    new_cert, new_key = certs.issue(tmp_path / "rotated", name, server=True, common_name=SERVICE_PRINCIPAL_NAME)
    both = tmp_path / "both.pem"
    both.write_bytes(old_ca.read_bytes() + new_ca.read_bytes())
    assert check(address, credentials(old_ca, admin_cert, admin_key)) == "SERVING"
    saved = {path: path.read_bytes() for path in (tls_dir / f"{name}.pem", tls_dir / f"{name}-key.pem")}
    try:
        shutil.copy(new_key, tls_dir / f"{name}-key.pem")
        shutil.copy(new_cert, tls_dir / f"{name}.pem")
        wait_until(lambda: check(address, credentials(new_ca, admin_cert, admin_key)) == "SERVING", 30,
                   "the rotated certificate served")
        assert check(address, credentials(old_ca, admin_cert, admin_key)) == "UNAVAILABLE"
        assert check(address, credentials(both, admin_cert, admin_key)) == "SERVING"
        assert cluster.state.services[name].pid == pid and cluster.status()[name]["alive"]
    finally:  # the original certificate back, so the other instances reach it again
        for path, data in saved.items():
            path.write_bytes(data)
        wait_until(lambda: check(address, credentials(old_ca, admin_cert, admin_key)) == "SERVING", 30,
                   "the original certificate served again")


def test_the_health_only_port_answers_probes_in_plaintext_and_serves_nothing_else(cluster):
    """--health-listen: what a Kubernetes gRPC probe (no TLS) can reach; the main port stays mutual TLS."""
    command = cluster.state.services["producer_id_svc-0"].command
    address = command[command.index("--health-listen") + 1]
    assert check(address, None) == "SERVING"
    assert check(cluster.state.services["producer_id_svc-0"].address, None) == "UNAVAILABLE"
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            producer_id_pb2_grpc.ProducerIdServiceStub(channel).AllocateProducerIds(
                producer_id_pb2.AllocateProducerIdsRequest(requester_id=1), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_znodes_of_a_secured_cluster_are_readable_by_anyone_and_changeable_only_by_the_services(cluster):
    """--zookeeper-auth-file: every znode the services made carries their digest identity's ACL."""
    identity = Path(cluster.state.tls["zookeeper_auth"]).read_text().strip()
    topic_path = "/txlog/topics/__transaction_state"
    stranger = KazooClient(hosts=cluster.state.zookeeper)
    stranger.start(timeout=30)
    try:
        data, _ = stranger.get(topic_path)  # reading is open: operators and tools can look
        assert json.loads(data)["partitions"] >= 1
        for change in (lambda: stranger.set(topic_path, b"{}"), lambda: stranger.delete("/txlog/controller_epoch"),
                       lambda: stranger.create(topic_path + "/forged", b"x"),
                       lambda: stranger.create("/txlog/services/partition_svc/99", b"{}")):
            with pytest.raises(NoAuthError):
                change()
        acls, _ = stranger.get_acls(topic_path)
        assert {(acl.id.scheme, acl.perms) for acl in acls} == {("digest", Permissions.ALL), ("world", Permissions.READ)}
        assert stranger.get(topic_path)[0] == data  # nothing changed
    finally:
        stranger.stop()
        stranger.close()
    owner = KazooClient(hosts=cluster.state.zookeeper, auth_data=[("digest", identity)])
    owner.start(timeout=30)
    try:  # the ACL is the services' identity: with it, a change is allowed
        owner.create("/txlog/acl-probe", b"x")
        owner.delete("/txlog/acl-probe")
    finally:
        owner.stop()
        owner.close()


def test_a_service_with_an_unusable_zookeeper_auth_file_exits_2_naming_it(tmp_path):
    (tmp_path / "auth").write_text("no-colon-here\n")
    done = subprocess.run([sys.executable, "-m", "producer_id_svc", "--zookeeper-auth-file", str(tmp_path / "auth"),
                           "--zookeeper", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "must hold one line user:password" in done.stderr, done.stderr[-500:]
