"""The transactional Producer against an in-memory fake of the coordinator and
the partition leaders (``tests/unit/fake_cluster.py: FakeCluster``): commit and
abort flows, epochs and sequences across transactions, fencing, abortable
errors, retries, coordinator moves, offsets in transactions, and the calls
the state refuses. Only the network is fake; the SDK's code is the real one."""

import threading

import pytest
from fake_cluster import OFFSETS_TP, FakeCluster
from support.waiting import wait_until

from txlog import (
    ClientTimeoutError,
    Consumer,
    InvalidTxnStateError,
    Producer,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimedOutError,
    TxnState,
)
from txlog.errors import FatalError
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition

E = ErrorCode.Value
FAST = {"retry_backoff_ms": 1, "retry_backoff_max_ms": 5, "linger_ms": 1}
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _producer(fake, transactional_id="tx", **kwargs):
    return Producer(fake.addresses[0], transport=fake, transactional_id=transactional_id, **{**FAST, **kwargs})


def _ready(fake, transactional_id="tx", **kwargs):
    producer = _producer(fake, transactional_id, **kwargs)
    producer.init_transactions(timeout_s=10)
    return producer


def _send_both(producer, values):
    return [producer.send("t", value, partition=i % 2) for i, value in enumerate(values)]


def _batches_of(fake, tp):
    return [(seq, error) for t, seq, error in fake.produce_results if t == tp]


# --- commit and abort ----------------------------------------------------------------------------------


def test_a_committed_transaction_is_visible_on_every_partition_at_once():
    fake = FakeCluster({"t": 2})
    with _ready(fake) as producer:
        producer.begin_transaction()
        futures = _send_both(producer, [b"a", b"b", b"c", b"d"])
        for future in futures:
            future.result(timeout=10)
        assert fake.committed_values(T0) == fake.committed_values(T1) == []  # acknowledged, not yet committed
        assert fake.values(T0) == [b"a", b"c"]  # read_uncommitted sees them
        producer.commit_transaction(timeout_s=10)
        assert producer.transaction_state is TxnState.READY
    assert fake.committed_values(T0) == [b"a", b"c"] and fake.committed_values(T1) == [b"b", b"d"]
    assert [m[2] for m in fake.partitions[T0].markers] == [True]


async def _hold_the_loop(holding: threading.Event, release: threading.Event) -> None:
    holding.set()
    release.wait(60)  # blocks the producer's event loop (its sender) until the test releases it


def test_partitions_are_added_to_the_transaction_before_their_first_batch_is_sent():
    fake = FakeCluster({"t": 2})
    with _ready(fake, implicit_partition_adds=False) as producer:
        producer.partitions_for("t")  # the topic's metadata is known: send() needs nothing from the loop
        producer.begin_transaction()
        holding, release = threading.Event(), threading.Event()
        held = producer._loop.submit(_hold_the_loop(holding, release))
        assert holding.wait(60)
        _send_both(producer, [b"a", b"b"])  # both partitions pending before the sender looks
        release.set()
        held.result(timeout=60)
        producer.commit_transaction(timeout_s=10)
    rpcs = [rpc for _, rpc in fake.calls if rpc in ("AddPartitionsToTxn", "Produce", "EndTxn")]
    assert rpcs.index("AddPartitionsToTxn") < rpcs.index("Produce") < rpcs.index("EndTxn")
    assert fake.count("AddPartitionsToTxn") == 1  # both partitions in one request


def test_every_end_txn_bumps_the_epoch_and_the_next_transaction_starts_at_sequence_zero():
    fake = FakeCluster({"t": 2})
    with _ready(fake, batch_records_max=1) as producer:
        producer_id = producer.producer_id
        assert producer.producer_epoch == 0
        for round_number in range(3):
            producer.begin_transaction()
            for future in _send_both(producer, [b"x%d" % round_number] * 4):
                future.result(timeout=10)
            producer.commit_transaction(timeout_s=10)
            assert producer.producer_epoch == round_number + 1 and producer.producer_id == producer_id
        producer.begin_transaction()
        producer.send("t", b"aborted", partition=0).result(timeout=10)
        producer.abort_transaction(timeout_s=10)
        assert producer.producer_epoch == 4
    assert [epochs for _, _, *epochs in fake.end_txns] == [[0, 1], [1, 2], [2, 3], [3, 4]]
    # two one-record batches per partition per transaction: sequences 0, 1 in every epoch
    assert [seq for seq, _ in _batches_of(fake, T0)] == [0, 1, 0, 1, 0, 1, 0]
    assert all(error == "NONE" for _, _, error in fake.produce_results)


