"""What the network-partition tests (test_zookeeper_partition, test_peer_partition)
ask the real services: an instance's health, and how an acks=all produce is answered."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integ.raw import Raw
from tests.support.errors import error_name
from txlog.protocol import errors
from txlog.two_phase import wait_until
from txlog.v1 import common_pb2, partition_pb2

# A short session, so that a cut instance is replaced within seconds; a replica lag time long enough that a
# loaded machine does not drop the followers from the ISR between a test's check that all are in sync and its
# cut (a leader then dies alone in its ISR, and rightly no other may lead: the scenario is gone).
SESSION = ["--zookeeper-session-timeout-s", "4", "--replica-lag-time-max-ms", "10000",
           "--controller-pass-interval-ms", "1000", "--partition-state-refresh-ms", "1000", "--min-insync-replicas", "2"]


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def produce(raw: Raw, address: str, topic: str, value: bytes) -> str:
    """The error code an acks=all produce of ``value`` is answered with (NONE: acknowledged)."""
    try:
        reply = raw.stub(address).Produce(partition_pb2.ProduceRequest(acks=-1, timeout_ms=3_000, batches=[
            partition_pb2.PartitionBatch(topic=topic, partition=0, batch=common_pb2.RecordBatch(
                records=[common_pb2.Record(value=value)]))]), timeout=30)
    except grpc.RpcError as exc:
        return errors.from_rpc_error(exc).name
    return error_name(reply.results[0])


def partition_zero(raw: Raw, topic: str, address: str | None = None) -> partition_pb2.PartitionMetadata:
    """Partition 0 of ``topic`` as the instance at ``address`` sees it (default: the first that answers)."""
    request = partition_pb2.MetadataRequest(topics=[topic])
    reply = raw.stub(address).Metadata(request, timeout=10) if address else raw.metadata(request)
    return reply.topics[0].partitions[0]


def elected_instead(raw: Raw, topic: str, old: partition_pb2.PartitionMetadata,
                    address: str | None = None) -> partition_pb2.PartitionMetadata:
    """Partition 0's metadata once (as ``address`` sees it) a leader other than ``old``'s leads it."""
    def elected():
        meta = partition_zero(raw, topic, address)
        return meta if meta.leader_id not in (-1, old.leader_id) else None

    wait_until(lambda: elected() is not None, 60, "another leader elected")
    return elected()


def first_acknowledged(raw: Raw, address: str, topic: str, prefix: str) -> bytes:
    """The value of the first acks=all produce the leader at ``address`` acknowledges, tried until one is; each
    attempt sends its own value (``prefix-N``), since one that timed out may be stored too."""
    attempts = iter(range(1000))
    acknowledged = []

    def acknowledges() -> bool:
        value = f"{prefix}-{next(attempts)}".encode()
        if produce(raw, address, topic, value) == "NONE":
            acknowledged.append(value)
        return bool(acknowledged)

    wait_until(acknowledges, 60, f"{address} acknowledging")
    return acknowledged[0]
