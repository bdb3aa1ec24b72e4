"""Clients still open when the interpreter exits are closed then, quietly:
a Producer flushes what was sent (as Kafka's producer does on close), a
Consumer commits (with auto-commit) and leaves its group, every client closes
its connections. Each close waits at most EXIT_CLOSE_TIMEOUT_S, so a script
whose cluster went away still exits; what could not be delivered by then is
lost, and a warning on stderr says so.

atexit handlers run after the main thread returns and before daemon threads
are stopped, so the clients' loop threads still run while they close."""

from __future__ import annotations

import atexit
import logging
import weakref

from txlog import _loop

log = logging.getLogger(__name__)

EXIT_CLOSE_TIMEOUT_S = 10.0

_open: weakref.WeakSet = weakref.WeakSet()


def close_at_exit(client) -> None:
    """Closes ``client`` at interpreter exit unless it was closed (or collected) before."""
    _open.add(client)


def closed_by_owner(client) -> None:
    """``client`` belongs to another object that closes it itself, first (as a
    TransactionChecker unregisters through its Admin): not closed on its own at exit."""
    _open.discard(client)


@atexit.register
def _close_open_clients() -> None:
    _loop.interpreter_exiting = True
    for client in list(_open):
        try:
            client.close_at_exit(EXIT_CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 -- exiting: say what was lost, never a traceback
            log.warning("a %s left open was closed at exit, not cleanly: %s", type(client).__name__, exc)
