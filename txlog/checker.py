"""TransactionChecker: the application's side of transaction check-back
(issue 19, as RocketMQ checks back half messages).

An application that prepares transactions with ``prepare_transaction(metadata=...)``
and keeps the outcome in its own store runs a TransactionChecker for its
transaction group. The group's coordinator asks it about a prepared
transaction whose owner has not completed it within the group's
``transaction.check.interval.ms``; ``check(transactional_id, metadata)``
answers from the application's store::

    def check(transactional_id: str, metadata: bytes) -> str:
        return "COMMIT" if order_committed(metadata) else "ABORT"

    with TransactionChecker(bootstrap="127.0.0.1:7001", group="orders", check=check):
        serve_forever()

Guarantees
----------
* ``start()`` returns once the server listens and the group's coordinator has
  the registration; if the registration does not succeed within
  ``start_timeout_s`` (retriable errors are retried meanwhile), it raises and
  nothing is left running.
* While started, the registration is renewed every third of the lease the
  coordinator granted, from a background thread. A renewal answered
  NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, or that cannot reach the
  coordinator, looks the group's coordinator up again (the SDK's one routing
  code: ``Admin`` / ``txn_requests.CoordinatorClient``), so after a
  coordinator failover the checker registers at the new one.
* The answer sent is exactly what ``check`` returned when that is "COMMIT",
  "ABORT" or "UNKNOWN" (any case); anything else, and an exception raised by
  ``check``, answers UNKNOWN (logged): a checker never commits or aborts
  anything by default. UNKNOWN makes the coordinator ask again an interval
  later.
* At most ``max_concurrent_checks`` checks run at once (the server's threads
  and its maximum of concurrent calls): one more is refused at once with
  RESOURCE_EXHAUSTED, so the application bounds its own load; the coordinator
  then asks another registered instance of the group, and when all were busy
  asks again in a later round without counting the check.
* ``stop()`` takes at most about ``timeout_s``: it stops renewing, removes the
  registration (best effort: a registration it could not remove lapses at the
  end of its lease), then stops the server, letting checks in flight finish
  within the second half of ``timeout_s``.

The same transaction may be checked more than once (a lost answer, a
coordinator failover): ``check`` must answer from durable state, the same way
every time.

State Transitions
-----------------
::

    NEW      -> STARTING   start()
    STARTING -> STARTED    listening, and the first registration succeeded
    STARTING -> STOPPED    the server or the first registration failed (start() raises)
    STARTED  -> STOPPING   stop()
    STOPPING -> STOPPED    unregistered (or given up), server stopped
    NEW      -> STOPPED    stop() before start()

Error Handling
--------------
Coordinator errors are sorted by :func:`txlog.errors.txn_action_for`
inside ``Admin``; a renewal that still fails (its attempt lasts at most a
third of the lease) is logged and tried again after a back-off
(:data:`RENEW_RETRY`), until stop().
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc

from txlog import shutdown
from txlog.admin import Admin, check_transaction_group
from txlog.errors import ClientClosedError, ClientError
from txlog.net import channels
from txlog.net.addresses import advertised
from txlog.protocol.retry import RetryPolicy
from txlog.structs import CHECK_ANSWERS
from txlog.transactions import IllegalStateError
from txlog.v1 import transaction_check_pb2, transaction_check_pb2_grpc

log = logging.getLogger(__name__)

LEASE_MS_MIN = 1_000  # RegisterTransactionCheckerRequest.lease_ms: the coordinator's range
LEASE_MS_MAX = 300_000
MAX_CONCURRENT_CHECKS_MAX = 256
START_TIMEOUT_S_DEFAULT = 30.0
STOP_TIMEOUT_S_DEFAULT = 10.0
# After a failed renewal: soon again, then at most every 2 s (each attempt retries inside, too).
RENEW_RETRY = RetryPolicy(attempts_max=1 << 30, backoff_initial_ms=100, backoff_max_ms=2_000)

Check = Callable[[str, bytes], str]


class CheckerState(enum.Enum):
    """Where a TransactionChecker is in its life (see the module docstring)."""

    NEW = "new"
    STARTING = "starting"
    STARTED = "started"
    STOPPING = "stopping"
    STOPPED = "stopped"


_VALID_PREVIOUS_STATES: dict[CheckerState, frozenset[CheckerState]] = {
    CheckerState.NEW: frozenset(),
    CheckerState.STARTING: frozenset({CheckerState.NEW}),
    CheckerState.STARTED: frozenset({CheckerState.STARTING}),
    CheckerState.STOPPING: frozenset({CheckerState.STARTED}),
    CheckerState.STOPPED: frozenset({CheckerState.NEW, CheckerState.STARTING, CheckerState.STOPPING}),
}


def answer_of(verdict, transactional_id: str) -> str:
    """``check``'s return value as the answer to send: "COMMIT", "ABORT" or
    "UNKNOWN" (anything that is not one of them, in any case, is UNKNOWN)."""
    name = verdict.upper() if isinstance(verdict, str) else None
    if name in CHECK_ANSWERS:
        return name
    log.warning("the check of transactional id %r returned %r, not 'COMMIT', 'ABORT' or 'UNKNOWN': answering UNKNOWN",
                transactional_id, verdict)
    return "UNKNOWN"


class _CheckService(transaction_check_pb2_grpc.TransactionCheckServiceServicer):
    """TransactionCheckService over the checker's ``answer``."""

    def __init__(self, answer: Callable[[transaction_check_pb2.CheckTransactionRequest], str]):
        self._answer = answer

    def CheckTransaction(self, request, context):  # noqa: N802 -- the rpc's name
        return transaction_check_pb2.CheckTransactionResponse(answer=CHECK_ANSWERS[self._answer(request)])


