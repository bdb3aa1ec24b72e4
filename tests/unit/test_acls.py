"""The ACL decision (txlog/protocol/acls.py) and the per-RPC table
(services/security/access.py), pure: examples of Kafka's rules, the wire form, and
hypothesis against a reference written from Kafka's documentation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.security import access
from services.security.authorizer import parse_super_users, peer_host
from txlog.net.tls import TlsConfigError
from txlog.protocol import acls
from txlog.protocol.acls import (
    ALLOW,
    CLUSTER,
    CLUSTER_NAME,
    DENY,
    GROUP,
    LITERAL,
    PREFIXED,
    TOPIC,
    TRANSACTIONAL_ID,
    AclBinding,
    AclError,
    AclFilter,
)
from txlog.protocol.errors import ErrorCode
from txlog.v1 import common_pb2, coordinator_pb2, partition_pb2


def allow(name, operation, *, pattern=LITERAL, principal="User:alice", resource_type=TOPIC, host="*"):
    return AclBinding(resource_type, pattern, name, principal, host, operation, ALLOW).check()


def deny(name, operation, *, pattern=LITERAL, principal="User:alice", resource_type=TOPIC, host="*"):
    return AclBinding(resource_type, pattern, name, principal, host, operation, DENY).check()


def may(bindings, name, operation, principal="User:alice", host="10.0.0.1", resource_type=TOPIC):
    return acls.authorized(bindings, principal, host, resource_type, name, operation)


def test_deny_by_default_and_an_allow_grants_only_what_it_names():
    assert not may([], "orders", "Read")
    assert may([allow("orders", "Read")], "orders", "Read")
    assert not may([allow("orders", "Read")], "orders", "Write")
    assert not may([allow("orders", "Read")], "orders-2", "Read")
    assert not may([allow("orders", "Read")], "orders", "Read", principal="User:bob")
    assert not may([allow("orders", "Read", resource_type=GROUP)], "orders", "Read"), "a group ACL says nothing of a topic"


def test_deny_wins_over_any_allow():
    assert not may([allow("orders", "All"), deny("orders", "Write")], "orders", "Write")
    assert may([allow("orders", "All"), deny("orders", "Write")], "orders", "Read")
    assert not may([allow("*", "Read"), deny("ord", "All", pattern=PREFIXED)], "orders", "Read")
    assert not may([allow("orders", "Read"), deny("orders", "Read", principal="User:*")], "orders", "Read")


def test_prefixed_and_wildcard_patterns():
    bindings = [allow("team-a.", "Write", pattern=PREFIXED)]
    assert may(bindings, "team-a.events", "Write") and may(bindings, "team-a.", "Write")
    assert not may(bindings, "team-b.events", "Write")
    assert may([allow("*", "Read")], "anything", "Read")
    assert may([allow("orders", "Read", principal="User:*")], "orders", "Read", principal="User:zed")


def test_implied_operations_come_from_allows_only():
    for granting in ("Read", "Write", "Delete", "Alter"):
        assert may([allow("orders", granting)], "orders", "Describe")
    assert not may([allow("orders", "Create")], "orders", "Describe")
    assert may([allow("orders", "AlterConfigs")], "orders", "DescribeConfigs")
    assert may([allow("orders", "Read"), deny("orders", "Write")], "orders", "Describe"), "a Deny refuses only what it names"


def test_a_binding_for_one_host_applies_to_that_host_only():
    bindings = [allow("orders", "Read", host="10.0.0.1")]
    assert may(bindings, "orders", "Read", host="10.0.0.1")
    assert not may(bindings, "orders", "Read", host="10.0.0.2")


def test_bindings_that_cannot_be_are_refused_naming_the_part():
    with pytest.raises(AclError, match="resource type"):
        AclBinding("Topics", LITERAL, "t", "User:a", "*", "Read", ALLOW).check()
    with pytest.raises(AclError, match="principal"):
        AclBinding(TOPIC, LITERAL, "t", "alice", "*", "Read", ALLOW).check()
    with pytest.raises(AclError, match="operation"):
        AclBinding(TOPIC, LITERAL, "t", "User:a", "*", "Reed", ALLOW).check()
    with pytest.raises(AclError, match="Cluster resource"):
        AclBinding(CLUSTER, LITERAL, "mine", "User:a", "*", "Alter", ALLOW).check()
    with pytest.raises(AclError, match="PREFIXED"):
        AclBinding(TOPIC, PREFIXED, "*", "User:a", "*", "Read", ALLOW).check()
    with pytest.raises(AclError, match="empty"):
        AclBinding(TOPIC, LITERAL, "", "User:a", "*", "Read", ALLOW).check()


def test_idempotent_write_is_granted_by_write_on_some_topic():
    assert acls.allowed_on_any([allow("orders", "Write")], "User:alice", "h", TOPIC, "Write")
    assert acls.allowed_on_any([allow("ord", "Write", pattern=PREFIXED)], "User:alice", "h", TOPIC, "Write")
    assert not acls.allowed_on_any([allow("orders", "Read")], "User:alice", "h", TOPIC, "Write")
    assert not acls.allowed_on_any([allow("orders", "Write"), deny("orders", "Write")], "User:alice", "h", TOPIC, "Write")


def test_filters_match_as_kafkas_do():
    literal, prefixed, wildcard = allow("orders", "Read"), allow("ord", "Write", pattern=PREFIXED), allow("*", "Describe")
    everything = [literal, prefixed, wildcard]
    assert [b for b in everything if AclFilter().matches(b)] == everything
    assert [b for b in everything if AclFilter(TOPIC, LITERAL, "orders").matches(b)] == [literal]
    assert [b for b in everything if AclFilter(TOPIC, "MATCH", "orders").matches(b)] == everything
    assert [b for b in everything if AclFilter(operation="Write").matches(b)] == [prefixed]
    with pytest.raises(AclError, match="MATCH"):
        AclFilter(pattern_type="MATCH").check()


def test_the_wire_form_round_trips_and_refuses_unspecified_fields():
    for binding in (allow("orders", "DescribeConfigs"), deny("t.", "IdempotentWrite", pattern=PREFIXED),
                    AclBinding(CLUSTER, LITERAL, CLUSTER_NAME, "User:ops", "10.1.1.1", "ClusterAction", ALLOW)):
        assert acls.binding_from_proto(acls.binding_to_proto(binding)) == binding
    wanted = AclFilter(TRANSACTIONAL_ID, PREFIXED, "app-", principal="User:a", operation="Write")
    assert acls.filter_from_proto(acls.filter_to_proto(wanted)) == wanted
    assert acls.filter_from_proto(partition_pb2.AclBindingFilter()) == AclFilter()
    unspecified = acls.binding_to_proto(allow("orders", "Read"))
    unspecified.ClearField("operation")
    with pytest.raises(AclError, match="operation must be set"):
        acls.binding_from_proto(unspecified)


def test_super_users_and_peer_hosts_parse():
    assert parse_super_users("User:admin; User:txlog-service;") == {"User:admin", "User:txlog-service"}
    with pytest.raises(TlsConfigError, match="super_users"):
        parse_super_users("admin")
    assert peer_host("ipv4:10.1.2.3:5555") == "10.1.2.3"
    assert peer_host("ipv6:[::1]:5555") == "::1"


# --- the per-RPC table ------------------------------------------------------------------

class Grants:
    """A caller allowed exactly ``allowed``: (resource type, name, operation)."""

    principal = "User:alice"

    def __init__(self, *allowed):
        self.allowed = set(allowed)

    def may(self, resource_type, name, operation):
        return (resource_type, name, operation) in self.allowed

    def may_on_any(self, resource_type, operation):
        return any(t == resource_type and o == operation for t, _, o in self.allowed)


def refused(method, request, caller):
    need = access.first_refused(caller, access.needs(method, request, caller))
    return None if need is None else ErrorCode.Name(access.refusal(caller.principal, need).code)


def test_transactional_rpcs_need_write_on_the_transactional_id_and_the_topics():
    add = coordinator_pb2.AddPartitionsToTxnRequest(transactional_id="app", partitions=[common_pb2.TopicPartition(topic="t")])
    assert refused("AddPartitionsToTxn", add, Grants()) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    assert refused("AddPartitionsToTxn", add, Grants((TRANSACTIONAL_ID, "app", "Write"))) == "TOPIC_AUTHORIZATION_FAILED"
    assert refused("AddPartitionsToTxn", add, Grants((TRANSACTIONAL_ID, "app", "Write"), (TOPIC, "t", "Write"))) is None
    end = coordinator_pb2.EndTxnRequest(transactional_id="app")
    assert refused("EndTxn", end, Grants((TRANSACTIONAL_ID, "app", "Describe"))) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    offsets = partition_pb2.TxnOffsetCommitRequest(transactional_id="app", group_id="g",
                                                   offsets=[partition_pb2.PartitionOffset(topic="t")])
    assert refused("TxnOffsetCommit", offsets, Grants((TRANSACTIONAL_ID, "app", "Write"))) == "GROUP_AUTHORIZATION_FAILED"


def test_internal_calls_and_internal_topics_need_cluster_action():
    for method, request in (("WriteTxnMarkers", partition_pb2.WriteTxnMarkersRequest()),
                            ("AbortTransaction", coordinator_pb2.AbortTransactionRequest()),
                            ("NoSuchRpcYet", partition_pb2.MetadataRequest())):
        assert refused(method, request, Grants((TOPIC, "t", "All"))) == "CLUSTER_AUTHORIZATION_FAILED"
    forged = partition_pb2.ProduceRequest(batches=[partition_pb2.PartitionBatch(topic="__transaction_state")])
    assert refused("Produce", forged, Grants((TOPIC, "__transaction_state", "All"))) == "CLUSTER_AUTHORIZATION_FAILED"
    write = access.topics(["__transaction_state", "orders"], "Write")
    assert write == [(CLUSTER, CLUSTER_NAME, "ClusterAction"), (TOPIC, "orders", "Write")]
    assert access.topics(["__consumer_offsets"], "Describe") == [(TOPIC, "__consumer_offsets", "Describe")]


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic():
    init = coordinator_pb2.InitProducerIdRequest()
    assert refused("InitProducerId", init, Grants()) == "CLUSTER_AUTHORIZATION_FAILED"
    assert refused("InitProducerId", init, Grants((TOPIC, "t", "Write"))) is None
    assert refused("InitProducerId", init, Grants((CLUSTER, CLUSTER_NAME, "IdempotentWrite"))) is None


def test_create_topics_needs_create_on_the_cluster_or_on_each_topic():
    create = partition_pb2.CreateTopicsRequest(topics=[partition_pb2.CreatableTopic(name="a"), partition_pb2.CreatableTopic(name="b")])
    assert refused("CreateTopics", create, Grants((CLUSTER, CLUSTER_NAME, "Create"))) is None
    assert refused("CreateTopics", create, Grants((TOPIC, "a", "Create"), (TOPIC, "b", "Create"))) is None
    assert refused("CreateTopics", create, Grants((TOPIC, "a", "Create"))) == "TOPIC_AUTHORIZATION_FAILED"


def test_metadata_leaves_out_or_marks_what_the_caller_may_not_describe():
    def answer():
        response = partition_pb2.MetadataResponse()
        response.topics.add(name="mine")
        response.topics.add(name="theirs")
        return response

    listed = answer()
    access.FILTERS["Metadata"](partition_pb2.MetadataRequest(all_topics=True), listed, Grants((TOPIC, "mine", "Describe")))
    assert [t.name for t in listed.topics] == ["mine"]
    named = answer()
    access.FILTERS["Metadata"](partition_pb2.MetadataRequest(topics=["mine", "theirs"]), named, Grants((TOPIC, "mine", "Describe")))
    assert [(t.name, ErrorCode.Name(t.error.code)) for t in named.topics] == [("mine", "NONE"), ("theirs", "TOPIC_AUTHORIZATION_FAILED")]
    assert "User:alice may not Describe Topic 'theirs'" in named.topics[1].error.message


def test_describing_the_cluster_needs_describe_on_the_cluster():
    cluster = partition_pb2.MetadataRequest(describe_cluster=True)
    assert refused("Metadata", cluster, Grants((TOPIC, "t", "Describe"))) == "CLUSTER_AUTHORIZATION_FAILED"
    assert refused("Metadata", cluster, Grants((CLUSTER, CLUSTER_NAME, "Describe"))) is None
    assert refused("Metadata", partition_pb2.MetadataRequest(all_topics=True), Grants()) is None, "topics alone are filtered"


def test_every_rpc_of_every_service_has_its_line():
    from txlog.v1 import producer_id_pb2, replication_pb2
    methods = {m.name for module in (partition_pb2, coordinator_pb2, replication_pb2, producer_id_pb2)
               for service in module.DESCRIPTOR.services_by_name.values() for m in service.methods}
    assert methods - set(access.CHECKS) == set(), "an RPC without a line is refused to all but super users"


# --- against a reference --------------------------------------------------------------

NAMES = st.sampled_from(["a", "ab", "abc", "b", "*"])
OPS = st.sampled_from(["Read", "Write", "Describe", "Alter", "All"])
PRINCIPALS = st.sampled_from(["User:alice", "User:bob", "User:*"])


@st.composite
def bindings(draw):
    pattern = draw(st.sampled_from([LITERAL, PREFIXED]))
    name = draw(NAMES.filter(lambda n: not (pattern == PREFIXED and n == "*")))
    return AclBinding(TOPIC, pattern, name, draw(PRINCIPALS), draw(st.sampled_from(["*", "h1"])), draw(OPS),
                      draw(st.sampled_from([ALLOW, DENY])))


def reference(bound, principal, host, name, operation):
    """Kafka's documented rule, spelled out: deny if any matching Deny names
    the operation (or All); else allow if a matching Allow names it, All, or
    (for Describe) Read, Write, Delete or Alter."""
    def matching(b):
        name_ok = (b.pattern_type == LITERAL and (b.resource_name == name or b.resource_name == "*")) or \
                  (b.pattern_type == PREFIXED and name[:len(b.resource_name)] == b.resource_name)
        return name_ok and b.principal in (principal, "User:*") and b.host in (host, "*")
    relevant = [b for b in bound if matching(b)]
    if any(b.permission == DENY and b.operation in (operation, "All") for b in relevant):
        return False
    granting = {operation, "All"} | ({"Read", "Write", "Delete", "Alter"} if operation == "Describe" else set())
    return any(b.permission == ALLOW and b.operation in granting for b in relevant)


@given(st.lists(bindings(), max_size=6), st.sampled_from(["User:alice", "User:bob"]), st.sampled_from(["h1", "h2"]),
       st.sampled_from(["a", "ab", "abc", "b", "c"]), st.sampled_from(["Read", "Write", "Describe", "Alter", "Create"]))
def test_the_decision_is_the_reference(bound, principal, host, name, operation):
    assert acls.authorized(bound, principal, host, TOPIC, name, operation) == reference(bound, principal, host, name, operation)


def test_a_refusal_shows_a_hostile_name_cut_short():
    """The hostile suite found it: a 100,000-character name in the refusal
    overflowed gRPC's header limit and the call failed RESOURCE_EXHAUSTED
    without our details."""
    error = access.refusal("User:alice", (TOPIC, "x" * 100_000, "Write"))
    assert len(error.message) < 1000 and "(100000 characters)" in error.message
    assert ErrorCode.Name(error.code) == "TOPIC_AUTHORIZATION_FAILED"
