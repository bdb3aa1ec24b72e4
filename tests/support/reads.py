"""What a partition holds, read over raw gRPC (tests/integ/raw.py's Raw)."""

from __future__ import annotations

from txlog.protocol.errors import TxlogError
from txlog.v1 import common_pb2

COMMITTED, UNCOMMITTED = common_pb2.ISOLATION_LEVEL_READ_COMMITTED, common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED


def values(raw, topic: str, partition: int = 0, isolation=COMMITTED, stub=None, offset: int = 0) -> list[str]:
    """The values one Fetch from ``offset`` at ``isolation`` returns, decoded.

    A Fetch answered with an error raises it as a TxlogError: a retriable one
    (leadership moving) is what wait_until polls through."""
    result = raw.fetch(topic, partition, offset, isolation=isolation, stub=stub)
    if result.error.code:
        raise TxlogError(result.error.code, f"Fetch {topic}-{partition}: {result.error.message}")
    return record_values(r for b in result.batches for r in b.records)


def record_values(records) -> list[str]:
    return [r.value.decode() for r in records]