def test_abort_fails_unsent_records_and_leaves_sent_ones_invisible_to_read_committed():
    fake = FakeCluster({"t": 2})
    with _ready(fake, linger_ms=60_000) as producer:
        producer.begin_transaction()
        sent = producer.send("t", b"sent", partition=0)
        producer.flush(timeout_s=10)
        queued = producer.send("t", b"queued", partition=1)  # lingers: not sent when the abort comes
        producer.abort_transaction(timeout_s=10)
        assert producer.transaction_state is TxnState.READY
        assert sent.result(timeout=0).offset == 0
        with pytest.raises(TransactionAbortedError, match="aborted"):
            queued.result(timeout=5)
    assert fake.values(T0) == [b"sent"] and fake.committed_values(T0) == []  # read_uncommitted / read_committed
    assert fake.values(T1) == []
    assert fake.end_txns[-1][1] is False and fake.partitions[T0].aborted == {0}


def test_an_abort_while_partitions_are_being_added_stops_adding_them():
    fake = FakeCluster({"t": 1})
    fake.fail_next("AddPartitionsToTxn", *[E("CONCURRENT_TRANSACTIONS")] * 10_000)
    with _ready(fake, implicit_partition_adds=False) as producer:
        producer.begin_transaction()
        future = producer.send("t", b"v", partition=0)
        wait_until(lambda: fake.count("AddPartitionsToTxn") >= 3, 30, "three refused AddPartitionsToTxn")
        producer.abort_transaction(timeout_s=10)
        with pytest.raises(TransactionAbortedError):
            future.result(timeout=30)
        # the abort returned after the task that adds partitions ended (the sender cancels it and waits for it),
        # and nothing is left for a new one to add: no AddPartitionsToTxn can follow
        adder, txn = producer._sender._add_task, producer._sender._txn
        assert adder is not None and adder.done() and not txn.has_pending_partitions()
        assert producer.transaction_state is TxnState.READY
    assert fake.count("Produce") == 0


def test_records_not_yet_sent_fail_with_transaction_aborted_error():
    fake = FakeCluster({"t": 1})
    with _ready(fake, linger_ms=60_000) as producer:
        producer.begin_transaction()
        futures = [producer.send("t", b"v%d" % i, partition=0) for i in range(5)]  # lingering
        producer.abort_transaction(timeout_s=10)
        for future in futures:
            with pytest.raises(TransactionAbortedError, match="aborted"):
                future.result(timeout=5)
        assert fake.count("Produce") == 0
        producer.begin_transaction()  # the same producer goes on
        producer.send("t", b"next", partition=0)
        producer.commit_transaction(timeout_s=10)
    assert fake.committed_values(T0) == [b"next"]


def test_an_empty_transaction_commits_and_aborts_without_the_coordinator():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        producer.commit_transaction(timeout_s=5)
        producer.begin_transaction()
        producer.abort_transaction(timeout_s=5)
        assert producer.producer_epoch == 0 and producer.transaction_state is TxnState.READY
    assert fake.count("EndTxn") == 0


def test_close_aborts_an_open_transaction():
    fake = FakeCluster({"t": 1})
    producer = _ready(fake)
    producer.begin_transaction()
    producer.send("t", b"never", partition=0).result(timeout=10)
    producer.close(timeout_s=10)
    assert fake.end_txns[-1][1] is False
    assert fake.committed_values(T0) == [] and fake.partitions[T0].aborted == {0}


# --- fencing ------------------------------------------------------------------------------------------------


