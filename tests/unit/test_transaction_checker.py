"""The SDK's side of transaction check-back that needs no cluster: what a
TransactionChecker answers (through its real gRPC server, on port 0), the
address it registers, and the arguments the SDK refuses before any call."""

import logging

import grpc
import pytest

from txlog import Admin, Producer, TransactionChecker
from txlog.checker import CheckerState, _CheckService, create_server
from txlog.config import PREPARE_METADATA_BYTES_MAX
from txlog.errors import ClientClosedError, ClientError
from txlog.net.addresses import advertised
from txlog.v1 import transaction_check_pb2, transaction_check_pb2_grpc

UNREACHABLE = "127.0.0.1:1"
ANSWER = transaction_check_pb2.TransactionCheckAnswer


def serve(checker: TransactionChecker):
    server, port = create_server("127.0.0.1:0", _CheckService(checker._answer), checker.max_concurrent_checks)
    server.start()
    return server, grpc.insecure_channel(f"127.0.0.1:{port}")


def ask(channel, transactional_id: str, metadata: bytes = b"") -> str:
    stub = transaction_check_pb2_grpc.TransactionCheckServiceStub(channel)
    response = stub.CheckTransaction(transaction_check_pb2.CheckTransactionRequest(
        transactional_id=transactional_id, prepare_metadata=metadata, group_id="orders", attempt=1), timeout=10)
    return ANSWER.Name(response.answer).removeprefix("TRANSACTION_CHECK_ANSWER_")


def test_a_check_answers_what_the_application_said_and_unknown_for_anything_else(caplog):
    def check(transactional_id: str, metadata: bytes):
        verdicts = {b"paid": "COMMIT", b"cancelled": "abort", b"later": "Unknown", b"odd": "maybe", b"number": 1}
        if metadata == b"boom":
            raise RuntimeError("the database is down")
        return verdicts[metadata]

    checker = TransactionChecker(UNREACHABLE, "orders", check)
    server, channel = serve(checker)
    try:
        with caplog.at_level(logging.WARNING, logger="txlog.checker"):
            answers = [ask(channel, "orders/1", m) for m in (b"paid", b"cancelled", b"later", b"odd", b"number", b"boom")]
    finally:
        channel.close()
        server.stop(0)
    assert answers == ["COMMIT", "ABORT", "UNKNOWN", "UNKNOWN", "UNKNOWN", "UNKNOWN"]
    assert checker.checks_answered == {"COMMIT": 1, "ABORT": 1, "UNKNOWN": 4}
    logged = caplog.text
    assert "returned 'maybe'" in logged and "returned 1" in logged
    assert "raised: answering UNKNOWN" in logged and "the database is down" in logged  # with its traceback


def test_the_metadata_reaches_the_check_as_bytes_exactly():
    seen = []
    checker = TransactionChecker(UNREACHABLE, "orders", lambda tid, metadata: seen.append((tid, metadata)) or "ABORT")
    server, channel = serve(checker)
    try:
        assert ask(channel, "orders/a/b", bytes(range(256))) == "ABORT"
        assert ask(channel, "orders", b"") == "ABORT"
    finally:
        channel.close()
        server.stop(0)
    assert seen == [("orders/a/b", bytes(range(256))), ("orders", b"")]


def test_the_registered_address_is_the_advertised_one_or_the_listen_host_with_the_bound_port(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "box-7")
    assert advertised("127.0.0.1:0", 4711, None) == "127.0.0.1:4711"
    assert advertised("0.0.0.0:0", 4711, None) == "box-7:4711"
    assert advertised("[::]:0", 4711, None) == "box-7:4711"
    assert advertised(":0", 4711, None) == "box-7:4711"
    assert advertised("0.0.0.0:0", 4711, "checker.internal") == "checker.internal:4711"
    assert advertised("0.0.0.0:0", 4711, "checker.internal:0") == "checker.internal:4711"
    assert advertised("0.0.0.0:9000", 9000, "lb.internal:443") == "lb.internal:443"


