"""Protobuf's wire format, for messages assembled from bytes already encoded.

A protobuf message is the concatenation of its encoded fields, in any order,
and a repeated message field is one length-delimited field per element. So a
message can be built by joining encoded pieces, each field as its tag, its
length (a varint) and its bytes: how the producer sends records it encoded in
send() (services/client), without a message per record on either side.
"""

from __future__ import annotations

VARINT, LENGTH_DELIMITED = 0, 2


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS_COUNT = 1 << 14  # the lengths of keys, header names and most values: one lookup
_SMALL_VARINTS = tuple(_varint_bytes(n) for n in range(_SMALL_VARINTS_COUNT))


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    return _SMALL_VARINTS[value] if value < _SMALL_VARINTS_COUNT else _varint_bytes(value)


def field_tag(message_class, field_name: str) -> bytes:
    """The tag of a field of ``message_class``, from its descriptor (a renumbered field needs no edit here)."""
    field = message_class.DESCRIPTOR.fields_by_name[field_name]
    wire_type = LENGTH_DELIMITED if field.type in (field.TYPE_BYTES, field.TYPE_STRING, field.TYPE_MESSAGE) else VARINT
    return varint(field.number << 3 | wire_type)
