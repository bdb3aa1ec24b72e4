"""The authorization matrix through the real services (issue 15): every RPC
of every service, called with raw gRPC on a cluster with mutual TLS and the
ACL authorizer, by three principals each:

- one that no ACL names: refused, PERMISSION_DENIED with the resource
  type's *_AUTHORIZATION_FAILED code, naming the principal;
- one granted every resource the RPC needs, but with another operation
  (one that implies nothing the RPC needs): refused the same way;
- one granted exactly what services/security/access.py says the RPC needs: not
  refused for authorization (it may still fail for protocol reasons: a
  producer id that does not exist, say).

Around the refusals, what is stored (topics, a partition's offsets, a
group's offsets, the ACLs) is read as the super user and must not change.
A client without a certificate cannot connect at all.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from services.security import access, certs
from services.tooling.cluster import LocalCluster
from txlog import Admin, Producer, TopicPartition
from txlog.protocol import errors
from txlog.protocol.acls import ALLOW, CLUSTER, CLUSTER_NAME, LITERAL, AclBinding, AclFilter
from txlog.protocol.acls import CLUSTER as CLU
from txlog.protocol.acls import GROUP as GRP
from txlog.protocol.acls import TOPIC as TOP
from txlog.protocol.acls import TRANSACTIONAL_ID as TXN_ID
from txlog.two_phase import wait_until
from txlog.v1 import (
    common_pb2,
    coordinator_pb2,
    partition_pb2,
    partition_pb2_grpc,
    producer_id_pb2,
    replication_pb2,
)

TOPIC, GROUP, TXN = "mx-topic", "mx-group", "mx-txn"
SERVICES = {service.name: service for module in (partition_pb2, coordinator_pb2, producer_id_pb2, replication_pb2)
            for service in module.DESCRIPTOR.services_by_name.values()}
TP = common_pb2.TopicPartition(topic=TOPIC, partition=0)
OFFSET = partition_pb2.PartitionOffset(topic=TOPIC, partition=0, offset=1)
BATCH = common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, records=[common_pb2.Record(value=b"x")])
HANDLE = coordinator_pb2.TransactionHandle(transactional_id=TXN, producer_id=1, producer_epoch=0)

# (service, rpc, the process kind that serves it, a request naming the matrix's resources)
CALLS: list[tuple[str, str, str, Message]] = [
    ("PartitionService", "Metadata", "partition_svc", partition_pb2.MetadataRequest(transactional_ids=[TXN], group_ids=[GROUP])),
    ("PartitionService", "CreateTopics", "partition_svc", partition_pb2.CreateTopicsRequest(
        topics=[partition_pb2.CreatableTopic(name="mx-created", partition_count=1)])),
    ("PartitionService", "Produce", "partition_svc", partition_pb2.ProduceRequest(
        acks=1, batches=[partition_pb2.PartitionBatch(topic=TOPIC, partition=0, batch=BATCH)])),
    ("PartitionService", "Fetch", "partition_svc", partition_pb2.FetchRequest(
        partitions=[partition_pb2.FetchPartition(topic=TOPIC, partition=0)])),
    ("PartitionService", "FetchStream", "partition_svc", partition_pb2.FetchStreamRequest(fetch=partition_pb2.FetchRequest(
        partitions=[partition_pb2.FetchPartition(topic=TOPIC, partition=0)]))),
    ("PartitionService", "ListOffsets", "partition_svc", partition_pb2.ListOffsetsRequest(
        partitions=[partition_pb2.ListOffsetsPartition(topic=TOPIC, partition=0, spec=partition_pb2.OFFSET_SPEC_LATEST)])),
    ("PartitionService", "EpochEndOffsets", "partition_svc", partition_pb2.EpochEndOffsetsRequest(
        partitions=[partition_pb2.EpochEndOffsetsPartition(topic=TOPIC, partition=0, leader_epoch=0, current_leader_epoch=-1)])),
    ("PartitionService", "WriteTxnMarkers", "partition_svc", partition_pb2.WriteTxnMarkersRequest(markers=[
        partition_pb2.TxnMarker(producer_id=1, producer_epoch=0, committed=True, coordinator_epoch=1_000_000, partitions=[TP])])),
    ("PartitionService", "OffsetCommit", "partition_svc", partition_pb2.OffsetCommitRequest(group_id=GROUP, offsets=[OFFSET])),
    ("PartitionService", "TxnOffsetCommit", "partition_svc", partition_pb2.TxnOffsetCommitRequest(
        transactional_id=TXN, group_id=GROUP, producer_id=1, producer_epoch=0, offsets=[OFFSET])),
    ("PartitionService", "OffsetFetch", "partition_svc", partition_pb2.OffsetFetchRequest(group_id=GROUP, partitions=[TP])),
    ("PartitionService", "DescribeProducers", "partition_svc", partition_pb2.DescribeProducersRequest(partitions=[TP])),
    ("PartitionService", "AlterPartitionReassignments", "partition_svc", partition_pb2.AlterPartitionReassignmentsRequest(
        reassignments=[partition_pb2.ReplicaAssignment(topic=TOPIC, partition=0, replicas=[0])])),
    ("PartitionService", "ListPartitionReassignments", "partition_svc", partition_pb2.ListPartitionReassignmentsRequest()),
    ("PartitionService", "CreateAcls", "partition_svc", partition_pb2.CreateAclsRequest(bindings=[partition_pb2.AclBinding(
        resource_type=partition_pb2.ACL_RESOURCE_TYPE_TOPIC, pattern_type=partition_pb2.ACL_PATTERN_TYPE_LITERAL,
        resource_name="mx-planted", principal="User:mallory", host="*", operation=partition_pb2.ACL_OPERATION_ALL,
        permission=partition_pb2.ACL_PERMISSION_ALLOW)])),
    ("PartitionService", "DescribeAcls", "partition_svc", partition_pb2.DescribeAclsRequest()),
    ("PartitionService", "DeleteAcls", "partition_svc", partition_pb2.DeleteAclsRequest(
        filters=[partition_pb2.AclBindingFilter(resource_name="mx-planted")])),  # only what CreateAcls planted: the grants stay
    ("PartitionService", "ConsumerGroupHeartbeat", "partition_svc", partition_pb2.ConsumerGroupHeartbeatRequest(
        group_id=GROUP, member_id="mx-member", member_epoch=0, subscribed_topics=partition_pb2.TopicNames(names=[TOPIC]))),
    ("PartitionService", "ListGroups", "partition_svc", partition_pb2.ListGroupsRequest()),
    ("PartitionService", "DescribeGroups", "partition_svc", partition_pb2.DescribeGroupsRequest(group_ids=[GROUP])),
    ("PartitionService", "DeleteGroups", "partition_svc", partition_pb2.DeleteGroupsRequest(group_ids=[GROUP])),
    ("PartitionService", "CreatePartitions", "partition_svc", partition_pb2.CreatePartitionsRequest(
        topics=[partition_pb2.PartitionsIncrease(topic=TOPIC, total_count=1)])),
    ("PartitionService", "AlterTopicConfigs", "partition_svc", partition_pb2.AlterTopicConfigsRequest(
        topics=[partition_pb2.TopicConfigChange(topic=TOPIC, set={"retention.ms": "86400000"})])),
    # a topic that never exists: the allowed caller's deletion answers UNKNOWN_TOPIC_OR_PARTITION, the matrix's topic stays
    ("PartitionService", "DeleteTopics", "partition_svc", partition_pb2.DeleteTopicsRequest(topics=["mx-deleted"], timeout_ms=1000)),
    ("PartitionService", "DeleteGroupOffsets", "partition_svc", partition_pb2.DeleteGroupOffsetsRequest(
        group_id=GROUP, partitions=[common_pb2.TopicPartition(topic=TOPIC, partition=0)])),
    # offset 0, the log start already: the allowed caller's deletion changes nothing
    ("PartitionService", "DeleteRecords", "partition_svc", partition_pb2.DeleteRecordsRequest(
        partitions=[partition_pb2.DeleteRecordsPartition(topic=TOPIC, partition=0, offset=0)], timeout_ms=1000)),
    ("ReplicationService", "LeaderAndIsr", "partition_svc", replication_pb2.LeaderAndIsrRequest(controller_id=0, controller_epoch=1_000_000)),
    ("ReplicationService", "ReplicaFetch", "partition_svc", replication_pb2.ReplicaFetchRequest(
        replica_id=1, partitions=[replication_pb2.ReplicaFetchPartition(topic=TOPIC, partition=0)])),
    ("ReplicationService", "OffsetForLeaderEpoch", "partition_svc", replication_pb2.OffsetForLeaderEpochRequest(
        replica_id=1, partitions=[replication_pb2.OffsetForLeaderEpochPartition(topic=TOPIC, partition=0)])),
    ("ProducerIdService", "AllocateProducerIds", "producer_id_svc", producer_id_pb2.AllocateProducerIdsRequest(requester_id=7)),
    ("CoordinatorService", "FindCoordinator", "coordinator_svc", coordinator_pb2.FindCoordinatorRequest(key=TXN)),
    ("CoordinatorService", "InitProducerId", "coordinator_svc", coordinator_pb2.InitProducerIdRequest(
        transactional_id=TXN, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1)),
    ("CoordinatorService", "AddPartitionsToTxn", "coordinator_svc", coordinator_pb2.AddPartitionsToTxnRequest(
        transactional_id=TXN, producer_id=1, producer_epoch=0, partitions=[TP])),
    ("CoordinatorService", "AddOffsetsToTxn", "coordinator_svc", coordinator_pb2.AddOffsetsToTxnRequest(
        transactional_id=TXN, producer_id=1, producer_epoch=0, group_id=GROUP)),
    ("CoordinatorService", "EndTxn", "coordinator_svc", coordinator_pb2.EndTxnRequest(
        transactional_id=TXN, producer_id=1, producer_epoch=0, committed=True)),
    ("CoordinatorService", "ListTransactions", "coordinator_svc", coordinator_pb2.ListTransactionsRequest()),
    ("CoordinatorService", "DescribeTransactions", "coordinator_svc", coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[TXN])),
    ("CoordinatorService", "AbortTransaction", "coordinator_svc", coordinator_pb2.AbortTransactionRequest(
        partition=TP, producer_id=1, producer_epoch=0, coordinator_epoch=1_000_000)),
    ("CoordinatorService", "PrepareTransaction", "coordinator_svc", coordinator_pb2.PrepareTransactionRequest(
        transactional_id=TXN, producer_id=1, producer_epoch=0)),
    ("CoordinatorService", "CompleteTransaction", "coordinator_svc", coordinator_pb2.CompleteTransactionRequest(handle=HANDLE, committed=True)),
    ("CoordinatorService", "CommitTransactionGroup", "coordinator_svc", coordinator_pb2.CommitTransactionGroupRequest(
        group_id=TXN, handles=[HANDLE])),
    ("CoordinatorService", "RegisterTransactionChecker", "coordinator_svc", coordinator_pb2.RegisterTransactionCheckerRequest(
        group_id=TXN, address="127.0.0.1:9")),
    ("CoordinatorService", "UnregisterTransactionChecker", "coordinator_svc", coordinator_pb2.UnregisterTransactionCheckerRequest(
        group_id=TXN, address="127.0.0.1:9")),
    ("CoordinatorService", "AlterTransactionGroupConfig", "coordinator_svc", coordinator_pb2.AlterTransactionGroupConfigRequest(
        group_id=TXN, set={"transaction.check.max": "3"})),
    ("CoordinatorService", "DescribeTransactionGroupConfig", "coordinator_svc", coordinator_pb2.DescribeTransactionGroupConfigRequest(
        group_id=TXN)),
]
# What each RPC of CALLS needs, written out from Kafka's checks for its counterpart (the issue's list):
# the matrix grants from access.py's table, so this pins the table itself.
EXPECTED_NEEDS = {
    "Metadata": [(TXN_ID, TXN, "Describe"), (GRP, GROUP, "Describe")],
    "CreateTopics": [(CLU, CLUSTER_NAME, "Create")],
    "Produce": [(TOP, TOPIC, "Write")],
    "Fetch": [(TOP, TOPIC, "Read")],
    "FetchStream": [(TOP, TOPIC, "Read")],
    "ListOffsets": [(TOP, TOPIC, "Describe")],
    "EpochEndOffsets": [(TOP, TOPIC, "Describe")],
    "WriteTxnMarkers": [(CLU, CLUSTER_NAME, "ClusterAction")],
    "OffsetCommit": [(GRP, GROUP, "Read"), (TOP, TOPIC, "Read")],
    "TxnOffsetCommit": [(TXN_ID, TXN, "Write"), (GRP, GROUP, "Read"), (TOP, TOPIC, "Read")],
    "OffsetFetch": [(GRP, GROUP, "Describe"), (TOP, TOPIC, "Describe")],
    "DescribeProducers": [(TOP, TOPIC, "Read")],
    "AlterPartitionReassignments": [(CLU, CLUSTER_NAME, "Alter")],
    "ListPartitionReassignments": [(CLU, CLUSTER_NAME, "Describe")],
    "CreateAcls": [(CLU, CLUSTER_NAME, "Alter")],
    "DescribeAcls": [(CLU, CLUSTER_NAME, "Describe")],
    "DeleteAcls": [(CLU, CLUSTER_NAME, "Alter")],
    "ConsumerGroupHeartbeat": [(GRP, GROUP, "Read"), (TOP, TOPIC, "Describe")],
    "ListGroups": [],
    "DescribeGroups": [(GRP, GROUP, "Describe")],
    "DeleteGroups": [(GRP, GROUP, "Delete")],
    "DeleteGroupOffsets": [(GRP, GROUP, "Delete"), (TOP, TOPIC, "Read")],
    "AlterTopicConfigs": [(TOP, TOPIC, "AlterConfigs")],
    "CreatePartitions": [(TOP, TOPIC, "Alter")],
    "DeleteTopics": [(TOP, "mx-deleted", "Delete")],
    "DeleteRecords": [(TOP, TOPIC, "Delete")],
    "LeaderAndIsr": [(CLU, CLUSTER_NAME, "ClusterAction")],
    "ReplicaFetch": [(CLU, CLUSTER_NAME, "ClusterAction")],
    "OffsetForLeaderEpoch": [(CLU, CLUSTER_NAME, "ClusterAction")],
    "AllocateProducerIds": [(CLU, CLUSTER_NAME, "ClusterAction")],
    "FindCoordinator": [(TXN_ID, TXN, "Describe")],
    "InitProducerId": [(TXN_ID, TXN, "Write")],
    "AddPartitionsToTxn": [(TXN_ID, TXN, "Write"), (TOP, TOPIC, "Write")],
    "AddOffsetsToTxn": [(TXN_ID, TXN, "Write"), (GRP, GROUP, "Read")],
    "EndTxn": [(TXN_ID, TXN, "Write")],
    "ListTransactions": [],
    "DescribeTransactions": [(TXN_ID, TXN, "Describe")],
    "AbortTransaction": [(CLU, CLUSTER_NAME, "ClusterAction")],
    "PrepareTransaction": [(TXN_ID, TXN, "Write")],
    "CompleteTransaction": [(TXN_ID, TXN, "Write")],
    "CommitTransactionGroup": [(TXN_ID, TXN, "Write")],
    "RegisterTransactionChecker": [(TXN_ID, TXN, "Write")],
    "UnregisterTransactionChecker": [(TXN_ID, TXN, "Write")],
    "AlterTransactionGroupConfig": [(TXN_ID, TXN, "AlterConfigs")],
    "DescribeTransactionGroupConfig": [(TXN_ID, TXN, "DescribeConfigs")],
}
IDS = [rpc for _, rpc, _, _ in CALLS]
LISTINGS = {"ListGroups": partition_pb2.ListGroupsResponse, "ListTransactions": coordinator_pb2.ListTransactionsResponse}
CALLERS = ("nobody", "wrong_operation", "allowed")


class Everything:
    """access.needs asked with every permission: the full list of what a request needs."""

    principal = "User:probe"

    def may(self, *_):
        return True

    def may_on_any(self, *_):
        return False  # an idempotent InitProducerId: the IdempotentWrite branch


class Nothing(Everything):
    def may(self, *_):
        return False


def needs_of(rpc: str, request: Message) -> list[tuple[str, str, str]]:
    return list(dict.fromkeys(access.needs(rpc, request, Everything())))


def other_operation(operation: str) -> str:
    """An operation that grants nothing ``operation`` needs (implies no Describe either)."""
    return "Create" if operation == "Describe" else "Describe"


def principal(rpc: str, caller: str) -> str:
    return f"mx-{rpc.lower()}-{caller.replace('_', '-')}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("authz-matrix") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=2, coordinator_svcs=1, tls=True)
    local.wait_until_coordinators_settle()
    directory = Path(local.state.tls["dir"])
    bindings = []
    for _, rpc, _, request in CALLS:
        for caller in CALLERS:
            certs.issue(directory, principal(rpc, caller))
            for resource_type, name, operation in needs_of(rpc, request):
                if caller == "nobody":
                    continue
                granted = operation if caller == "allowed" else other_operation(operation)
                bindings.append(AclBinding(resource_type, LITERAL, name, f"User:{principal(rpc, caller)}", "*", granted, ALLOW))
    certs.issue(directory, "mx-probe")
    bindings.append(AclBinding(CLUSTER, LITERAL, "txlog-cluster", "User:mx-probe", "*", "Describe", ALLOW))
    with Admin(local.state.bootstrap, **local.client_tls()) as admin:
        admin.create_topics([(TOPIC, 1, 2)])
        admin.create_acls(bindings)
    with Producer(local.state.bootstrap, **local.client_tls()) as producer:
        producer.send(TOPIC, value=b"stored", partition=0).result(timeout=30)
    stored(local)  # the first read of group offsets creates __consumer_offsets: before any snapshot compared
    for service in local.state.services.values():
        if service.kind != "zookeeper":  # every instance's cache has the grants
            wait_until(lambda address=service.address: probe_allowed(local, address), 60, f"the ACLs in force at {service.address}")
    yield local
    local.down(grace_s=5)


def credentials(cluster, name: str) -> grpc.ChannelCredentials:
    directory = Path(cluster.state.tls["dir"])
    return grpc.ssl_channel_credentials(Path(cluster.state.tls["ca"]).read_bytes(), (directory / f"{name}-key.pem").read_bytes(),
                                        (directory / f"{name}.pem").read_bytes())


def call(cluster, service: str, rpc: str, kind: str, request: Message, name: str, address: str | None = None):
    address = address or next(p.address for p in cluster.state.services.values() if p.kind == kind)
    streamed = SERVICES[service].methods_by_name[rpc].server_streaming  # its chunks, joined
    with grpc.secure_channel(address, credentials(cluster, name)) as channel:
        method = (channel.unary_stream if streamed else channel.unary_unary)(
            f"/txlog.v1.{service}/{rpc}", request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b)
        return b"".join(method(request, timeout=30)) if streamed else method(request, timeout=30)


def probe_allowed(cluster, address: str) -> bool:
    """User:mx-probe (Describe on the Cluster) reaches the ACL cache of the instance at ``address``."""
    kind = next(p.kind for p in cluster.state.services.values() if p.address == address)
    service, rpc, request = {"partition_svc": ("PartitionService", "ListPartitionReassignments",
                                               partition_pb2.ListPartitionReassignmentsRequest()),
                             "coordinator_svc": ("CoordinatorService", "ListTransactions", coordinator_pb2.ListTransactionsRequest()),
                             "producer_id_svc": (None, None, None)}[kind]
    if service is None:
        return True  # producer_id_svc answers super users and ClusterAction only: nothing to grant
    try:
        call(cluster, service, rpc, kind, request, "mx-probe", address)
        return True
    except grpc.RpcError as exc:
        return exc.code() != grpc.StatusCode.PERMISSION_DENIED


def stored(cluster) -> dict:
    """What the refused calls must leave as it was, read as the super user."""
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as admin:
        return {
            "topics": admin.list_topics(),
            "offsets": admin.list_offsets({TopicPartition(TOPIC, 0): "latest"}),
            "group": admin.list_group_offsets(GROUP),
            "acls": sorted(map(repr, admin.describe_acls())),
            "transactions": admin.list_transactions(),
        }


def test_the_table_asks_what_kafka_asks():
    assert {rpc: needs_of(rpc, request) for _, rpc, _, request in CALLS} == EXPECTED_NEEDS


@pytest.mark.parametrize("service, rpc, kind, request_message", CALLS, ids=IDS)
def test_each_rpc_refuses_the_principals_not_allowed_and_changes_nothing(cluster, service, rpc, kind, request_message):
    needed = needs_of(rpc, request_message)
    if not needed:  # a listing: it answers everyone, leaving out what the caller may not Describe
        assert rpc in access.FILTERS, f"{rpc} needs nothing and filters nothing"
        for caller in ("nobody", "wrong_operation"):
            answer = call(cluster, service, rpc, kind, request_message, principal(rpc, caller))
            listed = LISTINGS[rpc].FromString(answer)
            assert not any(listed.ListFields()), f"{rpc} listed to {caller}: {listed}"
        return
    refused_first = access.first_refused(Nothing(), access.needs(rpc, request_message, Nothing()))
    expected = access.FAILED_CODE[refused_first[0]]
    before = stored(cluster)
    for caller in ("nobody", "wrong_operation"):
        name = principal(rpc, caller)
        with pytest.raises(grpc.RpcError) as refused:
            call(cluster, service, rpc, kind, request_message, name)
        error = errors.from_rpc_error(refused.value)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, (caller, refused.value.details())
        assert errors.ErrorCode.Name(error.code).endswith("_AUTHORIZATION_FAILED") and f"User:{name}" in error.message, error.message
        if caller == "nobody":
            assert errors.ErrorCode.Name(error.code) == expected, error.message
    assert stored(cluster) == before, f"a refused {rpc} changed what is stored"


@pytest.mark.parametrize("service, rpc, kind, request_message", CALLS, ids=IDS)
def test_each_rpc_lets_a_principal_allowed_what_it_needs_through(cluster, service, rpc, kind, request_message):
    try:
        call(cluster, service, rpc, kind, request_message, principal(rpc, "allowed"))
    except grpc.RpcError as exc:
        assert exc.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED), \
            f"{rpc}, with {needs_of(rpc, request_message)} granted, was refused: {exc.details()}"


def test_a_client_without_a_certificate_cannot_connect(cluster):
    address = cluster.state.bootstrap.split(",")[0]
    request = partition_pb2.MetadataRequest(all_topics=True)
    for channel in (grpc.insecure_channel(address),
                    grpc.secure_channel(address, grpc.ssl_channel_credentials(Path(cluster.state.tls["ca"]).read_bytes()))):
        with channel, pytest.raises(grpc.RpcError) as refused:
            partition_pb2_grpc.PartitionServiceStub(channel).Metadata(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def grant(cluster, *bindings: AclBinding) -> None:
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as admin:
        admin.create_acls(bindings)


def client_of(cluster, name: str) -> dict:
    directory = Path(cluster.state.tls["dir"])
    if not (directory / f"{name}.pem").exists():
        certs.issue(directory, name)
    return {"tls_ca": cluster.state.tls["ca"], "tls_cert": str(directory / f"{name}.pem"), "tls_key": str(directory / f"{name}-key.pem")}


def produce_as(cluster, name: str, topic: str) -> str:
    """Either "ok" or the refusal's code name."""
    try:
        call(cluster, "PartitionService", "Produce", "partition_svc", partition_pb2.ProduceRequest(
            acks=1, batches=[partition_pb2.PartitionBatch(topic=topic, partition=0, batch=BATCH)]), name,
            address=leader_of(cluster, topic))
        return "ok"
    except grpc.RpcError as exc:
        return errors.ErrorCode.Name(errors.from_rpc_error(exc).code)


