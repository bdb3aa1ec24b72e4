"""The CoordinatorService RPCs any partition_svc answers, so that a client
knowing only the bootstrap addresses needs nothing else."""

from __future__ import annotations

from partition_svc.cluster_view import ClusterView
from partition_svc.rpc_errors import request_error
from services.coordination.producer_ids import IdempotentProducerInitServicer, ProducerIdSource
from services.runtime import server
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.names import check_transactional_id
from txlog.v1 import coordinator_pb2


class BootstrapCoordinatorServicer(IdempotentProducerInitServicer):
    """The CoordinatorService rpcs any partition_svc answers, so that a client
    knowing only the bootstrap addresses needs nothing else: FindCoordinator
    (transactional ids and groups) and InitProducerId without a transactional
    id. The transactional rpcs answer NOT_COORDINATOR: they go to the
    coordinator FindCoordinator names."""

    def __init__(self, source: ProducerIdSource, view: ClusterView):
        super().__init__(source)
        self.view = view

    @server.rpc_handler
    async def FindCoordinator(self, request, context):
        if request.key_type == coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION:
            check_transactional_id(request.key)
            return await self.view.find_transaction_coordinator(request.key)
        if request.key_type == coordinator_pb2.COORDINATOR_KEY_TYPE_GROUP:
            return await self.view.find_group_coordinator(request.key)
        raise request_error(f"unknown key_type {request.key_type}")


def _not_a_coordinator(rpc: str):
    @server.rpc_handler
    async def handler(self, request, context):
        raise TxlogError(ErrorCode.Value("NOT_COORDINATOR"),
                         f"{rpc} is served by transaction coordinators (coordinator_svc), not by partition_svc: ask "
                         "FindCoordinator (any address) where the transactional id's coordinator is")

    handler.__name__ = rpc
    return handler


for _rpc in coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].methods_by_name:
    if _rpc not in ("FindCoordinator", "InitProducerId"):
        setattr(BootstrapCoordinatorServicer, _rpc, _not_a_coordinator(_rpc))
