"""PartitionService is served by several small servicers, one per concern:
every RPC of the contract by exactly one of them, as a coroutine handler."""

from __future__ import annotations

import asyncio

import pytest

from partition_svc.admin_servicer import AdminServicer
from partition_svc.data_servicer import DataServicer
from partition_svc.group_servicer import GroupServicer
from partition_svc.quota_servicer import QuotaServicer
from partition_svc.server import Routes
from partition_svc.txn_servicer import TransactionServicer
from txlog.v1 import partition_pb2

SERVICERS = (DataServicer, TransactionServicer, GroupServicer, AdminServicer, QuotaServicer)


def test_every_rpc_of_the_contract_is_served_by_exactly_one_servicer():
    rpcs = [m.name for m in partition_pb2.DESCRIPTOR.services_by_name["PartitionService"].methods]
    served = [name for servicer in SERVICERS for name in servicer.RPCS]
    assert sorted(served) == sorted(rpcs)
    for servicer in SERVICERS:
        for name in servicer.RPCS:
            assert asyncio.iscoroutinefunction(getattr(servicer, name)), f"{servicer.__name__}.{name}"


def test_routes_refuse_an_rpc_served_twice():
    class One:
        RPCS = ("Produce",)

        async def Produce(self, request, context):
            return None

    assert asyncio.iscoroutinefunction(Routes(One()).Produce)
    with pytest.raises(ValueError, match="Produce is served twice"):
        Routes(One(), One())
