"""ReplicaFetch and OffsetForLeaderEpoch read the states of partitions not
known here many at once (partition_svc/replication.py). The replica manager
is a fake that counts its ZooKeeper-backed state reads: what is under test is
how the servicer asks, not the reads themselves."""

import asyncio

from partition_svc.replication import STATE_READS_CONCURRENT_MAX, ReplicationServicer
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import replication_pb2


class CountingReplicas:
    def __init__(self):
        self.states = {("known", 0): object()}
        self.read: list[tuple[str, int]] = []
        self.in_flight = self.most_in_flight = 0

    async def state(self, topic: str, index: int):
        self.read.append((topic, index))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return None

    async def leader(self, topic: str, index: int):
        if await self.state(topic, index) is None:  # as ReplicaManager.leader: a state read, then the answer
            raise TxlogError(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"{topic} partition {index} does not exist")
        raise AssertionError("every partition here is unknown")


def test_unknown_partitions_are_read_once_each_and_many_at_once():
    replicas = CountingReplicas()
    named = [replication_pb2.ReplicaFetchPartition(topic=f"t{i % 700}", partition=i % 3) for i in range(3000)]
    named.append(replication_pb2.ReplicaFetchPartition(topic="known", partition=0))
    asyncio.run(ReplicationServicer(replicas, 100)._read_states(named))
    assert sorted(replicas.read) == sorted({(p.topic, p.partition) for p in named} - {("known", 0)})
    assert replicas.most_in_flight == STATE_READS_CONCURRENT_MAX  # not one at a time, and bounded


def test_a_partition_named_many_times_is_looked_up_once_per_request():
    """The hostile fuzz's 380 KB ReplicaFetch names one partition that does not exist thousands of
    times; each naming read ZooKeeper again, which held the caller past its deadline under load."""
    replicas = CountingReplicas()
    named = [replication_pb2.ReplicaFetchPartition(topic="gone", partition=5, fetch_offset=-2)] * 5000
    named += [replication_pb2.ReplicaFetchPartition(topic=f"t{i}", partition=0) for i in range(300)] * 2
    request = replication_pb2.ReplicaFetchRequest(replica_id=1, max_wait_ms=1, partitions=named)
    reply = replication_pb2.ReplicaFetchResponse.FromString(asyncio.run(ReplicationServicer(replicas, 100).ReplicaFetch(request, None)))
    assert sorted(replicas.read) == sorted({(p.topic, p.partition) for p in named})  # once each, however often named
    assert len(reply.results) == len(named)
    assert {ErrorCode.Name(r.error.code) for r in reply.results} == {"UNKNOWN_TOPIC_OR_PARTITION"}
    assert "'gone' partition 5 does not exist" in reply.results[0].error.message
