"""Producer ids handed out by services from blocks of producer_id_svc.

:class:`ProducerIdSource` takes a block from producer_id_svc and hands its ids
out one by one, taking a new block when one is used up (one
AllocateProducerIds per 1000 producers); coordinator_svc and partition_svc use
it. :class:`IdempotentProducerInitServicer` is how, as any Kafka broker does,
any partition_svc answers ``InitProducerId`` without a transactional id;
transactional ids belong to their coordinator: NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio

from services.coordination.rpc import PeerClient, answer_of
from services.runtime.server import rpc_handler
from txlog.protocol import PRODUCER_EPOCH_MAX
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import coordinator_pb2, coordinator_pb2_grpc, producer_id_pb2

ALLOCATION_TIMEOUT_S = 5.0


class ProducerIdSource:
    def __init__(self, peers: PeerClient, requester_id: int):
        self.peers = peers
        self.requester_id = requester_id
        self._next = 0
        self._end = 0  # exclusive
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                first, count = await self._allocate_block()
                self._next, self._end = first, first + count
            producer_id = self._next
            self._next += 1
            return producer_id

    async def _allocate_block(self) -> tuple[int, int]:
        live = await self.peers.live("producer_id_svc")
        if not live:
            raise TxlogError(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), "no producer_id_svc is running; retry")
        last_error = None
        request = producer_id_pb2.AllocateProducerIdsRequest(requester_id=self.requester_id)
        for address in live.values():
            try:
                reply = await answer_of(lambda a=address: self.peers.producer_id_stub(a).AllocateProducerIds(
                    request, timeout=ALLOCATION_TIMEOUT_S))
                return reply.first_producer_id, reply.count
            except TxlogError as exc:
                last_error = exc
        raise TxlogError(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), f"producer_id_svc failed: {last_error}; retry")


def previous_producer(request: coordinator_pb2.InitProducerIdRequest) -> tuple[int, int]:
    """The (producer id, epoch) an InitProducerId names, (-1, -1) when it names
    none (both left out, or both -1); one without the other is INVALID_REQUEST."""
    has_id, has_epoch = request.HasField("producer_id"), request.HasField("producer_epoch")
    if has_id != has_epoch:
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                         "InitProducerId sets one of producer_id and producer_epoch: set both (a producer bumping its own "
                         "epoch, KIP-360) or neither (a new producer)")
    if not has_id:
        return -1, -1
    if request.producer_id < -1 or request.producer_epoch < -1 or request.producer_epoch > PRODUCER_EPOCH_MAX \
            or (request.producer_id == -1) != (request.producer_epoch == -1):
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                         f"producer_id and producer_epoch must both be valid (>= 0, 0..{PRODUCER_EPOCH_MAX}) or both -1, "
                         f"got {request.producer_id}/{request.producer_epoch}")
    return request.producer_id, request.producer_epoch


def check_producer(producer_id: int, producer_epoch: int, what: str) -> None:
    """A producer id and epoch as every request that acts as a producer must name them."""
    if producer_id < 0 or not 0 <= producer_epoch <= PRODUCER_EPOCH_MAX:
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                         f"{what}: producer_id must be >= 0 and producer_epoch 0..{PRODUCER_EPOCH_MAX}, "
                         f"got {producer_id}/{producer_epoch}")


def named_producer(request, rpc: str) -> tuple[int, int]:
    """The (producer id, epoch) a transactional request acts as. Both are
    required (proto3 optional only so that absence shows): left out they would
    read as producer 0 at epoch 0, a real id, and be answered PRODUCER_FENCED
    or INVALID_PRODUCER_ID_MAPPING, which point at the wrong cause."""
    missing = [name for name in ("producer_id", "producer_epoch") if not request.HasField(name)]
    if missing:
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                         f"{rpc} leaves out {' and '.join(missing)}: set both to what InitProducerId (or the last "
                         f"EndTxn) answered")
    check_producer(request.producer_id, request.producer_epoch, rpc)
    return request.producer_id, request.producer_epoch


class IdempotentProducerInitServicer(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """InitProducerId without a transactional id. partition_svc serves its
    subclass (partition_svc.bootstrap_servicer.BootstrapCoordinatorServicer), which adds
    FindCoordinator and answers NOT_COORDINATOR for the transactional rpcs."""

    def __init__(self, source: ProducerIdSource):
        self.source = source

    @rpc_handler
    async def InitProducerId(self, request, context):
        previous_producer(request)  # checked even though the answer does not depend on it
        if request.transactional_id:
            raise TxlogError(
                ErrorCode.Value("NOT_COORDINATOR"),
                "a transactional InitProducerId goes to the coordinator of the id (FindCoordinator / Metadata)",
            )
        # Always a new id, as Kafka answers an init without a transactional id: an idempotent producer
        # resetting after an unknown outcome (KIP-360) starts afresh at epoch 0. Bumping the epoch of the id
        # it names would let anyone move any producer id's epoch, a transactional one's included, under
        # its open transaction.
        return coordinator_pb2.InitProducerIdResponse(producer_id=await self.source.next_id(), producer_epoch=0)
