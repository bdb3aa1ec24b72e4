"""The gRPC face of producer_id_svc: decode, allocate, answer."""

from __future__ import annotations

import sys

from opentelemetry.metrics import Meter, NoOpMeter

from producer_id_svc.allocator import BlockAllocator
from producer_id_svc.core import BLOCK_SIZE_DEFAULT, check_requester_id
from producer_id_svc.store import ProducerIdBlockStore
from services.runtime import server
from services.runtime.config import Setting, boolean, positive_int
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import producer_id_pb2, producer_id_pb2_grpc

KIND = "producer_id_svc"
SERVICE = producer_id_pb2.DESCRIPTOR.services_by_name["ProducerIdService"]

SETTINGS = (
    Setting("listen", "0.0.0.0:7100", "host:port the gRPC server binds"),
    Setting("producer_id_block_size", BLOCK_SIZE_DEFAULT, "producer ids per block", positive_int),
    Setting(
        "producer_id_prefetch",
        True,
        "reserve the next block in the background after each answer (a crash then skips at most one block)",
        boolean,
    ),
)


class ProducerIdServicer(producer_id_pb2_grpc.ProducerIdServiceServicer):
    def __init__(self, allocator: BlockAllocator, meter: Meter | None = None):
        self.allocator = allocator
        meter = meter or NoOpMeter("txlog")
        self.blocks = meter.create_counter("txlog.producer_id.blocks", description="blocks of producer ids handed out")
        self.ids = meter.create_counter("txlog.producer_id.ids", description="producer ids handed out (in blocks)")

    @server.rpc_handler
    async def AllocateProducerIds(self, request, context):
        if not request.HasField("requester_id"):
            raise TxlogError(ErrorCode.Value("INVALID_REQUEST"), "requester_id is required")
        block = await self.allocator.allocate(check_requester_id(request.requester_id))
        self.blocks.add(1)
        self.ids.add(block.size)
        return producer_id_pb2.AllocateProducerIdsResponse(first_producer_id=block.block_start, count=block.size)


async def build(runtime: server.ServiceRuntime) -> ProducerIdServicer:
    store = ProducerIdBlockStore(runtime.zookeeper, runtime.config.zookeeper_root)
    servicer = ProducerIdServicer(BlockAllocator(
        store, runtime.config.producer_id_block_size, prefetch=runtime.config.producer_id_prefetch
    ), runtime.metrics.meter)
    runtime.add_servicer(servicer, SERVICE)
    return servicer


def main(argv=None) -> int:
    return server.run(KIND, "txlog producer id service", SETTINGS, build, argv)


if __name__ == "__main__":
    sys.exit(main())
