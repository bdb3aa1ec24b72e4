"""Raw gRPC calls to partition_svc for tests that hand-build requests."""

from __future__ import annotations

import grpc

from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, errors_pb2, partition_pb2, partition_pb2_grpc


class Raw:
    def __init__(self, cluster):
        self.cluster = cluster
        self._channels = {}

    def stub(self, address) -> partition_pb2_grpc.PartitionServiceStub:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return partition_pb2_grpc.PartitionServiceStub(self._channels[address])

    @property
    def bootstrap(self) -> list[str]:
        return self.cluster.state.bootstrap.split(",")

    def metadata(self, request: partition_pb2.MetadataRequest) -> partition_pb2.MetadataResponse:
        """Metadata from the first instance that answers (some may be down in fault tests)."""
        for address in self.bootstrap:
            try:
                return self.stub(address).Metadata(request, timeout=10)
            except grpc.RpcError as exc:
                failure = exc
        raise failure

    def create_topic(self, name, partitions, **configs):
        reply = self.stub(self.bootstrap[0]).CreateTopics(
            partition_pb2.CreateTopicsRequest(topics=[partition_pb2.CreatableTopic(name=name, partition_count=partitions, configs=configs)]),
            timeout=10,
        )
        assert reply.results[0].error.code == 0, reply
        return reply

    def leaders(self, topic) -> dict[int, str]:
        reply = self.metadata(partition_pb2.MetadataRequest(topics=[topic]))
        return {p.partition: p.leader_address for p in reply.topics[0].partitions}

    def leader(self, topic, partition):
        return self.stub(self.leaders(topic)[partition])

    def producer_id(self) -> int:
        channel = self._channels.setdefault(self.bootstrap[0], grpc.insecure_channel(self.bootstrap[0]))
        reply = coordinator_pb2_grpc.CoordinatorServiceStub(channel).InitProducerId(
            coordinator_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=10
        )
        return reply.producer_id

    def produce(self, topic, partition, batch, stub=None, acks=-1):
        stub = stub or self.leader(topic, partition)
        reply = stub.Produce(
            partition_pb2.ProduceRequest(acks=acks, batches=[partition_pb2.PartitionBatch(topic=topic, partition=partition, batch=batch)]),
            timeout=10,
        )
        return reply.results[0]

    def produce_encoded(self, topic, partition, encoded_batch: bytes, acks=-1):
        """A Produce of one batch in the encoded form (PartitionBatch.encoded_batch)."""
        reply = self.leader(topic, partition).Produce(partition_pb2.ProduceRequest(acks=acks, batches=[
            partition_pb2.PartitionBatch(topic=topic, partition=partition, encoded_batch=encoded_batch)]), timeout=10)
        return reply.results[0]

    def fetch(self, topic, partition, offset, isolation=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED, max_wait_ms=0, stub=None, **limits):
        stub = stub or self.leader(topic, partition)
        reply = stub.Fetch(
            partition_pb2.FetchRequest(
                isolation_level=isolation,
                max_wait_ms=max_wait_ms,
                partitions=[partition_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)],
                **limits,
            ),
            timeout=60,
        )
        return reply.results[0]

    def read_all(self, topic, partition, start=0) -> list[common_pb2.Record]:
        records = self._records_from(topic, partition, start)
        assert records is not None, f"{topic}-{partition}'s log start moved past offset {start} while it was read"
        return records

    def read_from_log_start(self, topic, partition, attempts=10) -> tuple[int, list[common_pb2.Record]]:
        """The partition's log start and every record from there; read again from the new
        start when retention, or the coordinators' cleaning of their log, moves the start
        past the reader meanwhile."""
        for _ in range(attempts):
            start = self._log_start(topic, partition)
            records = self._records_from(topic, partition, start)
            if records is not None:
                return start, records
        raise AssertionError(f"{topic}-{partition}'s log start moved on {attempts} times in a row while it was read")

    def _records_from(self, topic, partition, offset) -> list[common_pb2.Record] | None:
        """Every record from ``offset`` on; None once the log start is past the next offset to read."""
        records = []
        while True:
            result = self.fetch(topic, partition, offset)
            if result.error.code == errors_pb2.ERROR_CODE_OFFSET_OUT_OF_RANGE and offset < self._log_start(topic, partition):
                return None
            assert result.error.code == 0, result.error
            got = [r for b in result.batches for r in b.records]
            if not got:
                return records
            records.extend(got)
            offset = result.next_fetch_offset

    def _log_start(self, topic, partition) -> int:
        return self.list_offset(topic, partition, partition_pb2.OFFSET_SPEC_EARLIEST).offset

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def list_offset(self, topic, partition, spec, timestamp_ms=0):
        reply = self.leader(topic, partition).ListOffsets(
            partition_pb2.ListOffsetsRequest(
                partitions=[partition_pb2.ListOffsetsPartition(topic=topic, partition=partition, spec=spec, timestamp_ms=timestamp_ms)]
            ),
            timeout=10,
        )
        return reply.results[0]

    def producers(self, topic, partition):
        reply = self.leader(topic, partition).DescribeProducers(
            partition_pb2.DescribeProducersRequest(partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)]),
            timeout=10,
        )
        return reply.results[0]

    def close(self):
        for channel in self._channels.values():
            channel.close()


def batch(producer_id, base_sequence, values, epoch=0, **fields):
    return common_pb2.RecordBatch(
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        records=[common_pb2.Record(value=v if isinstance(v, bytes) else str(v).encode()) for v in values],
        **fields,
    )


def plain_batch(values):
    return batch(-1, -1, values, epoch=-1)
