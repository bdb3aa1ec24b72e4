"""Checks with the transaction coordinator that a partition is part of a
producer's open transaction before the leader accepts its first transactional
batch there (Kafka's KIP-890 server-side defence against hanging transactions),
or, when the producer asks for it (ProduceRequest.add_to_transaction, KIP-890
part 2), adds it to the transaction there, saving the producer its own
AddPartitionsToTxn round trip.

A positive answer is cached per (producer id, epoch, partition): every later
batch of that transaction on that partition is accepted without asking again;
with Transactions V2 the epoch changes at every transaction, so the cache never
answers for a transaction it was not asked about. For the same reason only a
producer's latest epoch is kept: an earlier epoch's answers are never used
again (its batches are fenced by the producer state), and keeping every
transaction's grew a partition_svc by tens of MB an hour under steady load.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from partition_svc.partition import Partition
from partition_svc.rpc_errors import request_error
from services.coordination.rpc import PeerClient, answer_of
from txlog.protocol.errors import ErrorCode, TxlogError, error_proto
from txlog.v1 import common_pb2, coordinator_pb2, errors_pb2

NONE = ErrorCode.Value("NONE")
# Producers whose latest transaction's answers are kept; past it the least recently confirmed is
# forgotten, which costs only one more ask if its transaction goes on.
VERIFIED_PRODUCERS_MAX = 10_000


class TransactionVerifier:
    def __init__(self, coordinator_address: Callable[[str], Awaitable[str]], peers: PeerClient):
        self.coordinator_address = coordinator_address
        self.peers = peers
        # producer id -> (its latest confirmed epoch, the partitions confirmed in that transaction)
        self._verified: OrderedDict[int, tuple[int, set[tuple[str, int]]]] = OrderedDict()
        self._in_flight: dict[tuple[int, int, str, int], asyncio.Future] = {}

    async def verify(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]], add: bool = False
    ) -> dict[tuple[str, int], errors_pb2.Error]:
        """The partitions that may NOT take the producer's transactional batches,
        with why. ``add``: add them to the transaction rather than only check."""
        confirmed = self._verified.get(producer_id)
        known = confirmed[1] if confirmed is not None and confirmed[0] == producer_epoch else set()
        unknown = [tp for tp in partitions if tp not in known]
        if not unknown:
            return {}
        # Coalesce: a batch whose partition is being verified already awaits that verification, so the
        # batches of a transaction's first window resume in arrival (= sequence) order.
        waits = {self._in_flight[(producer_id, producer_epoch, *tp)] for tp in unknown if (producer_id, producer_epoch, *tp) in self._in_flight}
        ask = [tp for tp in unknown if (producer_id, producer_epoch, *tp) not in self._in_flight]
        refused = {}
        if ask:
            future = asyncio.get_running_loop().create_future()
            for tp in ask:
                self._in_flight[(producer_id, producer_epoch, *tp)] = future
            answer = {tp: error_proto(ErrorCode.Value("UNKNOWN_SERVER_ERROR"), "the verification was cancelled") for tp in ask}
            try:
                answer = await self._ask(transactional_id, producer_id, producer_epoch, ask, add)
            except Exception as exc:  # noqa: BLE001 - the batches waiting on this ask get it as their answer
                answer = {tp: error_proto(ErrorCode.Value("UNKNOWN_SERVER_ERROR"), str(exc)) for tp in ask}
            finally:  # cancelled too: the batches coalesced onto this ask are answered, and the cancellation goes on
                for tp in ask:
                    self._in_flight.pop((producer_id, producer_epoch, *tp), None)
                future.set_result(answer)
            refused.update(answer)
        for wait in waits:
            answer = await asyncio.shield(wait)
            refused.update({tp: e for tp, e in answer.items() if tp in unknown})
        return refused

    async def _ask(self, transactional_id, producer_id, producer_epoch, unknown, add):
        try:
            address = await self.coordinator_address(transactional_id)
        except TxlogError as exc:
            return {tp: exc.to_proto() for tp in unknown}
        try:
            reply = await answer_of(lambda: self.peers.coordinator_stub(address).AddPartitionsToTxn(
                coordinator_pb2.AddPartitionsToTxnRequest(
                    transactional_id=transactional_id,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in unknown],
                    verify_only=not add,
                )
            ))
        except TxlogError as error:
            return {tp: error_proto(error.code, f"verifying with the coordinator: {error.message}") for tp in unknown}
        # a partition the answer does not name is not confirmed: refused, retriably
        refused = {tp: error_proto(ErrorCode.Value("COORDINATOR_NOT_AVAILABLE"), "the coordinator's answer left this partition out")
                   for tp in unknown}
        for result in reply.results:
            tp = (result.partition.topic, result.partition.partition)
            if tp not in refused:
                continue
            if result.error.code == NONE:
                del refused[tp]
                self._remember(producer_id, producer_epoch, tp)
            else:
                refused[tp] = result.error
        return refused

    @staticmethod
    def needs_verification(transactional_id: str, batch, partition: Partition) -> bool:
        """Whether the coordinator must confirm that the partition is in the
        producer's transaction before the leader takes the batch."""
        if not transactional_id:
            raise request_error("transactional batches need the request's transactional_id")
        entry = partition.producers.get(batch.producer_id)
        if entry is not None and batch.producer_epoch < entry.producer_epoch:
            return False  # a zombie: the producer-state check fences it (PRODUCER_FENCED), no need to ask
        # its transaction open here already: verified with its first batch
        return not (entry is not None and entry.producer_epoch == batch.producer_epoch and entry.current_txn_first_offset >= 0)

    @staticmethod
    def not_in_transaction(tp: tuple[str, int], reason: errors_pb2.Error, added: bool = False) -> errors_pb2.Error:
        said = f"did not add {tp[0]}-{tp[1]} to" if added else f"does not have {tp[0]}-{tp[1]} in"  # added: the leader asked it to
        return error_proto(reason.code, f"the coordinator {said} this transaction: {reason.message}")

    async def verify_transactional(self, transactional_id: str, batch, partition: Partition) -> None:
        """Raises unless the partition is in the producer's open transaction."""
        if self.needs_verification(transactional_id, batch, partition):
            tp = (partition.topic, partition.index)
            refused = await self.verify(transactional_id, batch.producer_id, batch.producer_epoch, [tp])
            if refused:
                reason = self.not_in_transaction(tp, refused[tp])
                raise TxlogError(reason.code, reason.message)

    def _remember(self, producer_id: int, producer_epoch: int, tp: tuple[str, int]) -> None:
        confirmed = self._verified.get(producer_id)
        if confirmed is None or confirmed[0] < producer_epoch:  # a later transaction: the earlier one's answers are done with
            confirmed = self._verified[producer_id] = (producer_epoch, set())
        elif confirmed[0] > producer_epoch:
            return  # a late answer for a transaction the producer has left behind
        confirmed[1].add(tp)
        self._verified.move_to_end(producer_id)
        while len(self._verified) > VERIFIED_PRODUCERS_MAX:
            self._verified.popitem(last=False)

    def remembered(self) -> int:
        """How many (producer, partition) confirmations are kept."""
        return sum(len(partitions) for _, partitions in self._verified.values())
