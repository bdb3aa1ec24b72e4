"""Where this instance dials the others: at their registered addresses, unless
a routes file says otherwise.

The file (``--peer-routes-file``) maps registered addresses to the addresses
to dial instead, as JSON: ``{"127.0.0.1:7001": "127.0.0.1:9123", ...}``. A test
harness puts its own proxy on every path between two instances this way, one
per direction, so that it can cut an instance off from its peers while clients
and ZooKeeper still reach it (``txlog chaos run --faults partition_peers``);
each instance's file names its own proxies, so a cut is symmetric. Clients
never read it: they dial the registered addresses.

The file is read again when it changes (looked at no more than once per
:data:`CHECK_INTERVAL_S`), so a harness may write it after the cluster started.
A file that cannot be read or parsed keeps the routes last read, logged once
per change; a file removed removes its routes (every instance dialled at its
registered address again).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

from services.runtime import config as config_mod
from services.runtime.logs import fields

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0

PEER_ROUTES_SETTING = config_mod.Setting(
    "peer_routes_file", "",
    "a JSON file mapping other instances' registered addresses (host:port) to the addresses this instance dials "
    "them at instead, read again when it changes: a test harness's own proxies on the paths between instances "
    "(txlog chaos's partition_peers); empty: every instance is dialled at its registered address")


def parse_routes(text: str) -> dict[str, str]:
    """The routes a file's text gives; ValueError saying what is wrong."""
    routes = json.loads(text)
    if not isinstance(routes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in routes.items()):
        raise ValueError("expected a JSON object of \"host:port\": \"host:port\" strings")
    bad = sorted(a for a in [*routes, *routes.values()] if not a.rpartition(":")[2].isdigit())
    if bad:
        raise ValueError(f"not host:port: {bad[:3]}")
    return routes


class PeerRoutes:
    """The dialled address of each registered one, from ``path`` (empty: none)."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self._clock = clock
        self._routes: dict[str, str] = {}
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read
        self._checked_at = float("-inf")

    def dialled(self, address: str) -> str:
        if self.path:
            self._reload()
        return self._routes.get(address, address)

    def _reload(self) -> None:
        now = self._clock()
        if now - self._checked_at < CHECK_INTERVAL_S:
            return
        self._checked_at = now
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            stat = None
        except OSError as exc:  # kept: the routes last read
            log.warning("peer routes file not read", extra=fields(path=self.path, error=str(exc)))
            return
        seen = (stat.st_mtime_ns, stat.st_size) if stat is not None else None
        if seen == self._seen:
            return
        self._seen = seen
        if stat is None:
            self._routes = {}
            return
        try:
            with open(self.path, encoding="utf-8") as file:
                self._routes = parse_routes(file.read())
        except (OSError, ValueError) as exc:  # kept: the routes last read
            log.warning("peer routes file not read", extra=fields(path=self.path, error=str(exc)))
            return
        log.info("peer routes read", extra=fields(path=self.path, routes=len(self._routes)))
