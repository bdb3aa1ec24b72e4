"""Producer-id blocks: the pure rules (no ZooKeeper, no gRPC).

Guarantees: ``next_block`` returns the block right after the latest one, so as
long as every writer replaces the node only with a conditional write on the
version it read, blocks never overlap and never repeat; inside a block there are
no gaps. The node's JSON (``version``, ``requester``, ``block_start``,
``block_end``; ``block_end`` inclusive, as Kafka's) is decoded strictly: a node
that does not parse is never silently replaced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from txlog.protocol.errors import ErrorCode, TxlogError

BLOCK_SIZE_DEFAULT = 1000
IDS_PER_WRITE_MAX = 1 << 40  # one write may reserve the blocks of many waiting requests
PRODUCER_ID_MAX = 2**63 - 1
REQUESTER_ID_MAX = 2**31 - 1
NODE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ProducerIdBlock:
    requester_id: int
    block_start: int
    block_end: int  # inclusive

    @property
    def size(self) -> int:
        return self.block_end - self.block_start + 1

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": NODE_FORMAT_VERSION,
                "requester": self.requester_id,
                "block_start": self.block_start,
                "block_end": self.block_end,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ProducerIdBlock:
        """Raises ValueError when the node is not a block this code wrote."""
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"producer-id block node is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("version") != NODE_FORMAT_VERSION:
            raise ValueError(f"producer-id block node has an unknown format: {data[:200]!r}")
        try:
            block = cls(int(raw["requester"]), int(raw["block_start"]), int(raw["block_end"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"producer-id block node lacks a field: {exc}") from exc
        if not 0 <= block.block_start <= block.block_end <= PRODUCER_ID_MAX:
            raise ValueError(f"producer-id block node holds an impossible range: {block}")
        return block


def check_requester_id(requester_id: int) -> int:
    if not 0 <= requester_id <= REQUESTER_ID_MAX:
        raise TxlogError(
            ErrorCode.Value("INVALID_REQUEST"),
            f"requester_id must be between 0 and {REQUESTER_ID_MAX}, got {requester_id}",
        )
    return requester_id


def next_block(latest: ProducerIdBlock | None, requester_id: int, block_size: int) -> ProducerIdBlock:
    """The block after ``latest`` (the first block when there is none)."""
    if not 1 <= block_size <= IDS_PER_WRITE_MAX:
        raise ValueError(f"block size must be 1..{IDS_PER_WRITE_MAX}, got {block_size}")
    start = 0 if latest is None else latest.block_end + 1
    end = start + block_size - 1
    if end > PRODUCER_ID_MAX:
        raise TxlogError(
            ErrorCode.Value("PRODUCER_IDS_EXHAUSTED"),
            f"the producer-id space is used up: the latest block ends at {start - 1} and a block of "
            f"{block_size} would pass {PRODUCER_ID_MAX}",
        )
    return ProducerIdBlock(requester_id, start, end)
