"""ZooKeeper access for the services: one kazoo client per process, awaited from
asyncio, and the registry of live services.

Layout under the root (default ``/txlog``)::

    services/<kind>/<node_id>    ephemeral, JSON {"address", "pid", "node_id"}
    latest_producer_id_block     producer_id_svc's block node

Authentication
--------------
With a digest identity (``--zookeeper-auth-file``, a file holding
``user:password``), the client authenticates with it and every znode it
creates gets two ACLs: all rights for that identity, read for anyone. So
only the services (which share the identity) can change txlog's metadata;
operators and tools can still read it. ZooKeeper ACLs are per znode: nodes
made before the identity was set keep theirs.

Error Handling
--------------
kazoo reconnects by itself (unlimited connection retries). While the session is
suspended or lost, calls fail at once with ZOOKEEPER_UNAVAILABLE (retriable)
instead of waiting, so clients back off and retry; ephemeral registrations are
written again when a new session is established.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback
from kazoo.retry import KazooRetry
from kazoo.security import ACL, ANYONE_ID_UNSAFE, Permissions, make_digest_acl

from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError

log = logging.getLogger(__name__)

K = TypeVar("K")
R = TypeVar("R")

# Failures that mean "ZooKeeper is out of reach right now", as opposed to answers.
CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)
# The longest anything waits for ZooKeeper's answer to one request. kazoo drops
# the requests still queued when a session expires (KazooClient._reset replaces
# its queue; no one is told), so a wait without a deadline can last for ever,
# holding what the waiter holds: a thread of the event loop's default executor
# (a pool of a few), a lock every other reader of the same view then waits on.
REPLY_TIMEOUT_S = 15.0


def unavailable(detail: str) -> TxlogError:
    return TxlogError(ErrorCode.Value("ZOOKEEPER_UNAVAILABLE"), f"ZooKeeper is unreachable ({detail}); retry shortly")


def digest_identity(auth_file: str) -> str:
    """The ``user:password`` in ``auth_file``; ValueError naming the file when it is not one."""
    try:
        with open(auth_file) as file:
            identity = file.read().strip()
    except OSError as exc:
        raise ValueError(f"zookeeper_auth_file {auth_file!r} cannot be read: {exc.strerror}") from None
    user, sep, password = identity.partition(":")
    if not sep or not user or not password or "\n" in identity:
        raise ValueError(f"zookeeper_auth_file {auth_file!r} must hold one line user:password")
    return identity


def connect(hosts: str, session_timeout_s: float = 10.0, start_timeout_s: float = 30.0, identity: str | None = None) -> KazooClient:
    """A started client that reconnects forever after a loss; with a digest
    ``identity`` (user:password), authenticated, creating znodes that only it
    may change."""
    auth = {}
    if identity:
        user, _, password = identity.partition(":")
        auth = {"auth_data": [("digest", identity)],
                "default_acl": [make_digest_acl(user, password, all=True), ACL(Permissions.READ, ANYONE_ID_UNSAFE)]}
    client = KazooClient(
        hosts=hosts,
        timeout=session_timeout_s,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
        command_retry=KazooRetry(max_tries=0),
        **auth,
    )
    client.start(timeout=start_timeout_s)
    return client


# Until this time.monotonic() deadline, a call waits for a lost or suspended
# session to come back before it is made (see ``patient_until``).
_patient_until: contextvars.ContextVar[float] = contextvars.ContextVar("zk_patient_until", default=0.0)


@contextlib.contextmanager
def patient_for(seconds: float):
    """Calls made in this context (and in tasks it starts, until the deadline
    passes) wait up to ``seconds`` from now for a session kazoo is
    re-establishing, instead of failing at once with ZOOKEEPER_UNAVAILABLE.
    For a service's start-up: a session lost while it builds (a stalled
    ZooKeeper, a loaded machine) must not make the process exit, while a
    request's call fails fast for its caller to retry."""
    token = _patient_until.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _patient_until.reset(token)


