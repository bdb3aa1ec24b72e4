"""Start positions of partitions the group hands over while the consumer is
fetching the committed offsets of others.

A subscribed consumer's membership task runs on the consumer's event loop:
a heartbeat's answer can give it partitions at any await of a poll, among
them the OffsetFetch that looks up the start positions of the partitions it
got before. Those added meanwhile were never asked about: they must be
looked up in turn, not reset by ``auto_offset_reset``. The chaos run of seed
20240611 (52 duplicates) was this: a ctp member got chaos-a/2, and while its
OffsetFetch for it was out, chaos-a/0 and chaos-a/1 too (the previous owner's
session had run out); those two started from the earliest offset instead of
the group's committed 78 and 45, and their records were transformed again
into committed output."""

from __future__ import annotations

from fake_cluster import FakeCluster

from txlog import Consumer, Producer
from txlog.structs import TopicPartition

FIRST, ADDED = TopicPartition("t", 0), TopicPartition("t", 1)
GROUP = "g"
RECORDS = 10
COMMITTED = {FIRST: 4, ADDED: 7}


class AssignsDuringOffsetFetch(FakeCluster):
    """Gives ``ADDED`` to the consumer (as its membership task does with a
    heartbeat's answer) while the first OffsetFetch is out."""

    def __init__(self):
        super().__init__({"t": 2})
        self.consumer: Consumer | None = None
        self.offset_fetches: list[list[TopicPartition]] = []

    async def call(self, address, rpc, request, *, timeout_ms=None):
        if rpc == "OffsetFetch":
            self.offset_fetches.append(sorted(TopicPartition(p.topic, p.partition) for p in request.partitions))
            if len(self.offset_fetches) == 1:
                self.consumer._assignment_changed(added=frozenset({ADDED}))
        return await super().call(address, rpc, request, timeout_ms=timeout_ms)


def _cluster(kind: type[AssignsDuringOffsetFetch]) -> AssignsDuringOffsetFetch:
    fake = kind()
    with Producer(fake.addresses[0], transport=fake, linger_ms=0) as producer:
        for tp in (FIRST, ADDED):
            for i in range(RECORDS):
                producer.send(tp.topic, f"{tp.partition}-{i}".encode(), partition=tp.partition)
        producer.flush(timeout_s=10)
    fake.group_offsets[GROUP] = dict(COMMITTED)
    return fake


def test_a_partition_assigned_while_an_offset_fetch_is_out_starts_at_its_committed_offset():
    fake = _cluster(AssignsDuringOffsetFetch)
    with Consumer(fake.addresses[0], transport=fake, group_id=GROUP, fetch_max_wait_ms=10, retry_backoff_ms=5) as consumer:
        fake.consumer = consumer
        consumer.assign([FIRST])
        records = []
        for _ in range(100):
            records += consumer.poll(timeout_s=0.05)
            if len(records) >= 2 * RECORDS - sum(COMMITTED.values()):
                break
        positions = {tp: consumer.position(tp) for tp in (FIRST, ADDED)}
    offsets = {tp: [r.offset for r in records if (r.topic, r.partition) == tp] for tp in (FIRST, ADDED)}
    assert fake.offset_fetches[0] == [FIRST]
    assert [ADDED] in fake.offset_fetches[1:], "the partition added during the first OffsetFetch was never looked up"
    assert offsets == {tp: list(range(COMMITTED[tp], RECORDS)) for tp in (FIRST, ADDED)}
    assert positions == {FIRST: RECORDS, ADDED: RECORDS}


class ReassignsDuringOffsetFetch(AssignsDuringOffsetFetch):
    """Takes ``FIRST`` away while the first OffsetFetch is out; another member
    commits further meanwhile, and the group gives it back."""

    async def call(self, address, rpc, request, *, timeout_ms=None):
        if rpc == "OffsetFetch":
            self.offset_fetches.append(sorted(TopicPartition(p.topic, p.partition) for p in request.partitions))
            if len(self.offset_fetches) == 1:
                answer = await FakeCluster.call(self, address, rpc, request, timeout_ms=timeout_ms)  # the old offset
                self.consumer._assignment_changed(revoked=frozenset({FIRST}))
                self.group_offsets[GROUP][FIRST] = COMMITTED[FIRST] + 2
                self.consumer._assignment_changed(added=frozenset({FIRST}))
                return answer
        return await FakeCluster.call(self, address, rpc, request, timeout_ms=timeout_ms)


def test_a_partition_taken_away_and_given_back_during_an_offset_fetch_starts_at_its_new_committed_offset():
    fake = _cluster(ReassignsDuringOffsetFetch)
    with Consumer(fake.addresses[0], transport=fake, group_id=GROUP, fetch_max_wait_ms=10, retry_backoff_ms=5) as consumer:
        fake.consumer = consumer
        consumer.assign([FIRST])
        assert consumer.position(FIRST) == COMMITTED[FIRST] + 2
    assert fake.offset_fetches == [[FIRST], [FIRST]]
