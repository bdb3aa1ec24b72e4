"""Admission of calls: a service refuses work it cannot hold instead of queueing it.

Each process bounds the calls it is working on (``max_concurrent_rpcs``) and
the bytes of their requests (``max_queued_request_bytes``). A call over either
bound is refused at once, before its handler runs, with LIMIT_EXCEEDED
(gRPC RESOURCE_EXHAUSTED) and a RetryInfo delay the SDK backs off by; nothing
of a refused request is applied, so a retry is always safe.

Invariants
----------
* The cluster's own traffic keeps a share client load cannot take: client calls
  are admitted only while the process is below ``1 - reserved_internal_share``
  of either bound, internal calls (replication, transaction markers, the
  controller's LeaderAndIsr, producer-id blocks) up to the whole bound. So under
  any client flood an internal call finds at least the reserved share free.
* The byte bound is checked as Kafka's memory pool checks it: a call is
  admitted while the bytes in flight are below the bound, whatever its own size.
  So the bytes in flight stay under the bound plus one request (at most
  grpc_max_message_bytes), and a request larger than the bound is slow under
  load, never refused for ever.
* Every admitted call is released exactly once, when it ends (a stream when it
  ends or is cancelled).
* Since admission never depends on the size of the call itself, a Produce is
  admitted before its request is read (READ_AFTER_ADMISSION): a refused one
  costs the process what its transport took in before the refusal (HTTP/2
  flow-control windows), not the whole request received and parsed. Until it
  is read, an admitted one weighs the mean request read so far, so that a
  burst admitted together still meets the byte bound; it must arrive within
  REQUEST_READ_TIMEOUT_S.
* grpc.health.v1 and reflection are not admitted here: a probe is answered
  however loaded the process is.

Internal calls are recognized by method (replication, markers, producer-id
blocks) or by the peer mark the services put on their calls to one another
(the coordinators' transaction-log reads and writes, the leaders'
transaction checks), trusted from a super user only when an authorizer runs
(txlog.net.identity).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc

from services.runtime import config as config_mod
from txlog.protocol import errors
from txlog.protocol.errors import ErrorCode, TxlogError

MAX_CONCURRENT_RPCS_DEFAULT = 1024
MAX_QUEUED_REQUEST_BYTES_DEFAULT = 256 * 1024 * 1024
RESERVED_INTERNAL_SHARE_DEFAULT = 0.25
# The RetryInfo delay of a refusal, jittered by +-50% so refused clients do not
# come back together.
REFUSAL_RETRY_MS = 100


def share(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise ValueError(f"must be between 0 and 1 (exclusive), got {text!r}")
    return value


ADMISSION_SETTINGS: tuple[config_mod.Setting, ...] = (
    config_mod.Setting("max_concurrent_rpcs", MAX_CONCURRENT_RPCS_DEFAULT, "calls this process works on at once; "
                       "more are refused at once with RESOURCE_EXHAUSTED (LIMIT_EXCEEDED) and a RetryInfo delay",
                       config_mod.positive_int),
    config_mod.Setting("max_queued_request_bytes", MAX_QUEUED_REQUEST_BYTES_DEFAULT, "bytes of the requests of the "
                       "calls this process works on; once they reach it, calls are refused as above (a call is "
                       "admitted below it whatever its size, so the bytes stay under this plus one request)", config_mod.positive_int),
    config_mod.Setting("reserved_internal_share", RESERVED_INTERNAL_SHARE_DEFAULT, "share of both bounds that only "
                       "the cluster's own calls (replication, markers, LeaderAndIsr, producer-id blocks) may use",
                       share),
)

# Calls the cluster makes to itself, by gRPC service; None: every method.
INTERNAL_METHODS: dict[str, frozenset[str] | None] = {
    "txlog.v1.ReplicationService": None,
    "txlog.v1.PartitionService": frozenset({"WriteTxnMarkers"}),
    "txlog.v1.ProducerIdService": None,
}


# Calls whose request is read only once the call is admitted (served as request-streaming, one message): a refused
# one is never received whole nor parsed, which a flood of large batches would otherwise cost in memory and CPU.
READ_AFTER_ADMISSION: frozenset[tuple[str, str]] = frozenset({("txlog.v1.PartitionService", "Produce")})
# How long an admitted call's request may take to arrive: a client that sends it slowly, or never, holds a slot
# meanwhile (answered REQUEST_TIMED_OUT, nothing applied, so a retry is safe).
REQUEST_READ_TIMEOUT_S = 10.0
# What an unread request is taken to weigh until it is read: the mean of those read (exponentially weighted), so
# that a burst of calls admitted before any is read still counts towards the byte bound.
UNREAD_WEIGHT = 0.1
UNREAD_SIZE_INITIAL = 1024 * 1024  # the mean assumed before any request was read


class Unread:
    """The request of a call that is read only once admitted (READ_AFTER_ADMISSION)."""

    def __init__(self, context, missing: Callable[[], object]):
        self._context = context
        self._missing = missing

    async def read(self, timeout_s: float):
        """The one request the client sent (parsed by the method's deserializer); ``missing()`` if it sent
        none. CancelledError when the call ended meanwhile; REQUEST_TIMED_OUT after ``timeout_s``."""
        try:
            message = await asyncio.wait_for(self._context.read(), timeout_s)
        except TimeoutError:
            raise TxlogError(ErrorCode.Value("REQUEST_TIMED_OUT"),
                             f"the request did not arrive within {timeout_s:.0f} s of the call's start") from None
        if message is grpc.aio.EOF:
            if self._context.cancelled() or self._context.done():  # the client went, or the message was refused
                raise asyncio.CancelledError()
            return self._missing()
        return message


def is_internal(service: str, method: str) -> bool:
    if service not in INTERNAL_METHODS:
        return False
    methods = INTERNAL_METHODS[service]
    return methods is None or method in methods


@dataclass(frozen=True)
class Limits:
    max_rpcs: int
    max_bytes: int
    reserved_share: float

    @property
    def client_rpcs(self) -> int:
        return max(1, int(self.max_rpcs * (1 - self.reserved_share)))

    @property
    def client_bytes(self) -> int:
        return max(1, int(self.max_bytes * (1 - self.reserved_share)))


class Admission:
    """The bounds of one process and what is in flight under them (all on the
    event loop's thread: no lock)."""

    def __init__(self, limits: Limits, rng: random.Random | None = None,
                 cluster_call: Callable[[object], bool] | None = None):
        """``cluster_call(context)``: whether a call is another instance's (its
        peer mark, trusted: services.security.authorizer.is_cluster_call), which
        takes the internal share whatever its method."""
        self.limits = limits
        self.cluster_call = cluster_call
        self.in_flight = 0
        self.in_flight_bytes = 0
        self.refused = 0
        self.unread_size = float(UNREAD_SIZE_INITIAL)  # what an unread request weighs until read (UNREAD_WEIGHT)
        self._rng = rng or random.Random()

    @classmethod
    def from_config(cls, cfg) -> Admission:
        return cls(Limits(getattr(cfg, "max_concurrent_rpcs", MAX_CONCURRENT_RPCS_DEFAULT),
                          getattr(cfg, "max_queued_request_bytes", MAX_QUEUED_REQUEST_BYTES_DEFAULT),
                          getattr(cfg, "reserved_internal_share", RESERVED_INTERNAL_SHARE_DEFAULT)))

    def refusal(self, internal: bool) -> str | None:
        """Why a call cannot start now, or None."""
        rpcs_max = self.limits.max_rpcs if internal else self.limits.client_rpcs
        bytes_max = self.limits.max_bytes if internal else self.limits.client_bytes
        if self.in_flight >= rpcs_max:
            return f"{self.in_flight} calls in flight, the bound for {_kind(internal)} calls is {rpcs_max} (max_concurrent_rpcs)"
        if self.in_flight_bytes >= bytes_max:
            return (f"{self.in_flight_bytes} request bytes in flight, the bound for {_kind(internal)} calls is "
                    f"{bytes_max} (max_queued_request_bytes)")
        return None

    def admit(self, internal: bool, size: int) -> TxlogError | None:
        """Takes a slot for a call; or, when it cannot start now, takes none
        and returns the LIMIT_EXCEEDED (with a retry delay) to answer it."""
        reason = self.refusal(internal)
        if reason is not None:
            self.refused += 1
            delay_ms = int(REFUSAL_RETRY_MS * self._rng.uniform(0.5, 1.5))
            return TxlogError(ErrorCode.Value("LIMIT_EXCEEDED"), f"overloaded, retry later: {reason}",
                              retry_delay_ms=delay_ms)
        self.in_flight += 1
        self.in_flight_bytes += size
        return None

    def release(self, size: int) -> None:
        self.in_flight -= 1
        self.in_flight_bytes -= size

    def admitted(self, service: str, method: str, handler, *, streaming: bool):
        """``handler`` (a coroutine handler; for a server-streaming method, one
        returning an async iterator) run only inside a slot."""
        internal = is_internal(service, method)

        async def unary(request, context):
            if isinstance(request, Unread):  # the slot is decided on what is in flight, before the request is read
                return await self._admitted_unread(internal, request, handler, context)
            size = await self._enter(internal, request, context)
            try:
                return await handler(request, context)
            finally:
                self.release(size)

        async def stream(request, context):
            size = await self._enter(internal, request, context)
            try:
                responses = await handler(request, context)
            except BaseException:
                self.release(size)
                raise
            return self._held(responses, size)

        return stream if streaming else unary

    async def _admitted_unread(self, internal: bool, unread: Unread, handler, context):
        """Takes a slot weighing the mean request, reads the request, weighs it as it is, runs the handler."""
        size = max(0, round(self.unread_size))
        await self._enter(internal, None, context, size)
        try:
            remaining = context.time_remaining()
            try:
                request = await unread.read(REQUEST_READ_TIMEOUT_S if remaining is None else min(REQUEST_READ_TIMEOUT_S, remaining))
            except TxlogError as exc:
                await errors.abort(context, exc)
            read = _size_of(request)
            self.unread_size += UNREAD_WEIGHT * (read - self.unread_size)
            self.in_flight_bytes += read - size
            size = read
            return await handler(request, context)
        finally:
            self.release(size)

    async def _enter(self, internal: bool, request, context, size: int | None = None) -> int:
        """Takes a slot for the call of ``request`` (returning its size) or ends the call refused."""
        internal = internal or (self.cluster_call is not None and self.cluster_call(context))
        size = _size_of(request) if size is None else size
        refused = self.admit(internal, size)
        if refused is not None:
            await errors.abort(context, refused)
        return size

    async def _held(self, responses: AsyncIterator, size: int) -> AsyncIterator:
        try:
            async for response in responses:
                yield response
        finally:
            self.release(size)
            close = getattr(responses, "aclose", None)
            if close is not None:
                await close()


def _kind(internal: bool) -> str:
    return "internal" if internal else "client"


def _size_of(request) -> int:
    byte_size = getattr(request, "ByteSize", None)
    return byte_size() if byte_size is not None else 0
