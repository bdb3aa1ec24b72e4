"""Transaction check-back on a cluster that runs mutual TLS and the ACL
authorizer (issues 15 and 19), through the real services: a coordinator
dials a group's checker over TLS with its own service certificate, as it
dials the other services, verifying the checker's certificate against the
cluster's CA and the address registered; a checker it cannot verify -- one
served in plaintext, one whose certificate does not name the address, one
signed by another CA -- is never asked (the coordinator does not fall back
to plaintext): each check counts as an attempt nobody answered, and nothing
commits.

The checker's own principal (``User:checker``) is granted exactly what its
calls to the coordinator need: Write on the transaction group's
TransactionalId (RegisterTransactionChecker, UnregisterTransactionChecker).
"""

from __future__ import annotations

import json
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from services.security import certs
from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer, Producer, TopicPartition, TransactionChecker
from txlog.errors import ClientError
from txlog.protocol.acls import ALLOW, LITERAL, TRANSACTIONAL_ID, AclBinding
from txlog.two_phase import wait_until
from txlog.v1 import transaction_check_pb2, transaction_check_pb2_grpc

CHECKER = "checker"  # its certificate's CN: User:checker
INTERVAL_MS = "500"  # the groups' transaction.check.interval.ms
SETTLE_S = 60  # the longest an outcome may take to show
VERIFIED_GROUP = "tls-orders"
# checkers the coordinator cannot verify over TLS -> what its failed dial says (gRPC's words, lowered)
UNVERIFIABLE = {"plaintext": "tls handshake failed", "wrong-host": "hostname verification check failed",
                "foreign-ca": "certificate_verify_failed"}
GROUPS = (VERIFIED_GROUP, *(f"unverified-{case}" for case in UNVERIFIABLE))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("check-back-tls") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=1, tls=True,
             service_args={"coordinator_svc": ["--transaction-check-interval-ms", "200"]})
    local.wait_until_coordinators_settle()
    certs.issue(Path(local.state.tls["dir"]), CHECKER, server=True)  # serves 127.0.0.1 and localhost, and is a client
    with Admin(local.state.bootstrap, **local.client_tls()) as admin:
        admin.create_acls([AclBinding(TRANSACTIONAL_ID, LITERAL, group, f"User:{CHECKER}", "*", "Write", ALLOW)
                           for group in GROUPS])
        for group in GROUPS:
            admin.alter_transaction_group_config(group, {"transaction.check.interval.ms": INTERVAL_MS})
    with Admin(local.state.bootstrap, **checker_client(local)) as as_checker:
        for group in GROUPS:
            wait_until(lambda group=group: may_register(as_checker, group), 30, f"User:{CHECKER}'s grant on {group} in force")
    yield local
    local.down(grace_s=5)


@pytest.fixture(scope="module")
def admin(cluster):
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as client:
        yield client


def checker_client(cluster) -> dict[str, str]:
    """The TLS options of the checker's calls to the coordinator: its CA-issued certificate."""
    directory = Path(cluster.state.tls["dir"])
    return {"tls_ca": cluster.state.tls["ca"], "tls_cert": str(directory / f"{CHECKER}.pem"),
            "tls_key": str(directory / f"{CHECKER}-key.pem")}


def may_register(as_checker: Admin, group: str) -> bool:
    """Whether the coordinator lets User:checker (un)register checkers of ``group`` (removing nothing)."""
    try:
        as_checker.unregister_transaction_checker(group, "127.0.0.1:9", timeout_s=5)
        return True
    except ClientError as exc:
        assert "AUTHORIZATION_FAILED" in exc.name, exc
        return False


def served_over_tls(cert: Path, key: Path, cluster_ca: Path) -> grpc.ServerCredentials:
    """A checker's server credentials: its certificate, and only clients with a certificate the cluster's CA signed."""
    return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())], root_certificates=cluster_ca.read_bytes(),
                                       require_client_auth=True)


def prepare_and_go_silent(cluster, admin: Admin, group: str, metadata: bytes) -> str:
    """A transaction of ``group`` prepared with ``metadata`` by a producer that closes without completing it."""
    transactional_id, topic = f"{group}/owner-1", f"{group}-events"
    admin.create_topics([(topic, 1, 1)])
    with Producer(cluster.state.bootstrap, transactional_id=transactional_id, **cluster.client_tls()) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"the event", partition=0)
        producer.prepare_transaction(metadata=metadata)
    assert admin.describe_transactions([transactional_id])[0].state == "Prepared"
    return transactional_id


def state_of(admin: Admin, transactional_id: str) -> str:
    return admin.describe_transactions([transactional_id])[0].state


def dial_errors(cluster, group: str) -> list[str]:
    """Why the coordinator's calls to ``group``'s checkers failed, from its log."""
    (coordinator,) = (p for p in cluster.state.services.values() if p.kind == "coordinator_svc")
    errors = []
    for line in Path(coordinator.log).read_text().splitlines():
        if "a transaction checker did not answer" not in line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written as it was read
        if record["group_id"] == group:
            errors.append(record["error"])
    return errors


