"""The replay faults' parts without a cluster: the orders between nemesis and
worker, the marker rebuilt from a producer's recorded requests, the answers,
and a worker's Replayer from order to delivery. Deliveries go to a loopback
port nothing listens on (a real refused connection: the replay is recorded as
not delivered)."""

import itertools
import random
import threading

import pytest

from services.tooling.chaos.faults import FAULT_KINDS, FaultEvent, Nemesis
from services.tooling.chaos.history import REPLAY_KINDS, History, read_events
from services.tooling.chaos.replay import (
    Order,
    RecordingTransport,
    Replayer,
    answers_of,
    check_local,
    delivered,
    marker_producer,
    marker_request,
    opposite,
    partitions_by_leader,
    pending_orders,
    read_done,
    send,
    wait_done,
    write_done,
    write_order,
)
from services.tooling.cluster import free_port
from txlog.protocol import PRODUCER_EPOCH_MAX
from txlog.v1 import common_pb2, coordinator_pb2, errors_pb2, partition_pb2

LEADER_A, LEADER_B, COORDINATOR = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"


def produce(tps, producer_id=7, epoch=3, tid="chaos-p0"):
    return partition_pb2.ProduceRequest(transactional_id=tid, acks=-1, batches=[
        partition_pb2.PartitionBatch(topic=t, partition=p, leader_epoch=-1, batch=common_pb2.RecordBatch(
            producer_id=producer_id, producer_epoch=epoch, base_sequence=0, is_transactional=True,
            records=[common_pb2.Record(value=b"x")])) for t, p in tps])


def produced_ok(tps):
    return partition_pb2.ProduceResponse(results=[partition_pb2.ProducePartitionResult(topic=t, partition=p,
                                                                                        base_offset=10)
                                                  for t, p in tps])


def end_txn(committed=True, producer_id=7, epoch=3):
    return coordinator_pb2.EndTxnRequest(transactional_id="chaos-p0", producer_id=producer_id,
                                         producer_epoch=epoch, committed=committed)


def closed_address() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there: connection refused


# --- orders -------------------------------------------------------------------------------------------------


def test_an_order_round_trips_and_only_a_produce_goes_into_its_own_transaction():
    order = Order(3, "replay_produce", 1.25, "same")
    assert Order.from_json(order.to_json()) == order
    assert Order.from_json('{"seq": 1, "kind": "replay_marker", "delay_s": 2}').into == "next"
    with pytest.raises(ValueError):
        Order(1, "replay_marker", 1.0, "same")
    with pytest.raises(ValueError):
        Order(1, "replay_everything", 1.0)
    assert set(REPLAY_KINDS) <= set(FAULT_KINDS)


def test_orders_are_taken_oldest_first_once_and_answered(tmp_path):
    assert pending_orders(tmp_path, "p0", set()) == []
    write_order(tmp_path, "p0", Order(12, "replay_marker", 1.0))
    write_order(tmp_path, "p0", Order(4, "replay_end_txn", 2.0))
    write_order(tmp_path, "p1", Order(5, "replay_produce", 2.0))
    (tmp_path / "replay" / "p0" / "00020.json").write_text('{"seq": 20, "ki')  # torn: skipped
    assert [o.seq for o in pending_orders(tmp_path, "p0", set())] == [4, 12]
    assert [o.seq for o in pending_orders(tmp_path, "p0", {4})] == [12]
    assert read_done(tmp_path, "p0", 4) is None
    write_done(tmp_path, "p0", 4, {"delivered": True})
    assert read_done(tmp_path, "p0", 4) == {"delivered": True}


def test_waiting_for_an_answer_is_bounded_and_stops_on_request(tmp_path):
    stop = threading.Event()
    assert wait_done(tmp_path, "p0", 1, 0.2, stop) is None
    stop.set()
    assert wait_done(tmp_path, "p0", 1, 60, stop) is None  # returns at once
    write_order(tmp_path, "p0", Order(1, "replay_marker", 1.0))
    write_done(tmp_path, "p0", 1, {"delivered": False})
    assert wait_done(tmp_path, "p0", 1, 60, threading.Event()) == {"delivered": False}


# --- rebuilding and answering ---------------------------------------------------------------------------


def test_markers_carry_the_epoch_end_txn_answered_or_the_old_id_at_the_top_epoch():
    assert marker_producer(end_txn(epoch=3), coordinator_pb2.EndTxnResponse(producer_id=7, producer_epoch=4)) == (7, 4)
    exhausted = coordinator_pb2.EndTxnResponse(producer_id=9, producer_epoch=0)
    assert marker_producer(end_txn(epoch=PRODUCER_EPOCH_MAX - 1), exhausted) == (7, PRODUCER_EPOCH_MAX)


