"""Committed offsets of a consumer group, kept by the group's coordinator (the
partition_svc leading the group's ``__consumer_offsets`` partition).

Guarantees
----------
* Requests go to the coordinator named by Metadata ``group_coordinators``; a
  NOT_COORDINATOR (or COORDINATOR_NOT_AVAILABLE) answer makes the client look
  the coordinator up again and retry, within the retry policy.
* A commit is all or nothing from the caller's view: it returns when every
  offset was accepted and raises otherwise (committing the same offsets again
  is harmless, so a retried commit is safe).
* ``fetch`` answers None for a partition without a committed offset.
"""

from __future__ import annotations

from collections.abc import Iterable

from txlog.errors import error_for, from_proto
from txlog.membership import GroupMetadata
from txlog.metadata import Metadata
from txlog.protocol.errors import ErrorCode
from txlog.protocol.retry import RetryPolicy
from txlog.requests import with_retries
from txlog.structs import OffsetAndMetadata, TopicPartition
from txlog.v1 import common_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
OFFSETS_PER_COMMIT_MAX = 100_000


class GroupOffsets:
    def __init__(self, metadata: Metadata, transport, group_id: str, *, request_timeout_ms: float):
        self._metadata = metadata
        self._transport = transport
        self.group_id = group_id
        self._request_timeout_ms = request_timeout_ms

    async def _call(self, rpc: str, request):
        address = await self._metadata.group_coordinator(self.group_id)
        return await self._transport.call(address, rpc, request, timeout_ms=self._request_timeout_ms)

    async def commit(self, offsets: dict[TopicPartition, int | OffsetAndMetadata], *, policy: RetryPolicy,
                     member: GroupMetadata | None = None) -> None:
        """``offsets``: an offset, or an OffsetAndMetadata to commit text beside it.
        ``member``: a subscribed consumer's id and epoch, which the coordinator checks (KIP-447)."""
        offsets = {tp: value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
                   for tp, value in offsets.items()}
        if len(offsets) > OFFSETS_PER_COMMIT_MAX:
            raise error_for(ErrorCode.Value("INVALID_REQUEST"),
                            f"at most {OFFSETS_PER_COMMIT_MAX} offsets per commit, not {len(offsets)}")
        for tp, (offset, text) in offsets.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise error_for(ErrorCode.Value("INVALID_OFFSET"), f"offset of {tp} must be an int >= 0, not {offset!r}")
            if not isinstance(text, str):
                raise error_for(ErrorCode.Value("INVALID_REQUEST"), f"the metadata of {tp} must be a str, not {type(text).__name__}")
        request = partition_pb2.OffsetCommitRequest(
            group_id=self.group_id,
            offsets=[partition_pb2.PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset, metadata=text)
                     for tp, (offset, text) in sorted(offsets.items())],
        )
        if member is not None and member.member_id:
            request.member_id, request.member_epoch = member.member_id, member.member_epoch

        async def attempt() -> None:
            response = await self._call("OffsetCommit", request)
            self._raise_first(response.results)

        await with_retries(attempt, metadata=self._metadata, policy=policy, group_id=self.group_id)

    async def fetch(self, tps: Iterable[TopicPartition] | None, *, policy: RetryPolicy,
                    require_stable: bool = True) -> dict[TopicPartition, int | None]:
        """Committed offsets of ``tps`` (None: every partition the group has offsets for)."""
        committed = await self.fetch_with_metadata(tps, policy=policy, require_stable=require_stable)
        return {tp: None if c is None else c.offset for tp, c in committed.items()}

    async def fetch_with_metadata(self, tps: Iterable[TopicPartition] | None, *, policy: RetryPolicy,
                                  require_stable: bool = True) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """As fetch, with the text committed beside each offset."""
        wanted = None if tps is None else sorted(set(tps))
        request = partition_pb2.OffsetFetchRequest(
            group_id=self.group_id,
            partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in wanted or ()],
            require_stable=require_stable,
        )

        async def attempt() -> dict[TopicPartition, OffsetAndMetadata | None]:
            response = await self._call("OffsetFetch", request)
            committed: dict[TopicPartition, OffsetAndMetadata | None] = {}
            for item in response.offsets:
                if item.error.code != NONE:
                    raise from_proto(item.error)
                committed[TopicPartition(item.topic, item.partition)] = \
                    OffsetAndMetadata(item.offset, item.metadata) if item.offset >= 0 else None
            for tp in wanted or ():
                committed.setdefault(tp, None)
            return committed

        return await with_retries(attempt, metadata=self._metadata, policy=policy, group_id=self.group_id)

    def _raise_first(self, results) -> None:
        for result in results:
            if result.error.code != NONE:
                raise from_proto(result.error)
