"""A partition's writer (``partition_svc.partition.Writer``) whose writes and
acknowledgements happen when the test says. The real GroupCommitWriter writes
submitted changes to RocksDB and then completes their futures, in submission
order, as soon as it can; the partition tests stage what lies between: a
change applied in memory but not written (a crash then loses it), written (readable: a
leader's followers may fetch it) but not acknowledged, acknowledged. The
writes are real RocksDB writes."""

from __future__ import annotations

import asyncio

from partition_svc.log_store import LogStore


class ScriptedWriter:
    def __init__(self, store: LogStore):
        self.store = store
        self.unwritten: list[tuple[list, asyncio.Future, asyncio.Future | None]] = []  # (changes, durable, readable)
        self.unacknowledged: list[tuple[list, asyncio.Future, asyncio.Future | None]] = []

    def submit(self, changes: list) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.unwritten.append((changes, future, None))
        return future

    def submit_readable(self, changes: list) -> tuple[asyncio.Future, asyncio.Future]:
        readable, durable = asyncio.get_running_loop().create_future(), asyncio.get_running_loop().create_future()
        self.unwritten.append((changes, durable, readable))
        return readable, durable

    def write(self, count: int | None = None) -> None:
        """Writes the oldest ``count`` submissions (all by default), as one group
        commit: readable now (their readable futures complete), not acknowledged."""
        count = len(self.unwritten) if count is None else count
        written, self.unwritten = self.unwritten[:count], self.unwritten[count:]
        if written:
            self.store.write([change for changes, _, _ in written for change in changes])
        for _, _, readable in written:
            if readable is not None:
                readable.set_result(None)
        self.unacknowledged += written

    def acknowledge(self, count: int | None = None) -> None:
        """Completes the futures of the oldest ``count`` written submissions; the
        partition's durable callbacks run at the event loop's next turn."""
        count = len(self.unacknowledged) if count is None else count
        done, self.unacknowledged = self.unacknowledged[:count], self.unacknowledged[count:]
        for _, future, _ in done:
            future.set_result(None)

    async def settle(self) -> None:
        """Everything submitted written and acknowledged, and the callbacks run."""
        self.write()
        self.acknowledge()
        await asyncio.sleep(0)