def test_a_transactions_partitions_by_leader_come_from_its_own_produce_requests():
    transport = RecordingTransport()
    transport.remember(LEADER_A, "Produce", produce([("a", 0), ("a", 2)]))
    transport.remember(LEADER_B, "Produce", produce([("b", 1)]))
    transport.remember(LEADER_A, "Produce", produce([("a", 0)]))  # a retry
    transport.remember(LEADER_B, "Produce", produce([("b", 0)], epoch=4))  # the next transaction
    transport.remember(LEADER_B, "Produce", produce([("b", 0)], producer_id=8))  # another producer id
    produced, ended = transport.since(0)
    assert ended == []
    assert partitions_by_leader(produced, 7, 3) == {LEADER_A: [("a", 0), ("a", 2)], LEADER_B: [("b", 1)]}
    assert [s.n for s in transport.since(4)[0]] == [5]


def test_the_marker_request_is_the_coordinators():
    request = marker_request("chaos-p0", 7, 4, False, 2, [("a", 0), ("b", 1)])
    (marker,) = request.markers
    assert (marker.producer_id, marker.producer_epoch, marker.committed, marker.coordinator_epoch,
            marker.transactional_id) == (7, 4, False, 2, "chaos-p0")
    assert [(tp.topic, tp.partition) for tp in marker.partitions] == [("a", 0), ("b", 1)]


def test_answers_name_each_partitions_error_and_a_refused_connection_is_not_a_delivery():
    fenced = errors_pb2.Error(code=errors_pb2.ERROR_CODE_PRODUCER_FENCED)
    markers = partition_pb2.WriteTxnMarkersResponse(markers=[partition_pb2.TxnMarkerResult(producer_id=7, results=[
        common_pb2.PartitionResult(partition=common_pb2.TopicPartition(topic="a", partition=0), error=fenced),
        common_pb2.PartitionResult(partition=common_pb2.TopicPartition(topic="a", partition=1))])])
    assert answers_of("WriteTxnMarkers", markers) == [{"partition": "a/0", "error": "PRODUCER_FENCED"},
                                                      {"partition": "a/1", "error": "NONE"}]
    assert answers_of("Produce", produced_ok([("b", 0)])) == [{"partition": "b/0", "error": "NONE", "base_offset": 10}]
    assert answers_of("EndTxn", coordinator_pb2.EndTxnResponse(producer_id=7, producer_epoch=5))[0]["error"] == "NONE"
    assert delivered([{"error": "UNAVAILABLE"}, {"error": "PRODUCER_FENCED"}])
    assert not delivered([{"error": "UNAVAILABLE"}, {"error": "REPLAY_FAILED"}])
    assert send(closed_address(), "EndTxn", end_txn()) == [{"error": "UNAVAILABLE", "status": "UNAVAILABLE"}]


def test_the_next_transaction_takes_the_opposite_outcome_and_replays_stay_on_loopback():
    assert (opposite("committed"), opposite("aborted")) == ("abort", "commit")
    assert check_local("127.0.0.1:5") == "127.0.0.1:5"
    with pytest.raises(ValueError):
        check_local("10.0.0.1:5")
    with pytest.raises(ValueError):
        send("example.com:443", "EndTxn", end_txn())


# --- the worker's Replayer --------------------------------------------------------------------------------


def replayer(tmp_path, order):
    write_order(tmp_path, "p0", order)
    transport = RecordingTransport()
    r = Replayer(tmp_path, "p0", "chaos-p0", History(tmp_path, "p0"))
    r.producer_replaced(transport)
    return r, transport


def run_txn(transport, leader, coordinator, tps, epoch, committed=True):
    """What a transaction of the producer sent: its records, then its EndTxn, answered."""
    transport.remember(leader, "Produce", produce(tps, epoch=epoch), produced_ok(tps))
    transport.remember(coordinator, "EndTxn", end_txn(committed, epoch=epoch),
                       coordinator_pb2.EndTxnResponse(producer_id=7, producer_epoch=epoch + 1))


def test_an_end_txn_is_captured_from_n_and_delivered_into_n_plus_1_with_the_opposite_outcome(tmp_path):
    coordinator = closed_address()
    r, transport = replayer(tmp_path, Order(1, "replay_end_txn", 1.5))
    assert r.plan(1).deliver is False  # transaction 1 is the one captured
    run_txn(transport, LEADER_A, coordinator, [("a", 0), ("b", 1)], epoch=3, committed=True)
    r.ended(1, True, "committed")
    plan = r.plan(2)
    assert (plan.intent, plan.partitions, plan.deliver, plan.delay_s) == ("abort", [("a", 0), ("b", 1)], True, 1.5)
    r.deliver(2)
    (event,) = [e for e in read_events(tmp_path) if e["type"] == "replay"]
    assert (event["kind"], event["of_txn"], event["into_txn"], event["delivered"]) == ("replay_end_txn", 1, 2, False)
    assert event["request"]["producer_epoch"] == 3 and event["request"]["committed"] is True
    assert event["answers"][0]["address"] == coordinator
    assert read_done(tmp_path, "p0", 1)["delivered"] is False
    assert r.plan(3).deliver is False and r.order is None  # done: no order left
    assert [e["type"] for e in read_events(tmp_path)].count("replay_order") == 1


