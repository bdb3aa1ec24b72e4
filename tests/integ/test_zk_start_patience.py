"""A service's start-up outlives a ZooKeeper session lost while it builds
(zk.patient_for), while a request's call still fails fast: a partition_svc
exited during start-up on a loaded machine when its session was lost."""

from __future__ import annotations

import asyncio

import pytest
from kazoo.client import KazooState
from support.waiting import wait_until

from services.coordination import zk
from txlog.protocol.errors import ErrorCode, TxlogError


@pytest.mark.own_zookeeper  # stops ZooKeeper
def test_a_patient_call_waits_for_the_session_to_come_back_and_an_impatient_one_fails_at_once(cluster):
    client = zk.connect(cluster.state.zookeeper, session_timeout_s=30)
    try:
        cluster.kill("zookeeper")
        wait_until(lambda: client.state != KazooState.CONNECTED, 30, "the client to see ZooKeeper gone")

        async def scenario() -> None:
            with pytest.raises(TxlogError) as impatient:
                await zk.call(client, "ensure_path", "/patience/impatient")
            assert impatient.value.code == ErrorCode.Value("ZOOKEEPER_UNAVAILABLE")
            with zk.patient_for(120):
                patient = asyncio.ensure_future(zk.call(client, "ensure_path", "/patience/patient"))
            await asyncio.sleep(0.2)
            assert not patient.done()  # ZooKeeper is down: nothing can have answered it
            await asyncio.to_thread(cluster.start, "zookeeper")
            await asyncio.wait_for(patient, 120)

        asyncio.run(scenario())
        assert client.exists("/patience/patient") and not client.exists("/patience/impatient")
    finally:
        client.stop()
        client.close()
