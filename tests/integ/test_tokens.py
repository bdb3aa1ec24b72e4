"""Bearer tokens through the real services (issue 15): a cluster started
with ``tls=True, tokens=True`` (``txlog cluster up --tls --tokens``) asks for
no client certificate; every caller, the services among themselves too,
names its principal with a signed JWT, which the authorizer then checks like
a certificate's. A call without a token, or with one that is expired, forged
or signed by another key, is refused UNAUTHENTICATED (AUTHENTICATION_FAILED)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import grpc
import pytest

from services.security import certs, tokens
from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer, Producer, TopicPartition
from txlog.cli import program as cli
from txlog.errors import ClientError
from txlog.net.tls import BearerToken
from txlog.protocol import errors
from txlog.protocol.acls import ALLOW, LITERAL, TOPIC, AclBinding
from txlog.two_phase import wait_until
from txlog.v1 import partition_pb2, partition_pb2_grpc

TOPIC_NAME = "by-token"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("tokens") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=1, tls=True, tokens=True)
    local.wait_until_coordinators_settle()
    with Admin(local.state.bootstrap, **local.client_tls()) as admin:
        admin.create_topics([(TOPIC_NAME, 1, 2)])
    yield local
    local.down()


def tls_dir(cluster) -> Path:
    return Path(cluster.state.tls["dir"])


def metadata_call(cluster, credentials: grpc.ChannelCredentials) -> partition_pb2.MetadataResponse:
    address = cluster.state.bootstrap.split(",")[0]
    with grpc.secure_channel(address, credentials) as channel:
        return partition_pb2_grpc.PartitionServiceStub(channel).Metadata(partition_pb2.MetadataRequest(all_topics=True), timeout=10)


def with_token(cluster, token_path: Path) -> grpc.ChannelCredentials:
    ca = Path(cluster.state.tls["ca"]).read_bytes()
    return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(ca), grpc.metadata_call_credentials(BearerToken(str(token_path))))


def refusal(call) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    error = errors.from_rpc_error(refused.value)
    return refused.value.code(), errors.ErrorCode.Name(error.code), error.message


def test_the_admins_token_runs_transactions_through_services_that_call_one_another_with_theirs(cluster):
    with Producer(cluster.state.bootstrap, transactional_id="token-app", **cluster.client_tls()) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC_NAME, value=b"committed", partition=0)
        producer.commit_transaction()  # coordinator -> partition_svc markers, authorized by the services' token
    with Consumer(cluster.state.bootstrap, isolation_level="read_committed", **cluster.client_tls()) as consumer:
        consumer.assign([TopicPartition(TOPIC_NAME, 0)])
        consumer.seek_to_beginning()
        values = []
        wait_until(lambda: values.extend(r.value for r in consumer.poll(timeout_s=0.5)) or b"committed" in values, 60,
                   "the committed record read back")
    assert values == [b"committed"]


def test_a_principals_token_is_authorized_by_acls(cluster):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["tls", "token", "--dir", cluster.state.dir, "carol"]) == 0
    issued = json.loads(out.getvalue())
    assert issued["principal"] == "User:carol" and Path(issued["token_file"]).exists()
    carol = {"tls_ca": issued["tls_ca"], "token_file": issued["token_file"]}
    with Admin(cluster.state.bootstrap, **carol) as admin:
        assert admin.list_topics() == []  # authenticated as carol, allowed nothing yet
    with Producer(cluster.state.bootstrap, enable_idempotence=False, acks=1, **carol) as producer:
        with pytest.raises(ClientError) as refused:
            producer.send(TOPIC_NAME, value=b"x", partition=0).result(timeout=30)
    assert "TOPIC_AUTHORIZATION_FAILED" in str(refused.value) and "User:carol" in str(refused.value)
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as admin:
        admin.create_acls([AclBinding(TOPIC, LITERAL, TOPIC_NAME, "User:carol", "*", "Describe", ALLOW)])
    with Admin(cluster.state.bootstrap, **carol) as admin:
        wait_until(lambda: admin.list_topics() == [TOPIC_NAME], 30, "carol's grant reaching every instance")


def test_calls_without_a_valid_token_are_refused_unauthenticated(cluster, tmp_path):
    ca = Path(cluster.state.tls["ca"]).read_bytes()
    code, name, message = refusal(lambda: metadata_call(cluster, grpc.ssl_channel_credentials(ca)))
    assert (code, name) == (grpc.StatusCode.UNAUTHENTICATED, "AUTHENTICATION_FAILED") and "neither" in message

    expired = certs.issue_token(tls_dir(cluster), "expired-user", lifetime_s=-3600)
    code, name, message = refusal(lambda: metadata_call(cluster, with_token(cluster, expired)))
    assert (code, name) == (grpc.StatusCode.UNAUTHENTICATED, "AUTHENTICATION_FAILED") and "expired" in message

    forged = tmp_path / "forged.token"
    header, body, signature = certs.issue_token(tls_dir(cluster), "mallory").read_text().strip().split(".")
    claims = json.loads(tokens.b64url_decode(body))
    claims["sub"] = "admin"  # the signature no longer covers the claims
    forged.write_text(".".join([header, tokens.b64url_encode(json.dumps(claims).encode()), signature]))
    code, name, message = refusal(lambda: metadata_call(cluster, with_token(cluster, forged)))
    assert (code, name) == (grpc.StatusCode.UNAUTHENTICATED, "AUTHENTICATION_FAILED") and "signature" in message

    other_key = tmp_path / "other"
    certs.create_token_key(other_key)
    code, name, message = refusal(lambda: metadata_call(cluster, with_token(cluster, certs.issue_token(other_key, "admin"))))
    assert (code, name) == (grpc.StatusCode.UNAUTHENTICATED, "AUTHENTICATION_FAILED") and "signature" in message


def test_a_refreshed_token_file_is_used_without_a_new_client(cluster, tmp_path):
    token = tmp_path / "rotating.token"
    token.write_text(certs.issue_token(tls_dir(cluster), "nobody").read_text())
    with Admin(cluster.state.bootstrap, tls_ca=cluster.state.tls["ca"], token_file=str(token)) as admin:
        assert TOPIC_NAME not in admin.list_topics()
        token.write_text(Path(cluster.state.tls["token"]).read_text())  # the admin's: a super user
        wait_until(lambda: TOPIC_NAME in admin.list_topics(), 30, "the refreshed token's principal")
