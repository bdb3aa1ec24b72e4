"""Fetch responses built from stored batch bytes, without parsing them.

A protobuf message is the concatenation of its encoded fields, in any order, and
a repeated message field is one length-delimited field per element. So a
FetchPartitionResult is the encoding of its scalar fields followed by one
``batches`` field per stored RecordBatch payload, and a FetchResponse is one
``results`` field per partition result: the stored bytes go out as they are.
(Parsing every batch and serializing the response again cost more than half of
partition_svc's CPU in bench/produce_fetch.py.) A compressed batch goes out so
too, whole, to a reader that accepts its codec; Partition.read decompresses it
for one that does not (FetchRequest.accepted_compressions).
"""

from __future__ import annotations

from functools import cache

from services.stubs.txlog.v1 import common_pb2, partition_pb2

VARINT = 0
LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def field_tag(message_class, field_name: str) -> bytes:
    return varint(message_class.DESCRIPTOR.fields_by_name[field_name].number << 3 | LENGTH_DELIMITED)


RESULTS_TAG = field_tag(partition_pb2.FetchResponse, "results")
LEADER_EPOCH_TAG = varint(common_pb2.RecordBatch.DESCRIPTOR.fields_by_name["partition_leader_epoch"].number << 3 | VARINT)
BATCHES_TAG = field_tag(partition_pb2.FetchPartitionResult, "batches")


@cache
def leader_epoch_field(epoch: int) -> bytes:
    """RecordBatch.partition_leader_epoch encoded: appended to a stored batch's
    bytes, it sets the field (the last occurrence of a scalar field wins)."""
    return LEADER_EPOCH_TAG + varint(epoch & 0xFFFFFFFFFFFFFFFF)


def partition_result(result: partition_pb2.FetchPartitionResult, batch_payloads: list[bytes]) -> bytes:
    """``result`` (without batches) with the serialized RecordBatches appended."""
    parts = [result.SerializeToString()]
    for payload in batch_payloads:
        parts += (BATCHES_TAG, varint(len(payload)), payload)
    return b"".join(parts)


def fetch_response(encoded_results: list[bytes]) -> bytes:
    parts = []
    for encoded in encoded_results:
        parts += (RESULTS_TAG, varint(len(encoded)), encoded)
    return b"".join(parts)
