"""Serializers and deserializers by name or callable (txlog/serde.py)."""

import pytest

from txlog import serde


def test_named_serializers_and_their_deserializers_round_trip():
    for name, obj in (("json", {"id": 7, "tags": ["a", "é"]}), ("str", "héllo"), ("bytes", b"\x00\xff")):
        data = serde.serializer(name, "value_serializer")(obj)
        assert isinstance(data, bytes) and serde.deserializer(name, "value_deserializer")(data) == obj
    assert serde.serializer("json", "v")({"a": 1}) == b'{"a":1}'


def test_none_is_never_serialized_and_a_failure_says_which_and_why():
    assert serde.serialized(serde.serializer("json", "v"), None, "value") is None
    with pytest.raises(serde.SerializationError, match="the value serializer failed on set"):
        serde.serialized(serde.serializer("json", "v"), {1, 2}, "value")
    with pytest.raises(serde.SerializationError, match="the key serializer returned int, not bytes"):
        serde.serialized(len, "abc", "key")
    with pytest.raises(TypeError):  # a SerializationError is a TypeError too, as a bad send() argument is
        serde.serialized(serde.serializer("str", "k"), 5, "key")


def test_an_unknown_name_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="value_serializer must be a callable or one of bytes, str, json, not 'avro'"):
        serde.serializer("avro", "value_serializer")
