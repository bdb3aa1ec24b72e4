"""Protobuf's wire format, for messages assembled from bytes already encoded.

A protobuf message is the concatenation of its encoded fields, in any order,
and a repeated message field is one length-delimited field per element. So a
message can be built by joining encoded pieces, each field as its tag, its
length (a varint) and its bytes: how the producer sends records it encoded in
send() (the SDK, txlog/), without a message per record on either side.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

VARINT, LENGTH_DELIMITED = 0, 2
_VARINT_TYPES = frozenset({FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
                           FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM})


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
    """``value`` (0 .. 2^64 - 1) as a protobuf varint; a negative int64 is
    encoded by its two's complement (``value & (2**64 - 1)``) by the caller."""
    if 0 <= value < _SMALL_VARINTS_COUNT:
        return _SMALL_VARINTS[value]
    if not 0 <= value < 1 << 64:
        raise ValueError(f"a varint holds 0 .. 2^64 - 1, not {value}")
    return _varint_bytes(value)


def field_tag(message_class, field_name: str) -> bytes:
    """The tag of a field of ``message_class``, from its descriptor (a renumbered
    field needs no edit here): length-delimited or varint fields only."""
    field = message_class.DESCRIPTOR.fields_by_name[field_name]
    if field.type in (field.TYPE_BYTES, field.TYPE_STRING, field.TYPE_MESSAGE):
        wire_type = LENGTH_DELIMITED
    elif field.type in _VARINT_TYPES:
        wire_type = VARINT
    else:
        raise ValueError(f"{message_class.__name__}.{field_name} is not a varint or length-delimited field")
    return varint(field.number << 3 | wire_type)
