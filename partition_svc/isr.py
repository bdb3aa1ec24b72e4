"""The in-sync replicas of a partition and its high watermark, as its leader
computes them: pure, no I/O, time passed in (issue 14, replication; Kafka's
ISR with ``replica.lag.time.max.ms`` and ``min.insync.replicas``).

- A follower is caught up when its log end offset has reached the leader's;
  the leader remembers the last time each follower was caught up.
- A follower in the ISR that has not been caught up for ``lag_max_ms`` is
  dropped from it, and one whose log end went backwards (a wiped disk) at
  once; one outside that reaches the leader's high watermark, and
  has been caught up, is added back. The leader is always in its ISR. A
  follower the written ISR drops is forgotten (set_isr): only fetches made
  after bring it back.
- The high watermark is the smallest log end offset in the ISR: every record
  below it is on every in-sync replica. It never moves backwards.
- ``acks=all`` needs at least ``min_insync`` replicas in the ISR: fewer, and a
  produce is refused before anything is appended (NOT_ENOUGH_REPLICAS).
- The low watermark is the smallest log start offset in the ISR (what
  DeleteRecords waits for): each follower says its own in every fetch (what
  it holds durably); one that has not said counts as 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FollowerProgress:
    log_end_offset: int = 0
    last_caught_up_ms: int = -1
    log_start_offset: int = 0  # as its last fetch said
    storage_zxid: int | None = None  # the mark of the storage its last fetch came from (None: it did not say)


@dataclass
class ReplicaSet:
    leader: int
    isr: frozenset[int]
    followers: dict[int, FollowerProgress] = field(default_factory=dict)  # every replica but the leader
    high_watermark: int = 0

    def on_fetch(self, follower: int, log_end_offset: int, leader_log_end: int, now_ms: int,
                 log_start_offset: int = 0, storage_zxid: int | None = None) -> bool:
        """A follower fetched from ``log_end_offset``: it holds everything below it,
        from ``log_start_offset`` on, on the storage marked ``storage_zxid``. True
        when its log start changed."""
        progress = self.followers.setdefault(follower, FollowerProgress())
        log_start_was = progress.log_start_offset
        if storage_zxid is not None and storage_zxid != progress.storage_zxid:
            progress.last_caught_up_ms = -1  # other storage than its last fetch's: caught up only by what it says now
            progress.storage_zxid = storage_zxid
        if log_end_offset < progress.log_end_offset:
            # it holds less than it did (its disk was wiped, or it truncated): out of sync at once, whatever
            # the lag time, so it is never counted, nor elected, for records it no longer has
            progress.last_caught_up_ms = -1
        progress.log_end_offset = log_end_offset
        progress.log_start_offset = log_start_offset
        if log_end_offset >= leader_log_end:
            progress.last_caught_up_ms = now_ms
        return progress.log_start_offset != log_start_was

    def set_isr(self, isr: frozenset[int]) -> None:
        """The ISR as written to ZooKeeper. A follower it drops is forgotten:
        the controller drops one that restarted, and what was recorded of it
        came from its previous process (a fetch received before that one died,
        say), not from what the new one holds; it comes back only by fetches
        made after."""
        for node in self.isr - isr:
            if node in self.followers:
                self.followers[node] = FollowerProgress()
        self.isr = isr

    def storage_of(self, followers) -> dict[int, int]:
        """{follower: the storage its fetches came from} of ``followers`` that said."""
        return {n: self.followers[n].storage_zxid for n in followers
                if n in self.followers and self.followers[n].storage_zxid is not None}

    def low_watermark(self, leader_log_start: int) -> int:
        """The smallest log start offset in the ISR."""
        return min([leader_log_start] + [self.followers[n].log_start_offset if n in self.followers else 0
                                         for n in self.isr if n != self.leader])

    def replicated_end(self, replicas: tuple[int, ...]) -> int:
        """Below it every replica in ``replicas`` holds the log, as far as this leader knows: the
        high watermark, and each follower's last fetch offset (0 for one that has not fetched,
        since this leader's start, or at all). A follower out of the ISR holds it back too."""
        return min([self.high_watermark] + [self.followers[n].log_end_offset if n in self.followers else 0
                                            for n in replicas if n != self.leader])

    def isr_change(self, leader_log_end: int, now_ms: int, lag_max_ms: int) -> frozenset[int] | None:
        """The ISR as it should be now, or None when it stays. The new ISR must be
        written (a conditional ZooKeeper write) before it takes effect."""
        wanted = {self.leader}
        for node, progress in self.followers.items():
            lagging = progress.last_caught_up_ms < 0 or now_ms - progress.last_caught_up_ms > lag_max_ms
            if node in self.isr and not lagging:
                wanted.add(node)
            elif node not in self.isr and not lagging and progress.log_end_offset >= self.high_watermark:
                wanted.add(node)
        wanted_isr = frozenset(wanted)
        return None if wanted_isr == self.isr else wanted_isr

    def advance_high_watermark(self, leader_log_end: int) -> bool:
        """Moves the high watermark to the smallest log end offset in the ISR
        (never back); True when it moved."""
        ends = [leader_log_end] + [self.followers[n].log_end_offset if n in self.followers else 0
                                   for n in self.isr if n != self.leader]
        candidate = min(ends)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def enough_replicas(self, min_insync: int) -> bool:
        return len(self.isr) >= min_insync