async def _until_connected(client: KazooClient) -> None:
    deadline = _patient_until.get()
    while client.state != KazooState.CONNECTED and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def call(client: KazooClient, method: str, *args, **kwargs):
    """Awaits ``client.<method>_async(*args)``; connection problems become
    ZOOKEEPER_UNAVAILABLE, other kazoo exceptions (NoNode, BadVersion...) pass through."""
    return await _awaited(client, client, method, *args, **kwargs)


async def commit(client: KazooClient, transaction) -> list:
    """Awaits a kazoo transaction's commit: one result per operation, an
    exception instance for each that failed (all fail together)."""
    return await _awaited(client, transaction, "commit")


async def _awaited(client: KazooClient, target, method: str, *args, **kwargs):
    await _until_connected(client)
    if client.state != KazooState.CONNECTED:
        raise unavailable(f"session {client.state.lower()}")
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def done(result):
        def settle():
            if future.done():
                return
            try:
                future.set_result(result.get_nowait())
            except BaseException as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)

        loop.call_soon_threadsafe(settle)

    try:
        getattr(target, method + "_async")(*args, **kwargs).rawlink(done)
        return await asyncio.wait_for(future, REPLY_TIMEOUT_S)
    except CONNECTION_ERRORS as exc:
        raise unavailable(type(exc).__name__) from exc
    except TimeoutError:
        raise unavailable(f"no answer to {method} in {REPLY_TIMEOUT_S:.0f} s") from None


def reply(async_result):
    """The answer to a kazoo ``*_async`` request, for a thread that blocks on
    it: REPLY_TIMEOUT_S at most, then KazooTimeoutError (one of CONNECTION_ERRORS)."""
    return async_result.get(timeout=REPLY_TIMEOUT_S)


async def gather_in_chunks(read: Callable[[K], Awaitable[R]], keys: Sequence[K], chunk_size: int, *,
                           each_chunk: Callable[[Sequence[K], list[R]], Awaitable[None]] | None = None) -> list[R]:
    """``await read(key)`` for every key of ``keys``, many at once: the result
    of each, in the order of ``keys``.

    Bound: ``keys`` is cut into chunks of ``chunk_size`` (at least 1); the reads
    of a chunk run concurrently (one asyncio.gather) and the next chunk starts
    only once every read of the one before has ended, so at most ``chunk_size``
    reads are in flight at once (fewer while a chunk's slowest is). With
    ``each_chunk``, ``await each_chunk(chunk_keys, chunk_results)`` runs after
    each chunk's reads, before the next chunk starts.

    Errors: ``read`` itself turns answers that are not failures into results
    (NoNodeError into None, say). When a read raises, the first exception of
    its chunk propagates at once, as from asyncio.gather: no later chunk is
    started and ``each_chunk`` is not called for that chunk (it was for every
    chunk before); the chunk's other reads are not cancelled but run to their
    end with nobody waiting for them, so they may still be in flight when the
    caller goes on. An exception from ``each_chunk`` propagates too, and no
    later chunk is read."""
    found: list[R] = []
    for start in range(0, len(keys), chunk_size):
        chunk = keys[start:start + chunk_size]
        results = await asyncio.gather(*(read(key) for key in chunk))
        if each_chunk is not None:
            await each_chunk(chunk, results)
        found += results
    return found


DEREGISTER_TIMEOUT_S = 2.0


