"""Hypothesis strategies derived from protobuf message descriptors, for hostile-input tests.

:class:`MessageStrategies` builds, for any message type, a strategy of messages
whose fields hold, by the field's type, a typical value (3 times in 4) or a
hostile one: integers at their boundaries (negative, zero, the type's minimum
and maximum) and anywhere in range; strings empty, huge, unicode, control
characters, path-like and near the length limits of names; bytes empty, huge
or random; enums unknown numbers; repeated fields empty or long (a thousand
copies of one element and more: "deep" header lists); nested messages
recursively, down to a depth limit. Mostly typical fields let a request get
past the first check it meets, so the later ones are reached too.

Overrides replace the strategy of a field (by full or bare name) or of a whole
message type (by full name), so a test can aim a field at the names it cares
about while every other field stays generic, and a field added to a proto later
is fuzzed without a change here.

What the Python protobuf API cannot build (invalid UTF-8 in a string field, a
truncated message, unknown fields, groups nested past the parser's recursion
limit) is produced as wire bytes by :func:`raw_payloads`.

Size: huge values appear only outside long lists, and long lists hold only
"small" elements (no huge values, no nested long lists), so one request stays
within a few MiB, far below the servers' gRPC message limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT32_MAX, UINT64_MAX = 2**32 - 1, 2**64 - 1
HUGE_CHARS = 100_000
SHORT_LIST_SIZE_MAX = 3
LONG_LIST_LENGTHS = (1000, 1001, 10_001)  # 1000 headers per record is the limit; 10000 partitions per request
DEPTH_MAX_DEFAULT = 5
NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

# Characters and strings that break naive handling: control characters, line and
# paragraph separators, a BOM, right-to-left override, path separators and
# components, strings at and past the name length limits (249 topic, 255 ids).
CONTROL_CHARS = "".join(map(chr, range(32))) + "\x7f\x85\u2028\u2029\ufeff\u202e"
HOSTILE_STRINGS = (
    "", " ", "\t", "\n", "\x00", "a b", "a/b", "/", "\\", ".", "..", "-", "_", "__", ":", "*", "%s", "{}", "'\"",
    "é", "名前", "😀", "\u202e", "\ufeff", "a\n", "a\x00b", "x" * 249, "x" * 250, "x" * 255, "x" * 256,
)
HUGE_STRINGS = ("x" * HUGE_CHARS, "é" * (HUGE_CHARS // 2), "😀" * (HUGE_CHARS // 4))
HUGE_BYTES = (b"\x00" * HUGE_CHARS, b"\xff" * HUGE_CHARS)
TYPICAL_PER_HOSTILE = 3


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, each as often as its weight says (the first is
    what failing examples shrink towards)."""
    indexes = [i for i, (weight, _) in enumerate(choices) for _ in range(weight)]
    return st.sampled_from(indexes).flatmap(lambda i: choices[i][1])


