"""Serializers and deserializers of keys and values (Kafka's Serializer and
Deserializer): what ``Producer.send`` turns a key or value into bytes with,
and what a ``Consumer`` turns the bytes back with.

A serializer is a name or a callable ``(obj) -> bytes | None``; a
deserializer a name or a callable ``(bytes) -> obj``. Names:

* ``"bytes"``: bytes-like as they are, str as UTF-8 (what a client without a
  serializer does); reading, the bytes as they are;
* ``"str"``: str as UTF-8; reading, UTF-8 text;
* ``"json"``: any JSON value (compact, UTF-8); reading, the parsed value.

None (a key-less record, a tombstone) is never passed to either: it stays None.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from txlog.errors import ClientError
from txlog.protocol.errors import ErrorCode
from txlog.structs import to_bytes

Serializer = Callable[[object], bytes | None]
Deserializer = Callable[[bytes], object]


def _str_bytes(obj) -> bytes:
    if not isinstance(obj, str):
        raise TypeError(f"the str serializer takes str, not {type(obj).__name__}")
    return obj.encode()


SERIALIZERS: dict[str, Serializer] = {
    "bytes": lambda obj: to_bytes(obj, "value"),
    "str": _str_bytes,
    "json": lambda obj: json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(),
}
DESERIALIZERS: dict[str, Deserializer] = {
    "bytes": lambda data: data,
    "str": lambda data: data.decode(),
    "json": lambda data: json.loads(data),
}


def serializer(spec: str | Serializer | None, what: str) -> Serializer | None:
    return _resolved(spec, SERIALIZERS, what)


def deserializer(spec: str | Deserializer | None, what: str) -> Deserializer | None:
    return _resolved(spec, DESERIALIZERS, what)


def _resolved(spec, known: dict, what: str):
    if spec is None or callable(spec):
        return spec
    if spec not in known:
        raise ValueError(f"{what} must be a callable or one of {', '.join(known)}, not {spec!r}")
    return known[spec]


def serialized(serialize: Serializer | None, obj, what: str):
    """``obj`` as ``send`` takes it; a serializer's failure raises
    SerializationError at once (nothing was queued)."""
    if serialize is None or obj is None:
        return obj
    try:
        data = serialize(obj)
    except Exception as exc:  # noqa: BLE001 -- the application's serializer: whatever it raises
        raise SerializationError(f"the {what} serializer failed on {type(obj).__name__}: {exc}") from exc
    if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
        raise SerializationError(f"the {what} serializer returned {type(data).__name__}, not bytes")
    return data


class SerializationError(ClientError, TypeError):
    """A key or value its serializer could not turn into bytes; nothing was sent."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.Value("INVALID_REQUEST"), message)


class RecordDeserializationError(ClientError):
    """A record its deserializer could not read, at ``partition`` and ``offset``.
    The consumer's position in that partition stays at the record: seek past
    it (``seek(partition, offset + 1)``) to go on."""

    def __init__(self, partition, offset: int, message: str):
        super().__init__(ErrorCode.Value("INVALID_REQUEST"), message)
        self.partition = partition
        self.offset = offset
