"""Client quotas on partition_svc: AlterClientQuotas and DescribeClientQuotas
(the authorizer checks Alter or Describe on the Cluster first), and the
throttling of Produce, Fetch and FetchStream by the quotas that apply to the
caller (client_quotas.py): an answer that takes its client past a quota is
held for the throttle time and says so in ``throttle_time_ms``."""

from __future__ import annotations

import asyncio
import time

from partition_svc import wire
from partition_svc.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    QuotaTracker,
    checked_values,
    entity_of,
    entity_parts,
)
from partition_svc.quota_store import QuotaStore
from partition_svc.rpc_errors import error_of
from services.runtime import server
from services.security.authorizer import Authorizer
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import partition_pb2

CLIENT_ID_METADATA = "txlog-client-id"
USER_PREFIX = "User:"


def parts_of(entity) -> dict[str, str | None]:
    parts: dict[str, str | None] = {}
    for part in entity:
        if part.entity_type in parts:
            raise TxlogError(ErrorCode.Value("INVALID_REQUEST"), f"the entity names {part.entity_type!r} twice")
        parts[part.entity_type] = part.name if part.HasField("name") else None
    return parts


def entity_proto(entity) -> list[partition_pb2.ClientQuotaEntityPart]:
    return [partition_pb2.ClientQuotaEntityPart(entity_type=kind, name=name) for kind, name in entity_parts(entity).items()]


class QuotaServicer:
    RPCS = ("AlterClientQuotas", "DescribeClientQuotas")

    def __init__(self, store: QuotaStore):
        self.store = store

    @server.rpc_handler
    async def AlterClientQuotas(self, request, context):
        reply = partition_pb2.AlterClientQuotasResponse()
        for alteration in request.alterations:
            result = reply.results.add(entity=alteration.entity)
            try:
                entity = entity_of(parts_of(alteration.entity))
                keys = [v.key for v in alteration.values]
                if len(set(keys)) != len(keys):
                    raise TxlogError(ErrorCode.Value("INVALID_REQUEST"), "the alteration names a quota twice")
                changes = checked_values({v.key: None if v.remove else v.value for v in alteration.values})
                if not request.validate_only:
                    await self.store.alter(entity, changes)
            except TxlogError as exc:
                result.error.CopyFrom(error_of(exc))
        return reply

    @server.rpc_handler
    async def DescribeClientQuotas(self, request, context):
        configs = await self.store.load()  # as stored now, not as this instance loaded it last
        reply = partition_pb2.DescribeClientQuotasResponse()
        for entity, values in sorted(configs.items(), key=lambda item: str(item[0])):
            reply.entries.add(entity=entity_proto(entity), values=values)
        return reply


class Throttling:
    """Holds the answers of Produce, Fetch and FetchStream of callers over
    their quotas (nothing to do, and no cost beyond one check, while no quota
    is set)."""

    def __init__(self, store: QuotaStore, authorizer: Authorizer):
        self.store = store
        self.authorizer = authorizer
        self.tracker = QuotaTracker()

    def throttle(self, data_servicer) -> None:
        """Replaces the servicer's Produce, Fetch and FetchStream by throttled ones."""
        data_servicer.Produce = self._produce(data_servicer.Produce)
        data_servicer.Fetch = self._fetch(data_servicer.Fetch)
        data_servicer.FetchStream = self._fetch_stream(data_servicer.FetchStream)

    def held_ms(self, context, key: str, amount: int) -> int:
        if not self.store.configs:
            return 0
        principal = self.authorizer.caller(context).principal
        user = principal.removeprefix(USER_PREFIX)
        client_id = next((v for k, v in context.invocation_metadata() or () if k == CLIENT_ID_METADATA), "")
        return self.tracker.record(self.store.configs, user, client_id, [(key, amount)], time.monotonic() * 1000)

    def _produce(self, handler):
        async def produce(request, context):
            reply = await handler(request, context)
            held = self.held_ms(context, PRODUCER_BYTE_RATE, request.ByteSize() if hasattr(request, "ByteSize") else 0)
            if held:
                reply.throttle_time_ms = held
                await asyncio.sleep(held / 1000)
            return reply

        return produce

    async def _held_reply(self, reply: bytes, context) -> bytes:
        held = self.held_ms(context, CONSUMER_BYTE_RATE, len(reply))
        if held:
            await asyncio.sleep(held / 1000)
            return reply + wire.throttle_time(held)
        return reply

    def _fetch(self, handler):
        async def fetch(request, context):
            return await self._held_reply(await handler(request, context), context)

        return fetch

    def _fetch_stream(self, handler):
        async def fetch_stream(request, context):
            chunks = await handler(request, context)

            async def held():
                async for chunk in chunks:
                    yield await self._held_reply(chunk, context)

            return held()

        return fetch_stream
