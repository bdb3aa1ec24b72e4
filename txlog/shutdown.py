"""Clients still open when the interpreter exits are closed then, quietly:
a Producer flushes what was sent (as Kafka's producer does on close), a
Consumer commits (with auto-commit) and leaves its group, every client closes
its connections. Each close waits at most EXIT_CLOSE_TIMEOUT_S, so a script
whose cluster went away still exits; what could not be delivered by then is
lost, and a warning on stderr says so.

atexit handlers run after the main thread returns and before daemon threads
are stopped, so the clients' loop threads still run while they close.

The registry holds each open client strongly, until its close() has stopped
its loop. A client a script dropped without closing it (or whose close()
raised before the loop stopped) still has a loop thread running its tasks, and
asyncio holds tasks only weakly: with the client collected, a task waiting on
an event of its own (the Sender's loop, idle after its records failed) is a
cycle nothing else reaches, and the garbage collector destroys it pending
("Task was destroyed but it is pending!", its coroutine's cleanup run outside
the loop). Held here, it is closed at exit like any client left open."""

from __future__ import annotations

import atexit
import logging

from txlog import _loop

log = logging.getLogger(__name__)

EXIT_CLOSE_TIMEOUT_S = 10.0

_open: set = set()  # open clients, strongly held (see the module docstring); set.add/discard are atomic


def close_at_exit(client) -> None:
    """Closes ``client`` at interpreter exit unless it was closed before."""
    _open.add(client)


def closed(client) -> None:
    """``client`` stopped its loop: nothing is left for the exit to close (and
    the registry no longer keeps it alive)."""
    _open.discard(client)


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
