"""The SDK's only door to the network: one grpc.aio channel per server address,
opened lazily inside the client's event loop, and a call function that turns
every failure into a :class:`~txlog.errors.ClientError`.

Guarantees
----------
* Every call has a deadline (``timeout_ms``, else the transport's
  ``request_timeout_ms``).
* A failed call raises a ClientError (never a raw ``grpc.RpcError``), sorted by
  :func:`txlog.errors.action_for` upstream.
* Test-only fault injection (:class:`FaultInjection`) is off unless a client is
  given one. It acts on the client side only, so what it simulates is exactly
  what a real network does to a unary call: the request never arrives, or the
  server handles it and its answer is lost.

Request handlers depend only on :meth:`Transport.call`, :meth:`Transport.fetch`
and :meth:`Transport.close`, so unit tests replace the transport with an
in-memory fake server.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import grpc
from google.protobuf import message_factory

from txlog.errors import ClientError, error_for, from_exception
from txlog.net.channels import ChannelCache
from txlog.net.identity import CLIENT_ID_METADATA, checked_client_id
from txlog.net.tls import TlsFiles
from txlog.protocol.errors import ErrorCode
from txlog.v1 import coordinator_pb2, coordinator_pb2_grpc, partition_pb2, partition_pb2_grpc

REQUEST_TIMEOUT_MS_DEFAULT = 30_000

MAX_MESSAGE_BYTES_DEFAULT = 64 * 1024 * 1024

# rpc name -> which service's stub serves it (from the service descriptors, so a new rpc needs no edit here)
_COORDINATOR_RPCS = frozenset(coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].methods_by_name)
_PARTITION_RPCS = frozenset(partition_pb2.DESCRIPTOR.services_by_name["PartitionService"].methods_by_name)


@dataclass
class FaultInjection:
    """Test-only faults on the client's calls; never set it in production.

    For each call of an rpc in ``rpcs``: with ``drop_request_probability`` the
    request is not sent (the call fails as UNAVAILABLE would: the server never
    saw it); else the call is made and, with ``drop_response_probability``, the
    server's answer is thrown away after the server handled it -- appended, for
    a Produce -- and the call fails as a lost answer does (REQUEST_TIMED_OUT).
    Draws come from ``rng``; give it a seed to replay a run. ``requests_dropped``
    and ``responses_dropped`` count what was done, so a test can assert that
    faults really happened."""

    drop_request_probability: float = 0.0
    drop_response_probability: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    rpcs: frozenset[str] = frozenset({"Produce"})
    requests_dropped: int = 0
    responses_dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self):
        for name in ("drop_request_probability", "drop_response_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], not {value}")

    def before_call(self, rpc: str, address: str) -> None:
        if rpc not in self.rpcs:
            return
        with self._lock:
            drop = self.rng.random() < self.drop_request_probability
            if drop:
                self.requests_dropped += 1
        if drop:
            raise error_for(ErrorCode.Value("LEADER_NOT_AVAILABLE"),
                            f"fault injection: the {rpc} request to {address} was dropped before sending")

    def after_call(self, rpc: str, address: str) -> None:
        if rpc not in self.rpcs:
            return
        with self._lock:
            drop = self.rng.random() < self.drop_response_probability
            if drop:
                self.responses_dropped += 1
        if drop:
            raise error_for(ErrorCode.Value("REQUEST_TIMED_OUT"),
                            f"fault injection: the answer of {address} to {rpc} was dropped after the server handled it")


def tls_files(ca: str | None, cert: str | None, key: str | None, token: str | None = None) -> TlsFiles | None:
    """The SDK's tls_ca= / tls_cert= / tls_key= (PEM file paths) and
    token_file= (a bearer token, services/security/tokens.py) as TlsFiles; None
    (plaintext) when none is given. Raises ValueError (TlsConfigError) naming
    a file that is missing, a certificate without its key, or a token without TLS."""
    if not (ca or cert or key or token):
        return None
    files = TlsFiles(ca or "", cert or "", key or "", token or "")
    files.check(server=False)
    return files


class Transport:
    """Channels to txlog servers by address; use only inside one event loop."""

    def __init__(
        self,
        *,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT,
        fault_injection: FaultInjection | None = None,
        tracer_provider=None,
        max_message_bytes: int = MAX_MESSAGE_BYTES_DEFAULT,
        tls_files: TlsFiles | None = None,
        client_id: str = "",
    ):
        """``tls_files``: the CA that verifies the servers and, for mutual
        TLS, this client's certificate and key (None: plaintext).
        ``client_id``: sent with every call (``txlog-client-id`` metadata),
        what client quotas are set on; empty: none."""
        self.request_timeout_ms = request_timeout_ms
        self.client_id = checked_client_id(client_id)
        self._call_metadata = ((CLIENT_ID_METADATA, client_id),) if client_id else None
        self.fault_injection = fault_injection
        self._channels = ChannelCache(timeout_s=request_timeout_ms / 1000, tracer_provider=tracer_provider,
                                      max_message_bytes=max_message_bytes, tls_files=tls_files)
        self._stubs_on: dict[str, grpc.aio.Channel] = {}  # the channel each address's stubs were made on
        self._partition_stubs: dict[str, partition_pb2_grpc.PartitionServiceStub] = {}
        self._coordinator_stubs: dict[str, coordinator_pb2_grpc.CoordinatorServiceStub] = {}
        # (address, rpc) -> (the channel it was made on, a multicallable sending pre-encoded requests)
        self._encoded_methods: dict[tuple[str, str], tuple[grpc.aio.Channel, object]] = {}
        self._unary_fetch: set[str] = set()  # addresses of servers without FetchStream (older than it)
        self._closed = False

    @property
    def uses_tls(self) -> bool:
        return self._channels.uses_tls

    def _stub(self, address: str, rpc: str):
        if self._closed:
            raise ClientError(ErrorCode.Value("INVALID_REQUEST"), "the client is closed")
        channel = self._channels.get(address)
        if self._stubs_on.get(address) is not channel:
            self._stubs_on[address] = channel
            self._partition_stubs[address] = partition_pb2_grpc.PartitionServiceStub(channel)
            self._coordinator_stubs[address] = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        if rpc in _PARTITION_RPCS:
            return getattr(self._partition_stubs[address], rpc)
        if rpc in _COORDINATOR_RPCS:
            return getattr(self._coordinator_stubs[address], rpc)
        raise ValueError(f"unknown rpc {rpc!r}")

    async def call(self, address: str, rpc: str, request, *, timeout_ms: float | None = None):
        """Calls ``rpc`` at ``address``; raises ClientError on any failure."""
        return await self._call(self._stub(address, rpc), address, rpc, request, timeout_ms)

    async def call_encoded(self, address: str, rpc: str, request: bytes, *, timeout_ms: float | None = None):
        """As :meth:`call`, with the request already serialized: its bytes go out
        as they are (the producer encodes its Produce requests itself). The
        answer is a message, as from :meth:`call`."""
        if self._closed:
            raise ClientError(ErrorCode.Value("INVALID_REQUEST"), "the client is closed")
        channel = self._channels.get(address)
        made = self._encoded_methods.get((address, rpc))
        if made is None or made[0] is not channel:
            path, response_class = _method_path(rpc)
            made = self._encoded_methods[(address, rpc)] = (
                channel, channel.unary_unary(path, request_serializer=None, response_deserializer=response_class.FromString))
        return await self._call(made[1], address, rpc, request, timeout_ms)

    async def _call(self, method, address: str, rpc: str, request, timeout_ms: float | None):
        timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        if self.fault_injection is not None:
            self.fault_injection.before_call(rpc, address)
        try:
            response = await method(request, timeout=timeout_s, metadata=self._call_metadata)
        except grpc.RpcError as exc:
            raise from_exception(exc) from None
        if self.fault_injection is not None:
            self.fault_injection.after_call(rpc, address)
        return response

    async def fetch(self, address: str, request: partition_pb2.FetchRequest, *, timeout_ms: float | None = None):
        """The answer of a Fetch at ``address``, as the FetchResponses of a
        FetchStream (an async iterator; each continues the partitions of the one
        before); from a server that has no FetchStream (UNIMPLEMENTED, before any
        response), the one response of a Fetch, and Fetch from then on. Raises
        ClientError on any failure; the responses already yielded stand."""
        if address in self._unary_fetch:
            yield await self.call(address, "Fetch", request, timeout_ms=timeout_ms)
            return
        timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        if self.fault_injection is not None:
            self.fault_injection.before_call("FetchStream", address)
        call = self._stub(address, "FetchStream")(partition_pb2.FetchStreamRequest(fetch=request), timeout=timeout_s,
                                                  metadata=self._call_metadata)
        answered = False
        try:
            async for response in call:
                answered = True
                yield response
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED or answered:
                raise from_exception(exc) from None
            self._unary_fetch.add(address)  # a server older than FetchStream: Fetch, now and from then on
            yield await self.call(address, "Fetch", request, timeout_ms=timeout_ms)
            return
        finally:
            call.cancel()  # the caller stopped reading (or failed): the server stops streaming; a no-op once done
        if self.fault_injection is not None:
            self.fault_injection.after_call("FetchStream", address)

    async def close(self) -> None:
        self._closed = True
        self._stubs_on.clear()
        self._encoded_methods.clear()
        await self._channels.close()


def sends_encoded(transport) -> bool:
    """True when ``transport`` is a :class:`Transport` whose ``call`` is this
    module's: it takes pre-encoded requests (:meth:`Transport.call_encoded`).
    A test fake, or a subclass whose ``call`` looks at what is sent (the chaos
    runner's recording transport), is given messages."""
    return isinstance(transport, Transport) and type(transport).call is Transport.call


def _method_path(rpc: str) -> tuple[str, type]:
    """``rpc``'s gRPC method path and response class, from the service descriptors."""
    for service in (partition_pb2.DESCRIPTOR.services_by_name["PartitionService"],
                    coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"]):
        method = service.methods_by_name.get(rpc)
        if method is not None:
            return f"/{service.full_name}/{method.name}", message_factory.GetMessageClass(method.output_type)
    raise ValueError(f"unknown rpc {rpc!r}")