def test_a_second_producer_with_the_same_id_fences_the_first_whose_records_then_fail():
    fake = FakeCluster({"t": 1})
    zombie = _ready(fake)
    zombie.begin_transaction()
    zombie.send("t", b"zombie-1", partition=0).result(timeout=10)
    with _ready(fake) as successor:  # fences the zombie and aborts its open transaction
        # the fence bumps twice (the zombie's epoch is then neither current nor last), the new incarnation's init once more
        assert successor.producer_id == zombie.producer_id and successor.producer_epoch == 3
        late = zombie.send("t", b"zombie-2", partition=0)
        with pytest.raises(ProducerFencedError, match="zombie: close it"):
            late.result(timeout=10)
        assert zombie.transaction_state is TxnState.FATAL_ERROR
        with pytest.raises(ProducerFencedError) as caught:
            zombie.commit_transaction(timeout_s=10)
        assert "'tx'" in str(caught.value) and "epoch 0" in str(caught.value)
        for call in (zombie.begin_transaction, zombie.abort_transaction, zombie.init_transactions,
                     lambda: zombie.send("t", b"x", partition=0)):
            with pytest.raises(ProducerFencedError):
                call()
        successor.begin_transaction()
        successor.send("t", b"successor", partition=0)
        successor.commit_transaction(timeout_s=10)
    zombie.close(timeout_s=5)
    assert fake.committed_values(T0) == [b"successor"]


def test_a_fenced_commit_raises_producer_fenced_and_commits_nothing():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        producer.send("t", b"v", partition=0).result(timeout=10)
        fake.start_other_producer("tx")
        with pytest.raises(ProducerFencedError):
            producer.commit_transaction(timeout_s=10)
        assert producer.transaction_state is TxnState.FATAL_ERROR
    assert fake.committed_values(T0) == []


def test_invalid_producer_epoch_from_a_leader_is_fencing_for_a_transactional_producer():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        fake.fail_produce(0, lambda _: E("INVALID_PRODUCER_EPOCH"))
        with pytest.raises(ProducerFencedError):
            producer.send("t", b"v", partition=0).result(timeout=10)
        with pytest.raises(ProducerFencedError):
            producer.commit_transaction(timeout_s=10)


def test_init_transactions_fences_an_open_transaction_after_concurrent_transactions_retries():
    fake = FakeCluster({"t": 1})
    first = _ready(fake)
    first.begin_transaction()
    first.send("t", b"open", partition=0).result(timeout=10)
    second = _ready(fake)  # InitProducerId: CONCURRENT_TRANSACTIONS (first's fenced: epoch 2), then epoch 3
    assert second.producer_epoch == 3
    assert fake.count("InitProducerId") == 3
    assert fake.partitions[T0].aborted == {0}
    second.close()
    first.close(timeout_s=5)


# --- abortable errors -------------------------------------------------------------------------------------


def test_a_failed_record_makes_the_commit_raise_and_abort_recovers():
    fake = FakeCluster({"t": 2})
    with _ready(fake) as producer:
        producer.begin_transaction()
        good = producer.send("t", b"good", partition=1)
        good.result(timeout=10)
        fake.fail_produce(1, lambda _: E("INVALID_RECORD"))
        bad = producer.send("t", b"bad", partition=0)
        with pytest.raises(Exception) as caught:
            bad.result(timeout=10)
        assert caught.value.name == "INVALID_RECORD"
        with pytest.raises(TransactionAbortableError) as raised:
            producer.commit_transaction(timeout_s=10)
        assert raised.value.__cause__ is caught.value
        assert producer.transaction_state is TxnState.ABORTABLE_ERROR
        with pytest.raises(TransactionAbortableError, match=r"call abort_transaction\(\)"):
            producer.send("t", b"refused", partition=0)
        with pytest.raises(TransactionAbortableError):
            producer.send_offsets_to_transaction({("in", 0): 1}, "g")
        producer.abort_transaction(timeout_s=10)
        producer.begin_transaction()
        producer.send("t", b"again", partition=0)
        producer.commit_transaction(timeout_s=10)
    assert fake.committed_values(T0) == [b"again"] and fake.committed_values(T1) == []


