"""partition_svc/txn_verification.py's memory of what the coordinator
confirmed: with Transactions V2 every transaction has an epoch of its own, so
what was confirmed for a producer's earlier epochs is never asked again and
must not be kept (an hour's soak showed a partition_svc growing by it, a key
per partition of every transaction). The coordinator is a stand-in that
confirms everything and counts the asks: the cache is what is tested."""

from __future__ import annotations

import asyncio

from partition_svc import txn_verification
from partition_svc.txn_verification import TransactionVerifier
from txlog.v1 import common_pb2, coordinator_pb2


class ConfirmingCoordinator:
    def __init__(self):
        self.asks = 0

    async def AddPartitionsToTxn(self, request):
        self.asks += 1
        return coordinator_pb2.AddPartitionsToTxnResponse(results=[
            common_pb2.PartitionResult(partition=common_pb2.TopicPartition(topic=p.topic, partition=p.partition))
            for p in request.partitions])


class Peers:
    def __init__(self, coordinator):
        self.coordinator = coordinator

    def coordinator_stub(self, address):
        return self.coordinator


async def address_of(transactional_id: str) -> str:
    return "coordinator:1"


def verifier_and_coordinator():
    coordinator = ConfirmingCoordinator()
    return TransactionVerifier(address_of, Peers(coordinator)), coordinator


PARTITIONS = [("orders", 0), ("orders", 1), ("payments", 2)]


def test_a_confirmation_is_remembered_for_its_transaction_and_not_asked_again():
    verifier, coordinator = verifier_and_coordinator()

    async def run():
        assert await verifier.verify("app", 7, 0, PARTITIONS) == {}
        assert await verifier.verify("app", 7, 0, PARTITIONS[:2]) == {}
        assert coordinator.asks == 1
        assert await verifier.verify("app", 7, 1, PARTITIONS[:1]) == {}, "the next transaction asks again"
        assert coordinator.asks == 2

    asyncio.run(run())


def test_what_is_kept_grows_with_the_producers_not_with_their_transactions():
    verifier, coordinator = verifier_and_coordinator()

    async def run():
        for epoch in range(500):
            for producer_id in (7, 8):
                assert await verifier.verify("app", producer_id, epoch, PARTITIONS) == {}
        assert coordinator.asks == 1000
        # only each producer's last transaction: an earlier epoch's answer is never used again
        assert verifier.remembered() == 2 * len(PARTITIONS)
        assert await verifier.verify("app", 7, 499, PARTITIONS) == {} and coordinator.asks == 1000

    asyncio.run(run())


def test_the_producers_remembered_are_bounded(monkeypatch):
    monkeypatch.setattr(txn_verification, "VERIFIED_PRODUCERS_MAX", 10)
    verifier, _ = verifier_and_coordinator()

    async def run():
        for producer_id in range(50):
            await verifier.verify("app", producer_id, 0, PARTITIONS[:1])
        assert verifier.remembered() == 10

    asyncio.run(run())


def test_a_late_answer_for_an_earlier_transaction_does_not_replace_the_later_ones():
    verifier, coordinator = verifier_and_coordinator()

    async def run():
        assert await verifier.verify("app", 7, 3, PARTITIONS[:1]) == {}
        verifier._remember(7, 2, PARTITIONS[1])  # the coordinator's answer about epoch 2, arriving late
        assert verifier.remembered() == 1
        assert await verifier.verify("app", 7, 3, PARTITIONS[:1]) == {} and coordinator.asks == 1
        assert await verifier.verify("app", 7, 2, PARTITIONS[1:2]) == {} and coordinator.asks == 2, \
            "epoch 2 is asked about again, never answered from another transaction's confirmation"

    asyncio.run(run())


class ForgetfulCoordinator(ConfirmingCoordinator):
    """Answers about the first partition asked only."""

    async def AddPartitionsToTxn(self, request):
        reply = await super().AddPartitionsToTxn(request)
        del reply.results[1:]
        return reply


def test_a_partition_the_coordinator_does_not_answer_for_is_refused():
    verifier = TransactionVerifier(address_of, Peers(ForgetfulCoordinator()))

    async def run():
        refused = await verifier.verify("app", 7, 0, PARTITIONS[:2])
        assert list(refused) == [PARTITIONS[1]], "no answer is no confirmation"
        assert verifier.remembered() == 1

    asyncio.run(run())
