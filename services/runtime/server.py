"""The runtime every txlog service runs in.

It gives a service: configuration (services.runtime.config), JSON logs, a tracer
provider whose server interceptor continues callers' traces, a ``grpc.aio``
server with grpc.health.v1 and server reflection, a ZooKeeper session with this
instance registered as an ephemeral node, and graceful shutdown.

State Transitions (health of every service this runtime hosts)
----------------------------------------------------------------
``NOT_SERVING -> SERVING``: the server started and the ZooKeeper session is connected.
``SERVING -> NOT_SERVING``: the ZooKeeper session is suspended or lost (clients
go to another instance; kazoo reconnects and the status goes back to SERVING).
``* -> NOT_SERVING`` (final): SIGTERM or SIGINT. Then new calls are refused,
in-flight calls get up to ``shutdown_grace_s`` to finish, the registration is
removed, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace

import grpc
from google.protobuf import message_factory
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace.export import SpanExporter

from services.coordination import zk
from services.runtime import admission as admission_mod
from services.runtime import config as config_mod
from services.runtime import logs, malloc, metrics
from services.runtime.logs import fields
from services.security import authorizer
from txlog.net import channels, telemetry, tls
from txlog.net.addresses import advertised, reachable
from txlog.protocol import errors
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.release import VERSION

log = logging.getLogger(__name__)

# How long a service's start-up waits for a ZooKeeper session kazoo is
# re-establishing before it gives up and exits (zk.patient_for).
START_ZOOKEEPER_PATIENCE_S = 60.0

SERVER_SETTINGS: tuple[config_mod.Setting, ...] = (
    config_mod.Setting("grpc_max_message_bytes", 64 * 1024 * 1024, "largest gRPC message accepted or sent, bytes", config_mod.positive_int),
    config_mod.Setting("tls_cert", "", "PEM certificate chain of this instance; with tls_key, its port and its calls to other "
                       "instances use TLS (re-read when the file changes); empty: plaintext"),
    config_mod.Setting("tls_key", "", "PEM private key of tls_cert"),
    config_mod.Setting("tls_ca", "", "PEM CA bundle that verifies the certificates of clients and of other instances"),
    config_mod.Setting("health_listen", "", "host:port of a plaintext port that serves only grpc.health.v1, for probes "
                       "that cannot do TLS (Kubernetes' gRPC probes); empty: none (health is on the main port too)"),
    config_mod.Setting("tls_client_auth", "required", "with TLS: 'required' refuses clients without a certificate tls_ca "
                       "signed (mutual TLS); 'none' asks for none", str, tls.CLIENT_AUTH_CHOICES),
    config_mod.Setting("principal_mapping_rules", tls.DEFAULT_PRINCIPAL_MAPPING_RULES,
                       "how a client certificate's subject becomes a principal: Kafka's ssl.principal.mapping.rules "
                       "(RULE:pattern/replacement/, optionally followed by L or U to lower or upper the name; ...; DEFAULT)"),
    config_mod.Setting("authorizer", "none", "'acl' checks every call against the ACLs in ZooKeeper (deny by default, "
                       "super users excepted); 'none' lets every call through", str, authorizer.AUTHORIZER_CHOICES),
    config_mod.Setting("super_users", "", "principals the authorizer lets do anything, separated by ';' "
                       "(User:NAME); the services' own principals must be among them"),
    config_mod.Setting("jwt_jwks_file", "", "JWKS file (RFC 7517) of the RSA keys that sign the bearer tokens this server "
                       "accepts (re-read when it changes); set, a call with neither a client certificate nor a valid "
                       "token is refused UNAUTHENTICATED; empty: no tokens"),
    config_mod.Setting("jwt_issuer", "", "the iss claim accepted tokens must carry; empty: any"),
    config_mod.Setting("jwt_audience", "", "the aud claim accepted tokens must include; empty: any"),
    config_mod.Setting("jwt_principal_claim", "sub", "the token claim whose value names the principal (User:VALUE)"),
    config_mod.Setting("token_file", "", "bearer token this instance sends with its calls to other instances, for "
                       "clusters that authenticate by token (with tls_client_auth=none); re-read when it changes"),
    *metrics.METRICS_SETTINGS,
    *admission_mod.ADMISSION_SETTINGS,
    malloc.ARENA_MAX_SETTING,
)


class MalformedRequest:
    """What a request that does not parse as its message type becomes; handlers
    wrapped by :func:`rpc_handler` answer it INVALID_REQUEST."""

    def __init__(self, type_name: str, reason: Exception):
        self.type_name = type_name
        self.reason = reason

    def error(self) -> TxlogError:
        return TxlogError(
            ErrorCode.Value("INVALID_REQUEST"), f"the request is not a valid {self.type_name} message: {self.reason}"
        )


def _parser(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except Exception as exc:  # DecodeError: corrupt wire format, invalid UTF-8 in a string
            return MalformedRequest(message_class.DESCRIPTOR.full_name, exc)

    return parse


def _serialize(response) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def _read_when_admitted(implementation, message_name: str):
    """A unary method served as request-streaming: its one request reaches the chain of wrappers unread
    (admission_mod.Unread), and admission reads it once the call has a slot. A client that sent no message
    gets a MalformedRequest, as for one that does not parse."""
    def missing():
        return MalformedRequest(message_name, ValueError("no request message"))

    async def behaviour(request_iterator, context):  # the request is read through the context, once
        return await implementation(admission_mod.Unread(context, missing), context)

    return behaviour


def _unimplemented(service: str, method: str):
    async def handler(request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{service}.{method} is not implemented by this server yet")

    return handler


def generic_handler(servicer, service_descriptor, guard: authorizer.Authorizer | None = None,
                    measured: metrics.ServiceMetrics | None = None, traced: bool = False,
                    admission: admission_mod.Admission | None = None) -> grpc.GenericRpcHandler:
    """The handlers of a service: requests that fail to parse reach the
    handler as MalformedRequest instead of failing inside gRPC with a bare
    UNKNOWN, and methods the servicer does not define (a coroutine) answer
    UNIMPLEMENTED with our details. With ``guard``, each call is authorized
    first; with ``measured``, each call (refusals too) is counted and timed;
    ``traced``, each call's span names what the request touched; with
    ``admission``, a call starts only inside the process's bounds (refused
    calls are counted too).

    A server-streaming method is a coroutine too, which checks the request and
    returns an async iterator of the responses (see :func:`streamed`): every
    wrapper above applies to it as to a unary one (a streamed call is timed
    until its stream began)."""
    handlers = {}
    for method in service_descriptor.methods:
        implementation = getattr(servicer, method.name, None)
        if not asyncio.iscoroutinefunction(implementation):
            implementation = _unimplemented(service_descriptor.full_name, method.name)
        if guard is not None:
            implementation = guard.guard(method.name, implementation, MalformedRequest)
        if traced:
            implementation = telemetry.annotated(implementation)
        if admission is not None:
            implementation = admission.admitted(service_descriptor.full_name, method.name, implementation,
                                                streaming=method.server_streaming)
        if measured is not None:
            implementation = measured.measured(service_descriptor.full_name, method.name, implementation)
        make = grpc.unary_unary_rpc_method_handler
        parse = _parser(message_factory.GetMessageClass(method.input_type))
        if method.server_streaming:
            implementation, make = streamed(implementation, method.name), grpc.unary_stream_rpc_method_handler
        elif admission is not None and (service_descriptor.full_name, method.name) in admission_mod.READ_AFTER_ADMISSION:
            implementation, make = _read_when_admitted(implementation, method.input_type.full_name), grpc.stream_unary_rpc_method_handler
        handlers[method.name] = make(implementation, request_deserializer=parse, response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(service_descriptor.full_name, handlers)


def streamed(implementation, name: str):
    """The async generator gRPC serves for a server-streaming method whose
    ``implementation`` (a coroutine, wrapped as unary ones are) returns an async
    iterator of its responses; a failure while the stream runs ends the call as
    :func:`rpc_handler` ends a failed one."""

    async def stream(request, context):
        responses = await implementation(request, context)
        try:
            async for response in responses:
                yield response
        except BaseException as exc:
            await _end_failed_call(context, exc, name)
        finally:
            close = getattr(responses, "aclose", None)
            if close is not None:
                await close()  # a cancelled stream ends its generators now, not when they are collected

    return stream


def rpc_handler(method):
    """Wraps a servicer method: a TxlogError becomes the call's status with our
    details; anything unexpected is logged with its stack and answered
    UNKNOWN_SERVER_ERROR with a one-line message (never a stack trace)."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            if isinstance(request, MalformedRequest):
                raise request.error()
            return await method(self, request, context)
        except BaseException as exc:
            await _end_failed_call(context, exc, method.__name__)

    return wrapper


