"""The Admin client: topics, offsets, producer states and transactions,
synchronous for its callers (one event loop thread per Admin).

Guarantees
----------
* ``create_topics`` is idempotent: creating a topic that exists with the same
  partition count succeeds (TOPIC_ALREADY_EXISTS only for a different count),
  and it returns once every new topic's partitions have leaders in the
  metadata (or ``timeout_s`` passes), so a Producer made next can use them.
* Every call retries retriable errors (unreachable servers, leader moves,
  ZooKeeper hiccups) within its timeout, by the SDK's one error table, and
  raises the first error that is not retriable as a ClientError.
* Transaction tools (Kafka's ``kafka-transactions.sh``): ``list_transactions``
  asks one coordinator, which gathers the listings of every live coordinator;
  ``describe_transactions`` asks each id's own coordinator;
  ``abort_transaction`` has any coordinator write an ABORT marker for a hanging
  transaction; ``find_hanging`` finds the open transactions of partitions that
  no coordinator will end (see its docstring).
* Two-phase participation: ``complete_transaction`` commits or aborts a
  prepared transaction by its handle, ``commit_transaction_group`` commits
  prepared transactions of one group at once (both at the group's
  coordinator; repeating either answers as the first did). Coordinator errors are sorted by
  ``errors.txn_action_for`` (a moved or unavailable coordinator is looked up
  again, with another key for "any coordinator").
* Check-back: ``alter_transaction_group_config`` / ``describe_transaction_group_config``
  (a transaction group's settings and registered checkers) and
  ``register_transaction_checker`` / ``unregister_transaction_checker`` (what
  ``TransactionChecker`` calls) go to the group's coordinator, sorted likewise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence

from txlog import shutdown
from txlog._loop import LoopThread
from txlog.errors import ClientClosedError, ClientError, TxnAction, error_for, from_proto, txn_action_for
from txlog.fetcher import list_offsets
from txlog.group import GroupOffsets
from txlog.metadata import Metadata, TopicInfo
from txlog.protocol import OPEN_TRANSACTION_STATES, TRANSACTION_STATE_TOPIC, TransactionState, acls, names
from txlog.protocol.acls import AclBinding, AclFilter
from txlog.protocol.errors import ErrorCode
from txlog.requests import call_leaders, retry_policy, with_retries
from txlog.structs import (
    ClusterDescription,
    GroupDescription,
    GroupListing,
    GroupMemberDescription,
    HangingTransaction,
    OffsetAndTimestamp,
    PartitionDescription,
    PartitionReassignment,
    ProducerDescription,
    ServiceInstance,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
    TransactionGroupConfig,
    TransactionHandle,
    TransactionListing,
    as_tp,
    check_answer_name,
)
from txlog.transport import Transport, tls_files
from txlog.txn_requests import (
    AlterTransactionGroupConfigHandler,
    CommitTransactionGroupHandler,
    CompleteTransactionHandler,
    CoordinatorClient,
    DescribeTransactionGroupConfigHandler,
    RegisterTransactionCheckerHandler,
    UnregisterTransactionCheckerHandler,
)
from txlog.v1 import common_pb2, coordinator_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
TOPICS_PER_CALL_MAX = 10_000
TRANSACTIONAL_IDS_PER_CALL_MAX = 10_000
DELETE_WAIT_SHARE = 0.8  # delete_topics: the share of its timeout the server waits, so its answer comes before the deadline
MAX_TRANSACTION_TIMEOUT_MS_DEFAULT = 15 * 60 * 1000  # the coordinators' default maximum
ADMIN_KEY = "txlog-admin"  # a transactional id whose coordinator is asked for cluster-wide answers
# Coordinator state names (as Kafka prints them, what the SDK shows) <-> the protocol's enum.
TRANSACTION_STATES = {state.value: state.to_proto() for state in TransactionState}
STATE_NAMES = {number: name for name, number in TRANSACTION_STATES.items()}
OPEN_STATES = frozenset(state.value for state in OPEN_TRANSACTION_STATES)


def state_number(name: str) -> int:
    """A state given as ``Ongoing``, ``ONGOING``, ``ongoing`` or ``prepare_commit``."""
    wanted = name.replace("_", "").replace("-", "").lower()
    for known, number in TRANSACTION_STATES.items():
        if known.lower() == wanted:
            return number
    raise ValueError(f"unknown transaction state {name!r}; one of {', '.join(TRANSACTION_STATES)}")


def state_name(number: int) -> str:
    return STATE_NAMES.get(number, f"Unknown({number})")


OFFSET_SPECS = {
    "earliest": partition_pb2.OFFSET_SPEC_EARLIEST,
    "latest": partition_pb2.OFFSET_SPEC_LATEST,
    "last_stable": partition_pb2.OFFSET_SPEC_LAST_STABLE,
}


def describe(info: TopicInfo) -> TopicDescription:
    return TopicDescription(
        name=info.name,
        partitions=tuple(
            PartitionDescription(p.partition, p.leader_id, p.leader_address, p.leader_epoch,
                                 ErrorCode.Name(p.error_code) if p.error_code in ErrorCode.values() else str(p.error_code),
                                 p.replicas, p.isr)
            for p in info.partitions
        ),
        is_internal=info.is_internal,
        configs=dict(info.configs),
    )


def group_config_change(configs, delete) -> tuple[dict[str, str], list[str]]:
    """A transaction group's settings change as sent (keys set, keys deleted);
    ValueError for an empty change or a key both set and deleted."""
    changes = {str(k): str(v) for k, v in (configs or {}).items()}
    deleted = list(dict.fromkeys(str(k) for k in delete))
    if not changes and not deleted:
        raise ValueError("name at least one setting to set or delete")
    both = sorted(set(changes) & set(deleted))
    if both:
        raise ValueError(f"a setting is either set or deleted, not both: {', '.join(both)}")
    return changes, deleted


class Admin:
    """Administers a txlog cluster through any of its partition servers."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: float = 30_000,
        default_api_timeout_ms: float = 60_000,
        retry_backoff_ms: float = 100,
        transport=None,
        tracer_provider=None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token_file: str | None = None,
        client_id: str = "",
    ):
        self.tls_options = {"tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key, "token_file": token_file}  # for clients made on its behalf
        self._request_timeout_ms = request_timeout_ms
        self._default_api_timeout_ms = default_api_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._transport = transport or Transport(request_timeout_ms=int(request_timeout_ms),
                                                 tracer_provider=tracer_provider,
                                                 tls_files=tls_files(tls_ca, tls_cert, tls_key, token_file),
                                                 client_id=client_id)
        self._metadata = Metadata(self._transport, bootstrap, refresh_backoff_ms=retry_backoff_ms)
        self._closed = False
        self._loop = LoopThread("txlog-admin")
        shutdown.close_at_exit(self)  # left open, it is closed at interpreter exit

    def _run(self, coro, timeout_ms: float, what: str):
        if self._closed:
            coro.close()
            raise ClientClosedError("the admin client is closed")
        return self._loop.run(coro, timeout_s=timeout_ms / 1000 + 5, what=what)

    def _timeout_ms(self, timeout_s: float | None) -> float:
        return self._default_api_timeout_ms if timeout_s is None else timeout_s * 1000

    def _policy(self, timeout_ms: float):
        return retry_policy(deadline_ms=timeout_ms, backoff_ms=self._retry_backoff_ms)

    # --- topics ----------------------------------------------------------------------------------

    def create_topics(
        self,
        topics: Iterable[tuple[str, int] | tuple[str, int, int]],
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
        timeout_s: float | None = None,
    ) -> dict[str, int]:
        """Creates ``topics`` ((name, partition_count) or (name, partition_count,
        replication_factor) tuples; without a replication factor the cluster's
        default; ``configs`` apply to each); returns {name: partition count}.
        Raises the first topic's error that is not retriable
        (TOPIC_ALREADY_EXISTS for a different count, INVALID_TOPIC,
        INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_CONFIG...)."""
        wanted = []
        for topic in topics:
            if not isinstance(topic, tuple) or len(topic) not in (2, 3) or not isinstance(topic[0], str) or any(
                    not isinstance(n, int) or isinstance(n, bool) for n in topic[1:]):
                raise TypeError("a topic is (name: str, partition_count: int[, replication_factor: int]), "
                                f"not {topic!r}")
            wanted.append((topic[0], (topic[1], topic[2] if len(topic) == 3 else None)))
        if not wanted:
            return {}
        if len(wanted) > TOPICS_PER_CALL_MAX:
            raise ValueError(f"at most {TOPICS_PER_CALL_MAX} topics per call, not {len(wanted)}")
        timeout_ms = self._timeout_ms(timeout_s)
        return self._run(self._create_topics(wanted, dict(configs or {}), validate_only, timeout_ms), timeout_ms,
                         "create_topics")

    async def _create_topics(self, wanted, configs, validate_only: bool, timeout_ms: float) -> dict[str, int]:
        started = time.monotonic()
        pending = dict(wanted)
        created: dict[str, int] = {}

        async def attempt() -> None:
            request = partition_pb2.CreateTopicsRequest(
                topics=[partition_pb2.CreatableTopic(name=name, partition_count=count, configs=configs,
                                                     replication_factor=replication_factor)
                        for name, (count, replication_factor) in pending.items()],
                validate_only=validate_only,
            )
            response = await self._metadata.call_any("CreateTopics", request, timeout_ms=self._request_timeout_ms)
            retriable: ClientError | None = None
            for result in response.results:
                if result.name not in pending:
                    continue
                if result.error.code == NONE:
                    created[result.name] = result.partition_count or pending[result.name][0]
                    del pending[result.name]
                    continue
                error = from_proto(result.error)
                if not error.retriable:
                    raise error
                retriable = error
            if pending:
                raise retriable or error_for(ErrorCode.Value("REQUEST_TIMED_OUT"),
                                             f"CreateTopics answered nothing for {sorted(pending)}")

        await with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms))
        if not validate_only:
            remaining_ms = timeout_ms - (time.monotonic() - started) * 1000
            await self._wait_for_leaders(list(created), max(remaining_ms, 0))
        return created

    async def _wait_for_leaders(self, names: list[str], timeout_ms: float) -> None:
        deadline = time.monotonic() + timeout_ms / 1000
        delay_s = self._retry_backoff_ms / 1000
        while True:
            try:
                await self._metadata.refresh(names)
            except ClientError as exc:
                if not exc.retriable:
                    raise
            infos = [self._metadata.topic(name) for name in names]
            if all(i is not None and i.exists and all(p.has_leader for p in i.partitions) for i in infos):
                return
            if time.monotonic() + delay_s > deadline:
                return  # created; leaders will follow (the producer waits for them itself)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)

    def list_topics(self, timeout_s: float | None = None) -> list[str]:
        """Names of every topic (internal ones included), sorted."""
        return sorted(t.name for t in self.describe_topics(None, timeout_s=timeout_s))

    def describe_topics(self, names: Iterable[str] | None = None, *,
                        timeout_s: float | None = None) -> list[TopicDescription]:
        """The topics' partitions and leaders (None: every topic). A topic that does
        not exist raises UNKNOWN_TOPIC_OR_PARTITION."""
        wanted = None if names is None else list(dict.fromkeys(names))
        timeout_ms = self._timeout_ms(timeout_s)
        return self._run(self._describe_topics(wanted, timeout_ms), timeout_ms, "describe_topics")

    async def _describe_topics(self, wanted: list[str] | None, timeout_ms: float) -> list[TopicDescription]:
        async def attempt():
            return await self._metadata.fetch(wanted or (), all_topics=wanted is None)

        response = await with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms))
        by_name = {t.name: t for t in response.topics}
        out = []
        for name in wanted if wanted is not None else sorted(by_name):
            proto = by_name.get(name)
            if proto is None:
                raise error_for(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"no topic {name!r}")
            if proto.error.code != NONE:
                raise from_proto(proto.error)
            out.append(describe(self._metadata.topic(name)))
        return out

    # --- replicas -----------------------------------------------------------------------------------

    def alter_partition_reassignments(self, reassignments: Mapping, *, timeout_s: float | None = None) -> None:
        """Moves partitions' replicas: {(topic, partition): [node ids, the
        preferred leader first]}. Returns once the controller has them; it adds
        the new replicas, waits until they are in sync, then drops the old
        ones (list_partition_reassignments shows what is still under way).
        Raises the first partition's error (UNKNOWN_TOPIC_OR_PARTITION,
        INVALID_REPLICATION_FACTOR for a node that is not live...)."""
        request = partition_pb2.AlterPartitionReassignmentsRequest()
        for key, replicas in reassignments.items():
            tp = as_tp(key)
            replicas = list(replicas)
            if not replicas or any(not isinstance(n, int) or isinstance(n, bool) for n in replicas):
                raise TypeError(f"the replicas of {tp} must be node ids (ints), not {replicas!r}")
            request.reassignments.add(topic=tp.topic, partition=tp.partition, replicas=replicas)
        if not request.reassignments:
            return
        timeout_ms = self._timeout_ms(timeout_s)

        async def attempt():
            response = await self._metadata.call_any("AlterPartitionReassignments", request, timeout_ms=self._request_timeout_ms)
            for result in response.results:
                if result.error.code != NONE:
                    raise from_proto(result.error)

        self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms)), timeout_ms,
                  "alter_partition_reassignments")

    def list_partition_reassignments(self, *, timeout_s: float | None = None) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments under way: {TopicPartition: (replicas now, target replicas)}."""
        response = self._call_any("ListPartitionReassignments", partition_pb2.ListPartitionReassignmentsRequest(), timeout_s,
                                  "list_partition_reassignments")
        return {TopicPartition(r.topic, r.partition): PartitionReassignment(tuple(r.replicas), tuple(r.target_replicas))
                for r in response.reassignments}

    # --- ACLs (clusters with --authorizer acl) ------------------------------------------

    def create_acls(self, bindings: Iterable[AclBinding], *, timeout_s: float | None = None) -> None:
        """Adds the bindings (needs Alter on the Cluster). Every instance
        applies them within moments (a ZooKeeper watch). Raises
        SECURITY_DISABLED on a cluster without an authorizer, INVALID_REQUEST
        naming a binding that cannot be."""
        bindings = [b.check() for b in bindings]
        if not bindings:
            return
        request = partition_pb2.CreateAclsRequest(bindings=[acls.binding_to_proto(b) for b in bindings])
        self._call_any("CreateAcls", request, timeout_s, "create_acls")

    def describe_acls(self, wanted: AclFilter | None = None, *, timeout_s: float | None = None) -> list[AclBinding]:
        """The bindings the filter matches (every binding without one); needs Describe on the Cluster."""
        request = partition_pb2.DescribeAclsRequest(filters=[acls.filter_to_proto((wanted or AclFilter()).check())])
        response = self._call_any("DescribeAcls", request, timeout_s, "describe_acls")
        return [acls.binding_from_proto(b) for b in response.bindings]

    def delete_acls(self, filters: Iterable[AclFilter], *, timeout_s: float | None = None) -> list[AclBinding]:
        """Removes the bindings any filter matches and returns them (needs
        Alter on the Cluster). ``AclFilter()`` matches every binding."""
        filters = [f.check() for f in filters]
        if not filters:
            return []
        request = partition_pb2.DeleteAclsRequest(filters=[acls.filter_to_proto(f) for f in filters])
        response = self._call_any("DeleteAcls", request, timeout_s, "delete_acls")
        return [acls.binding_from_proto(b) for b in response.bindings]

    def alter_client_quotas(self, entity: Mapping[str, str | None], quotas: Mapping[str, float | None], *,
                            validate_only: bool = False, timeout_s: float | None = None) -> None:
        """Sets (a None value: removes) client quotas of ``entity`` (Kafka's
        alterClientQuotas; needs AlterConfigs on the Cluster). ``entity``:
        ``{"user": NAME}``, ``{"client-id": NAME}`` or both; a None name is
        that type's default. ``quotas``: ``producer_byte_rate`` and
        ``consumer_byte_rate``, bytes per second, and ``request_percentage``,
        the share of an instance's request-handling thread (its event loop)
        the client's Produce and Fetch handlers may take, in percent (Kafka's
        KIP-124). Every instance applies them
        within moments (a ZooKeeper watch); a client over its quota is held
        back, not failed. INVALID_REQUEST or INVALID_CONFIG names what was
        wrong, and then nothing changed."""
        alteration = partition_pb2.ClientQuotaAlteration(
            entity=[partition_pb2.ClientQuotaEntityPart(entity_type=kind, name=name) for kind, name in entity.items()],
            values=[partition_pb2.ClientQuotaValue(key=key, value=0 if value is None else float(value), remove=value is None)
                    for key, value in quotas.items()])
        request = partition_pb2.AlterClientQuotasRequest(alterations=[alteration], validate_only=validate_only)
        response = self._call_any("AlterClientQuotas", request, timeout_s, "alter_client_quotas")
        for result in response.results:
            if result.error.code != NONE:
                raise from_proto(result.error)

    def describe_client_quotas(self, *, timeout_s: float | None = None) -> list[dict]:
        """Every client quota set: ``[{"entity": {"client-id": "flood"}, "quotas": {"producer_byte_rate": 1048576.0}}]``
        (a None name: the default); needs DescribeConfigs on the Cluster."""
        response = self._call_any("DescribeClientQuotas", partition_pb2.DescribeClientQuotasRequest(), timeout_s,
                                  "describe_client_quotas")
        return [{"entity": {p.entity_type: p.name if p.HasField("name") else None for p in entry.entity},
                 "quotas": dict(sorted(entry.values.items()))} for entry in response.entries]

    def alter_topic_configs(self, topic: str, configs: Mapping[str, str] | None = None, delete: Iterable[str] = (), *,
                            validate_only: bool = False, timeout_s: float | None = None) -> dict[str, str]:
        """Sets ``configs`` of ``topic`` and puts ``delete``'s back to their
        defaults (Kafka's incrementalAlterConfigs); returns the topic's full
        configs after the change. Every replica takes it within the servers'
        partition_state_refresh_ms. INVALID_CONFIG names what was wrong, and
        then nothing changed."""
        names.check_topic_name(topic)
        changes = {str(k): str(v) for k, v in (configs or {}).items()}
        deleted = [str(k) for k in delete]
        if not changes and not deleted:
            raise ValueError("name at least one config to set or delete")
        request = partition_pb2.AlterTopicConfigsRequest(
            topics=[partition_pb2.TopicConfigChange(topic=topic, set=changes, delete=deleted)], validate_only=validate_only)
        result = self._call_any("AlterTopicConfigs", request, timeout_s, "alter_topic_configs").results[0]
        if result.error.code != NONE:
            raise from_proto(result.error)
        self._metadata.request_update()
        return dict(result.configs)

    def create_partitions(self, totals: Mapping[str, int], *, validate_only: bool = False,
                          timeout_s: float | None = None) -> dict[str, int]:
        """Grows each topic to its new total partition count (Kafka's
        createPartitions); returns {topic: partition count}. Raises the first
        topic's error (INVALID_PARTITIONS for a count not above the current
        one, UNKNOWN_TOPIC_OR_PARTITION, ...); the others were still done."""
        wanted = {}
        for topic, total in totals.items():
            names.check_topic_name(topic)
            if not isinstance(total, int) or isinstance(total, bool):
                raise TypeError(f"a partition count is an int, not {total!r}")
            wanted[topic] = total
        if not wanted:
            return {}
        request = partition_pb2.CreatePartitionsRequest(
            topics=[partition_pb2.PartitionsIncrease(topic=t, total_count=n) for t, n in wanted.items()], validate_only=validate_only)
        response = self._call_any("CreatePartitions", request, timeout_s, "create_partitions")
        self._metadata.request_update()
        for result in response.results:
            if result.error.code != NONE:
                raise from_proto(result.error)
        return {result.topic: result.partition_count for result in response.results}

    def delete_topics(self, topics: Iterable[str], *, timeout_s: float | None = None) -> None:
        """Deletes the topics (Kafka's deleteTopics): at once unknown to every
        request, then gone from every replica with the groups' committed
        offsets for them; returns once every one is gone. Raises the first
        topic's error (UNKNOWN_TOPIC_OR_PARTITION; INVALID_REQUEST for an
        internal topic; REQUEST_TIMED_OUT, retriable, when the deletion was
        not complete within ``timeout_s``: it goes on, and asking again waits
        for it again); the others were still done. A topic of the same name
        may be created once it is gone."""
        wanted = list(dict.fromkeys(topics))
        for topic in wanted:
            names.check_topic_name(topic)
        if not wanted:
            return
        if len(wanted) > TOPICS_PER_CALL_MAX:
            raise ValueError(f"at most {TOPICS_PER_CALL_MAX} topics per call, not {len(wanted)}")
        timeout_ms = self._timeout_ms(timeout_s)
        # the server waits for the deletion at most this long, and answers before the call's own deadline
        request = partition_pb2.DeleteTopicsRequest(topics=wanted, timeout_ms=max(1, int(timeout_ms * DELETE_WAIT_SHARE)))

        async def attempt():
            return await self._metadata.call_any("DeleteTopics", request, timeout_ms=max(self._request_timeout_ms, timeout_ms))

        response = self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms)), timeout_ms, "delete_topics")
        self._metadata.request_update()
        for result in response.results:
            if result.error.code != NONE:
                raise from_proto(result.error)

    def _call_any(self, rpc: str, request, timeout_s: float | None, what: str):
        timeout_ms = self._timeout_ms(timeout_s)

        async def attempt():
            return await self._metadata.call_any(rpc, request, timeout_ms=self._request_timeout_ms)

        return self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms)), timeout_ms, what)

    # --- consumer groups ------------------------------------------------------------------

    def list_groups(self, *, timeout_s: float | None = None) -> list[GroupListing]:
        """Every consumer group with live members or committed offsets (each
        partition_svc lists the groups it coordinates), sorted by id."""
        timeout_ms = self._timeout_ms(timeout_s)

        async def attempt():
            response = await self._metadata.fetch(())
            answers = await asyncio.gather(*(
                self._transport.call(b.address, "ListGroups", partition_pb2.ListGroupsRequest(), timeout_ms=self._request_timeout_ms)
                for b in response.brokers))
            return {g.group_id: GroupListing(g.group_id, g.state, g.members) for a in answers for g in a.groups}

        found = self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms)), timeout_ms, "list_groups")
        return [found[g] for g in sorted(found)]

    def describe_group(self, group_id: str, *, timeout_s: float | None = None) -> GroupDescription:
        """The group's members, epochs and partitions, from its coordinator."""
        _check_group_id(group_id)
        timeout_ms = self._timeout_ms(timeout_s)
        request = partition_pb2.DescribeGroupsRequest(group_ids=[group_id])

        async def attempt():
            address = await self._metadata.group_coordinator(group_id)
            response = await self._transport.call(address, "DescribeGroups", request, timeout_ms=self._request_timeout_ms)
            item = response.groups[0]
            if item.error.code != NONE:
                raise from_proto(item.error)
            return item

        item = self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms), group_id=group_id),
                         timeout_ms, "describe_group")
        members = tuple(GroupMemberDescription(
            m.member_id, m.instance_id if m.HasField("instance_id") else None, m.member_epoch, m.state, tuple(m.subscribed_topics),
            frozenset(TopicPartition(tp.topic, tp.partition) for tp in m.assigned),
            frozenset(TopicPartition(tp.topic, tp.partition) for tp in m.revoking)) for m in item.members)
        return GroupDescription(item.group_id, item.state, item.group_epoch, item.assignment_epoch, item.assignor, members)

    def delete_group(self, group_id: str, *, timeout_s: float | None = None) -> int:
        """Deletes a group without live members (its committed offsets go);
        returns how many offsets were deleted. NON_EMPTY_GROUP while members are live."""
        _check_group_id(group_id)
        timeout_ms = self._timeout_ms(timeout_s)
        request = partition_pb2.DeleteGroupsRequest(group_ids=[group_id])

        async def attempt():
            address = await self._metadata.group_coordinator(group_id)
            response = await self._transport.call(address, "DeleteGroups", request, timeout_ms=self._request_timeout_ms)
            item = response.groups[0]
            if item.error.code != NONE:
                raise from_proto(item.error)
            return item.offsets_deleted

        return self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms), group_id=group_id),
                         timeout_ms, "delete_group")

    def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition], *,
                             timeout_s: float | None = None) -> dict[TopicPartition, ClientError | None]:
        """Deletes the group's committed offsets of ``partitions`` (Kafka's
        deleteConsumerGroupOffsets); the group stays. Per partition: None when
        its offset is gone (or there was none), or the error that kept it
        (GROUP_SUBSCRIBED_TO_TOPIC while a live member subscribes to the topic)."""
        _check_group_id(group_id)
        wanted = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        if not wanted:
            raise error_for(ErrorCode.Value("INVALID_REQUEST"), "name at least one partition whose offset to delete")
        timeout_ms = self._timeout_ms(timeout_s)
        request = partition_pb2.DeleteGroupOffsetsRequest(
            group_id=group_id, partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in wanted])

        async def attempt():
            address = await self._metadata.group_coordinator(group_id)
            response = await self._transport.call(address, "DeleteGroupOffsets", request, timeout_ms=self._request_timeout_ms)
            return {TopicPartition(item.partition.topic, item.partition.partition):
                    from_proto(item.error) if item.error.code != NONE else None for item in response.partitions}

        return self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms), group_id=group_id),
                         timeout_ms, "delete_group_offsets")

    def list_group_offsets(self, group_id: str, *, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """The group's committed offsets (stable: none pending in an open transaction)."""
        _check_group_id(group_id)
        timeout_ms = self._timeout_ms(timeout_s)
        offsets = GroupOffsets(self._metadata, self._transport, group_id, request_timeout_ms=self._request_timeout_ms)
        committed = self._run(offsets.fetch(None, policy=self._policy(timeout_ms)), timeout_ms, "list_group_offsets")
        return {tp: offset for tp, offset in sorted(committed.items()) if offset is not None}

    def alter_group_offsets(self, group_id: str, offsets: Mapping, *, timeout_s: float | None = None) -> None:
        """Sets the group's committed offsets ({(topic, partition): offset}); refused
        (UNKNOWN_MEMBER_ID) while the group has live members, which would fight it."""
        _check_group_id(group_id)
        timeout_ms = self._timeout_ms(timeout_s)
        wanted = {as_tp(tp): offset for tp, offset in offsets.items()}
        if not wanted:
            return
        group = GroupOffsets(self._metadata, self._transport, group_id, request_timeout_ms=self._request_timeout_ms)
        self._run(group.commit(wanted, policy=self._policy(timeout_ms)), timeout_ms, "alter_group_offsets")

    def live_partition_nodes(self, *, timeout_s: float | None = None) -> list[int]:
        """Node ids of the live partition_svc instances."""
        timeout_ms = self._timeout_ms(timeout_s)

        async def attempt():
            return await self._metadata.fetch(())

        response = self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms)), timeout_ms,
                             "live_partition_nodes")
        return sorted(b.node_id for b in response.brokers)

    def describe_cluster(self, *, timeout_s: float | None = None) -> ClusterDescription:
        """The controller and every live instance of every service with its version (Kafka's describeCluster).
        Needs Describe on the Cluster on a secured cluster."""
        timeout_ms = self._timeout_ms(timeout_s)

        async def attempt():
            return await self._metadata.fetch((), describe_cluster=True)

        response = self._run(with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms)), timeout_ms,
                             "describe_cluster")
        if not response.instances:  # a server that knows describe_cluster lists itself at least
            raise ClientError(ErrorCode.Value("INVALID_REQUEST"), "the server that answered does not describe the cluster "
                                                                  "(a release before describe_cluster)")
        return ClusterDescription(
            controller_id=response.controller_id, controller_epoch=response.controller_epoch,
            instances=tuple(ServiceInstance(i.kind, i.node_id, i.address, i.version, i.rack, i.metrics_address)
                            for i in response.instances))

    def under_replicated_partitions(self, *, timeout_s: float | None = None) -> list[tuple[TopicPartition, PartitionDescription]]:
        """Every partition whose ISR is smaller than its replica list (or that has no leader)."""
        return [(TopicPartition(topic.name, p.partition), p) for topic in self.describe_topics(None, timeout_s=timeout_s)
                for p in topic.partitions if len(p.isr) < len(p.replicas) or p.leader_id < 0]

    # --- offsets and producers -----------------------------------------------------------------------

    def list_offsets(self, specs: Mapping, *, timeout_s: float | None = None) -> dict[TopicPartition, OffsetAndTimestamp]:
        """{(topic, partition): "earliest" | "latest" | "last_stable" | timestamp_ms}
        -> {TopicPartition: OffsetAndTimestamp}. "latest" is the high watermark."""
        kinds: dict[TopicPartition, int] = {}
        timestamps: dict[TopicPartition, int] = {}
        for key, spec in specs.items():
            tp = as_tp(key)
            if isinstance(spec, str):
                if spec not in OFFSET_SPECS:
                    raise ValueError(f"offset spec must be one of {sorted(OFFSET_SPECS)} or a timestamp, not {spec!r}")
                kinds[tp] = OFFSET_SPECS[spec]
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                kinds[tp] = partition_pb2.OFFSET_SPEC_TIMESTAMP
                timestamps[tp] = spec
            else:
                raise ValueError(f"offset spec must be a name or a timestamp in ms >= 0, not {spec!r}")
        timeout_ms = self._timeout_ms(timeout_s)
        answers = self._run(
            list_offsets(self._metadata, self._transport, kinds, timestamps, timeout_ms=timeout_ms,
                         backoff_ms=self._retry_backoff_ms, request_timeout_ms=self._request_timeout_ms),
            timeout_ms, "list_offsets")
        return {tp: OffsetAndTimestamp(offset, timestamp_ms) for tp, (offset, timestamp_ms) in answers.items()}

    def describe_producers(self, partitions: Iterable, *,
                           timeout_s: float | None = None) -> dict[TopicPartition, list[ProducerDescription]]:
        """The producers each partition's leader knows (ids, epochs, last sequence,
        open transactions)."""
        tps = [as_tp(p) for p in partitions]
        timeout_ms = self._timeout_ms(timeout_s)

        def build(group: list[TopicPartition]):
            return partition_pb2.DescribeProducersRequest(
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in group])

        def results_of(response):
            for item in response.results:
                producers = [ProducerDescription(p.producer_id, p.producer_epoch, p.last_sequence,
                                                 p.last_timestamp_ms, p.coordinator_epoch, p.current_txn_start_offset)
                             for p in item.producers]
                yield TopicPartition(item.topic, item.partition), item.error, producers

        answers = self._run(
            call_leaders(self._metadata, self._transport, tps, "DescribeProducers", build, results_of,
                         policy=self._policy(timeout_ms), timeout_ms=self._request_timeout_ms),
            timeout_ms, "describe_producers")
        return {tp: answers[tp] for tp in tps}

    def delete_records(self, offsets: Mapping, *, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """{(topic, partition): offset} -> {TopicPartition: low watermark}
        (Kafka's deleteRecords): moves each partition's log start to the
        offset (at most its last stable offset; -1 means that one), deleting
        the records below on the leader and on every replica, and returns
        once every in-sync replica has (the low watermark: their lowest log
        start). Raises the first partition's error that is not retriable
        (OFFSET_OUT_OF_RANGE for an offset past the last stable offset: that
        partition unchanged); REQUEST_TIMED_OUT when replicas have not
        followed within ``timeout_s`` (the deletion goes on)."""
        wanted: dict[TopicPartition, int] = {}
        for key, offset in offsets.items():
            tp = as_tp(key)
            names.check_topic_name(tp.topic)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
                raise ValueError(f"an offset to delete records below is an int >= 0, or -1 (the last stable offset), not {offset!r}")
            wanted[tp] = offset
        if not wanted:
            return {}
        timeout_ms = self._timeout_ms(timeout_s)
        wait_ms = int(min(timeout_ms, self._request_timeout_ms))  # each attempt's wait at the leader for its replicas

        def build(group: list[TopicPartition]):
            return partition_pb2.DeleteRecordsRequest(timeout_ms=wait_ms, partitions=[
                partition_pb2.DeleteRecordsPartition(topic=tp.topic, partition=tp.partition, offset=wanted[tp]) for tp in group])

        def results_of(response):
            for item in response.results:
                yield TopicPartition(item.topic, item.partition), item.error, item.low_watermark

        answers = self._run(
            call_leaders(self._metadata, self._transport, list(wanted), "DeleteRecords", build, results_of,
                         policy=self._policy(timeout_ms), timeout_ms=wait_ms + self._request_timeout_ms),
            timeout_ms + self._request_timeout_ms, "delete_records")
        return {tp: answers[tp] for tp in wanted}

    # --- transactions ---------------------------------------------------------------------------------

    async def _coordinator_call(self, rpc: str, request, timeout_ms: float):
        """``rpc`` on any transaction coordinator, retried by the transactional error table."""
        key_index = 0

        async def attempt():
            address = await self._metadata.transaction_coordinator(f"{ADMIN_KEY}-{key_index}" if key_index else ADMIN_KEY)
            return await self._transport.call(address, rpc, request, timeout_ms=self._request_timeout_ms)

        def retriable(exc: BaseException) -> bool:
            nonlocal key_index
            if not isinstance(exc, ClientError):
                return False
            action = txn_action_for(exc.code)
            if action is TxnAction.FIND_COORDINATOR:  # ask about another key: likely another coordinator
                self._metadata.forget_transaction_coordinator(f"{ADMIN_KEY}-{key_index}" if key_index else ADMIN_KEY)
                key_index += 1
            return action.retries

        return await self._policy(timeout_ms).run(attempt, retriable)

    def list_transactions(self, states=None, producer_ids=None, duration_ms: int | None = None, *,
                          prefix: str = "", timeout_s: float | None = None) -> list[TransactionListing]:
        """Every transaction the coordinators know, with optional filters: its
        ``states`` (names: Ongoing, Prepared, PrepareCommit, ...),
        ``producer_ids``, open longer than ``duration_ms``, transactional ids
        starting with ``prefix``. Sorted by transactional id."""
        if not isinstance(prefix, str):
            raise ValueError(f"prefix must be a str, not {prefix!r}")
        request = coordinator_pb2.ListTransactionsRequest(
            state_filters=[state_number(s) for s in states or ()],
            producer_id_filters=[int(p) for p in producer_ids or ()],
            duration_filter_ms=int(duration_ms or 0),
            transactional_id_prefix=prefix,
        )
        if request.duration_filter_ms < 0:
            raise ValueError(f"duration_ms must be >= 0, not {duration_ms}")
        timeout_ms = self._timeout_ms(timeout_s)
        response = self._run(self._coordinator_call("ListTransactions", request, timeout_ms), timeout_ms,
                             "list_transactions")
        listings = {(t.transactional_id, t.producer_id): TransactionListing(t.transactional_id, t.producer_id,
                                                                            state_name(t.state), t.producer_epoch)
                    for t in response.transactions}  # a coordinator that moved may list an id twice
        return sorted(listings.values())

    def describe_transactions(self, transactional_ids: Iterable[str], *,
                              timeout_s: float | None = None) -> list[TransactionDescription]:
        """The transactional ids in detail, in the order given, each asked of its
        own coordinator. An unknown id raises TRANSACTIONAL_ID_NOT_FOUND."""
        ids = list(dict.fromkeys(transactional_ids))
        if len(ids) > TRANSACTIONAL_IDS_PER_CALL_MAX:
            raise ValueError(f"at most {TRANSACTIONAL_IDS_PER_CALL_MAX} transactional ids per call, not {len(ids)}")
        for transactional_id in ids:
            if not isinstance(transactional_id, str) or not transactional_id:
                raise ValueError(f"a transactional id is a non-empty str, not {transactional_id!r}")
        if not ids:
            return []
        timeout_ms = self._timeout_ms(timeout_s)
        found = self._run(self._describe_transactions(ids, timeout_ms), timeout_ms, "describe_transactions")
        return [found[i] for i in ids]

    async def _describe_transactions(self, ids: list[str], timeout_ms: float) -> dict[str, TransactionDescription]:
        policy = self._policy(timeout_ms)
        started = policy.clock()
        pending = list(ids)
        found: dict[str, TransactionDescription] = {}
        attempt = 0
        last_error: ClientError | None = None
        while pending:
            try:  # one Metadata call for every id; those it cannot place are asked one by one below
                await self._metadata.fetch(transactional_ids=pending)
            except ClientError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
            by_address: dict[str, list[str]] = {}
            for transactional_id in pending:
                try:
                    address = await self._metadata.transaction_coordinator(transactional_id)
                except ClientError as exc:
                    if not txn_action_for(exc.code).retries:
                        raise
                    last_error = exc
                    continue
                by_address.setdefault(address, []).append(transactional_id)
            answers = await asyncio.gather(
                *(self._transport.call(address, "DescribeTransactions",
                                       coordinator_pb2.DescribeTransactionsRequest(transactional_ids=group),
                                       timeout_ms=self._request_timeout_ms)
                  for address, group in by_address.items()), return_exceptions=True)
            for (_, group), answer in zip(by_address.items(), answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, ClientError) or not txn_action_for(answer.code).retries:
                        raise answer
                    last_error = answer
                    for transactional_id in group:
                        self._metadata.forget_transaction_coordinator(transactional_id)
                    continue
                for item in answer.transactions:
                    if item.transactional_id not in group:
                        continue
                    if item.error.code != NONE:
                        error = from_proto(item.error)
                        if not txn_action_for(error.code).retries:
                            raise error
                        last_error = error
                        self._metadata.forget_transaction_coordinator(item.transactional_id)
                        continue
                    found[item.transactional_id] = TransactionDescription(
                        item.transactional_id, state_name(item.state), item.producer_id, item.producer_epoch,
                        item.transaction_timeout_ms, item.transaction_start_time_ms,
                        tuple(TopicPartition(p.topic, p.partition) for p in item.partitions),
                        item.prepared_time_ms, item.prepared_timeout_ms, item.prepare_metadata, item.checks_done,
                        check_answer_name(item.last_check_answer), item.next_check_time_ms)
            pending = [i for i in pending if i not in found]
            if not pending:
                break
            attempt += 1
            delay_ms = policy.delay_ms(attempt)
            if attempt >= policy.attempts_max or (policy.clock() - started) * 1000 + delay_ms > timeout_ms:
                raise last_error or error_for(ErrorCode.Value("REQUEST_TIMED_OUT"),
                                              f"DescribeTransactions: no answer for {pending}")
            await policy.sleep(delay_ms / 1000)
        return found

    def complete_transaction(self, handle: TransactionHandle, commit: bool, *, timeout_s: float | None = None) -> None:
        """Commits (``commit=True``) or aborts the prepared transaction ``handle``
        names (from ``Producer.prepare_transaction()``), from any process. On
        return the outcome is decided and durable; the markers follow (a commit
        is visible to read_committed readers once they are written). Repeating
        it changes nothing. A stale handle (its transaction was completed the
        other way, or fenced) raises ProducerFencedError or InvalidTxnStateError."""
        handle = self._checked_handle(handle)
        if not isinstance(commit, bool):
            raise ValueError(f"commit must be a bool, not {commit!r}")
        timeout_ms = self._timeout_ms(timeout_s)
        self._run(self._send_to_coordinator(handle.transactional_id, CompleteTransactionHandler(handle, commit),
                                            timeout_ms), timeout_ms, "complete_transaction")

    def commit_transaction_group(self, group_id: str, handles: Iterable[TransactionHandle], *,
                                 timeout_s: float | None = None) -> None:
        """Commits prepared transactions of transaction group ``group_id`` (their
        ids are ``<group_id>/...``) atomically: all of them or, on an error,
        none. Repeating it changes nothing. Every handle must be of the group,
        each id once, at most 10,000."""
        wanted = [self._checked_handle(h) for h in handles]
        check_transaction_group(group_id)
        if not wanted:
            raise ValueError("commit_transaction_group needs at least one handle")
        timeout_ms = self._timeout_ms(timeout_s)
        self._run(self._send_to_coordinator(group_id, CommitTransactionGroupHandler(group_id, wanted), timeout_ms),
                  timeout_ms, "commit_transaction_group")

    # --- transaction check-back (issue 19) ------------------------------------------------------------

    def alter_transaction_group_config(self, group_id: str, configs: Mapping[str, str] | None = None,
                                       delete: Iterable[str] = (), *, timeout_s: float | None = None) -> dict[str, str]:
        """Sets ``configs`` of transaction group ``group_id`` and puts ``delete``'s
        back to their defaults; returns every setting afterwards (defaults
        included). Kept durably by the group's coordinator. The keys:
        ``transaction.check.interval.ms`` (100..86,400,000, default 60,000),
        ``transaction.check.max`` (1..1,000, default 15),
        ``transaction.check.exhausted`` (``abort``, the default, or ``keep``),
        ``transaction.check.timeout.ms`` (100..60,000, default 5,000). An
        unknown key or a bad value raises (the coordinator's INVALID_CONFIG or
        INVALID_REQUEST names it), and then nothing changed."""
        check_transaction_group(group_id)
        changes, deleted = group_config_change(configs, delete)
        timeout_ms = self._timeout_ms(timeout_s)
        return self._run(self._send_to_coordinator(group_id, AlterTransactionGroupConfigHandler(group_id, changes, deleted),
                                                   timeout_ms), timeout_ms, "alter_transaction_group_config")

    def describe_transaction_group_config(self, group_id: str, *,
                                          timeout_s: float | None = None) -> TransactionGroupConfig:
        """Transaction group ``group_id``'s check-back settings (every key, with
        its default where none was set), the keys set explicitly, and the
        checkers registered now with what is left of their leases."""
        check_transaction_group(group_id)
        timeout_ms = self._timeout_ms(timeout_s)
        return self._run(self._send_to_coordinator(group_id, DescribeTransactionGroupConfigHandler(group_id), timeout_ms),
                         timeout_ms, "describe_transaction_group_config")

    def register_transaction_checker(self, group_id: str, address: str, lease_ms: int = 0, *,
                                     timeout_s: float | None = None) -> int:
        """Registers (or renews) ``address`` (host:port serving
        TransactionCheckService, reachable from the coordinators) as a checker
        of transaction group ``group_id`` for ``lease_ms`` (1,000..300,000; 0:
        the coordinator's 30,000); returns the lease granted, ms: renew within
        it. :class:`~txlog.checker.TransactionChecker` does this for you."""
        check_transaction_group(group_id)
        if not isinstance(address, str) or not address:
            raise ValueError(f"address must be a non-empty host:port str, not {address!r}")
        if not isinstance(lease_ms, int) or isinstance(lease_ms, bool) or lease_ms < 0:
            raise ValueError(f"lease_ms must be an int >= 0 (0: the coordinator's default), not {lease_ms!r}")
        timeout_ms = self._timeout_ms(timeout_s)
        return self._run(self._send_to_coordinator(
            group_id, RegisterTransactionCheckerHandler(group_id, address, lease_ms), timeout_ms),
            timeout_ms, "register_transaction_checker")

    def unregister_transaction_checker(self, group_id: str, address: str, *, timeout_s: float | None = None) -> None:
        """Removes the registration of ``address`` for ``group_id`` at once."""
        check_transaction_group(group_id)
        timeout_ms = self._timeout_ms(timeout_s)
        self._run(self._send_to_coordinator(group_id, UnregisterTransactionCheckerHandler(group_id, address), timeout_ms),
                  timeout_ms, "unregister_transaction_checker")

    @staticmethod
    def _checked_handle(handle) -> TransactionHandle:
        if not isinstance(handle, tuple) or len(handle) != 3:
            raise ValueError(f"a handle is a TransactionHandle(transactional_id, producer_id, producer_epoch), "
                             f"not {handle!r}")
        handle = TransactionHandle(*handle)
        if not names.is_transactional_id(handle.transactional_id) or not isinstance(handle.producer_id, int) \
                or not isinstance(handle.producer_epoch, int):
            raise ValueError(f"not a valid transaction handle: {handle!r}")
        return handle

    async def _send_to_coordinator(self, key: str, handler, timeout_ms: float):
        """``handler``'s request at the coordinator of ``key`` (a transactional id or group)."""
        client = CoordinatorClient(self._metadata, self._transport, key, request_timeout_ms=self._request_timeout_ms,
                                   backoff=self._policy(timeout_ms))
        try:
            return await asyncio.wait_for(client.send(handler, producer_epoch=-1), timeout_ms / 1000)
        except TimeoutError:
            raise error_for(ErrorCode.Value("REQUEST_TIMED_OUT"),
                            f"{handler.rpc} got no final answer within {timeout_ms:.0f} ms") from None

    def abort_transaction(self, partition, producer_id: int, producer_epoch: int, coordinator_epoch: int, *,
                          timeout_s: float | None = None) -> None:
        """Aborts a hanging transaction on one partition: a coordinator writes an
        ABORT marker there with the producer's id and epoch (from
        ``find_hanging`` or ``describe_producers``). A coordinator epoch of -1
        (no marker seen yet) is sent as 0, as Kafka's tool does."""
        tp = as_tp(partition)
        for name, value in (("producer_id", producer_id), ("producer_epoch", producer_epoch),
                            ("coordinator_epoch", coordinator_epoch)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, not {value!r}")
        if producer_id < 0 or producer_epoch < 0:
            raise ValueError(f"producer_id and producer_epoch must be >= 0, not {producer_id}, {producer_epoch}")
        request = coordinator_pb2.AbortTransactionRequest(
            partition=common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition), producer_id=producer_id,
            producer_epoch=producer_epoch, coordinator_epoch=max(coordinator_epoch, 0))
        timeout_ms = self._timeout_ms(timeout_s)
        self._run(self._coordinator_call("AbortTransaction", request, timeout_ms), timeout_ms, "abort_transaction")

    def find_hanging(self, topics: Iterable[str] | None = None,
                     max_transaction_timeout_ms: int = MAX_TRANSACTION_TIMEOUT_MS_DEFAULT, *,
                     timeout_s: float | None = None) -> list[HangingTransaction]:
        """The hanging transactions of ``topics``' partitions (None: every topic
        but ``__transaction_state``; ``__consumer_offsets`` included, where
        offsets sent in transactions live).

        A partition's open transaction (DescribeProducers: a producer with
        ``current_txn_start_offset`` >= 0) is hanging when its last write is
        older than ``max_transaction_timeout_ms`` (every coordinator would have
        aborted it by then), unless the coordinator has it Prepared (two-phase:
        it waits for whoever holds its handle, up to its prepared timeout); when no coordinator lists an open transaction
        (Ongoing, Prepare*) for its producer id; or when the coordinator's open
        transaction for that id is a later one (a higher epoch) without this
        partition. Kafka's ``kafka-transactions.sh find-hanging`` does the same."""
        if not isinstance(max_transaction_timeout_ms, int) or max_transaction_timeout_ms <= 0:
            raise ValueError(f"max_transaction_timeout_ms must be a positive int, not {max_transaction_timeout_ms!r}")
        wanted = None if topics is None else list(dict.fromkeys(topics))
        described = self.describe_topics(wanted, timeout_s=timeout_s)
        tps = [TopicPartition(t.name, p.partition) for t in described
               if wanted is not None or t.name != TRANSACTION_STATE_TOPIC for p in t.partitions]
        if not tps:
            return []
        states = self.describe_producers(tps, timeout_s=timeout_s)
        open_txns = [(tp, producer) for tp in tps for producer in states[tp] if producer.current_txn_start_offset >= 0]
        if not open_txns:
            return []
        listings = self.list_transactions(producer_ids=sorted({p.producer_id for _, p in open_txns}),
                                          timeout_s=timeout_s)
        open_listings = {t.producer_id: t for t in listings if t.state in OPEN_STATES}
        ongoing_ids = sorted({t.transactional_id for t in open_listings.values() if t.state == "Ongoing"})
        descriptions = {d.producer_id: d for d in self.describe_transactions(ongoing_ids, timeout_s=timeout_s)} \
            if ongoing_ids else {}
        now_ms = int(time.time() * 1000)
        hanging = []
        for tp, producer in open_txns:
            listing = open_listings.get(producer.producer_id)
            description = descriptions.get(producer.producer_id)
            prepared = listing is not None and listing.state == "Prepared"  # waits for its handle's holder, by design
            if not prepared and producer.last_timestamp_ms >= 0 \
                    and now_ms - producer.last_timestamp_ms > max_transaction_timeout_ms:
                reason = (f"open for more than max_transaction_timeout_ms={max_transaction_timeout_ms} "
                          f"(last write at {producer.last_timestamp_ms})")
            elif listing is None:
                reason = f"no coordinator has an open transaction for producer id {producer.producer_id}"
            elif description is not None and description.producer_epoch > producer.producer_epoch \
                    and description.state == "Ongoing" and tp not in description.partitions:
                reason = (f"the coordinator's open transaction of {description.transactional_id!r} is a later one "
                          f"(epoch {description.producer_epoch}) without this partition")
            else:
                continue
            hanging.append(HangingTransaction(tp.topic, tp.partition, producer.producer_id, producer.producer_epoch,
                                              producer.coordinator_epoch, producer.current_txn_start_offset,
                                              producer.last_timestamp_ms, reason))
        return hanging

    # --- closing ----------------------------------------------------------------------------------------

    def close_at_exit(self, timeout_s: float) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(self._transport.close(), timeout_s=5, what="closing connections")
        finally:
            self._loop.stop()
            shutdown.closed(self)

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def check_transaction_group(group_id) -> None:
    """ValueError unless ``group_id`` is a transaction group name."""
    if not names.is_transaction_group(group_id):
        raise ValueError(f"group_id must be 1 to {names.TRANSACTIONAL_ID_CHARS_MAX} characters of "
                         f"[a-zA-Z0-9._:-] (a transaction group: the part of a transactional id before its first "
                         f"'/'), not {group_id!r}")


def _check_group_id(group_id) -> None:
    if not isinstance(group_id, str) or not names.is_group_id(group_id):
        raise ValueError(f"group_id must be 1 to {names.GROUP_ID_CHARS_MAX} characters of [a-zA-Z0-9._-], not {group_id!r}")
