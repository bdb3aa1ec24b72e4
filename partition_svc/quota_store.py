"""Client quotas in ZooKeeper: one znode per entity under
``<root>/config/quotas`` (client_quotas.node_name), holding its values as
JSON; every change also writes the parent, whose data watch tells every
instance to load them all again. Each instance applies what it loaded
last (client_quotas.QuotaTracker)."""

from __future__ import annotations

import json
import logging
import posixpath

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from partition_svc.client_quotas import Entity, entity_of_node, node_name
from services.coordination import zk
from services.runtime.logs import fields
from txlog.protocol.errors import TxlogError

log = logging.getLogger(__name__)

WRITE_ATTEMPTS = 10  # conditional writes of one entity raced by other writers


class QuotaStore:
    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.base = posixpath.join(root, "config", "quotas")
        self.configs: dict[Entity, dict[str, float]] = {}  # as loaded last

    async def start(self) -> None:
        """Loads the quotas and reloads them on every change (before calls are taken)."""
        await zk.call(self.client, "ensure_path", self.base)
        await self.reload()
        await zk.ReloadOnChange(self.client, self.base, self.reload, "the client quotas").start()

    async def reload(self) -> None:
        self.configs = await self.load()
        log.info("client quotas loaded", extra=fields(entities=len(self.configs)))

    async def load(self) -> dict[Entity, dict[str, float]]:
        try:
            children = await zk.call(self.client, "get_children", self.base)
        except NoNodeError:
            return {}
        configs = {}
        for child in children:
            try:
                data, _ = await zk.call(self.client, "get", posixpath.join(self.base, child))
            except NoNodeError:
                continue
            try:
                configs[entity_of_node(child)] = {k: float(v) for k, v in json.loads(data).items()}
            except (TxlogError, ValueError, TypeError, AttributeError) as exc:  # a newer version's entity, a bad value
                log.warning("client quota entity skipped", extra=fields(node=child, error=str(exc)))
        return configs

    async def alter(self, entity: Entity, changes: dict[str, float | None]) -> dict[str, float]:
        """Sets (None: removes) the ``changes`` of one entity's quotas,
        conditionally on what was read; the entity's values after."""
        path = posixpath.join(self.base, node_name(entity))
        for _ in range(WRITE_ATTEMPTS):
            try:
                data, stat = await zk.call(self.client, "get", path)
                current = json.loads(data)
            except NoNodeError:
                stat, current = None, {}
            wanted = {k: v for k, v in {**current, **changes}.items() if v is not None}
            if wanted == current:
                return wanted
            transaction = self.client.transaction()
            if stat is None:
                transaction.create(path, json.dumps(wanted, sort_keys=True).encode())
            elif wanted:
                transaction.set_data(path, json.dumps(wanted, sort_keys=True).encode(), version=stat.version)
            else:
                transaction.delete(path, version=stat.version)
            transaction.set_data(self.base, b"")  # the change every instance's watch sees
            await zk.call(self.client, "ensure_path", self.base)
            results = await zk.commit(self.client, transaction)
            failed = [r for r in results if isinstance(r, Exception)]
            if not failed:
                return wanted
            if not any(isinstance(r, (BadVersionError, NodeExistsError, NoNodeError)) for r in failed):
                raise failed[0]
        raise RuntimeError(f"quotas of {node_name(entity)} kept changing under {WRITE_ATTEMPTS} writes")
