"""producer_id_svc against a real ZooKeeper, as real processes."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from kazoo.exceptions import NoNodeError
from support.waiting import wait_until

from producer_id_svc.core import PRODUCER_ID_MAX, ProducerIdBlock
from services.coordination import zk
from services.tooling.cluster import health_serving
from txlog.v1 import producer_id_pb2, producer_id_pb2_grpc

WORKER = str(Path(__file__).with_name("allocate_worker.py"))
NODE = "/txlog/latest_producer_id_block"


def start_worker(address, requester_id, count, pause_s=0.0):
    return subprocess.Popen(
        [sys.executable, WORKER, address, "--requester-id", str(requester_id), "--count", str(count),
         "--pause-s", str(pause_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(worker, timeout_s=240):
    out, err = worker.communicate(timeout=timeout_s)
    assert worker.returncode == 0, err
    return json.loads(out)


def assert_disjoint_full_blocks(blocks, block_size=1000):
    ids = set()
    for first, count in blocks:
        assert count == block_size, (first, count)
        block_ids = range(first, first + count)  # no gaps inside a block
        assert ids.isdisjoint(block_ids), f"block at {first} handed out twice or overlapping"
        ids.update(block_ids)
    assert len(ids) == len(blocks) * block_size


def node_version(cluster):
    client = zk.connect(cluster.state.zookeeper)
    try:
        data, stat = client.get(NODE)
        return data, stat.version
    finally:
        client.stop()
        client.close()


def call(address, **request_fields):
    with grpc.insecure_channel(address) as channel:
        stub = producer_id_pb2_grpc.ProducerIdServiceStub(channel)
        return stub.AllocateProducerIds(producer_id_pb2.AllocateProducerIdsRequest(**request_fields), timeout=10)


def error_info(rpc_error):
    for key, value in rpc_error.trailing_metadata():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info
    return None


def test_eight_concurrent_allocator_processes_get_every_id_exactly_once(cluster):
    services = [cluster.add_service("producer_id_svc", node_id) for node_id in range(4)]
    workers = [start_worker(services[i % 4].address, requester_id=i, count=200) for i in range(8)]
    blocks = [block for worker in workers for block in finish(worker)]
    assert len(blocks) == 1600
    assert_disjoint_full_blocks(blocks)
    # without faults the only ids not handed out are the blocks each instance reserved ahead
    starts = set(first for first, _ in blocks)
    skipped = set(range(0, max(starts) + 1000, 1000)) - starts
    assert len(skipped) <= 4, skipped


@pytest.mark.own_zookeeper  # stops ZooKeeper
def test_zookeeper_restarted_mid_allocation_resumes_without_repeating_a_block(cluster):
    service = cluster.add_service("producer_id_svc", 0)
    worker = start_worker(service.address, requester_id=1, count=150, pause_s=0.02)  # 150 blocks: 3 s at least
    wait_until(lambda: node_version(cluster)[1] >= 10, 60, "the worker's first blocks written",
               ignoring=lambda exc: isinstance(exc, NoNodeError))  # until the first block creates the node
    cluster.kill("zookeeper")
    wait_until(lambda: not health_serving(service.address), 15, "health NOT_SERVING without ZooKeeper")
    # the block reserved ahead may still be handed out; after it, calls fail, retriably
    during_outage = []
    with pytest.raises(grpc.RpcError) as info:
        for _ in range(3):
            reply = call(service.address, requester_id=2)
            during_outage.append([reply.first_producer_id, reply.count])
    assert len(during_outage) <= 1
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(info.value).reason == "ZOOKEEPER_UNAVAILABLE"
    cluster.start("zookeeper")
    blocks = finish(worker)
    assert len(blocks) == 150
    assert_disjoint_full_blocks(blocks + during_outage)
    wait_until(lambda: health_serving(service.address), 15, "health SERVING again after ZooKeeper came back")
    later = call(service.address, requester_id=2)
    assert later.first_producer_id > max(first for first, _ in blocks + during_outage)


@pytest.mark.parametrize(
    "request_fields, mentions",
    [
        ({}, "requester_id is required"),
        ({"requester_id": -1}, "-1"),
        ({"requester_id": 2**40}, str(2**40)),
        ({"requester_id": -(2**63)}, str(-(2**63))),
    ],
)
def test_bad_requests_are_invalid_argument_and_write_nothing(cluster, request_fields, mentions):
    service = cluster.add_service("producer_id_svc", 0)
    call(service.address, requester_id=1)
    # the block the service reserves ahead after answering (in the background: a full run once saw it written
    # after `before` was read)
    wait_until(lambda: json.loads(node_version(cluster)[0])["block_start"] == 1000, 30, "the block reserved ahead written")
    before = node_version(cluster)
    with pytest.raises(grpc.RpcError) as info:
        call(service.address, **request_fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert mentions in info.value.details()
    assert error_info(info.value).reason == "INVALID_REQUEST"
    assert node_version(cluster) == before
    assert call(service.address, requester_id=1).first_producer_id == 1000


def test_exhausted_id_space_is_a_clear_error_and_writes_nothing(cluster):
    client = zk.connect(cluster.state.zookeeper)
    near_end = ProducerIdBlock(9, PRODUCER_ID_MAX - 1500, PRODUCER_ID_MAX - 501)
    client.create(NODE, near_end.encode(), makepath=True)
    client.stop()
    client.close()
    service = cluster.add_service("producer_id_svc", 0)
    with pytest.raises(grpc.RpcError) as info:
        call(service.address, requester_id=1)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(info.value).reason == "PRODUCER_IDS_EXHAUSTED"
    assert node_version(cluster) == (near_end.encode(), 0)


def test_blocks_continue_after_the_service_is_killed_and_restarted(cluster):
    service = cluster.add_service("producer_id_svc", 0)
    first = [call(service.address, requester_id=1).first_producer_id for _ in range(3)]
    cluster.kill(service.name)
    cluster.start(service.name)
    after = call(service.address, requester_id=1).first_producer_id
    assert first == [0, 1000, 2000]
    assert after in (3000, 4000)  # 3000 if the block reserved ahead was not yet written when killed


def test_allocation_through_the_async_channel_helper(cluster):
    from txlog.net.channels import open_channel

    service = cluster.add_service("producer_id_svc", 0)

    async def run():
        async with open_channel(service.address) as channel:
            stub = producer_id_pb2_grpc.ProducerIdServiceStub(channel)
            replies = await asyncio.gather(
                *[stub.AllocateProducerIds(producer_id_pb2.AllocateProducerIdsRequest(requester_id=5)) for _ in range(20)]
            )
            return [[r.first_producer_id, r.count] for r in replies]

    blocks = asyncio.run(run())
    assert_disjoint_full_blocks(blocks)
    writes = node_version(cluster)[1] + 1  # the create, then one set per version
    assert writes <= 21  # at most one write per block, plus the block reserved ahead


def test_sequential_allocations_write_once_per_block(cluster):
    service = cluster.add_service("producer_id_svc", 0)
    blocks = [[r.first_producer_id, r.count] for r in (call(service.address, requester_id=3) for _ in range(30))]
    assert_disjoint_full_blocks(blocks)
    wait_until(lambda: node_version(cluster)[1] + 1 >= 31, 30, "the block reserved ahead written")
    data, version = node_version(cluster)
    assert version + 1 == 31  # 30 blocks answered + 1 reserved ahead
    assert ProducerIdBlock.decode(data).block_start == 30000
