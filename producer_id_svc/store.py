"""The ZooKeeper node that arbitrates producer-id blocks.

Every write is conditional on the node's version (or a create that fails if the
node exists), so of two allocators that read the same version only one can
write; the other gets :class:`VersionConflict` and reads again.
"""

from __future__ import annotations

import posixpath

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from producer_id_svc.core import ProducerIdBlock
from services.coordination import zk
from txlog.protocol.errors import ErrorCode, TxlogError

NODE_NAME = "latest_producer_id_block"


class VersionConflict(Exception):
    """Another allocator wrote the node since we read it."""


class ProducerIdBlockStore:
    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.path = posixpath.join(root, NODE_NAME)

    async def read(self) -> tuple[ProducerIdBlock | None, int | None]:
        """The latest block and the node's version; (None, None) when there is no node yet."""
        try:
            data, stat = await zk.call(self.client, "get", self.path)
        except NoNodeError:
            return None, None
        try:
            return ProducerIdBlock.decode(data), stat.version
        except ValueError as exc:
            raise TxlogError(ErrorCode.Value("UNKNOWN_SERVER_ERROR"), f"{self.path}: {exc}") from exc

    async def create(self, block: ProducerIdBlock) -> int:
        """Writes the first block; the node's version afterwards (0)."""
        try:
            await zk.call(self.client, "create", self.path, block.encode(), makepath=True)
        except NodeExistsError as exc:
            raise VersionConflict(self.path) from exc
        return 0

    async def write(self, block: ProducerIdBlock, expected_version: int) -> int:
        """Replaces the block if the node is still at ``expected_version``; the new version."""
        try:
            stat = await zk.call(self.client, "set", self.path, block.encode(), version=expected_version)
        except (BadVersionError, NoNodeError) as exc:
            raise VersionConflict(self.path) from exc
        return stat.version
