"""The address a server registers for others to dial: a service instance in
ZooKeeper (services/runtime/server.py), its metrics endpoint beside it, an
application's transaction checker at its coordinator (txlog/checker.py)."""

from __future__ import annotations

import socket

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def advertised(listen: str, port: int, advertised_address: str | None) -> str:
    """``advertised_address`` when given (its port, when it names none or 0,
    is the bound one), else the listen host with the bound ``port``; a
    wildcard listen host (0.0.0.0, ::, empty) is replaced by the machine's
    hostname, since nobody can dial a wildcard."""
    if advertised_address:
        host, sep, given = advertised_address.rpartition(":")
        if sep and host and given not in ("", "0"):
            return advertised_address
        return f"{host if sep else advertised_address}:{port}"
    host = listen.rpartition(":")[0]
    if host in WILDCARD_HOSTS:
        host = socket.gethostname()
    return f"{host}:{port}"


def reachable(bound: str, advertised_address: str) -> str:
    """Another endpoint of this process (its metrics) as others dial it: bound to a wildcard host, it is
    reached at the host the process advertises for gRPC (its pod's name or address), with its own port."""
    host, _, port = bound.rpartition(":")
    if host not in WILDCARD_HOSTS:
        return bound
    return f"{advertised_address.rpartition(':')[0]}:{port}"
