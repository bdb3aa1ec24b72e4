"""txlog's errors: one table built from the ErrorCode options in protos/, the
server-side mapping to gRPC status with rich details, and the client-side
decoding back to a :class:`TxlogError`.

Error Handling
--------------
Every ErrorCode value in ``protos/txlog/v1/errors.proto`` names its class
(retriable / abortable / fatal) and its gRPC status code as enum-value options;
:data:`ERROR_TABLE` is read from them, so there is no second list to keep in step.
A server answers a request-level error with :func:`abort`, which puts a
``google.rpc.Status`` into the call's details holding an ``ErrorInfo`` (reason =
the code's name) and, for retriable codes, a ``RetryInfo``. A client turns the
``grpc.RpcError`` back into a :class:`TxlogError` with :func:`from_rpc_error`;
plain gRPC failures without our details (a dead server, a deadline) are sorted
by their status code. Unknown codes read as retriable.
"""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from txlog.v1 import errors_pb2

ERROR_CODE_PREFIX = "ERROR_CODE_"
ERROR_DOMAIN = "txlog.v1"
RETRY_DELAY_MS_DEFAULT = 100


class ErrorClass(enum.Enum):
    """What a client does about an error (see errors.proto)."""

    NONE = "none"
    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"


_CLASS_FROM_PROTO = {
    errors_pb2.ERROR_CLASS_UNSPECIFIED: ErrorClass.NONE,
    errors_pb2.ERROR_CLASS_RETRIABLE: ErrorClass.RETRIABLE,
    errors_pb2.ERROR_CLASS_ABORTABLE: ErrorClass.ABORTABLE,
    errors_pb2.ERROR_CLASS_FATAL: ErrorClass.FATAL,
}
_GRPC_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


class ShortNamedErrorCode:
    """``txlog.v1.ErrorCode`` by the names messages, ``ErrorInfo.reason`` and the
    docs use: the proto's value names without the ERROR_CODE_ prefix protobuf
    style gives them. Answers ``Value``/``Name``/``values`` as protobuf's enum
    wrapper does, so ``ErrorCode.Value("PRODUCER_FENCED")`` reads as the code."""

    @staticmethod
    def Value(name: str) -> int:  # noqa: N802 - protobuf's enum wrapper API
        return errors_pb2.ErrorCode.Value(ERROR_CODE_PREFIX + name)

    @staticmethod
    def Name(number: int) -> str:  # noqa: N802 - protobuf's enum wrapper API
        return errors_pb2.ErrorCode.Name(number).removeprefix(ERROR_CODE_PREFIX)

    @staticmethod
    def values() -> list[int]:
        return errors_pb2.ErrorCode.values()


ErrorCode = ShortNamedErrorCode()
NONE = ErrorCode.Value("NONE")

_CLASS_TO_PROTO = {cls: number for number, cls in _CLASS_FROM_PROTO.items()}


def error_proto(code: int, message: str) -> errors_pb2.Error:
    """The per-item ``Error`` of a result, with its class: every Error a
    service answers is built here."""
    return errors_pb2.Error(code=code, message=message, error_class=_CLASS_TO_PROTO[spec_of(code).error_class])


@dataclass(frozen=True)
class ErrorSpec:
    code: int
    name: str
    error_class: ErrorClass
    grpc_status: grpc.StatusCode

    @property
    def retriable(self) -> bool:
        return self.error_class is ErrorClass.RETRIABLE


def _build_table() -> dict[int, ErrorSpec]:
    table = {}
    for value in errors_pb2.ErrorCode.DESCRIPTOR.values:
        options = value.GetOptions()
        if not (options.HasExtension(errors_pb2.error_class) and options.HasExtension(errors_pb2.grpc_code)):
            raise RuntimeError(f"ErrorCode {value.name} lacks its error_class or grpc_code option in errors.proto")
        table[value.number] = ErrorSpec(
            code=value.number,
            name=value.name.removeprefix(ERROR_CODE_PREFIX),
            error_class=_CLASS_FROM_PROTO[options.Extensions[errors_pb2.error_class]],
            grpc_status=_GRPC_BY_NUMBER[options.Extensions[errors_pb2.grpc_code]],
        )
    return table


ERROR_TABLE: dict[int, ErrorSpec] = _build_table()


