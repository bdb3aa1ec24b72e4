"""A partition replica's changes on their way through its writer, and the
signals of what moved.

The writer (log_store.GroupCommitWriter) writes submissions in order and
completes their futures in order: first readable (written, maybe not synced),
then durable. :class:`WriteQueue` tracks the appends among them by their end
offsets, so the replica learns how far its log is readable and durable, and
completes each append's ``replicated`` future once the high watermark passes
it. What truncates or wipes the log reads the store to know what to delete,
so it must first let every earlier submission be written (:meth:`settle`) and
may not run while appends are queued (:meth:`check_settled`): read before, a
queued append would be written after the deletions and survive them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

Changes = list[tuple[bytes, bytes | None]]


class Writer(Protocol):
    """Where a partition's changes go: log_store.GroupCommitWriter, which
    completes the futures in submission order once the changes are durable
    (and, with submit_readable, first once they are readable)."""

    def submit(self, changes: Changes) -> asyncio.Future: ...

    def submit_readable(self, changes: Changes) -> tuple[asyncio.Future, asyncio.Future]: ...


class Signal:
    """Wakes everyone waiting once per move: a new event each time, so whoever
    took the old one before the move and waits on it after returns at once."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def fire(self) -> None:
        self.event.set()
        self.event = asyncio.Event()

    async def wait(self) -> None:
        await self.event.wait()


class WriteQueue:
    def __init__(self, writer: Writer, on_readable: Callable[[int], None], on_durable: Callable[[int], None]):
        self.writer = writer
        self._on_readable = on_readable  # called with the end of the appends readable so far, in order
        self._on_durable = on_durable  # likewise once durable
        self._unreadable: deque[tuple[int, asyncio.Future]] = deque()  # (end offset, readable) in offset order
        self._in_flight: deque[tuple[int, asyncio.Future]] = deque()  # (end offset, durable) in offset order
        # (end offset, future, callback) of a leader's appends, completed once the high watermark passes them.
        self._replicating: deque[tuple[int, asyncio.Future, Callable[[], None] | None]] = deque()

    def submit(self, changes: Changes) -> asyncio.Future:
        """Changes that move no log end (epochs, producers forgotten, the log start); durable when the future completes."""
        return self.writer.submit(changes)

    def submit_append(self, changes: Changes, end: int,
                      on_replicated: Callable[[], None] | None = None) -> tuple[asyncio.Future, asyncio.Future]:
        """An append's changes, its log ending at ``end``: (durable here, replicated). ``on_replicated``
        runs, and ``replicated`` completes with True, once :meth:`replicated_to` passes ``end``."""
        readable, durable = self.writer.submit_readable(changes)
        self._unreadable.append((end, readable))
        self._in_flight.append((end, durable))
        # Added before anyone awaits the futures: the ends have moved by the time they resume.
        readable.add_done_callback(lambda _: self._settled(self._unreadable, self._on_readable))
        durable.add_done_callback(lambda _: self._settled(self._in_flight, self._on_durable))
        replicated = asyncio.get_running_loop().create_future()
        self._replicating.append((end, replicated, on_replicated))
        return durable, replicated

    def replicated_to(self, high_watermark: int) -> None:
        """Completes the appends the high watermark passed, in offset order."""
        while self._replicating and self._replicating[0][0] <= high_watermark:
            _, future, on_replicated = self._replicating.popleft()
            if on_replicated is not None:
                on_replicated()
            if not future.done():
                future.set_result(True)

    def abandon_replication(self) -> None:
        """This replica stopped leading: whoever waits for replication is told False (the new leader decides)."""
        waiting, self._replicating = self._replicating, deque()
        for _, future, _ in waiting:
            if not future.done():
                future.set_result(False)

    def check_settled(self, where: str, what: str) -> None:
        """What to delete is read from the store: an append not written yet would outlive the deletions."""
        if self._in_flight or self._unreadable:
            raise RuntimeError(f"{where}: cannot {what} with appends not written yet; settle_writes first")

    async def settle(self) -> None:
        """Returns once every change submitted before the call is written."""
        await self.writer.submit([])

    @staticmethod
    def _settled(writes: deque[tuple[int, asyncio.Future]], moved: Callable[[int], None]) -> None:
        """Takes the leading writes whose future is done off ``writes``; tells ``moved`` the end of the last one taken."""
        end = None
        while writes and writes[0][1].done():
            end = writes.popleft()[0]
        if end is not None:
            moved(end)
