"""The controller's LeaderAndIsr, sent from this instance while it is the
controller: the changed partition states to every live instance, every
state to those new or restarted.

Invariants
----------
* A pass waits at most ``ANNOUNCE_WAIT_S`` on an instance it is not
  connected to, never the whole LeaderAndIsr timeout: an instance killed but
  still registered (its ZooKeeper session not expired yet) must not hold up
  the pass that follows its expiry and elects new leaders. Such an instance
  counts as untold, so the next pass sends it every state. An instance it is
  connected to is waited for (up to the timeout): a slow answer is not a
  reason to send it everything again.
* To each instance the announcements are delivered in the order the passes
  made them: one still in flight holds back the next one for that instance
  (and only for that instance), so an older state never overtakes a newer one
  on the way. An instance gone from the registrations, or back at another
  address, has what was on its way to it cancelled."""

from __future__ import annotations

import asyncio
import logging

import grpc

from partition_svc.controller import PartitionStates
from services.coordination.rpc import PeerClient, answer_of
from services.runtime.logs import fields
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import replication_pb2

log = logging.getLogger(__name__)

NONE = ErrorCode.Value("NONE")
LEADER_AND_ISR_TIMEOUT_S = 5.0
ANNOUNCE_WAIT_S = 1.0


class Announcer:
    def __init__(self, node_id: int, peers: PeerClient, *, wait_s: float = ANNOUNCE_WAIT_S):
        self.node_id = node_id
        self.peers = peers
        self.wait_s = wait_s
        # node -> (the address it was sent to, its latest delivery: the one the next to that address must follow)
        self._last: dict[int, tuple[str, asyncio.Task]] = {}

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
                                               zk_mzxid=state.zk_mzxid, isr_storage_zxids=state.storage_records())
                for info, index, state in states])

        async def tell(node: int, address: str, states: PartitionStates, before: asyncio.Task | None) -> bool:
            if before is not None:
                await asyncio.wait([before])  # its outcome is its own pass's; this one only follows it
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

        for node, (address, task) in list(self._last.items()):
            if task.done():
                del self._last[node]
            elif addresses.get(node) != address:  # gone, or back at another address: what was on its way is moot
                task.cancel()
                del self._last[node]
        deliveries: dict[int, asyncio.Task] = {}
        for node, address in addresses.items():
            states = everything if node in newcomers else changed
            if states:
                before = self._last.get(node, (address, None))[1]
                task = asyncio.create_task(tell(node, address, states, before))
                task.add_done_callback(_retrieved)
                deliveries[node] = task
                self._last[node] = (address, task)
        if deliveries:
            await asyncio.wait(deliveries.values(), timeout=self.wait_s)
            # connected but slow (a loaded instance, a large first announcement): waited for, not sent everything again
            connected = [task for node, task in deliveries.items() if not task.done()
                         and self.peers.channel(addresses[node]).get_state() is grpc.ChannelConnectivity.READY]
            if connected:
                await asyncio.wait(connected)
        return {node for node, task in deliveries.items()
                if not task.done() or task.cancelled() or task.exception() is not None or not task.result()}


def _retrieved(task: asyncio.Task) -> None:
    """Marks a delivery's outcome as seen (one that ends after its pass has returned is nobody's to await)."""
    if not task.cancelled():
        task.exception()