def mostly(typical: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    return weighted((TYPICAL_PER_HOSTILE, typical), (1, hostile))


def edge_integers(low: int, high: int, extra: tuple[int, ...] = ()) -> st.SearchStrategy[int]:
    """Integers in [low, high], boundary values first: the type's limits, around
    zero, the epoch (int16) and int32 limits, 2^53 (the largest exact double)."""
    candidates = (low, low + 1, -2, -1, 0, 1, 2, 2**15 - 1, 2**15, 2**31 - 1, 2**31, 2**53, high - 1, high, *extra)
    edges = sorted({v for v in candidates if low <= v <= high})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def hostile_text(*, small: bool = False) -> st.SearchStrategy[str]:
    parts = [
        st.sampled_from(HOSTILE_STRINGS),
        st.text(max_size=40),
        st.text(alphabet=CONTROL_CHARS, min_size=1, max_size=8),
    ]
    if not small:
        parts.append(st.sampled_from(HUGE_STRINGS))
    return st.one_of(*parts)


def hostile_bytes(*, small: bool = False) -> st.SearchStrategy[bytes]:
    parts = [st.sampled_from((b"", b"\x00", b"\xff\xfe")), st.binary(max_size=64)]
    if not small:
        parts.append(st.sampled_from(HUGE_BYTES))
    return st.one_of(*parts)


_INTEGER_RANGES = {
    FieldDescriptor.TYPE_INT32: (INT32_MIN, INT32_MAX),
    FieldDescriptor.TYPE_SINT32: (INT32_MIN, INT32_MAX),
    FieldDescriptor.TYPE_SFIXED32: (INT32_MIN, INT32_MAX),
    FieldDescriptor.TYPE_INT64: (INT64_MIN, INT64_MAX),
    FieldDescriptor.TYPE_SINT64: (INT64_MIN, INT64_MAX),
    FieldDescriptor.TYPE_SFIXED64: (INT64_MIN, INT64_MAX),
    FieldDescriptor.TYPE_UINT32: (0, UINT32_MAX),
    FieldDescriptor.TYPE_FIXED32: (0, UINT32_MAX),
    FieldDescriptor.TYPE_UINT64: (0, UINT64_MAX),
    FieldDescriptor.TYPE_FIXED64: (0, UINT64_MAX),
}

# An override: a strategy, or a function of "small" (inside a long list) giving one.
Override = st.SearchStrategy | Callable[[bool], st.SearchStrategy]


def message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


class MessageStrategies:
    """Strategies of hostile messages for any descriptor. ``overrides`` maps a
    field's full name ("txlog.v1.FetchRequest.max_wait_ms"), a field's bare name
    ("topic": every field so named) or a message type's full name to an
    :data:`Override`; the most specific wins. An override gives one element of a
    repeated field (the list around it stays generic)."""

    def __init__(
        self,
        overrides: dict[str, Override] | None = None,
        *,
        long_lists: dict[str, tuple[int, ...]] | None = None,
        depth_max: int = DEPTH_MAX_DEFAULT,
    ):
        self.overrides = dict(overrides or {})
        self.long_lists = dict(long_lists or {})  # a repeated field's full name -> its long lengths
        self.depth_max = depth_max
        self._cache: dict[tuple[str, bool, int], st.SearchStrategy] = {}

    def _override(self, key: str, small: bool) -> st.SearchStrategy | None:
        found = self.overrides.get(key)
        if found is None or isinstance(found, st.SearchStrategy):
            return found
        return found(small)

    def message(self, descriptor: Descriptor, *, small: bool = False, depth: int = 0) -> st.SearchStrategy[Message]:
        key = (descriptor.full_name, small, depth)
        if key not in self._cache:
            self._cache[key] = self._build_message(descriptor, small, depth)
        return self._cache[key]

    def _build_message(self, descriptor: Descriptor, small: bool, depth: int) -> st.SearchStrategy[Message]:
        cls = message_class(descriptor)
        overridden = self._override(descriptor.full_name, small)
        if overridden is not None:
            return overridden
        if depth >= self.depth_max:
            return st.just(cls())
        fields = {f.name: self.field(f, small=small, depth=depth) for f in descriptor.fields}

        def build(values: dict) -> Message:
            message = cls()
            for field in descriptor.fields:
                assign(message, field, values[field.name])
            return message

        return st.fixed_dictionaries(fields).map(build)

    def element(self, field: FieldDescriptor, *, small: bool, depth: int) -> st.SearchStrategy:
        """One value of the field (one element, when it is repeated)."""
        for key in (field.full_name, field.name):
            overridden = self._override(key, small)
            if overridden is not None:
                return overridden
        kind = field.type
        if kind in _INTEGER_RANGES:
            return mostly(st.integers(0, 5), edge_integers(*_INTEGER_RANGES[kind]))
        if kind == FieldDescriptor.TYPE_BOOL:
            return st.booleans()
        if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return st.floats(allow_nan=True, allow_infinity=True, width=64 if kind == FieldDescriptor.TYPE_DOUBLE else 32)
        if kind == FieldDescriptor.TYPE_STRING:
            return mostly(st.text(alphabet=NAME_CHARS, min_size=1, max_size=12), hostile_text(small=small))
        if kind == FieldDescriptor.TYPE_BYTES:
            return mostly(st.binary(max_size=16), hostile_bytes(small=small))
        if kind == FieldDescriptor.TYPE_ENUM:
            known = [v.number for v in field.enum_type.values]
            return mostly(st.sampled_from(known), edge_integers(INT32_MIN, INT32_MAX, extra=(max(known) + 1,)))
        if kind in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
            return self.message(field.message_type, small=small, depth=depth + 1)
        raise TypeError(f"no strategy for field {field.full_name} of type {kind}")

    def field(self, field: FieldDescriptor, *, small: bool = False, depth: int = 0) -> st.SearchStrategy:
        """What to assign to the field: a list (repeated), a dict (map), None
        (a field with presence left unset) or one value."""
        if _is_map(field):
            entry = field.message_type
            keys = self.element(entry.fields_by_name["key"], small=True, depth=depth + 1)
            values = self.element(entry.fields_by_name["value"], small=small, depth=depth + 1)
            return st.dictionaries(keys, values, max_size=1 if small else SHORT_LIST_SIZE_MAX)
        if field.is_repeated:
            element = self.element(field, small=small, depth=depth)
            if small:
                return st.lists(element, max_size=1)
            lengths = self.long_lists.get(field.full_name, LONG_LIST_LENGTHS)
            long = st.tuples(self.element(field, small=True, depth=depth), st.sampled_from(lengths)).map(
                lambda pair: [pair[0]] * pair[1]
            )
            return weighted((4, st.lists(element, min_size=1, max_size=SHORT_LIST_SIZE_MAX)), (1, st.just([])), (1, long))
        value = self.element(field, small=small, depth=depth)
        if field.has_presence:
            return mostly(value, st.none())
        return value


def assign(message: Message, field: FieldDescriptor, value) -> None:
    if value is None:
        return
    target = getattr(message, field.name)
    if _is_map(field):
        value_field = field.message_type.fields_by_name["value"]
        for key, item in value.items():
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                target[key].CopyFrom(item)
            else:
                target[key] = item
    elif field.is_repeated:
        target.extend(value)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        target.CopyFrom(value)
    else:
        setattr(message, field.name, value)


# --- wire bytes ------------------------------------------------------------------------

WIRE_VARINT, WIRE_LEN, WIRE_START_GROUP, WIRE_END_GROUP, WIRE_I32, WIRE_I64 = 0, 2, 3, 4, 5, 1
UNKNOWN_FIELD_NUMBER = 5000  # no txlog message has a field this high
INVALID_UTF8 = (
    b"\xff",  # never valid
    b"\xc0\x80",  # overlong NUL
    b"\xed\xa0\x80",  # a surrogate (U+D800)
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"ok\x80",  # a stray continuation byte
    b"\xe2\x82",  # truncated sequence
)
NESTED_GROUP_DEPTHS = (10, 99, 100, 101, 1000, 100_000)  # the Python protobuf parser's recursion limit is 100


def varint(value: int) -> bytes:
    value &= UINT64_MAX  # negative int32/int64 travel as 10-byte two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, payload: bytes) -> bytes:
    return tag(number, WIRE_LEN) + varint(len(payload)) + payload


def string_field_paths(descriptor: Descriptor, depth_max: int = 4) -> list[tuple[int, ...]]:
    """Field-number paths from the message down to each string field (through
    nested, repeated and map fields), so invalid UTF-8 can be put anywhere."""
    paths: list[tuple[int, ...]] = []

    def walk(desc: Descriptor, prefix: tuple[int, ...]) -> None:
        if len(prefix) >= depth_max:
            return
        for field in desc.fields:
            if field.type == FieldDescriptor.TYPE_STRING:
                paths.append((*prefix, field.number))
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                walk(field.message_type, (*prefix, field.number))

    walk(descriptor, ())
    return paths


def nest(path: tuple[int, ...], payload: bytes) -> bytes:
    """``payload`` as the value of the last field of ``path``, wrapped in the
    length-delimited encodings of the fields before it."""
    encoded = length_delimited(path[-1], payload)
    for number in reversed(path[:-1]):
        encoded = length_delimited(number, encoded)
    return encoded


def nested_unknown_groups(depth: int, number: int = UNKNOWN_FIELD_NUMBER) -> bytes:
    return tag(number, WIRE_START_GROUP) * depth + tag(number, WIRE_END_GROUP) * depth


@dataclass(frozen=True)
class RawPayload:
    """Wire bytes for a request; ``kind`` says how they were made."""

    kind: str
    data: bytes


def raw_payloads(descriptor: Descriptor, messages: st.SearchStrategy[Message]) -> st.SearchStrategy[RawPayload]:
    """Requests as bytes: invalid UTF-8 in each string field (anywhere in the
    message), random bytes, a valid message cut short, unknown fields of every
    wire type, and unknown groups nested around the parser's recursion limit."""
    serialized = messages.map(lambda m: m.SerializeToString())
    choices = [
        st.binary(max_size=256).map(lambda b: RawPayload("random-bytes", b)),
        st.tuples(serialized, st.floats(0, 1)).map(lambda p: RawPayload("truncated", p[0][: int(len(p[0]) * p[1])])),
        st.sampled_from(NESTED_GROUP_DEPTHS).map(lambda d: RawPayload(f"unknown-groups-nested-{d}", nested_unknown_groups(d))),
        st.tuples(serialized, st.binary(max_size=32), st.integers(0, UINT64_MAX)).map(
            lambda p: RawPayload(
                "unknown-fields",
                p[0]
                + tag(UNKNOWN_FIELD_NUMBER, WIRE_VARINT) + varint(p[2])
                + length_delimited(UNKNOWN_FIELD_NUMBER + 1, p[1])
                + tag(UNKNOWN_FIELD_NUMBER + 2, WIRE_I32) + b"\x01\x02\x03\x04"
                + tag(UNKNOWN_FIELD_NUMBER + 3, WIRE_I64) + b"\x01" * 8,
            )
        ),
    ]
    paths = string_field_paths(descriptor)
    if paths:
        choices.append(
            st.tuples(serialized, st.sampled_from(paths), st.sampled_from(INVALID_UTF8)).map(
                lambda p: RawPayload("invalid-utf8", p[0] + nest(p[1], p[2]))
            )
        )
    return st.one_of(*choices)