def leader_of(cluster, topic: str) -> str:
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as admin:
        (described,) = admin.describe_topics([topic])
    return described.partitions[0].leader_address


def test_prefixed_deny_wildcard_and_super_user_rules_hold_through_the_services(cluster):
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as admin:
        admin.create_topics([("pre-x", 1, 2), ("other", 1, 2), ("denied", 1, 2)])
    for name in ("pfx", "denier", "anyone"):
        client_of(cluster, name)
    grant(cluster,
          AclBinding(TOP, "PREFIXED", "pre-", "User:pfx", "*", "Write", ALLOW),
          AclBinding(TOP, LITERAL, "denied", "User:denier", "*", "All", ALLOW),
          AclBinding(TOP, LITERAL, "denied", "User:denier", "*", "Write", "Deny"),
          AclBinding(TOP, LITERAL, "*", "User:*", "*", "Describe", ALLOW))
    wait_until(lambda: produce_as(cluster, "pfx", "pre-x") == "ok", 30, "the prefixed grant in force")
    assert produce_as(cluster, "pfx", "other") == "TOPIC_AUTHORIZATION_FAILED"
    assert produce_as(cluster, "denier", "denied") == "TOPIC_AUTHORIZATION_FAILED", "a Deny wins over All"
    fetch = partition_pb2.FetchRequest(partitions=[partition_pb2.FetchPartition(topic="denied", partition=0)])
    call(cluster, "PartitionService", "Fetch", "partition_svc", fetch, "denier", address=leader_of(cluster, "denied"))  # Read: allowed
    offsets = partition_pb2.ListOffsetsRequest(partitions=[
        partition_pb2.ListOffsetsPartition(topic="other", partition=0, spec=partition_pb2.OFFSET_SPEC_LATEST)])
    call(cluster, "PartitionService", "ListOffsets", "partition_svc", offsets, "anyone", address=leader_of(cluster, "other"))
    assert produce_as(cluster, "admin", "other") == "ok", "a super user needs no ACL"