async def _end_failed_call(context, exc: BaseException, name: str):
    """Ends a call that raised ``exc``: a TxlogError as its status with our
    details; a cancellation or an abort as it is; anything else logged with its
    stack and answered UNKNOWN_SERVER_ERROR with a one-line message."""
    if isinstance(exc, TxlogError):
        await errors.abort(context, exc)
    if isinstance(exc, (asyncio.CancelledError, grpc.aio.AbortError)) or not isinstance(exc, Exception):
        raise exc
    log.error("unexpected failure in %s", name, exc_info=exc)
    await errors.abort(context, TxlogError(ErrorCode.Value("UNKNOWN_SERVER_ERROR"), f"{type(exc).__name__} in {name}"))


class ServiceRuntime:
    """Hosts the gRPC servicers of one service process."""

    def __init__(self, kind: str, cfg: SimpleNamespace, *, span_exporter: SpanExporter | None = None):
        self.kind = kind
        self.config = cfg
        self.tracer_provider = telemetry.tracer_provider(kind, cfg.otel_exporter, cfg.otel_endpoint, span_exporter)
        self.tracing = span_exporter is not None or cfg.otel_exporter != "none"
        max_bytes = getattr(cfg, "grpc_max_message_bytes", SERVER_SETTINGS[0].default)
        self.server = grpc.aio.server(
            # With nowhere to send spans, recording them would cost ~20% of a
            # small call's CPU for nothing (bench/producer_ids.py measured it).
            interceptors=telemetry.server_interceptors(self.tracer_provider) if self.tracing else [],
            options=[
                ("grpc.max_receive_message_length", max_bytes),
                ("grpc.max_send_message_length", max_bytes),
                ("grpc.so_reuseport", 0),
                *channels.SERVER_KEEPALIVE_OPTIONS,
            ],
        )
        self.health = health.aio.HealthServicer()
        self.service_names: list[str] = []
        self._zookeeper = None
        self._registry: zk.ServiceRegistry | None = None
        self.port = 0
        self.address = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self.registration_details: dict[str, str] = {}  # stored in the ZooKeeper registration beside the address
        self.health_server: grpc.aio.Server | None = None
        self.health_port = 0
        self.tls_files = tls.files_from(cfg)
        self.tls_files.check(server=True)  # a bad TLS setting stops the process before it binds, naming the setting
        self.authorizer = authorizer.Authorizer(cfg)  # bad rules or super users stop the process, naming the setting
        self.metrics = metrics.ServiceMetrics(kind, cfg, lambda: None if self._zookeeper is None else self._zookeeper.connected)
        self.admission = admission_mod.Admission.from_config(cfg)
        self.admission.cluster_call = self.authorizer.is_cluster_call
        self.metrics.observe_admission(self.admission)
        auth_file = getattr(cfg, "zookeeper_auth_file", "")
        try:
            self.zookeeper_identity = zk.digest_identity(auth_file) if auth_file else None
        except ValueError as exc:
            raise config_mod.ConfigError(str(exc)) from None

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Runs ``callback`` after the server has stopped taking and finishing
        calls, before the process exits (flush and close stores here)."""
        self._on_stop.append(callback)

    def add_servicer(self, servicer, service_descriptor) -> None:
        """Serves ``servicer``'s coroutine methods for the service ``service_descriptor``
        (e.g. ``partition_pb2.DESCRIPTOR.services_by_name["PartitionService"]``)."""
        self.server.add_generic_rpc_handlers((generic_handler(servicer, service_descriptor, self.authorizer, self.metrics, self.tracing,
                                                            self.admission),))
        self.service_names.append(service_descriptor.full_name)

    @property
    def zookeeper(self):
        """This process's ZooKeeper session, connected on first use."""
        if self._zookeeper is None:
            self._zookeeper = zk.connect(self.config.zookeeper, self.config.zookeeper_session_timeout_s,
                                         identity=self.zookeeper_identity)
            self._registry = zk.ServiceRegistry(self._zookeeper, self.config.zookeeper_root)
        return self._zookeeper

    @property
    def registry(self) -> zk.ServiceRegistry:
        """The registry of live services, on this process's ZooKeeper session."""
        self.zookeeper  # noqa: B018  (connects on first use)
        return self._registry

    async def start(self) -> int:
        """Binds, starts serving, registers in ZooKeeper; returns the bound port."""
        self._loop = asyncio.get_running_loop()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        if self.tls_files.enabled:
            credentials = tls.server_credentials(self.tls_files, getattr(self.config, "tls_client_auth", "required"))
            self.port = self.server.add_secure_port(self.config.listen, credentials)
        else:
            self.port = self.server.add_insecure_port(self.config.listen)
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {self.config.listen}")
        self.address = advertised(self.config.listen, self.port, self.config.advertised_address)
        await self.authorizer.start(self.zookeeper, self.config.zookeeper_root)
        await self._start_health_server()
        self.metrics.start()
        if self.metrics.address:
            self.registration_details["metrics_address"] = reachable(self.metrics.address, self.address)
        self.registration_details["version"] = VERSION
        await self.server.start()
        zk.add_state_listener(self.zookeeper, self._on_zookeeper_state)
        self.registry.register(self.kind, self.config.node_id, self.address, self.registration_details)
        await self.set_serving(self.zookeeper.connected)
        log.info("serving", extra=fields(address=self.address, services=self.service_names, tls=self.tls_files.enabled,
                                         version=VERSION,
                                         metrics_address=self.metrics.address or None))
        return self.port

    async def _start_health_server(self) -> None:
        """The plaintext health-only port (--health-listen): the same health
        states, nothing else, so probes need no certificate."""
        listen = getattr(self.config, "health_listen", "")
        if not listen:
            return
        self.health_server = grpc.aio.server(options=channels.SERVER_KEEPALIVE_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
        self.health_port = self.health_server.add_insecure_port(listen)
        if self.health_port == 0:
            raise RuntimeError(f"cannot listen on {listen} (health_listen)")
        await self.health_server.start()

    async def set_serving(self, serving: bool) -> None:
        if self._stopping:
            return
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    def _on_zookeeper_state(self, connected: bool) -> None:
        if self._stopping or self._loop is None or self._loop.is_closed():
            return
        log.warning("ZooKeeper session %s", "connected" if connected else "not connected")
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self.set_serving(connected)))

    async def stop(self, grace_s: float | None = None) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        log.info("shutting down", extra=fields(grace_s=grace_s))
        await self.health.enter_graceful_shutdown()
        if self._registry is not None:
            self._registry.deregister_all()
        await self.server.stop(grace_s)
        if self.health_server is not None:
            await self.health_server.stop(0)
        for callback in self._on_stop:
            await callback()
        if self._zookeeper is not None:
            self._zookeeper.stop()
            self._zookeeper.close()
        self.tracer_provider.shutdown()
        self.metrics.stop()
        self._stopped.set()
        log.info("stopped")

    async def serve_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_requested.set)
        await stop_requested.wait()
        await self.stop()


def run(
    kind: str,
    description: str,
    settings: Sequence[config_mod.Setting],
    build: Callable[[ServiceRuntime], Awaitable[None]],
    argv: Sequence[str] | None = None,
) -> int:
    """The main of a service: load config, build its servicers, serve until
    SIGTERM, exit 0."""
    cfg = config_mod.load(description, [*config_mod.COMMON_SETTINGS, *SERVER_SETTINGS, *settings], argv)
    logs.configure(kind, cfg.log_level)
    malloc.cap_arenas(cfg.malloc_arena_max)  # before the threads (gRPC's, ZooKeeper's) take arenas of their own

    async def main() -> None:
        runtime = ServiceRuntime(kind, cfg)
        with zk.patient_for(START_ZOOKEEPER_PATIENCE_S):
            await build(runtime)
        await runtime.start()
        await runtime.serve_until_signal()

    try:
        asyncio.run(main())
    except config_mod.ConfigError as exc:
        log.error("cannot start: %s", exc)
        print(f"{kind}: {exc}", file=sys.stderr)
        return 2
    return 0
