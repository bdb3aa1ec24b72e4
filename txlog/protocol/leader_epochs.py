"""Leader epochs and where a replica's log diverges from its leader's: pure,
no I/O (issue 14, replication; Kafka's KIP-101, KIP-279 and KIP-320). Shared: followers
use it against their leader, consumers against the leader they read from.

Every replica keeps, for each leader epoch it has seen in its log, the offset
of the first record written in that epoch. A follower that starts fetching
from a new leader first asks it for the end offset of the follower's latest
epoch (OffsetsForLeaderEpoch): the leader answers the largest epoch it knows
at or below the one asked, and where that epoch ended in its log (the start
of its next epoch, or its log end). The follower truncates to the first
offset its log and the leader's may disagree on, so an old leader's
unreplicated tail never survives a failover.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

UNDEFINED = -1


@dataclass
class LeaderEpochCache:
    entries: list[tuple[int, int]] = field(default_factory=list)  # (epoch, start offset), both increasing

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Records that ``epoch`` starts at ``start_offset`` (its first append);
        False when it is known already. An epoch or offset that goes backwards
        is a bug of the caller: ValueError."""
        if self.entries and epoch == self.entries[-1][0]:
            return False
        if self.entries and (epoch < self.entries[-1][0] or start_offset < self.entries[-1][1]):
            raise ValueError(f"leader epoch {epoch} at {start_offset} goes back from {self.entries[-1]}")
        self.entries.append((epoch, start_offset))
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """The OffsetsForLeaderEpoch answer: (the largest epoch <= ``epoch`` known
        here, the offset where it ended: the next epoch's start, or the log end
        for the latest); (UNDEFINED, UNDEFINED) below every known epoch."""
        index = bisect.bisect_right([e for e, _ in self.entries], epoch) - 1
        if index < 0:
            return UNDEFINED, UNDEFINED
        end = self.entries[index + 1][1] if index + 1 < len(self.entries) else log_end_offset
        return self.entries[index][0], end

    def epoch_at(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written in (0 before every known epoch)."""
        index = bisect.bisect_right(self.entries, offset, key=lambda entry: entry[1]) - 1
        return self.entries[index][0] if index >= 0 else 0

    def truncate_from_end(self, offset: int) -> None:
        """The log was truncated to end before ``offset``: epochs starting at or after it are gone."""
        self.entries = [(e, start) for e, start in self.entries if start < offset]

    def truncate_from_start(self, offset: int) -> None:
        """The log now starts at ``offset`` (retention): the epoch covering it starts there."""
        kept = [(e, start) for e, start in self.entries if start > offset]
        covering = [(e, start) for e, start in self.entries if start <= offset]
        self.entries = ([(covering[-1][0], offset)] if covering else []) + kept


@dataclass(frozen=True)
class AskAgain:
    """The leader did not know the follower's epoch: ask it for this lower one."""

    epoch: int


def truncation_step(local: LeaderEpochCache, local_log_end: int, leader_epoch: int, leader_end_offset: int) -> int | AskAgain:
    """What a follower does with the leader's OffsetsForLeaderEpoch answer
    (``leader_epoch``, ``leader_end_offset``): the offset to truncate its log to,
    or the lower epoch to ask about next (KIP-279: when the leader answered an
    epoch the follower never had, they agree at most up to where the
    follower's own earlier epoch ended, which only the leader can place).
    The rounds end: every AskAgain names a lower epoch."""
    if leader_epoch == UNDEFINED:  # no epoch at or below the asked one on the leader: nothing in common
        return 0
    local_epoch, local_end = local.end_offset_for(leader_epoch, local_log_end)
    if local_epoch == leader_epoch:
        return min(local_end, leader_end_offset, local_log_end)
    if local_epoch == UNDEFINED:
        return 0
    return AskAgain(local_epoch)
