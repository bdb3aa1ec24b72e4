"""Topics in ZooKeeper: ``<root>/topics/<name>`` holds JSON
``{"partitions": N, "configs": {...}, "assignment": [node_id, ...],
"leader_epochs": [epoch, ...], "internal": bool}``.

A topic is created once with a create that fails if the node exists, so two
concurrent creations of one name cannot both win; partitions are assigned
round-robin over the partition_svc instances live at that moment, starting at an
offset derived from the name (so several small topics do not all start on the
same instance). Topics are never changed after creation (until replication
brings leader changes), so an instance caches what it read.

Leader epochs start at 0; the replication issue will bump them on failover.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from services import zk
from services.hashing import partition_for_id

INTERNAL_PREFIX = "__"


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partition_count: int
    configs: dict
    assignment: tuple[int, ...]
    leader_epochs: tuple[int, ...]
    internal: bool

    def encode(self) -> bytes:
        return json.dumps(
            {
                "partitions": self.partition_count,
                "configs": self.configs,
                "assignment": list(self.assignment),
                "leader_epochs": list(self.leader_epochs),
                "internal": self.internal,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, name: str, data: bytes) -> TopicInfo:
        raw = json.loads(data)
        return cls(name, raw["partitions"], raw["configs"], tuple(raw["assignment"]), tuple(raw["leader_epochs"]), raw["internal"])


def assign_round_robin(name: str, partition_count: int, live_nodes: list[int]) -> tuple[int, ...]:
    nodes = sorted(live_nodes)
    start = partition_for_id(name, len(nodes))
    return tuple(nodes[(start + p) % len(nodes)] for p in range(partition_count))


class TopicRegistry:
    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.base = posixpath.join(root, "topics")
        self._cache: dict[str, TopicInfo] = {}

    async def get(self, name: str) -> TopicInfo | None:
        info = self._cache.get(name)
        if info is not None:
            return info
        try:
            data, _ = await zk.call(self.client, "get", posixpath.join(self.base, name))
        except NoNodeError:
            return None
        info = TopicInfo.decode(name, data)
        self._cache[name] = info
        return info

    async def create(self, info: TopicInfo) -> TopicInfo:
        """Creates the topic; if it exists already, returns the existing one instead."""
        try:
            await zk.call(self.client, "create", posixpath.join(self.base, info.name), info.encode(), makepath=True)
        except NodeExistsError:
            existing = await self.get(info.name)
            if existing is None:
                raise
            return existing
        self._cache[info.name] = info
        return info

    async def names(self) -> list[str]:
        try:
            return sorted(await zk.call(self.client, "get_children", self.base))
        except NoNodeError:
            return []