def test_forged_internal_calls_from_a_client_allowed_every_topic_are_refused(cluster):
    client_of(cluster, "forger")
    grant(cluster, AclBinding(TOP, LITERAL, "*", "User:forger", "*", "All", ALLOW))
    wait_until(lambda: produce_as(cluster, "forger", TOPIC) == "ok", 30, "the forger's grant in force")
    assert produce_as(cluster, "forger", "__transaction_state") == "CLUSTER_AUTHORIZATION_FAILED", "a forged transaction-log write"
    marker = partition_pb2.WriteTxnMarkersRequest(markers=[partition_pb2.TxnMarker(
        producer_id=1, producer_epoch=0, committed=True, coordinator_epoch=2**31 - 1, partitions=[TP])])
    replica_fetch = replication_pb2.ReplicaFetchRequest(replica_id=1, partitions=[replication_pb2.ReplicaFetchPartition(topic=TOPIC, partition=0)])
    for service, rpc, request in (("PartitionService", "WriteTxnMarkers", marker), ("ReplicationService", "ReplicaFetch", replica_fetch)):
        with pytest.raises(grpc.RpcError) as refused:
            call(cluster, service, rpc, "partition_svc", request, "forger", address=leader_of(cluster, TOPIC))
        assert errors.ErrorCode.Name(errors.from_rpc_error(refused.value).code) == "CLUSTER_AUTHORIZATION_FAILED", rpc


def test_a_revoked_grant_refuses_again(cluster):
    client_of(cluster, "revoked")
    binding = AclBinding(TOP, LITERAL, TOPIC, "User:revoked", "*", "Write", ALLOW)
    grant(cluster, binding)
    wait_until(lambda: produce_as(cluster, "revoked", TOPIC) == "ok", 30, "the grant in force")
    with Admin(cluster.state.bootstrap, **cluster.client_tls()) as admin:
        assert admin.delete_acls([AclFilter(TOP, LITERAL, TOPIC, principal="User:revoked")]) == [binding]
    wait_until(lambda: produce_as(cluster, "revoked", TOPIC) == "TOPIC_AUTHORIZATION_FAILED", 30, "the revocation in force")
