"""Client quotas on partition_svc: AlterClientQuotas and DescribeClientQuotas
(the authorizer checks Alter or Describe on the Cluster first), and the
throttling of Produce, Fetch and FetchStream by the quotas that apply to the
caller (client_quotas.py): their bytes, and their handlers' time on the event
loop (handler_time.py) for request_percentage. An answer that takes its client
past a quota says so in ``throttle_time_ms``, and the client's next calls wait
their turn."""

from __future__ import annotations

import asyncio
import math
import time

from partition_svc import wire
from partition_svc.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaTracker,
    applying,
    checked_values,
    entity_of,
    entity_parts,
    request_amount,
)
from partition_svc.handler_time import Stopwatch, timed
from partition_svc.quota_store import QuotaStore
from partition_svc.rpc_errors import error_of
from services.runtime import server
from services.security.authorizer import Authorizer
from txlog.net.identity import CLIENT_ID_LENGTH_MAX, CLIENT_ID_METADATA
from txlog.protocol import errors
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import partition_pb2

USER_PREFIX = "User:"
WAITERS_MAX = 16  # calls of one throttled entity waiting on one instance; more are refused (each holds an admission slot)
DEADLINE_MARGIN_S = 0.5  # a call waits its turn only if this much of its deadline is left after


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
    """Throttles Produce, Fetch and FetchStream by the quotas that apply to
    the caller (Kafka's KIP-219): an answer says ``throttle_time_ms`` at once;
    a call of an entity still throttled waits before it is applied, at most
    until its deadline nears (then, and when ``WAITERS_MAX`` of the entity's
    calls wait already, it is refused LIMIT_EXCEEDED with the throttle left
    as its RetryInfo: nothing of it was applied). Nothing to do, beyond one
    check, while no quota is set. The cluster's own calls are never throttled."""

    def __init__(self, store: QuotaStore, authorizer: Authorizer):
        self.store = store
        self.authorizer = authorizer
        self.tracker = QuotaTracker()
        self.waiting: dict[tuple, int] = {}  # (entity, key) -> its calls waiting here

    def throttle(self, data_servicer) -> None:
        """Replaces the servicer's Produce, Fetch and FetchStream by throttled ones."""
        data_servicer.Produce = self._unary(data_servicer.Produce, PRODUCER_BYTE_RATE)
        data_servicer.Fetch = self._unary(data_servicer.Fetch, CONSUMER_BYTE_RATE)
        data_servicer.FetchStream = self._fetch_stream(data_servicer.FetchStream)

    def caller(self, context) -> tuple[str, str] | None:
        """(user, client id) of a call quotas apply to; None when none do (no quota
        set, the cluster's own call, a caller the guard refuses anyway)."""
        if not self.store.configs:
            return None
        if self.authorizer.is_cluster_call(context):
            return None
        metadata = dict(context.invocation_metadata() or ())
        try:
            principal = self.authorizer.caller(context).principal
        except TxlogError:
            return None
        return principal.removeprefix(USER_PREFIX), metadata.get(CLIENT_ID_METADATA, "")[:CLIENT_ID_LENGTH_MAX]

    async def wait_turn(self, who: tuple[str, str] | None, key: str, context) -> None:
        """Returns once the caller's entity is not throttled, by ``key`` or by its request_percentage; or ends
        the call refused."""
        if who is None:
            return
        now_ms = _now_ms()
        tracked, left_ms = max((self.tracker.throttled_ms(self.store.configs, *who, k, now_ms)
                                for k in (key, REQUEST_PERCENTAGE)), key=lambda found: found[1])
        if not left_ms:
            return
        key = tracked[1]
        time_left_s = context.time_remaining()
        if self.waiting.get(tracked, 0) >= WAITERS_MAX or (
                time_left_s is not None and time_left_s - DEADLINE_MARGIN_S < left_ms / 1000):
            await errors.abort(context, TxlogError(
                ErrorCode.Value("LIMIT_EXCEEDED"), f"over its {key} quota: throttled for {left_ms:.0f} ms more",
                retry_delay_ms=math.ceil(left_ms)))
        self.waiting[tracked] = self.waiting.get(tracked, 0) + 1
        try:
            await asyncio.sleep(left_ms / 1000)
        finally:
            self.waiting[tracked] -= 1
            if not self.waiting[tracked]:
                del self.waiting[tracked]

    def counted(self, who: tuple[str, str], key: str, amount: int, watch: Stopwatch | None) -> int:
        """Counts a call's bytes and, when timed, its handler's time; the throttle they call for (0: none)."""
        amounts = [(key, amount)] if watch is None else [(key, amount), (REQUEST_PERCENTAGE, request_amount(watch.seconds))]
        return self.tracker.record(self.store.configs, *who, amounts, _now_ms())

    async def _handled(self, handler, request, context, key: str):
        """(caller, its Stopwatch, the handler's answer) once the caller's turn came. The caller is None when no
        quota applies, and the Stopwatch None unless a request_percentage does: driving a handler step by step
        costs every call, so only those it counts for are timed. A failed handler's time is charged before its
        error goes on."""
        who = self.caller(context)
        await self.wait_turn(who, key, context)
        if who is None:
            return None, None, await handler(request, context)
        if applying(self.store.configs, *who, REQUEST_PERCENTAGE) is None:
            return who, None, await handler(request, context)
        watch = Stopwatch()
        try:
            return who, watch, await timed(handler(request, context), watch)
        except BaseException:
            self.counted(who, key, 0, watch)
            raise

    def _unary(self, handler, key: str):
        async def throttled(request, context):
            who, watch, reply = await self._handled(handler, request, context, key)
            if who is None:
                return reply
            if isinstance(reply, bytes):  # an encoded FetchResponse
                held = self.counted(who, key, len(reply), watch)
                return reply + wire.throttle_time(held) if held else reply
            held = self.counted(who, key, request.ByteSize(), watch)
            if held:
                reply.throttle_time_ms = held
            return reply

        return throttled

    def _fetch_stream(self, handler):
        async def fetch_stream(request, context):
            who, watch, chunks = await self._handled(handler, request, context, CONSUMER_BYTE_RATE)
            if who is None:
                return chunks

            async def next_chunk():
                return await (chunks.__anext__() if watch is None else timed(chunks.__anext__(), watch))

            async def counted_chunks():
                try:
                    while True:
                        try:
                            chunk = await next_chunk()
                        except StopAsyncIteration:
                            return
                        held = self.counted(who, CONSUMER_BYTE_RATE, len(chunk), watch)
                        if watch is not None:
                            watch.seconds = 0.0  # each chunk counts the time that made it
                        if held:
                            yield chunk + wire.throttle_time(held)
                            return  # throttled: the client's next fetch waits its turn
                        yield chunk
                finally:
                    if watch is not None and watch.seconds:  # the time since the last chunk: the end, a failure
                        self.counted(who, CONSUMER_BYTE_RATE, 0, watch)
                    await chunks.aclose()

            return counted_chunks()

        return fetch_stream


def _now_ms() -> float:
    return time.monotonic() * 1000