class ServiceRegistry:
    """Registers this instance as an ephemeral node and lists live instances."""

    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.root = root
        self._registered: dict[str, bytes] = {}
        self._live: dict[str, LiveInstances] = {}
        client.add_listener(self._on_state)

    def path(self, kind: str, node_id: int | None = None) -> str:
        base = posixpath.join(self.root, "services", kind)
        return base if node_id is None else posixpath.join(base, str(node_id))

    def register(self, kind: str, node_id: int, address: str, details: dict | None = None) -> None:
        """``details`` (a rack, say) are stored beside the address for live_details."""
        path = self.path(kind, node_id)
        data = json.dumps({**(details or {}), "address": address, "pid": os.getpid(), "node_id": node_id}).encode()
        self._registered[path] = data
        self._write(path, data)

    def deregister_all(self, timeout_s: float = DEREGISTER_TIMEOUT_S) -> None:
        """Deletes this instance's registrations, waiting at most ``timeout_s``
        for each. With ZooKeeper away nothing is waited for: kazoo would hold a
        delete until the connection came back, which may be never, and a
        shutdown must end; the ephemeral nodes go with the session anyway."""
        paths = list(self._registered)
        self._registered.clear()
        if self.client.state != KazooState.CONNECTED:
            return
        for path in paths:
            try:
                self.client.delete_async(path).get(timeout=timeout_s)
            except (NoNodeError, self.client.handler.timeout_exception, *CONNECTION_ERRORS):
                pass

    def live(self, kind: str) -> dict[int, str]:
        """node_id -> address of the live instances of a kind."""
        return {node_id: details["address"] for node_id, details in self.live_details(kind).items()}

    def live_details(self, kind: str) -> dict[int, dict]:
        """node_id -> what each live instance of a kind registered (address, details)."""
        view = self._live.get(kind)
        if view is None:
            view = self._live.setdefault(kind, LiveInstances(self.client, self.path(kind)))
        return view.read()

    def _write(self, path: str, data: bytes) -> None:
        self.client.ensure_path(posixpath.dirname(path))
        try:
            self.client.create(path, data, ephemeral=True)
        except NodeExistsError:
            # Our previous session's node may linger until that session expires;
            # replacing it is safe because node ids are unique per kind.
            self.client.delete(path)
            self.client.create(path, data, ephemeral=True)
        log.info("registered in ZooKeeper", extra=fields(path=path))

    def _on_state(self, state: str) -> None:
        # Ephemeral nodes vanish with a lost session; write them again once a new
        # session exists. The listener runs on kazoo's thread, which must not block.
        if state != KazooState.CONNECTED:  # watches may be gone with the session: read again once back
            for view in list(self._live.values()):
                view.changed()
        if state == KazooState.CONNECTED and self._registered:
            self.client.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        for path, data in list(self._registered.items()):
            try:
                if self.client.exists(path) is None:
                    self._write(path, data)
            except CONNECTION_ERRORS:
                return


class LiveInstances:
    """The live instances of one kind, read from ZooKeeper again only after a
    watch said something changed under them (an instance came, went or
    registered again), instead of 1 + n reads on every call.

    Invariant: while ``stale`` is false, a watch is set on the folder's
    children and on every child's data as the cache holds them, so any change
    fires one and sets ``stale`` before the next read. ``stale`` is cleared
    before a read sets its watches, so a change during the read is not lost:
    it makes the next call read again. A lost connection makes it stale too
    (ServiceRegistry._on_state): watches do not outlive a session.
    """

    def __init__(self, client: KazooClient, base: str):
        self.client = client
        self.base = base
        self.stale = True
        self.instances: dict[int, dict] = {}
        self._lock = threading.Lock()

    def changed(self, _event=None) -> None:
        self.stale = True

    def read(self) -> dict[int, dict]:
        with self._lock:
            if not self.stale and self.client.state == KazooState.CONNECTED:
                return dict(self.instances)
            self.stale = False
            try:
                self.instances = self._read()
            except BaseException:
                self.stale = True
                raise
            return dict(self.instances)

    def _read(self) -> dict[int, dict]:
        try:
            try:
                children = reply(self.client.get_children_async(self.base, watch=self.changed))
            except NoNodeError:
                if reply(self.client.exists_async(self.base, watch=self.changed)) is not None:  # created in between
                    self.stale = True
                return {}
            instances = {}
            for child in children:
                try:
                    data, _ = reply(self.client.get_async(posixpath.join(self.base, child), watch=self.changed))
                except NoNodeError:
                    continue
                info = json.loads(data)
                instances[int(info["node_id"])] = info
            return instances
        except CONNECTION_ERRORS as exc:
            raise unavailable(type(exc).__name__) from exc


