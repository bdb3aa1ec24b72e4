"""The transactional Producer and the transaction admin tools against a real
cluster: ZooKeeper, producer_id_svc, two partition_svc and two coordinator_svc
processes started by LocalCluster (as `txlog cluster up` does)."""

import json
import subprocess
import sys
import time

import pytest
from support.waiting import wait_until

from services.tooling.cluster import LocalCluster
from txlog import (
    Admin,
    Consumer,
    Producer,
    ProducerFencedError,
    RetriableError,
    TransactionAbortedError,
    TxnState,
)
from txlog.structs import TopicPartition


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("client-txn") / "cluster")
    cluster.up(service_args={"coordinator_svc": ["--transaction-check-interval-ms", "200",
                                                 "--ownership-check-interval-ms", "300"]})
    yield cluster
    cluster.down(grace_s=5)


@pytest.fixture(scope="module")
def bootstrap(local_cluster):
    return local_cluster.state.bootstrap


def _create(bootstrap, name, partitions=2):
    with Admin(bootstrap) as admin:
        admin.create_topics([(name, partitions)])
        (topic,) = admin.describe_topics([name])
    return topic


def _producer(bootstrap, transactional_id, **kwargs):
    producer = Producer(bootstrap, transactional_id=transactional_id, **{"linger_ms": 1, **kwargs})
    producer.init_transactions(timeout_s=60)
    return producer