def test_a_failed_transaction_or_a_new_producer_means_capturing_again(tmp_path):
    r, transport = replayer(tmp_path, Order(1, "replay_end_txn", 1.0))
    r.plan(1)
    run_txn(transport, LEADER_A, COORDINATOR, [("a", 0)], epoch=3)
    r.ended(1, False, "committed")  # its commit raised
    assert r.plan(2).deliver is False  # transaction 2 is captured instead
    run_txn(transport, LEADER_A, COORDINATOR, [("a", 1)], epoch=4, committed=False)
    r.ended(2, True, "aborted")
    r.producer_replaced(RecordingTransport())  # before transaction 3: what was captured is void
    assert r.plan(3).deliver is False
    assert r.order is not None and r.capture_txn == 3


def test_a_produce_into_its_own_transaction_is_its_first_answered_request(tmp_path):
    leader = closed_address()
    r, transport = replayer(tmp_path, Order(2, "replay_produce", 1.0, "same"))
    plan = r.plan(5)
    assert (plan.intent, plan.partitions, plan.deliver) == (None, [], True)
    transport.remember(leader, "Produce", produce([("a", 2)], epoch=9))  # its answer was lost
    transport.remember(leader, "Produce", produce([("b", 0)], epoch=9), produced_ok([("b", 0)]))
    r.deliver(5)
    (event,) = [e for e in read_events(tmp_path) if e["type"] == "replay"]
    assert (event["of_txn"], event["into_txn"], event["into"]) == (5, 5, "same")
    assert event["request"]["batches"][0]["partition"] == "b/0"


def test_a_produce_into_the_next_transaction_makes_it_write_on_the_same_partitions(tmp_path):
    r, transport = replayer(tmp_path, Order(2, "replay_produce", 2.0))
    r.plan(1)
    run_txn(transport, LEADER_B, COORDINATOR, [("b", 1), ("a", 0)], epoch=3)
    r.ended(1, True, "committed")
    plan = r.plan(2)
    assert (plan.intent, plan.partitions, plan.deliver) == (None, [("a", 0), ("b", 1)], True)


def test_a_marker_whose_coordinator_epoch_cannot_be_learned_is_captured_again(tmp_path):
    r, transport = replayer(tmp_path, Order(1, "replay_marker", 1.0))
    r.plan(1)
    run_txn(transport, LEADER_A, closed_address(), [("a", 0)], epoch=3)  # FindCoordinator: refused
    r.ended(1, True, "committed")
    assert r.plan(2).deliver is False and r.capture_txn == 2


# --- the nemesis's side -----------------------------------------------------------------------------------


def test_the_first_round_is_over_once_every_chosen_kind_has_ended():
    # the run goes on past its duration until then (a loaded machine once ended a run before kill_member)
    nemesis = Nemesis(None, random.Random(1), 1.0, {"p0": 0}, kinds=("replay_marker", "kill_zookeeper"))
    assert not nemesis.every_kind_injected()
    nemesis.log.append(FaultEvent("kill_zookeeper", "zookeeper", 1.0, end_s=2.0))
    nemesis.log.append(FaultEvent("replay_marker", "p0", 3.0))  # begun, not over
    assert not nemesis.every_kind_injected()
    nemesis.log[-1].end_s = 4.0
    assert nemesis.every_kind_injected()


def test_the_nemesis_injects_each_chosen_kind_first_then_only_those():
    nemesis = Nemesis(None, random.Random(1), 1.0, {"p0": 0}, kinds=("replay_marker", "kill_zookeeper"))
    drawn = list(itertools.islice(nemesis.schedule(), 30))
    assert sorted(drawn[:2]) == ["kill_zookeeper", "replay_marker"]
    assert set(drawn) == {"kill_zookeeper", "replay_marker"}
    with pytest.raises(ValueError):
        next(Nemesis(None, random.Random(1), 1.0, {}, kinds=("replay_everything",)).schedule())


def test_a_replay_order_is_counted_once_its_worker_answers_delivered(tmp_path):
    nemesis = Nemesis(None, random.Random(3), 1.0, {"p0": 0, "p1": 0}, directory=tmp_path, replay_wait_s=30)

    def worker():  # the worker's side: takes the order, answers it
        for _ in range(300):
            for name in ("p0", "p1"):
                orders = pending_orders(tmp_path, name, set())
                if orders:
                    write_done(tmp_path, name, orders[0].seq, {"delivered": True})
                    return
            threading.Event().wait(0.05)

    answering = threading.Thread(target=worker)
    answering.start()
    event = nemesis.inject("replay_marker")
    answering.join()
    assert event.error == "" and event.detail.endswith("delivered: True"), event
    nemesis.replay_wait_s = 0.2
    unanswered = nemesis.inject("replay_end_txn")
    assert "not delivered" in unanswered.detail
    counts = nemesis.counts()
    assert (counts["replay_marker"], counts["replay_end_txn"]) == (1, 0)
