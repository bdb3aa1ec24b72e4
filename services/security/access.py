"""What every RPC needs the caller's principal to be allowed, in one table
(issue 15): Kafka's checks for each RPC's counterpart.

A check gets the request and the caller's :class:`Permissions` and returns
what the call needs, as (resource type, name, operation); the first of them
not allowed refuses the call with the resource type's *_AUTHORIZATION_FAILED
code, naming the resource and the operation. A refused call is refused whole, before its handler runs, so nothing
of it is applied (Kafka answers some refusals per partition; a whole refusal
is the stricter reading of "nothing changes"). Two RPCs list rather than
refuse: Metadata (every topic) and ListTransactions leave out what the
caller may not Describe, and a Metadata entry named but not allowed carries
TOPIC_AUTHORIZATION_FAILED, as Kafka's do.

Internal RPCs (markers, replication, controller calls, producer id blocks,
writes to the internal topics, and the operator's AbortTransaction) need
ClusterAction on the Cluster, which only super users (the services' own
principals among them) hold unless an ACL grants it.

An RPC missing from the table is refused (ClusterAction), so a new RPC is
closed until its line is written here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from txlog.protocol import INTERNAL_TOPIC_PREFIX
from txlog.protocol.acls import CLUSTER, CLUSTER_NAME, GROUP, TOPIC, TRANSACTIONAL_ID
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.v1 import coordinator_pb2

Need = tuple[str, str, str]  # (resource type, name, operation)


class Permissions(Protocol):
    """What one caller may do (services/security/authorizer.py answers it)."""

    principal: str

    def may(self, resource_type: str, name: str, operation: str) -> bool: ...

    def may_on_any(self, resource_type: str, operation: str) -> bool: ...

FAILED_CODE = {TOPIC: "TOPIC_AUTHORIZATION_FAILED", GROUP: "GROUP_AUTHORIZATION_FAILED",
               TRANSACTIONAL_ID: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", CLUSTER: "CLUSTER_AUTHORIZATION_FAILED"}


NAME_SHOWN_MAX = 200  # a hostile name can be megabytes: the status travels in headers of a few KiB


def shown(name: str) -> str:
    return name if len(name) <= NAME_SHOWN_MAX else f"{name[:NAME_SHOWN_MAX]}... ({len(name)} characters)"


def refusal(principal: str, need: Need) -> TxlogError:
    resource_type, name, operation = need
    principal, name = shown(principal), shown(name)
    return TxlogError(ErrorCode.Value(FAILED_CODE[resource_type]),
                      f"{principal} may not {operation} {resource_type} {name!r}; an operator grants it with "
                      f"txlog acls add --allow {principal} --operation {operation} {_selector(resource_type, name)}")


def _selector(resource_type: str, name: str) -> str:
    return {TOPIC: f"--topic {name}", GROUP: f"--group {name}", TRANSACTIONAL_ID: f"--transactional-id {name}",
            CLUSTER: "--cluster"}[resource_type]


def first_refused(caller: Permissions, needs: Iterable[Need]) -> Need | None:
    for need in dict.fromkeys(needs):  # each once, in order
        if not caller.may(*need):
            return need
    return None


def cluster(operation: str) -> list[Need]:
    return [(CLUSTER, CLUSTER_NAME, operation)]


def topics(names: Iterable[str], operation: str) -> list[Need]:
    """Internal topics are written and read only by the services (ClusterAction):
    their records are every principal's transaction states and group offsets,
    reached through the RPCs that check the transactional id or group instead.
    Describing them is as for any topic."""
    return [(CLUSTER, CLUSTER_NAME, "ClusterAction") if name.startswith(INTERNAL_TOPIC_PREFIX) and operation in ("Read", "Write")
            else (TOPIC, name, operation) for name in names]


def _either(caller: Permissions, first: list[Need], second: list[Need]) -> list[Need]:
    """``first`` when all of it is allowed, else ``second`` (whose refusal is reported)."""
    return first if first_refused(caller, first) is None else second


def _produce(request, caller: Permissions) -> list[Need]:
    needs = [(TRANSACTIONAL_ID, request.transactional_id, "Write")] if request.transactional_id else []
    return needs + topics((b.topic for b in request.batches), "Write")


def _create_topics(request, caller: Permissions) -> list[Need]:
    # Kafka: Create on the Cluster, or on each topic
    return _either(caller, cluster("Create"), topics((t.name for t in request.topics), "Create"))


def _init_producer_id(request, caller: Permissions) -> list[Need]:
    if request.transactional_id:
        return [(TRANSACTIONAL_ID, request.transactional_id, "Write")]
    # an idempotent producer: IdempotentWrite on the Cluster, or Write on some topic (KIP-679)
    return [] if caller.may_on_any(TOPIC, "Write") else cluster("IdempotentWrite")


def _find_coordinator(request, caller: Permissions) -> list[Need]:
    kind = GROUP if request.key_type == coordinator_pb2.COORDINATOR_KEY_TYPE_GROUP else TRANSACTIONAL_ID
    return [(kind, request.key, "Describe")]


def _handles(handles, operation: str) -> list[Need]:
    return [(TRANSACTIONAL_ID, h.transactional_id, operation) for h in handles]


CHECKS: dict[str, Callable[[object, Permissions], list[Need]]] = {
    # PartitionService
    "Metadata": lambda r, caller: ([(TRANSACTIONAL_ID, t, "Describe") for t in r.transactional_ids]
                                + [(GROUP, g, "Describe") for g in r.group_ids]
                                + (cluster("Describe") if r.describe_cluster else [])),  # topics: filtered, below
    "CreateTopics": _create_topics,
    "Produce": _produce,
    "Fetch": lambda r, caller: topics((p.topic for p in r.partitions), "Read"),
    "FetchStream": lambda r, caller: topics((p.topic for p in r.fetch.partitions), "Read"),
    "ListOffsets": lambda r, caller: topics((p.topic for p in r.partitions), "Describe"),
    "EpochEndOffsets": lambda r, caller: topics((p.topic for p in r.partitions), "Describe"),
    "WriteTxnMarkers": lambda r, caller: cluster("ClusterAction"),
    "OffsetCommit": lambda r, caller: [(GROUP, r.group_id, "Read"), *topics((o.topic for o in r.offsets), "Read")],
    "TxnOffsetCommit": lambda r, caller: [(TRANSACTIONAL_ID, r.transactional_id, "Write"), (GROUP, r.group_id, "Read"),
                                       *topics((o.topic for o in r.offsets), "Read")],
    "OffsetFetch": lambda r, caller: [(GROUP, r.group_id, "Describe"), *topics((p.topic for p in r.partitions), "Describe")],
    "DescribeProducers": lambda r, caller: topics((p.topic for p in r.partitions), "Read"),
    "AlterPartitionReassignments": lambda r, caller: cluster("Alter"),
    "ListPartitionReassignments": lambda r, caller: cluster("Describe"),
    "CreateAcls": lambda r, caller: cluster("Alter"),
    "DescribeAcls": lambda r, caller: cluster("Describe"),
    "DeleteAcls": lambda r, caller: cluster("Alter"),
    "AlterClientQuotas": lambda r, caller: cluster("AlterConfigs"),
    "DescribeClientQuotas": lambda r, caller: cluster("DescribeConfigs"),
    "ConsumerGroupHeartbeat": lambda r, caller: [(GROUP, r.group_id, "Read"),
                                                 *topics(r.subscribed_topics.names, "Describe")],
    "ListGroups": lambda r, caller: [],  # filtered, below
    "DescribeGroups": lambda r, caller: [(GROUP, g, "Describe") for g in r.group_ids],
    "DeleteGroups": lambda r, caller: [(GROUP, g, "Delete") for g in r.group_ids],
    "CreatePartitions": lambda r, caller: topics((t.topic for t in r.topics), "Alter"),
    "AlterTopicConfigs": lambda r, caller: topics((t.topic for t in r.topics), "AlterConfigs"),
    "DeleteRecords": lambda r, caller: topics((p.topic for p in r.partitions), "Delete"),
    "DeleteTopics": lambda r, caller: topics(r.topics, "Delete"),
    "DeleteGroupOffsets": lambda r, caller: [(GROUP, r.group_id, "Delete"), *topics((p.topic for p in r.partitions), "Read")],
    # ReplicationService and ProducerIdService: the services among themselves
    "LeaderAndIsr": lambda r, caller: cluster("ClusterAction"),
    "ReplicaFetch": lambda r, caller: cluster("ClusterAction"),
    "OffsetForLeaderEpoch": lambda r, caller: cluster("ClusterAction"),
    "AllocateProducerIds": lambda r, caller: cluster("ClusterAction"),
    # CoordinatorService
    "FindCoordinator": _find_coordinator,
    "InitProducerId": _init_producer_id,
    "AddPartitionsToTxn": lambda r, caller: [(TRANSACTIONAL_ID, r.transactional_id, "Write"),
                                          *topics((p.topic for p in r.partitions), "Write")],
    "AddOffsetsToTxn": lambda r, caller: [(TRANSACTIONAL_ID, r.transactional_id, "Write"), (GROUP, r.group_id, "Read")],
    "EndTxn": lambda r, caller: [(TRANSACTIONAL_ID, r.transactional_id, "Write")],
    "ListTransactions": lambda r, caller: [],  # filtered, below
    "DescribeTransactions": lambda r, caller: [(TRANSACTIONAL_ID, t, "Describe") for t in r.transactional_ids],
    "AbortTransaction": lambda r, caller: cluster("ClusterAction"),
    "PrepareTransaction": lambda r, caller: [(TRANSACTIONAL_ID, r.transactional_id, "Write")],
    # the holder of a prepared transaction's handle completes it, as its producer would
    "CompleteTransaction": lambda r, caller: _handles([r.handle], "Write"),
    "CommitTransactionGroup": lambda r, caller: _handles(r.handles, "Write"),
    # a checker decides the group's prepared transactions, as their producers would: Write on the group's
    # name (a PREFIXED binding on it covers every id of the group)
    "RegisterTransactionChecker": lambda r, caller: [(TRANSACTIONAL_ID, r.group_id, "Write")],
    "UnregisterTransactionChecker": lambda r, caller: [(TRANSACTIONAL_ID, r.group_id, "Write")],
    "AlterTransactionGroupConfig": lambda r, caller: [(TRANSACTIONAL_ID, r.group_id, "AlterConfigs")],
    "DescribeTransactionGroupConfig": lambda r, caller: [(TRANSACTIONAL_ID, r.group_id, "DescribeConfigs")],
}


def _filter_metadata(request, response, caller: Permissions) -> None:
    kept = []
    for topic in response.topics:
        need = topics([topic.name], "Describe")[0]
        if caller.may(*need):
            kept.append(topic)
        elif not request.all_topics:
            failed = refusal(caller.principal, need)
            name = topic.name
            topic.Clear()
            topic.name = name
            topic.error.CopyFrom(error_proto(failed.code, failed.message))
            kept.append(topic)
    del response.topics[:]
    response.topics.extend(kept)


def _filter_transactions(request, response, caller: Permissions) -> None:
    kept = [t for t in response.transactions if caller.may(TRANSACTIONAL_ID, t.transactional_id, "Describe")]
    del response.transactions[:]
    response.transactions.extend(kept)


def _filter_groups(request, response, caller: Permissions) -> None:
    kept = [g for g in response.groups if caller.may(GROUP, g.group_id, "Describe")]
    del response.groups[:]
    response.groups.extend(kept)


FILTERS: dict[str, Callable[[object, object, Permissions], None]] = {
    "Metadata": _filter_metadata,
    "ListTransactions": _filter_transactions,
    "ListGroups": _filter_groups,
}


def needs(method: str, request, caller: Permissions) -> list[Need]:
    check = CHECKS.get(method)
    return cluster("ClusterAction") if check is None else check(request, caller)
