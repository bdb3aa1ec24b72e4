"""This instance's periodic work on its partitions: producers expired,
retention and compaction enforced (then RocksDB's blob GC tuned)."""

from __future__ import annotations

import asyncio
import logging

from partition_svc.log_store import LogStore
from partition_svc.partition import Partition, now_ms
from services.runtime.logs import fields

log = logging.getLogger(__name__)


class Maintenance:
    def __init__(self, partitions: dict[tuple[str, int], Partition], store: LogStore, producer_id_expiration_ms: int,
                 delete_retention_ms: int):
        self.partitions = partitions  # the replica manager's, kept current by it
        self.store = store
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.delete_retention_ms = delete_retention_ms  # a compacted topic's delete.retention.ms unless it sets its own

    @staticmethod
    async def every(interval_ms: int, one_pass, what: str) -> None:
        """Runs ``one_pass()`` every ``interval_ms``, for good; a pass that fails is logged, the next one runs."""
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await one_pass()
            except Exception:
                log.exception(f"{what} pass failed")

    async def expire_producers(self) -> None:
        now = now_ms()
        for partition in list(self.partitions.values()):
            before = len(partition.producers)
            written = partition.expire_producers(now, self.producer_id_expiration_ms)
            if written is not None:
                await written
                log.info("producers expired", extra=fields(topic=partition.topic, partition=partition.index,
                                                           expired=before - len(partition.producers)))

    async def enforce_retention(self) -> None:
        now = now_ms()
        for partition in list(self.partitions.values()):
            written = partition.enforce_retention(now, self.delete_retention_ms)
            if written is not None:
                await written
                log.info("retention", extra=fields(topic=partition.topic, partition=partition.index, log_start_offset=partition.log_start_offset))
        # after retention, and after whatever else deleted batches since the last pass (deleted topics, DeleteRecords)
        await asyncio.to_thread(self.store.tune_blob_gc)
