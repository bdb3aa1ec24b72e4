"""A Produce's batches appended to the partitions this instance leads, and
the wait its acks ask for (as Kafka's ReplicaManager.appendRecords): acks=0
answers at once, acks=1 once each batch is durable here, acks=all once each
is replicated to the in-sync replicas, then says what became of each (its
leader went first; the ISR fell below min.insync.replicas meanwhile)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from partition_svc import validation
from partition_svc.partition import Partition, Produced
from partition_svc.producer_state import Reject
from partition_svc.rpc_errors import error
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.v1 import common_pb2

ACKS_ALL = -1


@dataclass(frozen=True)
class Taken:
    """A batch appended (or a duplicate answered), its result, and what its acks wait for."""

    result: object  # the request's per-partition result
    partition: Partition
    written: asyncio.Future  # acks=1: durable here; acks=all: replicated (True) or leadership gone first (False)


def append(partition: Partition, batch: common_pb2.RecordBatch, acks: int, now_ms: int,
           limits: validation.BatchLimits) -> Produced | Reject:
    """acks=all is refused before anything is appended while the ISR is smaller than min.insync.replicas."""
    refused = partition.check_enough_replicas() if acks == ACKS_ALL else None
    return refused or partition.produce(batch, now_ms, limits)


def written(produced: Produced, acks: int) -> asyncio.Future:
    return produced.replicated if acks == ACKS_ALL else produced.durable


async def wait_for_acks(taken: list[Taken], acks: int, timeout_ms: int) -> None:
    """Returns once every batch is as written as ``acks`` asks (0: at once);
    REQUEST_TIMED_OUT after ``timeout_ms`` (0: no limit): the writes go on,
    and an idempotent retry of a batch is answered as a duplicate once it is."""
    if acks == 0 or not taken:
        return
    done = asyncio.gather(*(t.written for t in taken))
    if timeout_ms:
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout_ms / 1000)
        except TimeoutError:
            raise TxlogError(ErrorCode.Value("REQUEST_TIMED_OUT"),
                             f"the batches were not {'replicated' if acks == ACKS_ALL else 'durable'} within timeout_ms "
                             f"{timeout_ms}; retry them (an idempotent retry is answered as a duplicate once "
                             "they are)") from None
    else:
        await done
    if acks == ACKS_ALL:
        for t in taken:
            check_replicated(t.result, t.partition, t.written.result())


def check_replicated(result, partition: Partition, replicated: bool) -> None:
    """What an acks=all append turned into once it was replicated, or
    once leadership went first: the error its result must carry, if any."""
    if not replicated:
        result.error.CopyFrom(error("NOT_LEADER", f"{partition.topic}-{partition.index} stopped being led here before "
                                    "the batch was replicated; refresh metadata and retry (an idempotent retry is "
                                    "answered as a duplicate if it survived)"))
    elif partition.check_enough_replicas() is not None:
        result.error.CopyFrom(error("NOT_ENOUGH_REPLICAS_AFTER_APPEND",
                                    f"{partition.topic}-{partition.index} was appended, but its in-sync replicas fell "
                                    f"below min.insync.replicas {partition.min_insync_replicas} before it was acknowledged"))