def spec_of(code: int) -> ErrorSpec:
    """The spec of a code; a code this build does not know (a newer server) reads as retriable."""
    spec = ERROR_TABLE.get(code)
    if spec is None:
        return ErrorSpec(code, f"UNKNOWN_CODE_{code}", ErrorClass.RETRIABLE, grpc.StatusCode.UNAVAILABLE)
    return spec


class TxlogError(Exception):
    """An error with one of our codes. ``str()`` gives the code's name and the message."""

    def __init__(self, code: int, message: str, *, retry_delay_ms: int | None = None):
        self.code = code
        self.spec = spec_of(code)
        self.message = message
        self.retry_delay_ms = retry_delay_ms
        super().__init__(f"{self.spec.name}: {message}")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def error_class(self) -> ErrorClass:
        return self.spec.error_class

    @property
    def retriable(self) -> bool:
        return self.spec.retriable

    def to_proto(self) -> errors_pb2.Error:
        return error_proto(self.code, self.message)


def to_status(code: int, message: str, *, retry_delay_ms: int = RETRY_DELAY_MS_DEFAULT) -> status_pb2.Status:
    """The google.rpc.Status a server answers ``code`` with."""
    spec = spec_of(code)
    status = status_pb2.Status(code=spec.grpc_status.value[0], message=f"{spec.name}: {message}")
    info = error_details_pb2.ErrorInfo(
        reason=spec.name,
        domain=ERROR_DOMAIN,
        metadata={"code": str(code), "class": spec.error_class.value},
    )
    status.details.add().Pack(info)
    if spec.retriable:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(retry_delay_ms)
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status


# The error code a call ended with, set where it is aborted: the call's handler
# runs in the task of the wrapper that records the call (metrics), so the
# wrapper reads it back after the handler raises.
call_error: contextvars.ContextVar[int | None] = contextvars.ContextVar("txlog_call_error", default=None)


async def abort(context: grpc.aio.ServicerContext, error: TxlogError) -> None:
    """Ends the call with ``error`` as its status (never returns)."""
    call_error.set(error.code)
    kwargs = {} if error.retry_delay_ms is None else {"retry_delay_ms": error.retry_delay_ms}
    await context.abort_with_status(rpc_status.to_status(to_status(error.code, error.message, **kwargs)))


# Plain gRPC failures that carry none of our details (the server is down, the
# deadline passed, a proxy answered) are read as these codes.
_CODE_FROM_GRPC_STATUS = {
    grpc.StatusCode.UNAVAILABLE: ErrorCode.Value("LEADER_NOT_AVAILABLE"),
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.Value("REQUEST_TIMED_OUT"),
    grpc.StatusCode.CANCELLED: ErrorCode.Value("REQUEST_TIMED_OUT"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.Value("LIMIT_EXCEEDED"),
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.Value("INVALID_REQUEST"),
    grpc.StatusCode.UNIMPLEMENTED: ErrorCode.Value("INVALID_REQUEST"),
}


def details_of(error: grpc.RpcError) -> tuple[error_details_pb2.ErrorInfo | None, int | None]:
    """The ErrorInfo and the RetryInfo delay (ms) in a failed call's details, if any."""
    trailing = error.trailing_metadata() or () if hasattr(error, "trailing_metadata") else ()
    info = retry_ms = None
    for key, value in trailing:
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_ms = retry.retry_delay.ToMilliseconds()
    return info, retry_ms


def from_rpc_error(error: grpc.RpcError) -> TxlogError:
    """The TxlogError a failed call stands for."""
    info, retry_ms = details_of(error)
    message = error.details() or ""
    if info is not None and info.domain == ERROR_DOMAIN and "code" in info.metadata:
        code = int(info.metadata["code"])
        prefix = f"{spec_of(code).name}: "
        return TxlogError(code, message[len(prefix):] if message.startswith(prefix) else message, retry_delay_ms=retry_ms)
    code = _CODE_FROM_GRPC_STATUS.get(error.code(), ErrorCode.Value("UNKNOWN_SERVER_ERROR"))
    return TxlogError(code, f"gRPC {error.code().name}: {message}", retry_delay_ms=retry_ms)


def check(error: errors_pb2.Error) -> None:
    """Raises the TxlogError of a per-item Error message unless it is NONE."""
    if error.code != NONE:
        raise TxlogError(error.code, error.message)