class WatchedNode:
    """One znode's data and stat (None while it does not exist), read from
    ZooKeeper again only after a watch said it changed, or after the
    connection dropped (watches do not outlive a session). Same invariant as
    LiveInstances: ``stale`` is cleared before the read that sets the watch."""

    def __init__(self, client: KazooClient, path: str):
        self.client = client
        self.path = path
        self.stale = True
        self.value = None
        self._reading: asyncio.Future | None = None  # a read under way: callers meanwhile wait for it, not the old value
        add_state_listener(client, lambda connected: None if connected else self.changed())

    def changed(self, _event=None) -> None:
        self.stale = True

    async def get(self, *, fresh: bool = False):
        """(data, stat) or None; ``fresh``: read it from ZooKeeper whatever the cache says."""
        if self._reading is not None and self._reading.done():  # its callers went before it ended
            self._reading = None
        if self._reading is None and not fresh and not self.stale and self.client.state == KazooState.CONNECTED:
            return self.value
        if self._reading is None or fresh:
            self._reading = asyncio.ensure_future(self._read())
        reading = self._reading
        try:
            return await asyncio.shield(reading)
        finally:
            if reading.done() and self._reading is reading:
                self._reading = None

    async def _read(self):
        self.stale = False
        try:
            try:
                self.value = await call(self.client, "get", self.path, watch=self.changed)
            except NoNodeError:
                self.value = None
                if await call(self.client, "exists", self.path, watch=self.changed) is not None:  # created in between
                    self.stale = True
        except BaseException:
            self.stale = True
            raise
        return self.value


class ReloadOnChange:
    """Runs ``reload`` (a coroutine) on the event loop at each change of the
    data of ``path`` (a ZooKeeper data watch), one at a time: a change while
    one runs runs one more after it, since it may have read before the change.
    A failed reload is logged; the next change tries again."""

    def __init__(self, client: KazooClient, path: str, reload: Callable[[], Awaitable[None]], what: str):
        self.client = client
        self.path = path
        self.reload = reload
        self.what = what
        self._running: asyncio.Task | None = None
        self._again = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await call(self.client, "ensure_path", self.path)
        self.client.DataWatch(self.path, lambda *_: loop.call_soon_threadsafe(self.changed))

    def changed(self) -> None:
        """A change (or a late or repeated notice of one): a reload soon."""
        if self._running is not None and not self._running.done():
            self._again = True
            return
        self._running = asyncio.ensure_future(self._reload_until_settled())

    async def _reload_until_settled(self) -> None:
        while True:
            self._again = False
            try:
                await self.reload()
            except Exception:
                log.exception("reloading %s failed; the next change tries again", self.what)
            if not self._again:
                return


def add_state_listener(client: KazooClient, on_change: Callable[[bool], None]) -> None:
    """Calls ``on_change(connected)`` (from kazoo's thread) on every session change."""
    client.add_listener(lambda state: on_change(state == KazooState.CONNECTED))


WATCHES_DELIVERED_TIMEOUT_S = 10.0


async def watches_delivered(client: KazooClient, timeout_s: float = WATCHES_DELIVERED_TIMEOUT_S) -> None:
    """Returns once kazoo has called every watch function whose event it
    received before this call. kazoo runs watch functions in order on one
    thread, and ZooKeeper sends a session a change's event before any answer
    it gives that session after the change: so after an answer, this
    returns only once every watch that fired before that answer has run.
    ZOOKEEPER_UNAVAILABLE after ``timeout_s`` (that thread stuck, or stopped)."""
    loop = asyncio.get_running_loop()
    delivered = loop.create_future()

    def settle() -> None:
        if not delivered.done():
            delivered.set_result(None)

    def delivered_now() -> None:  # kazoo's thread
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed meanwhile: nobody waits
            pass

    client.handler.dispatch_callback(Callback("watch", delivered_now, ()))
    try:
        await asyncio.wait_for(delivered, timeout_s)
    except TimeoutError:
        raise unavailable(f"watch functions not run within {timeout_s} s") from None
