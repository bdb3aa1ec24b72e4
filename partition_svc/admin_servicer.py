"""PartitionService's cluster administration: Metadata, topics (create,
configs, partitions, delete), reassignments and ACLs (the authorizer checks
Alter or Describe on the Cluster first). Topics live in ZooKeeper
(topics.py); a change that races another is read again and redone."""

from __future__ import annotations

import asyncio
import logging

from partition_svc import placement, validation
from partition_svc.cluster_view import KIND, ClusterView
from partition_svc.data_servicer import INTERNAL_TOPICS
from partition_svc.rpc_errors import checked_acl, error, error_of, request_error
from partition_svc.topic_deletion import TopicDeletion
from partition_svc.topics import INTERNAL_PREFIX, TopicInfo
from services.coordination import zk
from services.runtime import server
from services.runtime.logs import fields
from txlog.protocol import CONSUMER_OFFSETS_TOPIC, acls
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.hashing import partition_for_id
from txlog.protocol.names import is_group_id, is_topic_name
from txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)

CONFIG_WRITE_ATTEMPTS = 5  # conditional writes of a topic (configs, partitions) raced by others (a reassignment, another change)
METADATA_STATE_READS_CONCURRENT_MAX = 500  # ZooKeeper reads one Metadata call has outstanding at once


