"""The SDK's one error table: what a client does about each code, and the
exception type each failure becomes."""

import grpc
import pytest
from grpc_status import rpc_status

from txlog.errors import (
    AbortableError,
    Action,
    ClientError,
    FatalError,
    RetriableError,
    action_for,
    error_for,
    from_exception,
)
from txlog.protocol import errors as txlog_errors
from txlog.protocol.errors import ERROR_TABLE, ErrorClass, ErrorCode

E = ErrorCode.Value


@pytest.mark.parametrize("name, action", [
    ("NOT_LEADER", Action.REFRESH_METADATA),
    ("UNKNOWN_TOPIC_OR_PARTITION", Action.REFRESH_METADATA),
    ("LEADER_NOT_AVAILABLE", Action.REFRESH_METADATA),
    ("FENCED_LEADER_EPOCH", Action.REFRESH_METADATA),
    ("UNKNOWN_LEADER_EPOCH", Action.REFRESH_METADATA),
    ("NOT_COORDINATOR", Action.FIND_COORDINATOR),
    ("COORDINATOR_NOT_AVAILABLE", Action.FIND_COORDINATOR),
    ("COORDINATOR_LOAD_IN_PROGRESS", Action.RETRY),
    ("REQUEST_TIMED_OUT", Action.RETRY),
    ("ZOOKEEPER_UNAVAILABLE", Action.RETRY),
    ("LIMIT_EXCEEDED", Action.RETRY),
    ("DUPLICATE_SEQUENCE", Action.ALREADY_APPENDED),
    ("OUT_OF_ORDER_SEQUENCE", Action.SEQUENCE_REJECTED),
    ("UNKNOWN_PRODUCER_ID", Action.SEQUENCE_REJECTED),
    ("RECORD_TOO_LARGE", Action.FAIL),
    ("INVALID_PRODUCER_EPOCH", Action.FAIL),
    ("PRODUCER_FENCED", Action.FAIL),
    ("INVALID_REQUEST", Action.FAIL),
    ("OFFSET_OUT_OF_RANGE", Action.FAIL),
])
def test_action_of_well_known_codes(name, action):
    assert action_for(E(name)) is action


def test_every_retriable_code_is_retried_and_every_other_code_is_not():
    special = {E("DUPLICATE_SEQUENCE"), E("OUT_OF_ORDER_SEQUENCE"), E("UNKNOWN_PRODUCER_ID")}
    for code, spec in ERROR_TABLE.items():
        if code == E("NONE") or code in special:
            continue
        assert action_for(code).retries == (spec.error_class is ErrorClass.RETRIABLE), spec.name


def test_codes_from_a_newer_server_are_retried():
    assert action_for(9999) is Action.RETRY
    assert isinstance(error_for(9999, "new"), RetriableError)


@pytest.mark.parametrize("name, error_type", [
    ("NOT_LEADER", RetriableError),
    ("RECORD_TOO_LARGE", AbortableError),
    ("PRODUCER_FENCED", FatalError),
])
def test_the_exception_type_follows_the_codes_class(name, error_type):
    error = error_for(E(name), "why")
    assert isinstance(error, error_type) and isinstance(error, ClientError)
    assert isinstance(error, txlog_errors.TxlogError)
    assert str(error) == f"{name}: why" and error.name == name


def _rpc_error(status_code, details, trailing=()):
    return grpc.aio.AioRpcError(status_code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)


def test_a_status_with_our_details_becomes_its_code():
    status = rpc_status.to_status(txlog_errors.to_status(E("NOT_COORDINATOR"), "go elsewhere", retry_delay_ms=70))
    error = from_exception(_rpc_error(status.code, status.details, status.trailing_metadata))
    assert (error.name, error.message, error.retry_delay_ms) == ("NOT_COORDINATOR", "go elsewhere", 70)
    assert action_for(error.code) is Action.FIND_COORDINATOR


def test_an_unreachable_server_reads_as_leader_not_available_and_refreshes_metadata():
    error = from_exception(_rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert error.name == "LEADER_NOT_AVAILABLE" and isinstance(error, RetriableError)
    assert action_for(error.code) is Action.REFRESH_METADATA


def test_a_deadline_reads_as_a_retriable_timeout():
    error = from_exception(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"))
    assert error.name == "REQUEST_TIMED_OUT" and action_for(error.code) is Action.RETRY


def test_unexpected_exceptions_are_not_retried():
    error = from_exception(KeyError("boom"))
    assert error.name == "UNKNOWN_SERVER_ERROR" and action_for(error.code) is Action.FAIL