def test_a_record_refused_before_it_is_sent_makes_the_transaction_abortable():
    fake = FakeCluster({"t": 1}, topic_configs={"t": {"max.record.bytes": "10"}})
    with _ready(fake) as producer:
        producer.begin_transaction()
        producer.send("t", b"small", partition=0)
        too_large = producer.send("t", b"x" * 100, partition=0)
        with pytest.raises(Exception, match="max.record.bytes"):
            too_large.result(timeout=0)
        assert producer.transaction_state is TxnState.ABORTABLE_ERROR
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction(timeout_s=10)  # never commit a transaction that lost a record
        producer.abort_transaction(timeout_s=10)
    assert fake.committed_values(T0) == []


def test_a_fenced_answer_wins_over_an_abortable_one_in_the_same_request():
    fake = FakeCluster({"t": 2}, addresses=("fake-a:1",))  # both partitions in one Produce request
    with _ready(fake, linger_ms=50) as producer:
        producer.begin_transaction()
        fake.fail_produce(0, lambda tp: E("INVALID_RECORD") if tp == T0 else E("PRODUCER_FENCED"))
        futures = [producer.send("t", b"a", partition=0), producer.send("t", b"b", partition=1)]
        producer.flush(timeout_s=10)
        assert fake.count("Produce") == 1
        assert isinstance(futures[1].exception(timeout=0), ProducerFencedError)
        assert producer.transaction_state is TxnState.FATAL_ERROR
        with pytest.raises(ProducerFencedError):
            producer.abort_transaction(timeout_s=10)


@pytest.mark.parametrize("code", ["OUT_OF_ORDER_SEQUENCE", "UNKNOWN_PRODUCER_ID"])
def test_a_sequence_rejection_within_a_transaction_is_abortable_and_the_abort_resets_sequences(code):
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        fake.fail_produce(0, lambda _: E(code))
        future = producer.send("t", b"v", partition=0)
        with pytest.raises(TransactionAbortedError):
            future.result(timeout=10)  # held, then dropped: it was never appended
        with pytest.raises(TransactionAbortableError) as raised:
            producer.commit_transaction(timeout_s=10)
        assert raised.value.__cause__.name == code
        producer.abort_transaction(timeout_s=10)
        epoch = producer.producer_epoch
        producer.begin_transaction()
        producer.send("t", b"w", partition=0).result(timeout=10)
        producer.commit_transaction(timeout_s=10)
    assert epoch == 1
    assert _batches_of(fake, T0)[-1] == (0, "NONE")  # the new epoch starts at sequence 0
    assert fake.committed_values(T0) == [b"w"]


@pytest.mark.parametrize("code, error_type", [("INVALID_TXN_STATE", InvalidTxnStateError),
                                               ("TRANSACTION_TIMED_OUT", TransactionTimedOutError)])
@pytest.mark.parametrize("implicit", [False, True])
def test_an_abortable_add_partitions_answer_fails_the_transaction(code, error_type, implicit):
    """Explicit adds: the producer's AddPartitionsToTxn is refused, the batch is never sent.
    Implicit adds (KIP-890 part 2): the leader's add is refused, and with it the batch."""
    fake = FakeCluster({"t": 1})
    with _ready(fake, implicit_partition_adds=implicit) as producer:
        producer.begin_transaction()
        fake.fail_add_partitions(lambda _: E(code))
        future = producer.send("t", b"v", partition=0)
        with pytest.raises(error_type if implicit else TransactionAbortedError):
            future.result(timeout=10)
        with pytest.raises(TransactionAbortableError) as raised:
            producer.commit_transaction(timeout_s=10)
        assert isinstance(raised.value.__cause__, error_type)
        producer.abort_transaction(timeout_s=10)
        assert producer.transaction_state is TxnState.READY
    assert fake.count("Produce") == (1 if implicit else 0)
    assert fake.values(T0) == []


def test_a_timed_out_end_txn_commit_is_abortable_and_the_abort_goes_through():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        producer.send("t", b"v", partition=0).result(timeout=10)
        fake.fail_next("EndTxn", E("TRANSACTION_TIMED_OUT"))
        with pytest.raises(TransactionAbortableError) as raised:
            producer.commit_transaction(timeout_s=10)
        assert isinstance(raised.value.__cause__, TransactionTimedOutError)
        producer.abort_transaction(timeout_s=10)
        assert producer.producer_epoch == 1
    assert fake.committed_values(T0) == []


