"""The error table: every code classified and mapped, rich details round-trip."""

import grpc
import pytest
from google.rpc import error_details_pb2

from txlog.protocol import errors
from txlog.protocol.errors import ERROR_TABLE, ErrorClass, ErrorCode, TxlogError


def test_every_code_but_none_has_a_class_and_a_non_ok_status():
    for code, spec in ERROR_TABLE.items():
        if code == ErrorCode.Value("NONE"):
            assert spec.error_class is ErrorClass.NONE and spec.grpc_status is grpc.StatusCode.OK
        else:
            assert spec.error_class in (ErrorClass.RETRIABLE, ErrorClass.ABORTABLE, ErrorClass.FATAL), spec
            assert spec.grpc_status is not grpc.StatusCode.OK, spec


@pytest.mark.parametrize(
    "name, error_class, status",
    [
        ("CONCURRENT_TRANSACTIONS", ErrorClass.RETRIABLE, grpc.StatusCode.ABORTED),
        ("PRODUCER_FENCED", ErrorClass.FATAL, grpc.StatusCode.FAILED_PRECONDITION),
        ("OUT_OF_ORDER_SEQUENCE", ErrorClass.ABORTABLE, grpc.StatusCode.FAILED_PRECONDITION),
        ("NOT_LEADER", ErrorClass.RETRIABLE, grpc.StatusCode.UNAVAILABLE),
        ("INVALID_REQUEST", ErrorClass.FATAL, grpc.StatusCode.INVALID_ARGUMENT),
        ("ZOOKEEPER_UNAVAILABLE", ErrorClass.RETRIABLE, grpc.StatusCode.UNAVAILABLE),
        ("PRODUCER_IDS_EXHAUSTED", ErrorClass.FATAL, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
def test_classification_of_well_known_codes(name, error_class, status):
    spec = ERROR_TABLE[ErrorCode.Value(name)]
    assert (spec.error_class, spec.grpc_status) == (error_class, status)


def test_unknown_codes_read_as_retriable():
    error = TxlogError(9999, "from a newer server")
    assert error.retriable and error.name == "UNKNOWN_CODE_9999"


def _details(status):
    infos, retries = [], []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retries.append(retry)
    return infos, retries


def test_status_of_a_retriable_code_carries_error_info_and_retry_info():
    status = errors.to_status(ErrorCode.Value("NOT_LEADER"), "partition t-0 moved", retry_delay_ms=250)
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert status.message == "NOT_LEADER: partition t-0 moved"
    infos, retries = _details(status)
    assert [i.reason for i in infos] == ["NOT_LEADER"]
    assert infos[0].domain == "txlog.v1"
    assert infos[0].metadata["code"] == str(ErrorCode.Value("NOT_LEADER"))
    assert infos[0].metadata["class"] == "retriable"
    assert [r.retry_delay.ToMilliseconds() for r in retries] == [250]


def test_status_of_a_fatal_code_has_no_retry_info():
    _, retries = _details(errors.to_status(ErrorCode.Value("PRODUCER_FENCED"), "zombie"))
    assert retries == []


class _FakeRpcError(grpc.RpcError):
    """Stands in for a failed call (what is tested is the decoding, not gRPC)."""

    def __init__(self, code, details, trailing):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


def test_from_rpc_error_recovers_our_code_and_message():
    status = errors.to_status(ErrorCode.Value("CONCURRENT_TRANSACTIONS"), "a commit is completing", retry_delay_ms=40)
    rpc_error = _FakeRpcError(grpc.StatusCode.ABORTED, status.message, (("grpc-status-details-bin", status.SerializeToString()),))
    error = errors.from_rpc_error(rpc_error)
    assert error.code == ErrorCode.Value("CONCURRENT_TRANSACTIONS")
    assert error.message == "a commit is completing"
    assert error.retry_delay_ms == 40 and error.retriable


def test_from_rpc_error_sorts_plain_grpc_failures_by_status():
    error = errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused", ()))
    assert error.retriable
    error = errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline", None))
    assert error.code == ErrorCode.Value("REQUEST_TIMED_OUT") and error.retriable