def create_server(listen: str, service: _CheckService, max_concurrent_checks: int,
                  server_credentials: grpc.ServerCredentials | None = None) -> tuple[grpc.Server, int]:
    """A gRPC server (not started) serving ``service`` on ``listen``, and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_concurrent_checks,
                                                    thread_name_prefix="txlog-checker"),
                         maximum_concurrent_rpcs=max_concurrent_checks, options=channels.SERVER_KEEPALIVE_OPTIONS)
    transaction_check_pb2_grpc.add_TransactionCheckServiceServicer_to_server(service, server)
    port = server.add_secure_port(listen, server_credentials) if server_credentials is not None \
        else server.add_insecure_port(listen)
    if port == 0:
        raise ValueError(f"cannot listen on {listen!r}")
    return server, port



class TransactionChecker:
    """Serves TransactionCheckService for transaction group ``group`` and keeps
    it registered with the group's coordinator (see the module docstring).

    ``bootstrap``: the cluster's partition_svc addresses; ``check(transactional_id,
    metadata) -> "COMMIT" | "ABORT" | "UNKNOWN"``, called from the server's
    threads (at most ``max_concurrent_checks`` at once). ``listen``: host:port
    to serve on (port 0: any free one). The address registered is
    ``advertised_address`` if given, else the listen host with the bound port;
    with a wildcard listen host (0.0.0.0, ::, empty) the machine's hostname,
    so give ``advertised_address`` when that is not how the coordinators reach
    this machine. ``lease_ms`` (1,000..300,000): how long the registration
    lasts without renewal. ``server_credentials``: serve over TLS (the
    coordinators must then be able to verify it). ``tls_ca``, ``tls_cert``,
    ``tls_key``, ``token_file``, ``request_timeout_ms``, ``retry_backoff_ms``,
    ``tracer_provider``: as ``Admin``'s, for the calls to the coordinator.

    ``checks_answered`` counts the answers sent ({"COMMIT": n, "ABORT": n,
    "UNKNOWN": n}); ``renewals`` and ``renewal_failures`` count renewals."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        group: str,
        check: Check,
        *,
        listen: str = "127.0.0.1:0",
        advertised_address: str | None = None,
        lease_ms: int = 30_000,
        max_concurrent_checks: int = 8,
        start_timeout_s: float = START_TIMEOUT_S_DEFAULT,
        server_credentials: grpc.ServerCredentials | None = None,
        request_timeout_ms: float = 30_000,
        retry_backoff_ms: float = 100,
        tracer_provider=None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token_file: str | None = None,
    ):
        check_transaction_group(group)
        if not callable(check):
            raise TypeError(f"check must be a callable (transactional_id, metadata) -> str, not {check!r}")
        if not isinstance(listen, str) or ":" not in listen:
            raise ValueError(f"listen must be host:port (port 0: any free one), not {listen!r}")
        for name, value, low, high in (("lease_ms", lease_ms, LEASE_MS_MIN, LEASE_MS_MAX),
                                       ("max_concurrent_checks", max_concurrent_checks, 1, MAX_CONCURRENT_CHECKS_MAX)):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name} must be an int within [{low}, {high}], not {value!r}")
        if not start_timeout_s > 0:
            raise ValueError(f"start_timeout_s must be > 0, not {start_timeout_s!r}")
        self.group = group
        self._check = check
        self._listen = listen
        self._advertised_address = advertised_address
        self.lease_ms = lease_ms  # asked for; after start(), what the coordinator granted
        self.max_concurrent_checks = max_concurrent_checks
        self._start_timeout_s = start_timeout_s
        self._server_credentials = server_credentials
        self._admin_options = {"request_timeout_ms": request_timeout_ms, "retry_backoff_ms": retry_backoff_ms,
                               "tracer_provider": tracer_provider, "tls_ca": tls_ca, "tls_cert": tls_cert,
                               "tls_key": tls_key, "token_file": token_file}
        self._bootstrap = bootstrap
        self._state = CheckerState.NEW
        self._lifecycle = threading.Lock()  # start() and stop() one at a time
        self._counts_lock = threading.Lock()
        self._answered = dict.fromkeys(CHECK_ANSWERS, 0)
        self._stopping = threading.Event()
        self._admin: Admin | None = None
        self._server: grpc.Server | None = None
        self._renewer: threading.Thread | None = None
        self.address: str | None = None  # host:port registered, once started
        self.port: int | None = None  # the port bound, once started
        self.renewals = 0
        self.renewal_failures = 0

    # --- state ------------------------------------------------------------------------------------

    @property
    def state(self) -> CheckerState:
        return self._state

    def _set_state(self, to_state: CheckerState) -> None:
        if self._state not in _VALID_PREVIOUS_STATES[to_state]:
            raise IllegalStateError(f"TransactionChecker of group {self.group!r}: illegal transition "
                                    f"{self._state.name} -> {to_state.name}")
        self._state = to_state

    @property
    def checks_answered(self) -> dict[str, int]:
        """How many checks were answered, per answer (a copy)."""
        with self._counts_lock:
            return dict(self._answered)

    # --- starting and stopping ----------------------------------------------------------------------

    def start(self) -> TransactionChecker:
        """Serves, and registers with the group's coordinator; raises (leaving
        nothing running) when the registration fails for good or does not
        succeed within ``start_timeout_s``. A second call does nothing."""
        with self._lifecycle:
            if self._state is CheckerState.STARTED:
                return self
            if self._state is not CheckerState.NEW:
                raise ClientClosedError(f"the TransactionChecker of group {self.group!r} is {self._state.value}: "
                                        "make a new one")
            self._set_state(CheckerState.STARTING)
            try:
                self._admin = Admin(self._bootstrap, **self._admin_options)
                shutdown.closed_by_owner(self._admin)  # at exit, stop() unregisters through it, then closes it
                self._server, self.port = create_server(self._listen, _CheckService(self._answer),
                                                        self.max_concurrent_checks, self._server_credentials)
                self._server.start()
                self.address = advertised(self._listen, self.port, self._advertised_address)
                self.lease_ms = self._admin.register_transaction_checker(
                    self.group, self.address, self.lease_ms, timeout_s=self._start_timeout_s) or self.lease_ms
            except BaseException:
                self._release(grace_s=0)
                self._set_state(CheckerState.STOPPED)
                raise
            self._renewer = threading.Thread(target=self._renew_until_stopped, daemon=True,
                                             name=f"txlog-checker-renew-{self.group}")
            self._renewer.start()
            self._set_state(CheckerState.STARTED)
        shutdown.close_at_exit(self)  # left running, it unregisters at interpreter exit
        log.info("transaction checker of group %r serves at %s (lease %d ms)", self.group, self.address, self.lease_ms)
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> None:
        """Stops renewing, unregisters (best effort, within half of
        ``timeout_s``), then stops the server, giving checks in flight the
        other half to finish. Idempotent."""
        with self._lifecycle:
            if self._state is CheckerState.NEW:
                self._set_state(CheckerState.STOPPED)
                return
            if self._state is not CheckerState.STARTED:
                return
            self._set_state(CheckerState.STOPPING)
            leave_by = time.monotonic() + timeout_s / 2
            self._stopping.set()
            if self._renewer is not None:  # a renewal that ends after the unregister below undoes itself
                self._renewer.join(max(leave_by - time.monotonic(), 0))
            self._unregister_quietly(max(leave_by - time.monotonic(), 0.1))
            self._release(grace_s=timeout_s / 2)
            self._set_state(CheckerState.STOPPED)
        shutdown.closed(self)

    def _release(self, grace_s: float) -> None:
        """Stops the server (``grace_s`` for checks in flight) and closes the admin client."""
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace_s).wait(grace_s + 1)
        if self._admin is not None:
            self._admin.close()  # ends a renewal still under way
        if self._renewer is not None:
            self._renewer.join(1)

    def close_at_exit(self, timeout_s: float) -> None:
        self.stop(timeout_s)

    def __enter__(self) -> TransactionChecker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # --- the two jobs --------------------------------------------------------------------------------

    def _answer(self, request: transaction_check_pb2.CheckTransactionRequest) -> str:
        """Runs ``check`` for one CheckTransaction; the answer's name."""
        transactional_id = request.transactional_id
        try:
            verdict = self._check(transactional_id, bytes(request.prepare_metadata))
        except Exception:
            log.exception("the check of transactional id %r (attempt %d) raised: answering UNKNOWN",
                          transactional_id, request.attempt)
            verdict = "UNKNOWN"
        answer = answer_of(verdict, transactional_id)
        with self._counts_lock:
            self._answered[answer] += 1
        return answer

    def _renew_until_stopped(self) -> None:
        """Renews the registration every third of the lease; after a failure,
        again after RENEW_RETRY's back-off."""
        assert self._admin is not None and self.address is not None
        failures = 0
        delay_s = self.lease_ms / 3 / 1000
        while not self._stopping.wait(delay_s):
            try:
                granted_ms = self._admin.register_transaction_checker(self.group, self.address, self.lease_ms,
                                                                      timeout_s=self.lease_ms / 3 / 1000)
            except Exception as exc:  # noqa: BLE001 -- the thread goes on until stop(), whatever a renewal met
                if self._stopping.is_set():
                    return  # stop() closed the admin client under this renewal
                failures += 1
                self.renewal_failures += 1
                delay_s = RENEW_RETRY.delay_ms(failures) / 1000
                log.warning("transaction checker of group %r at %s: renewal failed (%s); trying again in %.1f s",
                            self.group, self.address, exc, delay_s)
                continue
            if self._stopping.is_set():  # stop() unregistered while this renewal was under way: undo it
                self._unregister_quietly(1.0)
                return
            failures = 0
            self.renewals += 1
            delay_s = (granted_ms or self.lease_ms) / 3 / 1000

    def _unregister_quietly(self, timeout_s: float) -> None:
        """Removes the registration, best effort: one not removed lapses with its lease."""
        assert self._admin is not None and self.address is not None
        try:
            self._admin.unregister_transaction_checker(self.group, self.address, timeout_s=timeout_s)
        except ClientClosedError:
            pass  # the interpreter is exiting and closed the admin client first: the lease lapses
        except ClientError as exc:
            log.warning("transaction checker of group %r at %s could not unregister (%s); its registration "
                        "lapses within %d ms", self.group, self.address, exc, self.lease_ms)