def test_an_abort_the_coordinator_refuses_bumps_the_epoch_with_kip_360():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        producer.send("t", b"v", partition=0).result(timeout=10)
        fake.fail_next("EndTxn", E("INVALID_TXN_STATE"))
        producer.abort_transaction(timeout_s=10)
        assert producer.transaction_state is TxnState.READY
        # the init's own abort bumped the epoch to 1; its retry is answered that epoch (KIP-360: no second bump)
        assert producer.producer_epoch == 1
        producer.begin_transaction()
        producer.send("t", b"w", partition=0)
        producer.commit_transaction(timeout_s=10)
    assert fake.count("InitProducerId") == 3  # init, then the bump: CONCURRENT_TRANSACTIONS, then answered
    assert fake.committed_values(T0) == [b"w"]


def test_a_fatal_init_answer_makes_the_producer_fatal():
    fake = FakeCluster({"t": 1})
    fake.fail_next("InitProducerId", E("INVALID_TRANSACTION_TIMEOUT"))
    with _producer(fake) as producer:
        with pytest.raises(FatalError) as caught:
            producer.init_transactions(timeout_s=10)
        assert caught.value.name == "INVALID_TRANSACTION_TIMEOUT"
        assert producer.transaction_state is TxnState.FATAL_ERROR
        with pytest.raises(FatalError):
            producer.begin_transaction()


# --- retries and coordinator discovery -------------------------------------------------------------------


@pytest.mark.parametrize("implicit", [False, True])
def test_concurrent_transactions_answers_are_retried_everywhere(implicit):
    fake = FakeCluster({"t": 1})
    fake.fail_next("InitProducerId", *[E("CONCURRENT_TRANSACTIONS")] * 3)
    fake.fail_next("AddPartitionsToTxn", *[E("CONCURRENT_TRANSACTIONS")] * 2)
    fake.fail_next("EndTxn", *[E("CONCURRENT_TRANSACTIONS")] * 2)
    with _ready(fake, implicit_partition_adds=implicit) as producer:
        producer.begin_transaction()
        fake.fail_add_partitions(lambda _: E("CONCURRENT_TRANSACTIONS"))  # per partition, too (the leader's add, implicitly)
        producer.send("t", b"v", partition=0)
        producer.commit_transaction(timeout_s=10)
    assert fake.count("InitProducerId") == 4 and fake.count("EndTxn") == 3
    if implicit:  # the leader's add was refused once, with its batch, which went again
        assert fake.count("AddPartitionsToTxn") == 0 and fake.count("Produce") == 2
    else:
        assert fake.count("AddPartitionsToTxn") == 4 and fake.count("Produce") == 1
    assert fake.committed_values(T0) == [b"v"]


def test_an_end_txn_whose_answer_was_lost_is_retried_and_answered_the_same_epoch():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        fake.fail_next("EndTxn", E("REQUEST_TIMED_OUT"), after_handling=True)
        producer.commit_transaction(timeout_s=10)
        assert producer.producer_epoch == 1
    assert [(committed, asked, answered) for _, committed, asked, answered in fake.end_txns] == [
        (True, 0, 1), (True, 0, 1)]
    assert fake.committed_values(T0) == [b"v"]


@pytest.mark.parametrize("code", ["NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
                                  "LEADER_NOT_AVAILABLE"])
def test_coordinator_errors_make_the_producer_find_the_coordinator_again(code):
    fake = FakeCluster({"t": 1})
    fake.fail_next("InitProducerId", E(code))
    with _ready(fake) as producer:
        assert fake.count("Metadata") >= 2  # looked up again after the error
        assert producer.transaction_state is TxnState.READY


