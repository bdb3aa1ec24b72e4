"""How a call names its client: the gRPC metadata a client sends so that
servers can tell who it is beyond its principal.

``txlog-client-id``: the client's id (Kafka's client.id), what client quotas
are set on. ``txlog-peer``: sent by the services on their calls to one
another; a server counts such a call as the cluster's own (admission's
reserved share, no client quota) when its caller may do anything (a super
user), or when the server has no authorizer (then any caller could be
anyone)."""

from __future__ import annotations

from txlog.errors import ConfigError

CLIENT_ID_METADATA = "txlog-client-id"
CLIENT_ID_LENGTH_MAX = 255
PEER_METADATA = "txlog-peer"


def checked_client_id(client_id: str) -> str:
    """``client_id`` if a server can take it (printable ASCII, at most 255 characters); else ConfigError."""
    if not isinstance(client_id, str) or len(client_id) > CLIENT_ID_LENGTH_MAX or not all(
            " " <= c <= "~" for c in client_id):
        raise ConfigError(f"client_id must be printable ASCII of at most {CLIENT_ID_LENGTH_MAX} characters, "
                          f"got {client_id!r}")
    return client_id


def metadata_value(context, key: str) -> str | None:
    """The value of ``key`` in a server call's invocation metadata, if sent."""
    return next((value for name, value in context.invocation_metadata() or () if name == key), None)
