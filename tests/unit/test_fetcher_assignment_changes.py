"""The fetcher while its assignment changes under it (issue 16): a
subscribed consumer's membership task runs on the same event loop as a
fetch round and may take partitions away (or give new ones, without a
position yet) at any await. bench/groups.py found a round that picked a
partition, awaited a metadata refresh, then read its state after the
membership task had revoked it: KeyError, and the application's poll()
died."""

from __future__ import annotations

import asyncio

from tests.support.fake_transport import UnaryFetch
from txlog.config import ConsumerConfig
from txlog.fetcher import Fetcher
from txlog.metadata import Metadata
from txlog.structs import TopicPartition
from txlog.v1 import common_pb2, partition_pb2

NODE = "127.0.0.1:1"
KNOWN, UNLED, ADDED = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)


class Servers(UnaryFetch):
    """t-0 led by NODE; t-1 without a leader (so a round refreshes metadata
    after choosing what to fetch); ``during_refresh`` runs inside that refresh."""

    def __init__(self):
        self.during_refresh = None
        self.fetched: list[list[tuple[str, int]]] = []

    async def call(self, address, rpc, request, *, timeout_ms=None):
        await asyncio.sleep(0)
        if rpc == "Metadata":
            if self.during_refresh is not None:
                hook, self.during_refresh = self.during_refresh, None
                hook()
            response = partition_pb2.MetadataResponse(brokers=[partition_pb2.NodeInfo(node_id=0, address=NODE)])
            topic = response.topics.add(name="t")
            topic.partitions.add(partition=0, leader_id=0, leader_address=NODE, leader_epoch=0)
            topic.partitions.add(partition=1, leader_id=-1, leader_epoch=0)
            topic.partitions.add(partition=2, leader_id=0, leader_address=NODE, leader_epoch=0)
            return response
        assert rpc == "Fetch", rpc
        self.fetched.append([(p.topic, p.partition) for p in request.partitions])
        response = partition_pb2.FetchResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition, high_watermark=1, last_stable_offset=1,
                                          next_fetch_offset=1)
            if item.fetch_offset == 0:
                result.batches.add(base_offset=0, records=[common_pb2.Record(offset=0, value=b"v")])
        return response

    async def close(self) -> None:
        pass


def fetcher_of(servers: Servers, *tps: TopicPartition) -> Fetcher:
    """A fetcher of ``tps``, each at offset 0."""
    fetcher = Fetcher(Metadata(servers, NODE, refresh_backoff_ms=0), servers,
                      ConsumerConfig(isolation_level="read_uncommitted", retry_backoff_ms=0))
    fetcher.assign(list(tps))
    for tp in tps:
        fetcher.seek(tp, 0)
    return fetcher


def round_with(change) -> tuple[Fetcher, Servers]:
    servers = Servers()
    fetcher = fetcher_of(servers, KNOWN, UNLED)

    async def run():
        await fetcher._metadata.refresh()
        servers.during_refresh = lambda: change(fetcher)
        await fetcher.fetch_once(0)

    asyncio.run(run())
    return fetcher, servers


def test_a_partition_revoked_during_a_round_is_not_fetched_and_breaks_nothing():
    fetcher, servers = round_with(lambda f: f.assign([UNLED]))
    assert KNOWN not in fetcher.states
    assert all(("t", 0) not in request for request in servers.fetched)


def test_a_partition_added_during_a_round_waits_for_its_position():
    fetcher, servers = round_with(lambda f: f.assign([KNOWN, UNLED, ADDED]))
    assert fetcher.states[ADDED].position is None
    assert servers.fetched and all(("t", 2) not in request for request in servers.fetched)
    assert [r.value for r in fetcher.drain(10)] == [b"v"], "the partition still assigned was fetched"


def test_a_paused_partition_is_not_fetched_and_keeps_what_it_had_buffered():
    servers = Servers()
    fetcher = fetcher_of(servers, KNOWN, ADDED)

    async def run():
        await fetcher._metadata.refresh()
        await fetcher.fetch_once(0)  # both buffered
        fetcher.set_paused([KNOWN], True)
        assert [(r.partition, r.value) for r in fetcher.drain(10)] == [(2, b"v")]
        fetcher.set_paused([KNOWN], False)
        assert [(r.partition, r.value) for r in fetcher.drain(10)] == [(0, b"v")], "what was buffered is kept"
        fetcher.seek(KNOWN, 0)
        fetcher.seek(ADDED, 0)
        fetcher.set_paused([KNOWN], True)
        await fetcher.fetch_once(0)
        assert servers.fetched[-1] == [("t", 2)], "the paused partition is left out of the fetch"

    asyncio.run(run())
