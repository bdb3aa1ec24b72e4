"""Where transaction coordinators are: shared by coordinator_svc (which owns
partitions of ``__transaction_state``) and partition_svc (which answers
Metadata and verifies transactional batches with the coordinator).

A transactional id belongs to partition ``murmur2(group) % N`` of the internal
topic ``__transaction_state`` (N fixed when the topic is created), where its
group is the part of the id before its first "/" (the whole id when it has
none; :func:`txlog.protocol.names.transaction_group`): every id of a group shares one
partition, so one coordinator can commit them together. Each
partition has one owner, recorded in ZooKeeper at
``<root>/transaction_state/owners/<partition>`` as JSON ``{"node_id",
"coordinator_epoch", "log_producer_id"}``; the coordinator epoch grows at every
change of owner, and partition leaders refuse markers carrying an older one.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from services.coordination import zk
from txlog.protocol import PRODUCER_EPOCHS, names
from txlog.protocol.hashing import partition_for_id

COORDINATOR_KIND = "coordinator_svc"




@dataclass(frozen=True)
class PartitionOwner:
    """The owner writes the partition's log as the idempotent producer
    ``log_producer_id`` at epoch ``log_producer_epoch``: the coordinator epoch
    while it fits a producer epoch. Ownership moves at every coordinator join or
    leave, so the coordinator epoch outgrows 32767; from then on every 32768th
    owner takes a new log producer id (partition_svc lets only the owner node's
    log producer id write the log, so the previous id is fenced all the same)."""

    node_id: int
    coordinator_epoch: int
    log_producer_id: int

    @property
    def log_producer_epoch(self) -> int:
        return self.coordinator_epoch % PRODUCER_EPOCHS

    def successor(self, node_id: int) -> PartitionOwner:
        """The next owner, on ``node_id``; its log producer id is this one's,
        or -1 when the epoch wraps and the caller must take a new one."""
        epoch = self.coordinator_epoch + 1
        return PartitionOwner(node_id, epoch, -1 if epoch % PRODUCER_EPOCHS == 0 else self.log_producer_id)

    def encode(self) -> bytes:
        return json.dumps(
            {"node_id": self.node_id, "coordinator_epoch": self.coordinator_epoch, "log_producer_id": self.log_producer_id}
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> PartitionOwner:
        raw = json.loads(data)
        return cls(raw["node_id"], raw["coordinator_epoch"], raw["log_producer_id"])


def transaction_log_partition(transactional_id: str, partition_count: int) -> int:
    """The __transaction_state partition of a transactional id (or of a group)."""
    return partition_for_id(names.transaction_group(transactional_id), partition_count)


def owners_path(root: str) -> str:
    return posixpath.join(root, "transaction_state", "owners")


def owner_path(root: str, partition: int) -> str:
    return posixpath.join(owners_path(root), str(partition))


class WatchedOwners:
    """The owners of the __transaction_state partitions as read_owner answers
    them, each kept in memory and read again once a ZooKeeper watch says it
    changed (or at once when ``fresh``): for answers that may lag a change by
    a notification (FindCoordinator, which a client retries on
    NOT_COORDINATOR), never for a coordinator confirming its own lease."""

    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.root = root
        self._nodes: dict[int, zk.WatchedNode] = {}

    async def get(self, partition: int, *, fresh: bool = False) -> tuple[PartitionOwner, int] | None:
        node = self._nodes.get(partition)
        if node is None:
            node = self._nodes.setdefault(partition, zk.WatchedNode(self.client, owner_path(self.root, partition)))
        value = await node.get(fresh=fresh)
        return None if value is None else (PartitionOwner.decode(value[0]), value[1].version)


async def read_owner(client: KazooClient, root: str, partition: int) -> tuple[PartitionOwner, int] | None:
    """The owner of a __transaction_state partition and the node's version, or None."""
    try:
        data, stat = await zk.call(client, "get", owner_path(root, partition))
    except NoNodeError:
        return None
    return PartitionOwner.decode(data), stat.version