def test_a_checker_refuses_bad_settings_before_serving_anything():
    ok = lambda tid, metadata: "UNKNOWN"  # noqa: E731
    for kwargs, message in (({"group": "orders/x"}, "group_id must be"), ({"check": "COMMIT"}, "check must be a callable"),
                            ({"listen": "8080"}, "listen must be host:port"), ({"lease_ms": 999}, "lease_ms must be"),
                            ({"lease_ms": 300_001}, "lease_ms must be"), ({"max_concurrent_checks": 0}, "max_concurrent_checks"),
                            ({"start_timeout_s": 0}, "start_timeout_s")):
        arguments = {"group": "orders", "check": ok, **kwargs}
        with pytest.raises((ValueError, TypeError), match=message):
            TransactionChecker(UNREACHABLE, **arguments)


def test_a_checker_that_cannot_register_raises_from_start_and_leaves_nothing_running():
    checker = TransactionChecker(UNREACHABLE, "orders", lambda tid, metadata: "COMMIT", start_timeout_s=1)
    with pytest.raises(ClientError):
        checker.start()
    assert checker.state is CheckerState.STOPPED
    with pytest.raises(ClientClosedError, match="make a new one"):
        checker.start()
    checker.stop()  # stopping a stopped checker does nothing
    never_started = TransactionChecker(UNREACHABLE, "orders", lambda tid, metadata: "COMMIT")
    never_started.stop()
    assert never_started.state is CheckerState.STOPPED


def test_prepare_metadata_is_bytes_of_at_most_4096_checked_before_any_call():
    with Producer(UNREACHABLE, transactional_id="orders/unit") as producer:
        with pytest.raises(TypeError, match=r"metadata must be bytes, not str \(encode a str first"):
            producer.prepare_transaction(metadata="order-1")
        with pytest.raises(ValueError, match=f"at most {PREPARE_METADATA_BYTES_MAX} bytes, not 4097"):
            producer.prepare_transaction(metadata=b"x" * (PREPARE_METADATA_BYTES_MAX + 1))


def test_admin_refuses_bad_group_config_calls_before_any_call():
    with Admin(UNREACHABLE) as admin:
        with pytest.raises(ValueError, match="group_id must be"):
            admin.describe_transaction_group_config("orders/1")
        with pytest.raises(ValueError, match="at least one setting"):
            admin.alter_transaction_group_config("orders", {})
        with pytest.raises(ValueError, match="not both: transaction.check.max"):
            admin.alter_transaction_group_config("orders", {"transaction.check.max": "3"}, delete=["transaction.check.max"])
        with pytest.raises(ValueError, match="lease_ms must be"):
            admin.register_transaction_checker("orders", "h:1", lease_ms=-1)


class SlowRenewalCoordinator:
    """Stands in for the Admin a TransactionChecker registers through (the coordinator is not what
    this tests): the first registration answers at once; a renewal is held until stop() unregisters,
    then lands, as a renewal slowed by a coordinator failover would. Keeps what is registered."""

    def __init__(self, *_, **__):
        import threading
        self.registered: set[str] = set()
        self.calls: list[str] = []
        self.renewing, self.unregistered, self.undone = threading.Event(), threading.Event(), threading.Event()

    def register_transaction_checker(self, group, address, lease_ms, timeout_s=None):
        if self.calls:  # a renewal
            self.renewing.set()
            assert self.unregistered.wait(10)
        self.calls.append("register")
        self.registered.add(address)
        return lease_ms

    def unregister_transaction_checker(self, group, address, timeout_s=None):
        self.calls.append("unregister")
        self.registered.discard(address)
        if self.unregistered.is_set():
            self.undone.set()
        self.unregistered.set()

    def close(self):
        self.undone.wait(5)  # the renewal thread gets to finish before the client is gone


def test_a_renewal_that_lands_after_stop_unregistered_is_undone(monkeypatch):
    """Found reading the change again: stop() waited for a renewal under way only up to half its
    timeout, then unregistered; a renewal landing after that registered the stopped checker again,
    and the coordinator went on asking a dead address for a whole lease."""
    import txlog.checker as checker_module

    fakes = []
    monkeypatch.setattr(checker_module, "Admin", lambda *a, **k: fakes.append(SlowRenewalCoordinator()) or fakes[-1])
    checker = TransactionChecker(UNREACHABLE, "orders", lambda tid, metadata: "UNKNOWN", lease_ms=1_000).start()
    coordinator = fakes[0]
    assert coordinator.renewing.wait(10), "no renewal came"
    checker.stop(timeout_s=0.2)
    assert coordinator.undone.wait(5)
    assert coordinator.calls == ["register", "unregister", "register", "unregister"]
    assert coordinator.registered == set()
