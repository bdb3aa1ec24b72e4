"""The consumer's truncation detection (KIP-320, issue 14) against unclean
elections, stale metadata and late answers.

A hypothesis state machine drives the real client Fetcher (and its real
Metadata) against three fake replicas of one partition. The replicas follow
the protocol's log rules with the real LeaderEpochCache: a leader appends in
its epoch, a follower truncates to where it agrees with the leader
(truncation_step) before copying, and any replica may be elected uncleanly,
with a shorter log, at a new epoch; the deposed leader keeps answering as a
zombie until it hears (late). A Fetch answer may be computed at one moment
and delivered after elections and appends (a late answer; computed after the
consumer asked, as a real one is). Only the servers are fake; the Fetcher's
positions, epochs and EpochEndOffsets rounds are the code under test.

What must hold (what KIP-320 promises): once the consumer has fetched under
the current leader's epoch, every record it returned below its position is,
at its offset, in that leader's log. A consumer that read an old leader's
tail never carries on past it into the new leader's different records.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.fake_transport import UnaryFetch
from txlog.config import ConsumerConfig
from txlog.errors import LogTruncationError
from txlog.fetcher import Fetcher
from txlog.metadata import Metadata
from txlog.protocol.errors import ErrorCode
from txlog.protocol.leader_epochs import AskAgain, LeaderEpochCache, truncation_step
from txlog.structs import TopicPartition
from txlog.v1 import common_pb2, partition_pb2

E = ErrorCode.Value
TP = TopicPartition("t", 0)
NODES = ("node-0:1", "node-1:2", "node-2:3")


@dataclass
class Replica:
    log: list = field(default_factory=list)  # (epoch, value) per offset
    epochs: LeaderEpochCache = field(default_factory=LeaderEpochCache)
    leads_at: int | None = None  # the epoch it believes it leads at (a zombie's too)

    def copy(self) -> Replica:
        return Replica(list(self.log), LeaderEpochCache(list(self.epochs.entries)), self.leads_at)


class Replicas(UnaryFetch):
    """The fake servers: Metadata from the controller's state, Fetch,
    EpochEndOffsets and ListOffsets from whichever replica is called (or
    from an earlier copy of it, for a late answer)."""

    def __init__(self):
        self.replicas = {address: Replica() for address in NODES}
        self.leader, self.epoch = NODES[0], 0
        self.replicas[self.leader].leads_at = 0
        self.replicas[self.leader].epochs.assign(0, 0)
        # The replicas as a Fetch from this position found them; its answer is delivered later.
        self.late: tuple[int, dict[str, Replica]] | None = None

    async def call(self, address, rpc, request, *, timeout_ms=None):
        await asyncio.sleep(0)
        return getattr(self, f"_{rpc}")(address, request)

    async def close(self) -> None:
        pass

    def _Metadata(self, address, request):  # noqa: N802
        response = partition_pb2.MetadataResponse()
        for node_id, broker in enumerate(NODES):
            response.brokers.add(node_id=node_id, address=broker)
        topic = response.topics.add(name=TP.topic)
        topic.partitions.add(partition=0, leader_id=NODES.index(self.leader), leader_address=self.leader, leader_epoch=self.epoch)
        return response

    def _serving(self, address: str, seen_epoch: int, result) -> Replica | None:
        replica = self.replicas[address]
        if replica.leads_at is None:
            result.error.code = E("NOT_LEADER")
        elif seen_epoch != replica.leads_at:
            result.error.code = E("FENCED_LEADER_EPOCH") if seen_epoch < replica.leads_at else E("UNKNOWN_LEADER_EPOCH")
        else:
            return replica
        result.error.message = "fake"
        return None

    def _Fetch(self, address, request):  # noqa: N802
        replicas = self.replicas
        if self.late is not None and all(item.fetch_offset == self.late[0] for item in request.partitions):
            replicas = self.late[1]  # answered then, delivered now
        self.late = None
        response = partition_pb2.FetchResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            saved, self.replicas = self.replicas, replicas
            replica = self._serving(address, item.leader_epoch, result)
            self.replicas = saved
            if replica is None:
                continue
            end = len(replica.log)
            result.high_watermark = result.last_stable_offset = end
            if not 0 <= item.fetch_offset <= end:
                result.error.code = E("OFFSET_OUT_OF_RANGE")
                continue
            for offset in range(item.fetch_offset, end):
                epoch, value = replica.log[offset]
                result.batches.add(base_offset=offset, partition_leader_epoch=epoch,
                                   records=[common_pb2.Record(offset=offset, value=value.encode())])
            result.next_fetch_offset = end
            if end > item.fetch_offset:
                result.next_fetch_epoch = replica.log[end - 1][0]
        return response

    def _EpochEndOffsets(self, address, request):  # noqa: N802
        response = partition_pb2.EpochEndOffsetsResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            replica = self._serving(address, item.current_leader_epoch, result)
            if replica is not None:
                result.leader_epoch, result.end_offset = replica.epochs.end_offset_for(item.leader_epoch, len(replica.log))
        return response

    def _ListOffsets(self, address, request):  # noqa: N802
        response = partition_pb2.ListOffsetsResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition, timestamp_ms=-1)
            replica = self.replicas[address]
            if replica.leads_at is None:
                result.error.code = E("NOT_LEADER")
                continue
            result.offset = 0 if item.spec == partition_pb2.OFFSET_SPEC_EARLIEST else len(replica.log)
        return response


class ConsumerTruncation(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.servers = Replicas()
        self.reset = "earliest"
        self.counter = 0
        self.returned: dict[int, str] = {}  # offset -> value of what poll returned, below the position
        self.truncations = 0
        self._new_fetcher()

    def _new_fetcher(self) -> None:
        config = ConsumerConfig(isolation_level="read_uncommitted", auto_offset_reset=self.reset, retry_backoff_ms=0)
        self.metadata = Metadata(self.servers, NODES[0], refresh_backoff_ms=0)
        self.fetcher = Fetcher(self.metadata, self.servers, config)
        self.fetcher.assign([TP])
        self.fetcher.seek(TP, 0)

    def teardown(self):
        self.loop.close()

    @property
    def state(self):
        return self.fetcher.states[TP]

    # --- the servers ------------------------------------------------------------------------------

    @rule(count=st.integers(1, 3))
    def append(self, count):
        leader = self.servers.replicas[self.servers.leader]
        for _ in range(count):
            self.counter += 1
            leader.log.append((self.servers.epoch, f"v{self.counter}@{self.servers.epoch}"))

    @rule(node=st.sampled_from(NODES), keep=st.integers(0, 4))
    def replicate(self, node, keep):
        """A follower truncates to where it agrees with the leader, then copies all but ``keep`` of the rest."""
        if node == self.servers.leader:
            return
        follower, leader = self.servers.replicas[node], self.servers.replicas[self.servers.leader]
        follower.leads_at = None  # it follows: it has heard of the new leader
        asked = follower.epochs.latest_epoch
        offset = 0
        while asked >= 0:
            step = truncation_step(follower.epochs, len(follower.log), *leader.epochs.end_offset_for(asked, len(leader.log)))
            if not isinstance(step, AskAgain):
                offset = step
                break
            asked = step.epoch
        del follower.log[offset:]
        follower.epochs.truncate_from_end(offset)
        for at in range(offset, max(offset, len(leader.log) - keep)):
            epoch, value = leader.log[at]
            follower.epochs.assign(epoch, at)
            follower.log.append((epoch, value))

    @rule(node=st.sampled_from(NODES))
    def elect_uncleanly(self, node):
        """Any replica, however short its log, leads at a new epoch; the old leader is not told yet."""
        self.servers.epoch += 1
        self.servers.leader = node
        replica = self.servers.replicas[node]
        replica.leads_at = self.servers.epoch
        replica.epochs.assign(self.servers.epoch, len(replica.log))

    @rule(node=st.sampled_from(NODES))
    def zombie_hears(self, node):
        if node != self.servers.leader:
            self.servers.replicas[node].leads_at = None

    @precondition(lambda self: self.state.position is not None)
    @rule()
    def a_fetch_is_answered_now_and_delivered_later(self):
        self.servers.late = (self.state.position, {a: r.copy() for a, r in self.servers.replicas.items()})

    # --- the consumer -----------------------------------------------------------------------------

    @rule(max_records=st.integers(1, 4))
    def poll(self, max_records):
        try:
            self.loop.run_until_complete(self._round())
            records = self.fetcher.drain(max_records)
        except LogTruncationError as exc:
            assert self.reset == "none"
            assert exc.divergent_offset < exc.position
            self.truncations += 1
            self.fetcher.seek(TP, max(exc.divergent_offset, 0))  # what an application does: go back and read again
            records = []
        for record in records:
            self.returned[record.offset] = record.value.decode()
        position = self.state.position
        if position is not None:
            self.returned = {o: v for o, v in self.returned.items() if o < position}

    async def _round(self):  # what Consumer.poll does
        await self.fetcher.reset_positions(timeout_ms=1_000)
        await self.fetcher.fetch_once(max_wait_ms=0)

    @rule()
    def metadata_refreshes(self):
        self.metadata.request_update()

    @rule()
    def strict_consumer(self):
        """From now on, auto_offset_reset 'none': truncation raises LogTruncationError."""
        self.reset = "none"
        self.fetcher._config = ConsumerConfig(isolation_level="read_uncommitted", auto_offset_reset="none", retry_backoff_ms=0)

    # --- what must hold ----------------------------------------------------------------------------

    @invariant()
    def what_was_returned_is_in_the_current_leaders_log(self):
        state = self.state
        if state.fetched_under_epoch != self.servers.epoch or state.buffer or state.position is None:
            return  # not validated against the current leader yet
        log = self.servers.replicas[self.servers.leader].log
        for offset, value in self.returned.items():
            assert offset < len(log) and log[offset][1] == value, (
                f"returned {value!r} at {offset}, but the leader at epoch {self.servers.epoch} has "
                f"{log[offset] if offset < len(log) else 'nothing'} there: {log}")


ConsumerTruncationTest = ConsumerTruncation.TestCase
ConsumerTruncationTest.settings = settings(max_examples=250, stateful_step_count=50, deadline=None)


def test_a_truncated_tail_is_noticed_and_read_again_from_the_new_leader():
    """The example behind the rule: the consumer read offsets 0..3 from the old
    leader; the new leader (elected uncleanly) has only 0..1 and writes 2..3
    anew. Without the check the consumer would carry on at 4, never seeing
    the new 2..3; with it, it goes back to 2 and reads them."""
    machine = ConsumerTruncation()
    try:
        machine.append(4)
        machine.replicate(NODES[1], keep=2)  # node 1 holds 0..1
        machine.poll(10)
        assert sorted(machine.returned) == [0, 1, 2, 3]
        machine.elect_uncleanly(NODES[1])
        machine.append(2)  # the new 2..3
        machine.metadata_refreshes()
        for _ in range(3):
            machine.poll(10)
        new_log = machine.servers.replicas[NODES[1]].log
        assert [machine.returned[o] for o in range(4)] == [v for _, v in new_log]
        assert machine.state.position == 4
    finally:
        machine.teardown()


def test_a_seek_back_after_a_truncation_keeps_checking_what_lies_below_it():
    # found by this machine's search: after LogTruncationError the application seeks back to the
    # divergent offset; the seek dropped the epochs of what it had read below, so a later unclean
    # election that lost those records went unnoticed (the consumer fetched on, or met
    # OFFSET_OUT_OF_RANGE instead of a truncation)
    machine = ConsumerTruncation()
    try:
        machine.elect_uncleanly(node="node-2:3")
        machine.strict_consumer()
        machine.append(count=2)
        machine.poll(max_records=1)
        machine.replicate(keep=1, node="node-0:1")
        machine.metadata_refreshes()
        machine.elect_uncleanly(node="node-0:1")
        machine.poll(max_records=1)
        machine.poll(max_records=1)  # the truncation: back to offset 1
        assert machine.truncations == 1
        machine.metadata_refreshes()
        machine.elect_uncleanly(node="node-1:2")  # a leader without offset 0 either
        machine.append(count=1)
        machine.poll(max_records=1)
        assert machine.truncations == 2, "the second divergence is found too"
        machine.what_was_returned_is_in_the_current_leaders_log()
    finally:
        machine.teardown()