@pytest.mark.parametrize("implicit", [False, True])
def test_a_moved_coordinator_is_found_again_through_metadata(implicit):
    fake = FakeCluster({"t": 1})
    with _ready(fake, implicit_partition_adds=implicit) as producer:
        fake.move_coordinator("fake-coordinator-2:9")
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        producer.commit_transaction(timeout_s=10)
    coordinator_rpcs = [address for address, rpc in fake.calls if rpc == "EndTxn"]
    # explicit adds: AddPartitionsToTxn met the move; implicit: EndTxn is the first to, and goes again
    assert coordinator_rpcs == (["fake-coordinator:9", "fake-coordinator-2:9"] if implicit else ["fake-coordinator-2:9"])
    assert fake.committed_values(T0) == [b"v"]


def test_find_coordinator_is_asked_when_metadata_knows_no_coordinator():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        fake.coordinator_available = False
        fake.move_coordinator("fake-coordinator-2:9")
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        producer.commit_transaction(timeout_s=10)
    assert ("fake-coordinator:9", "FindCoordinator") in fake.calls
    assert fake.committed_values(T0) == [b"v"]


def test_a_commit_that_times_out_goes_on_and_a_second_call_waits_for_it():
    fake = FakeCluster({"t": 1})
    with _ready(fake, retry_backoff_ms=40, retry_backoff_max_ms=40) as producer:
        producer.begin_transaction()
        producer.send("t", b"v", partition=0).result(timeout=10)
        fake.fail_next("EndTxn", *[E("CONCURRENT_TRANSACTIONS")] * 5)
        with pytest.raises(ClientTimeoutError, match=r"call commit_transaction\(\) again"):
            producer.commit_transaction(timeout_s=0.02)
        assert producer.transaction_state is TxnState.COMMITTING
        with pytest.raises(TransactionStateError, match="being committed"):
            producer.begin_transaction()
        with pytest.raises(TransactionStateError, match="being committed"):
            producer.abort_transaction()
        producer.commit_transaction(timeout_s=10)
        assert producer.transaction_state is TxnState.READY
    assert fake.committed_values(T0) == [b"v"]


# --- offsets in a transaction ---------------------------------------------------------------------------


def test_offsets_sent_to_a_transaction_are_committed_only_with_it():
    fake = FakeCluster({"t": 1, "in": 2})
    with _ready(fake) as producer, Consumer(fake.addresses[0], transport=fake, group_id="g") as consumer, \
            Consumer(fake.addresses[0], transport=fake, group_id="g", isolation_level="read_uncommitted") as peeker:
        producer.begin_transaction()
        producer.send("t", b"out", partition=0).result(timeout=10)  # its leader added t-0 (implicit adds)
        producer.send_offsets_to_transaction({("in", 0): 10, TopicPartition("in", 1): 20}, "g")
        assert peeker.committed(("in", 0)) is None  # pending until the COMMIT marker
        assert fake.transactions["tx"].partitions == {T0, OFFSETS_TP}
        producer.commit_transaction(timeout_s=10)
        assert consumer.committed(("in", 0)) == 10 and consumer.committed(("in", 1)) == 20
        producer.begin_transaction()
        producer.send_offsets_to_transaction({("in", 0): 99}, "g")
        producer.abort_transaction(timeout_s=10)
        assert consumer.committed(("in", 0)) == 10  # an aborted transaction's offsets never apply
    rpcs = [rpc for _, rpc in fake.calls if rpc in ("AddOffsetsToTxn", "TxnOffsetCommit")]
    assert rpcs == ["AddOffsetsToTxn", "TxnOffsetCommit"] * 2


