"""How the partition service's servicers answer what went wrong: our error
protos and TxlogErrors, and the checks they share."""

from __future__ import annotations

from partition_svc.partition import Partition
from txlog.protocol import acls
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.v1 import errors_pb2


def error(code: str, message: str) -> errors_pb2.Error:
    return error_proto(ErrorCode.Value(code), message)


def error_of(exc: TxlogError) -> errors_pb2.Error:
    return error_proto(exc.code, exc.message)


def request_error(message: str) -> TxlogError:
    return TxlogError(ErrorCode.Value("INVALID_REQUEST"), message)


def optional(request, name: str):
    """A proto3 optional field's value, None when left out."""
    return getattr(request, name) if request.HasField(name) else None


def checked_acl(convert, message, what: str):
    try:
        return convert(message)
    except acls.AclError as exc:
        raise request_error(f"{what}: {exc}") from None


def check_settled(partition: Partition) -> None:
    """A new leader answers reads only once its high watermark has reached
    the start of its epoch: below that, it could show a high watermark or LSO
    behind what the previous leader showed (KIP-207's OFFSET_NOT_AVAILABLE)."""
    if partition.high_watermark < partition.epoch_start_offset:
        raise TxlogError(ErrorCode.Value("OFFSET_NOT_AVAILABLE"),
                         f"{partition.topic}-{partition.index} has a new leader still catching its high watermark up to "
                         f"{partition.epoch_start_offset}; retry shortly")


def not_replicated(partition: Partition) -> TxlogError:
    return TxlogError(ErrorCode.Value("NOT_COORDINATOR"),
                      f"{partition.topic}-{partition.index} stopped being led here before the offsets were replicated; "
                      "find the group coordinator again and retry")
