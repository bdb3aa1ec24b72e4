"""Raw gRPC steps of a transactional producer, for tests that hand-build them."""

from __future__ import annotations

import time

import grpc

from tests.integ.raw import Raw
from txlog.protocol import errors
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, partition_pb2

RETRIABLE_WAIT_S = 30


def retrying(call):
    deadline = time.monotonic() + RETRIABLE_WAIT_S
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            if not errors.from_rpc_error(exc).retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class TxnProducer:
    """The wire steps of one transactional producer (no batching, one record per send)."""

    def __init__(self, raw: Raw, transactional_id: str, timeout_ms: int = 60_000):
        self.raw = raw
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id = self.producer_epoch = -1
        self.sequences: dict[tuple[str, int], int] = {}

    def coordinator(self) -> coordinator_pb2_grpc.CoordinatorServiceStub:
        def find():
            reply = self.raw.metadata(partition_pb2.MetadataRequest(transactional_ids=[self.transactional_id]))
            found = reply.transaction_coordinators[0]
            if found.error.code:
                raise errors.TxlogError(found.error.code, found.error.message)
            return found.address

        deadline = time.monotonic() + RETRIABLE_WAIT_S
        while True:
            try:
                address = find()
                break
            except errors.TxlogError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        channel = self.raw._channels.setdefault(address, grpc.insecure_channel(address))
        return coordinator_pb2_grpc.CoordinatorServiceStub(channel)

    def init(self):
        reply = retrying(lambda: self.coordinator().InitProducerId(coordinator_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms, producer_id=-1, producer_epoch=-1), timeout=10))
        self.producer_id, self.producer_epoch = reply.producer_id, reply.producer_epoch
        self.sequences.clear()
        return self

    def add(self, *partitions):
        reply = retrying(lambda: self.coordinator().AddPartitionsToTxn(coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions]), timeout=10))
        for result in reply.results:
            assert result.error.code == 0, result

    def send(self, topic, partition, value):
        sequence = self.sequences.get((topic, partition), 0)
        batch = common_pb2.RecordBatch(producer_id=self.producer_id, producer_epoch=self.producer_epoch, base_sequence=sequence,
                                       is_transactional=True, records=[common_pb2.Record(value=value.encode())])
        deadline = time.monotonic() + RETRIABLE_WAIT_S
        while True:  # a retriable answer (the coordinator moved, is loading) is retried as a producer would
            reply = self.raw.leader(topic, partition).Produce(partition_pb2.ProduceRequest(
                acks=-1, transactional_id=self.transactional_id,
                batches=[partition_pb2.PartitionBatch(topic=topic, partition=partition, batch=batch)]), timeout=10)
            result = reply.results[0]
            if result.error.code == 0 or not errors.spec_of(result.error.code).retriable or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if result.error.code == 0:
            self.sequences[(topic, partition)] = sequence + 1
        return result

    def end(self, committed: bool):
        reply = retrying(lambda: self.coordinator().EndTxn(coordinator_pb2.EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            committed=committed), timeout=10))
        self.producer_id, self.producer_epoch = reply.producer_id, reply.producer_epoch
        self.sequences.clear()
        return reply

    def describe(self):
        deadline = time.monotonic() + RETRIABLE_WAIT_S
        while True:  # the id's partition may move between finding its coordinator and asking it: ask again
            described = self.coordinator().DescribeTransactions(
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[self.transactional_id]), timeout=10).transactions[0]
            code = described.error.code
            if code == 0 or not errors.spec_of(code).retriable or time.monotonic() > deadline:
                return described
            time.sleep(0.1)