def test_a_checker_served_over_tls_with_a_cluster_certificate_commits_the_silent_owners_transaction(cluster, admin):
    tls_dir, ca = Path(cluster.state.tls["dir"]), Path(cluster.state.tls["ca"])
    transactional_id = prepare_and_go_silent(cluster, admin, VERIFIED_GROUP, b"order-7")
    seen = []

    def check(tid: str, metadata: bytes) -> str:
        seen.append((tid, metadata))
        return "COMMIT"

    credentials = served_over_tls(tls_dir / f"{CHECKER}.pem", tls_dir / f"{CHECKER}-key.pem", ca)
    with TransactionChecker(cluster.state.bootstrap, VERIFIED_GROUP, check, server_credentials=credentials,
                            **checker_client(cluster)) as checker:
        assert checker.address.startswith("127.0.0.1:")  # what the coordinator dials: the certificate names it
        wait_until(lambda: state_of(admin, transactional_id) == "CompleteCommit", SETTLE_S, "the COMMIT answer applied")
        # a caller without a certificate of the cluster's CA cannot ask it
        with grpc.secure_channel(checker.address, grpc.ssl_channel_credentials(ca.read_bytes())) as channel, \
                pytest.raises(grpc.RpcError) as refused:
            transaction_check_pb2_grpc.TransactionCheckServiceStub(channel).CheckTransaction(
                transaction_check_pb2.CheckTransactionRequest(transactional_id=transactional_id), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        answered = checker.checks_answered
    assert seen == [(transactional_id, b"order-7")] and answered == {"COMMIT": 1, "ABORT": 0, "UNKNOWN": 0}

    tp = TopicPartition(f"{VERIFIED_GROUP}-events", 0)
    with Consumer(cluster.state.bootstrap, isolation_level="read_committed", **cluster.client_tls()) as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        read = []
        wait_until(lambda: read.extend(r.value for r in consumer.poll(0.5)) or consumer.position(tp) >= end, 30,
                   "read_committed to the partition's end")
    assert read == [b"the event"]


@pytest.mark.parametrize("case", list(UNVERIFIABLE))
def test_a_checker_the_coordinator_cannot_verify_over_tls_is_never_asked_and_nothing_commits(cluster, admin, tmp_path, case):
    group = f"unverified-{case}"
    tls_dir, ca = Path(cluster.state.tls["dir"]), Path(cluster.state.tls["ca"])
    if case == "plaintext":
        credentials = None
    elif case == "wrong-host":  # the cluster's CA, but naming only localhost: the coordinator dials 127.0.0.1
        credentials = served_over_tls(*certs.issue(tls_dir, "checker-localhost", server=True, hosts=("localhost",)), ca)
    else:  # names 127.0.0.1, but signed by a CA the coordinator does not trust
        certs.create_ca(tmp_path / "other")
        credentials = served_over_tls(*certs.issue(tmp_path / "other", "stranger", server=True), ca)
    transactional_id = prepare_and_go_silent(cluster, admin, group, b"order-8")
    called = threading.Event()

    def check(tid: str, metadata: bytes) -> str:
        called.set()
        return "COMMIT"

    with TransactionChecker(cluster.state.bootstrap, group, check, server_credentials=credentials,
                            **checker_client(cluster)) as checker:
        wait_until(lambda: admin.describe_transactions([transactional_id])[0].checks_done >= 2, SETTLE_S,
                   "two checks counted")
        answered = checker.checks_answered
    unanswered = admin.describe_transactions([transactional_id])[0]
    assert unanswered.state == "Prepared" and unanswered.last_check_answer == "UNKNOWN", unanswered
    assert not called.is_set() and answered == {"COMMIT": 0, "ABORT": 0, "UNKNOWN": 0}
    errors = dial_errors(cluster, group)
    assert errors and all(e.startswith("UNAVAILABLE") and UNVERIFIABLE[case] in e.lower() for e in errors), errors
    tp = TopicPartition(f"{group}-events", 0)
    assert admin.list_offsets({tp: "last_stable"})[tp].offset == 0  # the prepared record stays invisible


class CapturingChecker(transaction_check_pb2_grpc.TransactionCheckServiceServicer):
    """A checker that keeps the metadata of the calls it receives (what the coordinator sends with them)."""

    def __init__(self):
        self.metadata: list[dict[str, str]] = []

    def CheckTransaction(self, request, context):  # noqa: N802 -- the rpc's name
        self.metadata.append(dict(context.invocation_metadata()))
        return transaction_check_pb2.CheckTransactionResponse(answer=transaction_check_pb2.TRANSACTION_CHECK_ANSWER_COMMIT)


def test_the_coordinator_never_sends_its_bearer_token_to_a_checker(tmp_path):
    """Found by this suite: on a --tls --tokens cluster the coordinator dialled checkers with the
    channel it uses for the services, which sends its service token (a super user's) with every
    call; whoever registered an address for a group could collect it and act as that super user."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=1, tls=True, tokens=True,
             service_args={"coordinator_svc": ["--transaction-check-interval-ms", "200"]})
    try:
        local.wait_until_coordinators_settle()
        cert, key = certs.issue(Path(local.state.tls["dir"]), "capture", server=True)
        capturing = CapturingChecker()
        server = grpc.server(futures.ThreadPoolExecutor(2))
        transaction_check_pb2_grpc.add_TransactionCheckServiceServicer_to_server(capturing, server)
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())]))
        server.start()
        try:
            with Admin(local.state.bootstrap, **local.client_tls()) as admin:
                admin.create_topics([("token-events", 1, 1)])
                admin.alter_transaction_group_config("token", {"transaction.check.interval.ms": INTERVAL_MS})
                admin.register_transaction_checker("token", f"127.0.0.1:{port}", 30_000)
                with Producer(local.state.bootstrap, transactional_id="token/1", **local.client_tls()) as producer:
                    producer.init_transactions()
                    producer.begin_transaction()
                    producer.send("token-events", b"x")
                    producer.prepare_transaction(metadata=b"m")
                wait_until(lambda: admin.describe_transactions(["token/1"])[0].state == "CompleteCommit", SETTLE_S,
                           "the checker's COMMIT applied")
        finally:
            server.stop(None)
        assert capturing.metadata and all("authorization" not in m for m in capturing.metadata), capturing.metadata
    finally:
        local.down(grace_s=5)
