"""Client channels to txlog services.

Every call gets a deadline (the caller's, or the channel's default), and gRPC's
own transparent retry (service config ``retryPolicy``) is switched on only for
the methods listed in :data:`SAFE_TO_RETRY`: reads, lookups, and allocations
whose repetition harms nothing. Writes (Produce, EndTxn, markers...) are retried
by the client SDK's request handlers, which know the sequence and epoch rules.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterable

import grpc
from opentelemetry.sdk.trace import TracerProvider

from txlog.net import telemetry, tls

CALL_TIMEOUT_S_DEFAULT = 10.0

# (service, method): repeating these cannot change what is stored, or only
# wastes something harmless (an allocated producer-id block that is never used).
SAFE_TO_RETRY: tuple[tuple[str, str], ...] = (
    ("txlog.v1.ProducerIdService", "AllocateProducerIds"),
    ("txlog.v1.PartitionService", "Metadata"),
    ("txlog.v1.PartitionService", "Fetch"),
    ("txlog.v1.PartitionService", "FetchStream"),
    ("txlog.v1.PartitionService", "ListOffsets"),
    ("txlog.v1.PartitionService", "OffsetFetch"),
    ("txlog.v1.PartitionService", "DescribeProducers"),
    ("txlog.v1.CoordinatorService", "FindCoordinator"),
    ("txlog.v1.CoordinatorService", "ListTransactions"),
    ("txlog.v1.CoordinatorService", "DescribeTransactions"),
    ("grpc.health.v1.Health", "Check"),
)


def service_config(safe_methods: Iterable[tuple[str, str]] = SAFE_TO_RETRY) -> str:
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{"service": service, "method": method} for service, method in safe_methods],
                    "retryPolicy": {
                        "maxAttempts": 4,
                        "initialBackoff": "0.05s",
                        "maxBackoff": "1s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


class _DefaultDeadline(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Gives every call without a timeout the channel's default one, and the
    channel's own metadata (a service's peer mark) beside the call's."""

    def __init__(self, timeout_s: float, metadata: tuple[tuple[str, str], ...] = ()):
        self.timeout_s = timeout_s
        self.metadata = metadata

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if details.timeout is not None and not self.metadata:
            return details
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self.metadata) if self.metadata else details.metadata
        return grpc.aio.ClientCallDetails(
            details.method, self.timeout_s if details.timeout is None else details.timeout, metadata,
            details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


# How soon a channel may look its address's name up again. gRPC's default is
# 30 s, and it looks up only after a connection failed: a peer that came back on
# another IP (a Kubernetes pod does, on every restart) stayed out of reach for
# 38-55 s after it was up (two containers on a podman network). With this and
# the three settings below, bench/peer_moves.py measured a median of 4.9 s
# against 28.7 s with gRPC's defaults (worst 36 s). Nothing is looked up while
# connected.
DNS_RESOLUTION_INTERVAL_MIN_MS = 1000
# A channel that failed to connect tries again at most this long after (gRPC
# backs off up to 120 s): each failure is what makes it look the name up again,
# so a backoff grown while the name still gave the old IP (DNS follows a new pod
# a little late) kept the peer out of reach for 25 s and more after it served
# (two containers on a podman network, beside the chart smoke). Kafka's clients reconnect
# at most 1 s apart (reconnect.backoff.max.ms).
RECONNECT_BACKOFF_MAX_MS = 2_000
# How long one connection attempt may take (gRPC's default is 20 s, its
# GRPC_ARG_MIN_RECONNECT_BACKOFF_MS): to an address that no longer answers (the
# old IP), the channel is otherwise stuck connecting for 20 s before it looks
# the name up again (seen there: calls failing with "ipv4:<old IP>: Connection
# timed out" for 25 s and more after the peer served). bench/peer_moves.py
# measures all of this against gRPC's defaults.
CONNECT_TIMEOUT_MS = 5_000
# A peer gone without closing its connections (a pod killed: its IP vanished, no
# reset came) was otherwise still "connected" for 20 s and more, each call on it
# timing out, before the channel gave up and looked the name up again: pings now
# find it out within KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS.
KEEPALIVE_TIME_MS = 5_000
KEEPALIVE_TIMEOUT_MS = 5_000
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),  # an idle channel's dead connection would fail its next calls
    ("grpc.http2.max_pings_without_data", 0),
]
# What a server takes from such channels (by default it allows a ping every 5
# minutes, and answers more with GOAWAY "too_many_pings"): every server of ours.
SERVER_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS - 1_000),
]


def open_channel(
    address: str,
    *,
    timeout_s: float = CALL_TIMEOUT_S_DEFAULT,
    tracer_provider: TracerProvider | None = None,
    max_message_bytes: int = 64 * 1024 * 1024,
    credentials: grpc.ChannelCredentials | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
) -> grpc.aio.Channel:
    """An aio channel with default deadlines, safe retries and tracing; TLS
    with ``credentials`` (txlog.net.tls.ChannelCredentials.get()), else plaintext.

    Create it inside the event loop that will use it."""
    options = [
        ("grpc.service_config", service_config()),
        ("grpc.enable_retries", 1),
        ("grpc.dns_min_time_between_resolutions_ms", DNS_RESOLUTION_INTERVAL_MIN_MS),
        *KEEPALIVE_OPTIONS,
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
        ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    interceptors = [_DefaultDeadline(timeout_s, metadata), *telemetry.client_interceptors(tracer_provider)]
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


class ChannelCache:
    """Channels by address, opened on first use. With TLS files, a channel is
    opened again once the files change (a rotated client certificate); the
    old one is closed after its calls in flight had time to finish."""

    CLOSE_GRACE_S = 30.0

    def __init__(self, *, timeout_s: float = CALL_TIMEOUT_S_DEFAULT, tracer_provider: TracerProvider | None = None,
                 max_message_bytes: int = 64 * 1024 * 1024, tls_files: tls.TlsFiles | None = None,
                 metadata: tuple[tuple[str, str], ...] = ()):
        """``metadata``: sent with every call on these channels."""
        self._open = functools.partial(open_channel, timeout_s=timeout_s, tracer_provider=tracer_provider,
                                       max_message_bytes=max_message_bytes, metadata=metadata)
        self._credentials = tls.ChannelCredentials(tls_files) if tls_files is not None and tls_files.enabled else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task] = set()

    @property
    def uses_tls(self) -> bool:
        return self._credentials is not None

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is not None and self._credentials is not None and self._credentials.changed():
            self._retire_all()
            channel = None
        if channel is None:
            credentials = self._credentials.get() if self._credentials is not None else None
            channel = self._channels[address] = self._open(address, credentials=credentials)
        return channel

    def _retire_all(self) -> None:
        old, self._channels = list(self._channels.values()), {}
        for channel in old:
            task = asyncio.ensure_future(channel.close(grace=self.CLOSE_GRACE_S))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
        for task in list(self._closing):
            task.cancel()
