"""Error codes by name, as tests compare them."""

from __future__ import annotations

import grpc

from txlog.errors import ClientError
from txlog.protocol import errors


def error_name(answer) -> str:
    """The name of an error code: given as a number, as an Error message, or as
    the ``error`` of an answer (a ProduceResult, a FetchResult...)."""
    if isinstance(answer, int):
        return errors.ErrorCode.Name(answer)
    return error_name(answer.error if hasattr(answer, "error") else answer.code)


def failure_name(call) -> str:
    """The code name ``call()`` fails with (an SDK ClientError or a raw gRPC error);
    AssertionError if it succeeds."""
    try:
        call()
    except ClientError as exc:
        return exc.name
    except grpc.RpcError as exc:
        return errors.from_rpc_error(exc).name
    raise AssertionError("the call succeeded")
