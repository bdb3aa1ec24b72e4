"""The topic registry's deletion writes on a real ZooKeeper: a mark hides the
topic and keeps its name from being created again; the removal takes the
topic's nodes, its reassignments, the acknowledgements and the mark in one
transaction, and only while the controller that decided it still is one."""

from __future__ import annotations

import asyncio

import pytest
from kazoo.client import KazooClient

from partition_svc.topics import TopicInfo, TopicRegistry
from services.tooling.cluster import LocalCluster
from txlog.protocol.errors import ErrorCode, TxlogError

ROOT = "/topic-deletion"
EPOCH_PATH = f"{ROOT}/controller_epoch"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("topic-deletion-zk") / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    zk = KazooClient(hosts=local.state.zookeeper)
    zk.start(timeout=30)
    yield zk
    zk.stop()
    zk.close()
    local.down(grace_s=5)


def test_a_marked_topic_is_hidden_cannot_be_created_again_and_goes_whole_only_under_the_current_controller(client):
    info = TopicInfo("doomed", 2, {}, ((0, 1), (1, 0)), False)
    client.create(EPOCH_PATH, b"1", makepath=True)
    stale = (EPOCH_PATH, client.set(EPOCH_PATH, b"1").version - 1)  # a controller deposed since it read the epoch
    current = (EPOCH_PATH, client.exists(EPOCH_PATH).version)

    async def scenario():
        registry = TopicRegistry(client, ROOT)
        await registry.create(info, controller_epoch=1)
        await registry.request_reassignment("doomed", 0, (1,))
        assert await registry.mark_for_deletion("doomed") and await registry.mark_for_deletion("doomed")  # twice: one mark
        assert not await registry.mark_for_deletion("never-made")
        assert await registry.get("doomed") is None and "doomed" not in await registry.names()
        assert (await registry.versioned("doomed", deleting=True))[0] == info  # the controller still reads it

        with pytest.raises(TxlogError) as refused:
            await registry.create(TopicInfo("doomed", 1, {}, ((0,),), False), controller_epoch=1)
        assert refused.value.code == ErrorCode.Value("TOPIC_ALREADY_EXISTS") and "being deleted" in refused.value.message

        await registry.acknowledge_deletion("doomed", 0)
        await registry.acknowledge_deletion("doomed", 0)  # again: no error
        assert await registry.deletion_acks("doomed") == {0}
        assert not await registry.remove("doomed", stale)
        assert client.exists(f"{ROOT}/topics/doomed/partitions/1/state") is not None and await registry.is_marked("doomed")

        assert await registry.remove("doomed", current)
        for path in ("topics/doomed", "reassignments/doomed", "admin/delete_topics/doomed"):
            assert client.exists(f"{ROOT}/{path}") is None, path
        await registry.acknowledge_deletion("doomed", 1)  # a late acknowledgement makes no mark again
        assert client.exists(f"{ROOT}/admin/delete_topics/doomed") is None
        assert await registry.read_marks() == set()
        again = TopicInfo("doomed", 1, {}, ((0,),), False)
        assert await registry.create(again, controller_epoch=1) == again
        assert await registry.get("doomed", fresh=True) == again

    asyncio.run(scenario())