class AdminServicer:
    RPCS = ("Metadata", "CreateTopics", "AlterPartitionReassignments", "ListPartitionReassignments", "AlterTopicConfigs",
            "CreatePartitions", "DeleteTopics", "CreateAcls", "DescribeAcls", "DeleteAcls")

    def __init__(self, view: ClusterView, deletion: TopicDeletion):
        self.view = view
        self.config = view.config
        self.deletion = deletion

    @server.rpc_handler
    async def Metadata(self, request, context):
        live = await self.view.live_nodes()
        reply = partition_pb2.MetadataResponse(
            brokers=[partition_pb2.NodeInfo(node_id=n, address=a) for n, a in sorted(live.items())]
        )
        if request.describe_cluster:
            reply.controller_id, reply.controller_epoch = await self.view.controller.current()
            for kind, node_id, details in await self.view.instances():
                reply.instances.add(kind=kind, node_id=node_id, address=details.get("address", ""),
                                    version=details.get("version", ""), rack=details.get("rack", ""),
                                    metrics_address=details.get("metrics_address", ""))
        names = await self.view.topics.names() if request.all_topics else list(dict.fromkeys(request.topics))
        for name in names:
            topic = reply.topics.add(name=name)
            info = await self.view.topics.get(name) if is_topic_name(name) else None
            if info is None:
                topic.error.CopyFrom(error("UNKNOWN_TOPIC_OR_PARTITION", f"topic {name[:300]!r} does not exist"))
                continue
            topic.is_internal = info.internal
            topic.configs.update(info.configs)
            await self._read_unknown_states(name, info.partition_count)
            for index in range(info.partition_count):
                state = await self.view.replicas.state(name, index)
                leader = state.leader if state is not None else -1
                entry = topic.partitions.add(partition=index, leader_id=leader, leader_epoch=state.leader_epoch if state else 0,
                                             replicas=info.replicas[index], isr=state.isr if state else ())
                if leader in live:
                    entry.leader_address = live[leader]
                else:
                    entry.error.CopyFrom(error("LEADER_NOT_AVAILABLE", f"partition {index} has no live leader (leader {leader}, "
                                                                       f"in-sync replicas {list(entry.isr)})"))
        for transactional_id in request.transactional_ids:
            entry = reply.transaction_coordinators.add(key=transactional_id)
            try:
                entry.address = await self.view.transaction_coordinator(transactional_id)
            except TxlogError as exc:
                entry.error.CopyFrom(error_of(exc))
        if request.group_ids:
            try:
                info = await self.view.offsets_topic()
            except TxlogError as exc:  # not created yet (too few instances live): each group says so
                for group_id in request.group_ids:
                    reply.group_coordinators.add(key=group_id, node_id=-1).error.CopyFrom(error_of(exc))
                return reply
            for group_id in request.group_ids:
                entry = reply.group_coordinators.add(key=group_id)
                try:
                    found = await self.view.find_group_coordinator(group_id, info)
                    entry.node_id, entry.address = found.coordinator_id, found.address
                except TxlogError as exc:
                    if is_group_id(group_id):
                        state = await self.view.replicas.state(CONSUMER_OFFSETS_TOPIC, partition_for_id(group_id, info.partition_count))
                        entry.node_id = state.leader if state is not None else -1
                    entry.error.CopyFrom(error_of(exc))
        return reply

    async def _read_unknown_states(self, topic: str, partition_count: int) -> None:
        """Reads the states of the topic's partitions not known here, many at once
        (an instance forgets those of partitions held elsewhere every minute: one
        at a time, a Metadata of every topic then waited for thousands of reads in a row)."""
        unknown = [index for index in range(partition_count) if (topic, index) not in self.view.replicas.states]
        await zk.gather_in_chunks(lambda index: self.view.replicas.state(topic, index), unknown, METADATA_STATE_READS_CONCURRENT_MAX)

    @server.rpc_handler
    async def CreateTopics(self, request, context):
        if not request.topics:
            raise request_error("the request names no topic")
        reply = partition_pb2.CreateTopicsResponse()
        for wanted in request.topics:
            result = reply.results.add(name=wanted.name, partition_count=wanted.partition_count)
            try:
                validation.check_topic_name(wanted.name)
                internal = wanted.name.startswith(INTERNAL_PREFIX)
                if internal and wanted.name not in INTERNAL_TOPICS:
                    raise TxlogError(ErrorCode.Value("INVALID_TOPIC"), f"names starting with {INTERNAL_PREFIX!r} are internal")
                validation.check_partition_count(wanted.partition_count, self.config.partitions_per_topic_max)
                configs = dict(wanted.configs, **({"cleanup.policy": "compact"} if internal else {}))
                replication_factor = wanted.replication_factor if wanted.HasField("replication_factor") else None
                if replication_factor is not None and replication_factor < 1:
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"replication factor must be at least 1, got {replication_factor}")
                validation.topic_configs(configs, self.config.record_bytes_max, replication_factor or 2**31)
                if request.validate_only:
                    continue
                info = await self.view.create_topic(wanted.name, wanted.partition_count, configs, replication_factor, internal=internal)
                result.replication_factor = info.replication_factor
                if info.partition_count != wanted.partition_count:
                    raise TxlogError(
                        ErrorCode.Value("TOPIC_ALREADY_EXISTS"),
                        f"topic {wanted.name!r} exists with {info.partition_count} partitions, not {wanted.partition_count}",
                    )
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def AlterPartitionReassignments(self, request, context):
        if not request.reassignments:
            raise request_error("the request names no reassignment")
        self.view.check_partition_count(len(request.reassignments))
        named = [(r.topic, r.partition) for r in request.reassignments]
        if len(set(named)) != len(named):
            raise request_error("the request names a partition twice")
        live = await asyncio.to_thread(self.view.runtime.registry.live, KIND)
        reply = partition_pb2.AlterPartitionReassignmentsResponse()
        for wanted in request.reassignments:
            result = reply.results.add(partition=common_pb2.TopicPartition(topic=wanted.topic, partition=wanted.partition))
            try:
                info = await self.view.topics.get(wanted.topic) if is_topic_name(wanted.topic) else None
                if info is None or not 0 <= wanted.partition < info.partition_count:
                    raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"),
                                     f"{wanted.topic[:300]!r} partition {wanted.partition} does not exist")
                target = tuple(wanted.replicas)
                if not target or len(set(target)) != len(target):
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"the target replicas must be distinct node ids, at least one, got {list(target)[:20]}")
                gone = sorted(set(target) - set(live))
                if gone:
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"nodes {gone[:20]} are not live partition_svc instances (live: {sorted(live)})")
                if int(info.configs.get("min.insync.replicas", "1")) > len(target):
                    raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"),
                                     f"{len(target)} replicas are fewer than the topic's min.insync.replicas {info.configs['min.insync.replicas']}")
                await self.view.topics.request_reassignment(wanted.topic, wanted.partition, target)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        self.view.controller.wake()
        return reply

    @server.rpc_handler
    async def ListPartitionReassignments(self, request, context):
        reply = partition_pb2.ListPartitionReassignmentsResponse()
        for (topic, index), target in sorted((await self.view.topics.reassignments()).items()):
            info = await self.view.topics.get(topic, fresh=True)
            current = info.replicas[index] if info is not None and index < info.partition_count else ()
            reply.reassignments.add(topic=topic, partition=index, replicas=current, target_replicas=target)
        return reply

    @server.rpc_handler
    async def AlterTopicConfigs(self, request, context):
        self.check_topic_items(request.topics)
        reply = partition_pb2.AlterTopicConfigsResponse()
        for change in request.topics:
            result = reply.results.add(topic=change.topic)
            try:
                result.configs.update(await self.alter_topic_configs(change, request.validate_only))
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    def check_topic_items(self, items) -> None:
        """A per-topic request's items: at least one, at most the limit, each topic once."""
        self.check_topic_names([item.topic for item in items], "; put its changes together")

    def check_topic_names(self, names, hint: str = "") -> None:
        """A request's topics: at least one, at most the limit, each once."""
        if not names:
            raise request_error("the request names no topic")
        if len(names) > self.config.partitions_per_request_max:
            raise request_error(f"the request names {len(names)} topics, more than {self.config.partitions_per_request_max}")
        if len(set(names)) < len(names):
            raise request_error(f"the request names a topic twice{hint}")

    async def alter_topic_configs(self, change, validate_only: bool) -> dict[str, str]:
        """The topic's configs after ``change`` (written unless ``validate_only``),
        checked as a new topic's are; a write that raced another is done again."""
        validation.check_topic_name(change.topic)
        if change.topic.startswith(INTERNAL_PREFIX):
            raise validation.invalid(f"{change.topic} is internal: its configs are the cluster's settings", "INVALID_CONFIG")
        both = sorted(set(change.set) & set(change.delete))
        if both:
            raise validation.invalid(f"config {both[0][:100]!r} is both set and deleted", "INVALID_CONFIG")
        unknown = sorted(set(change.delete) - validation.TOPIC_CONFIG_KEYS)
        if unknown:
            raise validation.invalid(f"unknown topic config {unknown[0][:100]!r} to delete; known: "
                                     f"{sorted(validation.TOPIC_CONFIG_KEYS)}", "INVALID_CONFIG")

        async def attempt(info: TopicInfo, version: int) -> dict[str, str] | None:
            kept = {key: value for key, value in info.configs.items() if key not in change.delete}
            configs = validation.topic_configs({**kept, **change.set}, self.config.record_bytes_max, info.replication_factor)
            if validate_only or configs == info.configs:
                return configs
            written = await self.view.topics.write_configs(info, configs, version)
            if written is None:
                return None
            self.view.replicas.apply_configs(written)
            log.info("topic configs altered", extra=fields(topic=change.topic, set=dict(change.set), deleted=list(change.delete)))
            return configs

        return await self.change_topic(change.topic, attempt, "its configs were written")

    async def change_topic(self, topic: str, attempt, doing: str):
        """Runs ``attempt(info, version)`` on the topic as ZooKeeper holds it
        until it answers something other than None (None: its conditional write
        lost to another change of the topic, so read again and redo)."""
        for _ in range(CONFIG_WRITE_ATTEMPTS):
            versioned = await self.view.topics.versioned(topic)
            if versioned is None:
                raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"topic {topic!r} does not exist")
            done = await attempt(*versioned)
            if done is not None:
                return done
        raise TxlogError(ErrorCode.Value("REQUEST_TIMED_OUT"), f"topic {topic!r} kept changing while {doing}; retry")

    @server.rpc_handler
    async def CreatePartitions(self, request, context):
        self.check_topic_items(request.topics)
        reply = partition_pb2.CreatePartitionsResponse()
        for wanted in request.topics:
            result = reply.results.add(topic=wanted.topic)
            try:
                result.partition_count = await self.add_partitions(wanted.topic, wanted.total_count, request.validate_only)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    async def add_partitions(self, topic: str, total: int, validate_only: bool) -> int:
        """Grows ``topic`` to ``total`` partitions, placed over the live instances
        (rack-aware) as a new topic's are; the partition count afterwards."""
        validation.check_topic_name(topic)
        if topic.startswith(INTERNAL_PREFIX):
            raise TxlogError(ErrorCode.Value("INVALID_PARTITIONS"), f"{topic} is internal: its partition count places "
                             "transactional ids and groups, and stays as it was created")
        validation.check_partition_count(total, self.config.partitions_per_topic_max)

        async def attempt(info: TopicInfo, version: int) -> int | None:
            if total <= info.partition_count:
                raise TxlogError(ErrorCode.Value("INVALID_PARTITIONS"), f"topic {topic!r} has {info.partition_count} partitions: "
                                 f"a new count must be more (partitions are never removed), got {total}")
            nodes = await asyncio.to_thread(self.view.runtime.registry.live_details, KIND)
            if len(nodes) < info.replication_factor:
                raise TxlogError(ErrorCode.Value("INVALID_REPLICATION_FACTOR"), f"topic {topic!r} has {info.replication_factor} "
                                 f"replicas per partition, more than the {len(nodes)} live partition_svc instances")
            if validate_only:
                return total
            racks = {node: (details.get("rack") or None) for node, details in nodes.items()}
            start = partition_for_id(topic, len(nodes))
            placed = placement.assign_replicas(total, info.replication_factor, racks, start=start, shift=start)[info.partition_count:]
            grown = await self.view.topics.add_partitions(info, [tuple(r) for r in placed], version, self.view.replicas.controller_epoch)
            if grown is None:
                return None
            self.view.controller.wake()
            log.info("partitions added", extra=fields(topic=topic, partitions=grown.partition_count))
            return grown.partition_count

        return await self.change_topic(topic, attempt, "partitions were added")

    @server.rpc_handler
    async def DeleteTopics(self, request, context):
        self.check_topic_names(request.topics)
        return await self.deletion.delete_topics(list(request.topics), request.timeout_ms)

    @server.rpc_handler
    async def CreateAcls(self, request, context):
        store = self.view.runtime.authorizer.check_admin_available()
        if not request.bindings:
            raise request_error("the request holds no binding")
        if len(request.bindings) > self.config.partitions_per_request_max:
            raise request_error(f"the request holds {len(request.bindings)} bindings, more than {self.config.partitions_per_request_max}")
        bindings = [checked_acl(acls.binding_from_proto, b, f"binding {i}") for i, b in enumerate(request.bindings)]
        await store.add(bindings)
        log.info("acls created", extra=fields(bindings=[acls.describe(b) for b in bindings]))
        return partition_pb2.CreateAclsResponse()

    @server.rpc_handler
    async def DescribeAcls(self, request, context):
        store = self.view.runtime.authorizer.check_admin_available()
        filters = [checked_acl(acls.filter_from_proto, f, f"filter {i}") for i, f in enumerate(request.filters)] or [acls.AclFilter()]
        found = [b for b in await asyncio.to_thread(store.load) if any(f.matches(b) for f in filters)]
        return partition_pb2.DescribeAclsResponse(bindings=[acls.binding_to_proto(b) for b in sorted(found, key=acls.describe)])

    @server.rpc_handler
    async def DeleteAcls(self, request, context):
        store = self.view.runtime.authorizer.check_admin_available()
        if not request.filters:
            raise request_error("the request holds no filter; AclBindingFilter() with nothing set matches every binding")
        filters = [checked_acl(acls.filter_from_proto, f, f"filter {i}") for i, f in enumerate(request.filters)]
        removed = await store.remove(filters)
        log.info("acls deleted", extra=fields(bindings=[acls.describe(b) for b in removed]))
        return partition_pb2.DeleteAclsResponse(bindings=[acls.binding_to_proto(b) for b in sorted(removed, key=acls.describe)])
