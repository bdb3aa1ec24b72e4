"""PartitionService's consumer groups: the heartbeat of the KIP-848
protocol, and listing, describing and deleting groups and their offsets.
The group coordinator (group_coordinator.py) keeps the groups; a group lives
where its __consumer_offsets partition is led."""

from __future__ import annotations

import logging

from partition_svc import log_format, validation
from partition_svc.cluster_view import ClusterView
from partition_svc.group_coordinator import GroupCoordinator
from partition_svc.partition import now_ms
from partition_svc.producer_state import Reject
from partition_svc.rpc_errors import error_of, not_replicated, request_error
from services.runtime import server
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)


class GroupServicer:
    RPCS = ("ConsumerGroupHeartbeat", "ListGroups", "DeleteGroups", "DeleteGroupOffsets", "DescribeGroups")

    def __init__(self, view: ClusterView, groups: GroupCoordinator):
        self.view = view
        self.config = view.config
        self.groups = groups

    @server.rpc_handler
    async def ConsumerGroupHeartbeat(self, request, context):
        validation.check_group_id(request.group_id)
        return await self.groups.heartbeat(request)

    @server.rpc_handler
    async def ListGroups(self, request, context):
        return await self.groups.list_groups()

    @server.rpc_handler
    async def DeleteGroups(self, request, context):
        reply = partition_pb2.DeleteGroupsResponse()
        for group_id in self.checked_group_ids(request.group_ids):
            item = reply.groups.add(group_id=group_id)
            try:
                offsets_partition = await self.view.group_partition(group_id)
                async with self.groups.lock(group_id):  # no member joins while the group goes
                    await self.groups.check_empty(group_id)
                    keys = [log_format.group_offset_key(group_id, topic, index) for topic, index, _, _ in self.view.store.group_offsets(group_id)]
                    membership = [log_format.membership_key(group_id, member_id) for member_id in self.view.store.group_membership(group_id)]
                    if keys or membership:
                        outcome = offsets_partition.commit_offsets([(key, None) for key in keys + membership], now_ms(), self.view.limits)
                        if isinstance(outcome, Reject) or not await outcome:
                            raise not_replicated(offsets_partition)
                    self.groups.forget(group_id)
                item.offsets_deleted = len(keys)
                log.info("group deleted", extra=fields(group=group_id, offsets=len(keys)))
            except TxlogError as exc:
                item.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def DeleteGroupOffsets(self, request, context):
        validation.check_group_id(request.group_id)
        self.view.check_partition_count(len(request.partitions))
        wanted = [(p.topic, p.partition) for p in request.partitions]
        for topic, index in wanted:
            validation.check_topic_name(topic)
            if index < 0:
                raise validation.invalid(f"partitions are numbered from 0: {topic}-{index}")
        if len(set(wanted)) < len(wanted):
            raise request_error("the request names a partition twice")
        offsets_partition = await self.view.group_partition(request.group_id)
        reply = partition_pb2.DeleteGroupOffsetsResponse()
        async with self.groups.lock(request.group_id):  # no member subscribes between the check and the write
            subscribed = await self.groups.subscribed_topics(request.group_id)
            committed = {(topic, index) for topic, index, _, _ in self.view.store.group_offsets(request.group_id)}
            keys = []
            for topic, index in wanted:
                item = reply.partitions.add(partition=common_pb2.TopicPartition(topic=topic, partition=index))
                if topic in subscribed:
                    item.error.CopyFrom(error_of(TxlogError(
                        ErrorCode.Value("GROUP_SUBSCRIBED_TO_TOPIC"),
                        f"a live member of group {request.group_id!r} subscribes to {topic}: its offsets stay "
                        "(stop or unsubscribe the members first)")))
                elif (topic, index) in committed:
                    keys.append(log_format.group_offset_key(request.group_id, topic, index))
            if keys:
                outcome = offsets_partition.commit_offsets([(key, None) for key in keys], now_ms(), self.view.limits)
                if isinstance(outcome, Reject) or not await outcome:
                    raise not_replicated(offsets_partition)
        log.info("group offsets deleted", extra=fields(group=request.group_id, offsets=len(keys)))
        return reply

    @server.rpc_handler
    async def DescribeGroups(self, request, context):
        return await self.groups.describe(self.checked_group_ids(request.group_ids))

    def checked_group_ids(self, group_ids) -> list[str]:
        """The request's group ids, each once; INVALID_REQUEST or INVALID_GROUP_ID naming what is wrong."""
        if not group_ids:
            raise request_error("the request names no group")
        if len(group_ids) > self.config.partitions_per_request_max:
            raise request_error(f"the request names {len(group_ids)} groups, more than {self.config.partitions_per_request_max}")
        for group_id in group_ids:
            validation.check_group_id(group_id)
        return list(dict.fromkeys(group_ids))
