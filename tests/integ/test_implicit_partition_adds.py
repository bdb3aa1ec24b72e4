"""Transactions V2's implicit partition registration (KIP-890 part 2, issue 18)
through the real services: a producer that sets ProduceRequest.add_to_transaction
never calls AddPartitionsToTxn for the partitions it produces to; their leaders
add them at the coordinator with the transaction's first batch there."""

from __future__ import annotations

import concurrent.futures

from support.reads import values
from support.waiting import wait_until

from tests.integ.txn_raw import TxnProducer, retrying
from txlog import Producer
from txlog.protocol import errors
from txlog.v1 import common_pb2, coordinator_pb2, partition_pb2


def produce(raw, producer: TxnProducer, topic: str, partition: int, value: str, add: bool = True, epoch: int | None = None):
    """One transactional batch, with the add flag; the partition's error code name."""
    sequence = producer.sequences.get((topic, partition), 0)
    batch = common_pb2.RecordBatch(producer_id=producer.producer_id, producer_epoch=producer.producer_epoch if epoch is None else epoch,
                                   base_sequence=sequence, is_transactional=True, records=[common_pb2.Record(value=value.encode())])
    request = partition_pb2.ProduceRequest(acks=-1, transactional_id=producer.transactional_id, add_to_transaction=add,
                                           batches=[partition_pb2.PartitionBatch(topic=topic, partition=partition, batch=batch)])
    result = retrying(lambda: raw.leader(topic, partition).Produce(request, timeout=10)).results[0]
    if result.error.code == 0:
        producer.sequences[(topic, partition)] = sequence + 1
    return errors.ErrorCode.Name(result.error.code)


def test_the_leaders_add_the_partitions_and_the_commit_covers_them(shared_raw):
    shared_raw.create_topic("implicit", 4)  # spread over both partition_svc
    producer = TxnProducer(shared_raw, "implicit-tx").init()
    assert [produce(shared_raw, producer, "implicit", p, f"v{p}") for p in range(4)] == ["NONE"] * 4
    described = producer.describe()
    assert described.state == coordinator_pb2.TRANSACTION_STATE_ONGOING
    assert sorted((tp.topic, tp.partition) for tp in described.partitions) == [("implicit", p) for p in range(4)]
    producer.end(committed=True)
    wait_until(lambda: all(values(shared_raw, "implicit", p) == [f"v{p}"] for p in range(4)), message="the commit on every partition")


def test_without_the_flag_the_leader_still_only_checks(shared_raw):
    shared_raw.create_topic("explicit", 1)
    producer = TxnProducer(shared_raw, "explicit-tx").init()
    refused = produce(shared_raw, producer, "explicit", 0, "v", add=False)
    assert refused not in ("NONE", "UNKNOWN_SERVER_ERROR"), refused
    assert producer.describe().state == coordinator_pb2.TRANSACTION_STATE_EMPTY  # nothing opened
    assert shared_raw.fetch("explicit", 0, 0).batches == []


def test_first_batches_to_many_partitions_at_once_are_all_taken(shared_raw):
    shared_raw.create_topic("fan-out", 8)
    producer = TxnProducer(shared_raw, "fan-out-tx").init()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: produce(shared_raw, producer, "fan-out", p, f"v{p}"), range(8)))
    assert answers == ["NONE"] * 8  # each leader's add waits for the others' instead of CONCURRENT_TRANSACTIONS
    assert len(producer.describe().partitions) == 8
    producer.end(committed=True)
    wait_until(lambda: sum(len(values(shared_raw, "fan-out", p)) for p in range(8)) == 8, message="the commit")


def test_a_fenced_producers_batch_adds_nothing_and_is_not_appended(shared_raw):
    shared_raw.create_topic("fenced-add", 1)
    zombie = TxnProducer(shared_raw, "fenced-add-tx").init()
    old_epoch = zombie.producer_epoch
    TxnProducer(shared_raw, "fenced-add-tx").init()  # a new incarnation
    answer = produce(shared_raw, zombie, "fenced-add", 0, "zombie", epoch=old_epoch)
    assert answer in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), answer
    assert zombie.describe().partitions == []
    assert shared_raw.fetch("fenced-add", 0, 0).batches == []


def test_the_sdk_produces_transactions_without_add_partitions_and_with_them_if_asked(shared_txn_cluster, shared_raw):
    shared_raw.create_topic("sdk-implicit", 2)
    for implicit, tid in ((True, "sdk-implicit-tx"), (False, "sdk-explicit-tx")):
        with Producer(shared_txn_cluster.state.bootstrap, transactional_id=tid, implicit_partition_adds=implicit) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for p in range(2):
                producer.send("sdk-implicit", value=f"{tid}-{p}".encode(), partition=p)
            producer.commit_transaction()
    wait_until(lambda: sorted(v for p in range(2) for v in values(shared_raw, "sdk-implicit", p))
               == sorted(f"{t}-{p}" for t in ("sdk-implicit-tx", "sdk-explicit-tx") for p in range(2)), message="both commits")