def test_a_txn_offset_commit_at_a_moved_group_coordinator_is_retried():
    fake = FakeCluster({"t": 1, "in": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        fake.fail_next("TxnOffsetCommit", E("NOT_COORDINATOR"), E("COORDINATOR_LOAD_IN_PROGRESS"))
        producer.send_offsets_to_transaction({("in", 0): 5}, "g")
        producer.commit_transaction(timeout_s=10)
    assert fake.group_offsets["g"] == {TopicPartition("in", 0): 5}
    assert fake.count("TxnOffsetCommit") == 3


def test_a_refused_offset_commit_makes_the_transaction_abortable():
    fake = FakeCluster({"t": 1, "in": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        fake.fail_next("TxnOffsetCommit", E("INVALID_TXN_STATE"))
        with pytest.raises(TransactionAbortableError) as raised:
            producer.send_offsets_to_transaction({("in", 0): 5}, "g")
        assert isinstance(raised.value.__cause__, InvalidTxnStateError)
        assert producer.transaction_state is TxnState.ABORTABLE_ERROR
        producer.abort_transaction(timeout_s=10)
    assert "g" not in fake.group_offsets


def test_offsets_are_checked_before_anything_is_sent():
    fake = FakeCluster({"t": 1})
    with _ready(fake) as producer:
        producer.begin_transaction()
        for offsets, group in (({("in", 0): -1}, "g"), ({("in", 0): "1"}, "g"), ({("in", 0): 1}, ""),
                               ({("in", 0): 1}, "bad group!")):
            with pytest.raises(ValueError):
                producer.send_offsets_to_transaction(offsets, group)
        with pytest.raises(TypeError):
            producer.send_offsets_to_transaction({"in": 1}, "g")
    assert fake.count("AddOffsetsToTxn") == 0


# --- calls the state refuses --------------------------------------------------------------------------------


def test_illegal_calls_raise_and_say_what_to_do():
    fake = FakeCluster({"t": 1})
    with _producer(fake) as producer:
        assert producer.transaction_state is TxnState.UNINITIALIZED
        with pytest.raises(TransactionStateError, match=r"init_transactions\(\) has not been called"):
            producer.send("t", b"v", partition=0)
        with pytest.raises(TransactionStateError, match=r"init_transactions\(\) has not been called"):
            producer.begin_transaction()
        producer.init_transactions(timeout_s=10)
        with pytest.raises(TransactionStateError, match=r"has completed already: call begin_transaction\(\)"):
            producer.init_transactions()
        with pytest.raises(TransactionStateError, match=r"no transaction is open: call begin_transaction\(\) first"):
            producer.commit_transaction()
        with pytest.raises(TransactionStateError, match="no transaction is open"):
            producer.abort_transaction()
        with pytest.raises(TransactionStateError, match="no transaction is open"):
            producer.send("t", b"v", partition=0)
        with pytest.raises(TransactionStateError, match="no transaction is open"):
            producer.send_offsets_to_transaction({("t", 0): 1}, "g")
        producer.begin_transaction()
        with pytest.raises(TransactionStateError, match="a transaction is open already"):
            producer.begin_transaction()
        producer.abort_transaction(timeout_s=10)
    assert fake.count("Produce") == 0


def test_transactional_calls_on_a_producer_without_transactional_id_are_refused():
    fake = FakeCluster({"t": 1})
    with Producer(fake.addresses[0], transport=fake, **FAST) as producer:
        for call in (producer.init_transactions, producer.begin_transaction, producer.commit_transaction,
                     producer.abort_transaction):
            with pytest.raises(TransactionStateError, match="transactional_id"):
                call()
        assert producer.transaction_state is None


def test_transactional_settings_are_checked():
    with pytest.raises(ValueError, match="enable_idempotence"):
        Producer("h:1", transactional_id="tx", enable_idempotence=False, acks=1)
    with pytest.raises(ValueError, match="transactional_id"):
        Producer("h:1", transactional_id="x" * 256)
    with pytest.raises(ValueError, match="transaction_timeout_ms"):
        Producer("h:1", transactional_id="tx", transaction_timeout_ms=0)


def test_sends_from_many_threads_all_land_in_the_transaction_they_passed_the_check_in():
    fake = FakeCluster({"t": 2})
    with _ready(fake) as producer:
        producer.begin_transaction()
        accepted, refused = [], []

        def sender(worker):
            for i in range(200):
                try:
                    accepted.append(producer.send("t", b"%d-%d" % (worker, i), partition=i % 2))
                except TransactionStateError:
                    refused.append(i)
                    return

        threads = [threading.Thread(target=sender, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        wait_until(lambda: accepted, 30, "the first records accepted")  # the commit comes while they send
        producer.commit_transaction(timeout_s=10)
        for thread in threads:
            thread.join()
        for future in accepted:
            future.result(timeout=0)  # every accepted record was part of the commit
    assert len(fake.committed_values(T0)) + len(fake.committed_values(T1)) == len(accepted)
