"""The controller's LeaderAndIsr, sent from this instance while it is the
controller: the changed partition states to every live instance, every
state to those new or restarted."""

from __future__ import annotations

import asyncio
import logging

from partition_svc.controller import PartitionStates
from services.coordination.rpc import PeerClient, answer_of
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import replication_pb2

log = logging.getLogger(__name__)

NONE = ErrorCode.Value("NONE")
LEADER_AND_ISR_TIMEOUT_S = 5.0


class Announcer:
    def __init__(self, node_id: int, peers: PeerClient):
        self.node_id = node_id
        self.peers = peers

    async def announce(self, controller_epoch: int, addresses: dict[int, str], changed: PartitionStates, newcomers: set[int],
                       everything: PartitionStates) -> set[int]:
        """The controller's LeaderAndIsr: the changed states to every live
        instance, every state to those that are new or restarted. Returns the
        instances it failed to tell: the controller's next pass takes them as
        new (every state again)."""
        def request(states: PartitionStates) -> replication_pb2.LeaderAndIsrRequest:
            return replication_pb2.LeaderAndIsrRequest(controller_id=self.node_id, controller_epoch=controller_epoch, partitions=[
                replication_pb2.PartitionState(topic=info.name, partition=index, leader=state.leader,
                                               leader_epoch=state.leader_epoch, isr=state.isr, replicas=info.replicas[index],
                                               zk_version=state.zk_version, controller_epoch=state.controller_epoch,
                                               zk_mzxid=state.zk_mzxid)
                for info, index, state in states])

        async def tell(node: int, address: str) -> bool:
            states = everything if node in newcomers else changed
            if not states:
                return True
            try:
                # wait_for_ready: a channel still backing off from the instance's last life reconnects first
                reply = await answer_of(lambda: self.peers.replication_stub(address).LeaderAndIsr(
                    request(states), wait_for_ready=True, timeout=LEADER_AND_ISR_TIMEOUT_S))
            except TxlogError as exc:  # the controller's next pass sends it every state (its resync is only the safety net)
                log.warning("LeaderAndIsr not delivered", extra=fields(node=node, error=exc.message))
                return False
            refused = [r for r in reply.results if r.error.code != NONE]
            if refused:
                log.warning("LeaderAndIsr refused in part", extra=fields(node=node, first=refused[0].error.message))
            return True

        nodes = list(addresses)
        told = await asyncio.gather(*(tell(node, addresses[node]) for node in nodes))
        return {node for node, ok in zip(nodes, told, strict=True) if not ok}
