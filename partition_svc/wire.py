"""Fetch responses built from stored batch bytes, without parsing them.

A protobuf message is the concatenation of its encoded fields, in any order, and
a repeated message field is one length-delimited field per element. So a
FetchPartitionResult is the encoding of its scalar fields followed by one
``batches`` field per stored RecordBatch payload (or one ``encoded_batches``
field per batch in the encoded format), and a FetchResponse is one
``results`` field per partition result: the stored bytes go out as they are.
(Parsing every batch and serializing the response again cost more than half of
partition_svc's CPU in bench/produce_fetch.py.) A compressed batch goes out so
too, whole, to a reader that accepts its codec; Partition.read decompresses it
for one that does not (FetchRequest.accepted_compressions). ReplicaFetch
responses are built the same way from the stored values.

A response is written once: each part (a message's head, a field's tag and
length, a stored payload, as a memoryview of the value RocksDB returned) is
kept in an :class:`Encoded` with the parts' total length, so an enclosing
field's length is known without joining, and only the whole response is
joined, one copy, for gRPC. (Joining each batch with its leader epoch, each
partition result and the response in turn copied every fetched byte three
times, and each copy of a fresh large buffer also page-faults.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import NamedTuple

from txlog.protocol.protowire import field_tag, varint
from txlog.v1 import common_pb2, partition_pb2, replication_pb2

RESULTS_TAG = field_tag(partition_pb2.FetchResponse, "results")
LEADER_EPOCH_TAG = field_tag(common_pb2.RecordBatch, "partition_leader_epoch")
BATCHES_TAG = field_tag(partition_pb2.FetchPartitionResult, "batches")
ENCODED_BATCHES_TAG = field_tag(partition_pb2.FetchPartitionResult, "encoded_batches")
REPLICA_RESULTS_TAG = field_tag(replication_pb2.ReplicaFetchResponse, "results")
REPLICA_BATCHES_TAG = field_tag(replication_pb2.ReplicaFetchPartitionResult, "batches")
STORED_VALUE_TAG = field_tag(replication_pb2.StoredBatch, "value")
THROTTLE_TIME_TAG = field_tag(partition_pb2.FetchResponse, "throttle_time_ms")


class Encoded(NamedTuple):
    """A message's encoding as parts (bytes-like) still to be joined, and their total length."""
    parts: Sequence
    size: int


def encoded(*parts) -> Encoded:
    return Encoded(parts, sum(map(len, parts)))


def embedded(head: bytes, tag: bytes, items: Iterable[Encoded]) -> Encoded:
    """``head`` (encoded fields) followed by one length-delimited ``tag`` field per item."""
    parts, size = [head], len(head)
    for item in items:
        prefix = tag + varint(item.size)
        parts.append(prefix)
        parts.extend(item.parts)
        size += len(prefix) + item.size
    return Encoded(parts, size)


@cache
def leader_epoch_field(epoch: int) -> bytes:
    """RecordBatch.partition_leader_epoch encoded: appended to a stored batch's
    bytes, it sets the field (the last occurrence of a scalar field wins)."""
    return LEADER_EPOCH_TAG + varint(epoch & 0xFFFFFFFFFFFFFFFF)


def record_batch(payload, leader_epoch: int) -> Encoded:
    """A RecordBatch: its serialized bytes (``payload``, unchanged) with partition_leader_epoch set."""
    return encoded(payload, leader_epoch_field(leader_epoch))


def partition_result(result: partition_pb2.FetchPartitionResult, batches: Iterable[Encoded], encoded_batches: bool = False) -> Encoded:
    """``result`` (without batches) with the batches appended: RecordBatches,
    or with ``encoded_batches`` batches in the encoded format (encoded_batches)."""
    return embedded(result.SerializeToString(), ENCODED_BATCHES_TAG if encoded_batches else BATCHES_TAG, batches)


def fetch_response(results: Iterable[Encoded]) -> bytes:
    return b"".join(embedded(b"", RESULTS_TAG, results).parts)


def throttle_time(held_ms: int) -> bytes:
    """A FetchResponse's throttle_time_ms field, to append to an encoded one."""
    return THROTTLE_TIME_TAG + varint(held_ms)


def stored_batch(base_offset: int, leader_epoch: int, value: bytes) -> Encoded:
    """A StoredBatch holding ``value``, a stored batch's bytes, unchanged."""
    head = replication_pb2.StoredBatch(base_offset=base_offset, leader_epoch=leader_epoch).SerializeToString()
    return encoded(head, STORED_VALUE_TAG, varint(len(value)), value)


def replica_fetch_result(result: replication_pb2.ReplicaFetchPartitionResult, batches: Iterable[Encoded]) -> Encoded:
    """``result`` (without batches) with the StoredBatches appended."""
    return embedded(result.SerializeToString(), REPLICA_BATCHES_TAG, batches)


def replica_fetch_response(results: Iterable[Encoded]) -> bytes:
    return b"".join(embedded(b"", REPLICA_RESULTS_TAG, results).parts)