def _read(bootstrap, topic, partitions, isolation):
    """Every value a reader with ``isolation`` sees, from the start to the end it sees now."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    values = []
    with Consumer(bootstrap, isolation_level=isolation, fetch_max_wait_ms=100) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic}: never reached the end offsets {ends}"
            values += [r.value.decode() for r in consumer.poll(timeout_s=0.5)]
        values += [r.value.decode() for r in consumer.poll(timeout_s=0.2)]  # nothing more is visible
    return sorted(values)


def test_a_commit_across_two_partition_servers_becomes_visible_to_read_committed_at_once(bootstrap):
    topic = _create(bootstrap, "txn-atomic")
    assert len({p.leader_address for p in topic.partitions}) == 2  # the transaction spans both instances
    sent = [f"v{i}" for i in range(20)]
    with _producer(bootstrap, "client-atomic") as producer:
        producer.begin_transaction()
        futures = [producer.send("txn-atomic", value, partition=i % 2) for i, value in enumerate(sent)]
        producer.flush(timeout_s=30)
        assert all(f.result(timeout=0).offset >= 0 for f in futures)
        assert _read(bootstrap, "txn-atomic", 2, "read_committed") == []
        assert _read(bootstrap, "txn-atomic", 2, "read_uncommitted") == sorted(sent)
        producer.commit_transaction(timeout_s=60)
        assert producer.producer_epoch == 1
    assert _read(bootstrap, "txn-atomic", 2, "read_committed") == sorted(sent)


def test_an_abort_leaves_nothing_to_read_committed_and_everything_but_markers_to_read_uncommitted(bootstrap):
    _create(bootstrap, "txn-abort")
    aborted = [f"aborted-{i}" for i in range(10)]
    with _producer(bootstrap, "client-abort") as producer:
        producer.begin_transaction()
        for i, value in enumerate(aborted):
            producer.send("txn-abort", value, partition=i % 2)
        producer.flush(timeout_s=30)
        producer.abort_transaction(timeout_s=60)
        assert producer.transaction_state is TxnState.READY
        producer.begin_transaction()
        producer.send("txn-abort", "after", partition=0)
        producer.commit_transaction(timeout_s=60)
    assert _read(bootstrap, "txn-abort", 2, "read_committed") == ["after"]
    assert _read(bootstrap, "txn-abort", 2, "read_uncommitted") == sorted([*aborted, "after"])


def test_records_not_sent_when_the_abort_comes_fail_and_never_appear(bootstrap):
    _create(bootstrap, "txn-unsent", 1)
    with _producer(bootstrap, "client-unsent", linger_ms=60_000) as producer:
        producer.begin_transaction()
        futures = [producer.send("txn-unsent", f"v{i}", partition=0) for i in range(5)]
        producer.abort_transaction(timeout_s=60)
        for future in futures:
            with pytest.raises(TransactionAbortedError):
                future.result(timeout=10)
    assert _read(bootstrap, "txn-unsent", 1, "read_uncommitted") == []


def test_a_second_producer_with_the_same_id_fences_the_first(bootstrap):
    _create(bootstrap, "txn-zombie")
    zombie = _producer(bootstrap, "client-zombie")
    zombie.begin_transaction()
    zombie.send("txn-zombie", "zombie-before", partition=0).result(timeout=30)
    with _producer(bootstrap, "client-zombie") as successor:  # fences the zombie, aborts its transaction
        assert successor.producer_id == zombie.producer_id and successor.producer_epoch > zombie.producer_epoch
        with pytest.raises(ProducerFencedError, match="zombie"):
            zombie.send("txn-zombie", "zombie-after", partition=0).result(timeout=30)
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction(timeout_s=30)
        with pytest.raises(ProducerFencedError):
            zombie.send("txn-zombie", "refused", partition=1)  # every later call raises it
        successor.begin_transaction()
        successor.send("txn-zombie", "successor", partition=1)
        successor.commit_transaction(timeout_s=60)
    zombie.close(timeout_s=10)
    assert _read(bootstrap, "txn-zombie", 2, "read_committed") == ["successor"]


def test_a_zombie_whose_records_were_all_acknowledged_is_fenced_at_commit(bootstrap):
    _create(bootstrap, "txn-zombie-commit")
    zombie = _producer(bootstrap, "client-zombie-commit")
    zombie.begin_transaction()
    for i in range(4):
        zombie.send("txn-zombie-commit", f"z{i}", partition=i % 2)
    zombie.flush(timeout_s=30)
    successor = _producer(bootstrap, "client-zombie-commit")
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction(timeout_s=30)
    assert zombie.transaction_state is TxnState.FATAL_ERROR
    zombie.close(timeout_s=10)
    successor.close(timeout_s=10)
    assert _read(bootstrap, "txn-zombie-commit", 2, "read_committed") == []


def test_offsets_sent_to_a_transaction_are_committed_only_when_it_commits(bootstrap):
    _create(bootstrap, "txn-in", 2)
    _create(bootstrap, "txn-out", 1)
    with _producer(bootstrap, "client-offsets") as producer, \
            Consumer(bootstrap, group_id="client-offsets-group") as consumer, \
            Consumer(bootstrap, group_id="client-offsets-group", isolation_level="read_uncommitted") as peeker:
        producer.begin_transaction()
        producer.send("txn-out", "derived", partition=0)
        producer.send_offsets_to_transaction({("txn-in", 0): 5, ("txn-in", 1): 7}, "client-offsets-group")
        assert peeker.committed(("txn-in", 0)) is None  # pending, not committed
        with pytest.raises(RetriableError, match="UNSTABLE_OFFSET_COMMIT"):  # read_committed waits for the outcome
            consumer.committed(("txn-in", 0), timeout_s=1)
        producer.commit_transaction(timeout_s=60)
        assert consumer.committed(("txn-in", 0)) == 5 and consumer.committed(("txn-in", 1)) == 7
        producer.begin_transaction()
        producer.send_offsets_to_transaction({("txn-in", 0): 9}, "client-offsets-group")
        producer.abort_transaction(timeout_s=60)
        assert consumer.committed(("txn-in", 0)) == 5
    assert _read(bootstrap, "txn-out", 1, "read_committed") == ["derived"]


def test_admin_lists_describes_and_finds_no_hanging_transaction(bootstrap, local_cluster):
    _create(bootstrap, "txn-admin")
    ids = [f"client-admin-{i}" for i in range(6)]  # spread over both coordinators
    producers = [_producer(bootstrap, transactional_id) for transactional_id in ids]
    try:
        for producer in producers[:3]:
            producer.begin_transaction()
            producer.send("txn-admin", "open", partition=0).result(timeout=30)
        with Admin(bootstrap) as admin:
            listed = {t.transactional_id: t for t in admin.list_transactions() if t.transactional_id in ids}
            assert set(listed) == set(ids)
            assert {i for i, t in listed.items() if t.state == "Ongoing"} == set(ids[:3])
            ongoing = admin.list_transactions(states=["Ongoing"], producer_ids=[producers[0].producer_id])
            assert [t.transactional_id for t in ongoing] == [ids[0]]
            described = admin.describe_transactions(ids)
            assert [d.transactional_id for d in described] == ids
            assert described[0].partitions == (TopicPartition("txn-admin", 0),)
            assert described[0].producer_epoch == producers[0].producer_epoch
            assert admin.find_hanging(["txn-admin"]) == []  # open, but each has its live coordinator
        out = subprocess.run([sys.executable, "-m", "txlog.cli", "transactions", "describe", ids[0],
                              "--dir", str(local_cluster.dir)], capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr.decode()
        assert json.loads(out.stdout)["state"] == "Ongoing"
    finally:
        for producer in producers:
            producer.close(timeout_s=30)  # aborts the open transactions
    # close() returns once each abort is decided (PrepareAbort durable); the markers follow
    with Admin(bootstrap) as admin:
        def aborted_states():
            states = {t.transactional_id: t.state for t in admin.list_transactions(producer_ids=[
                p.producer_id for p in producers])}
            return states if all(states[i] == "CompleteAbort" for i in ids[:3]) else None

        states = wait_until(aborted_states, 30, "the three open transactions aborted")
    assert all(states[i] == "Empty" for i in ids[3:]), states


def test_admin_aborts_a_hanging_transaction_that_find_hanging_reports(bootstrap, local_cluster):
    _create(bootstrap, "txn-hanging", 1)
    with _producer(bootstrap, "client-hanging") as producer:
        producer.begin_transaction()
        producer.send("txn-hanging", "kept-open", partition=0).result(timeout=30)
        with Admin(bootstrap) as admin:
            assert admin.find_hanging(["txn-hanging"]) == []
            # the coordinators' maximum is 15 min; a smaller bound here marks the open one as too old once it is
            (hanging,) = wait_until(lambda: admin.find_hanging(["txn-hanging"], max_transaction_timeout_ms=100), 30,
                                    "the open transaction older than 100 ms")
            assert (hanging.topic, hanging.partition, hanging.producer_id) == ("txn-hanging", 0, producer.producer_id)
            assert hanging.start_offset == 0
            out = subprocess.run([sys.executable, "-m", "txlog.cli", "transactions", "abort",
                                  "--topic", "txn-hanging", "--partition", "0",
                                  "--producer-id", str(hanging.producer_id),
                                  "--producer-epoch", str(hanging.producer_epoch),
                                  "--coordinator-epoch", str(hanging.coordinator_epoch),
                                  "--dir", str(local_cluster.dir)], capture_output=True, timeout=120)
            assert out.returncode == 0, out.stderr.decode()
            assert admin.find_hanging(["txn-hanging"], max_transaction_timeout_ms=100) == []
        assert _read(bootstrap, "txn-hanging", 1, "read_committed") == []
        producer.abort_transaction(timeout_s=60)
