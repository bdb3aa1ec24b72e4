"""Consume-transform-produce with offsets in the transaction: whatever step the
worker process dies at, after a restart the output holds each input exactly
once and the group's committed offsets match it."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from txlog import Admin, Consumer, Producer
from txlog.structs import TopicPartition

WORKER = str(Path(__file__).with_name("ctp_worker.py"))
INPUTS = 60


def run_worker(bootstrap, *args, timeout_s=120):
    return subprocess.run([sys.executable, WORKER, bootstrap, *args], capture_output=True, text=True, timeout=timeout_s)


def read_all(bootstrap, topic, partitions=2):
    """Every committed value of ``topic``, once no transaction is open or still
    writing its markers there (the last stable offset has reached the high
    watermark: a worker's commit returns once decided, its markers follow)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap, isolation_level="read_committed", fetch_max_wait_ms=100) as consumer, \
            Consumer(bootstrap) as uncommitted:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = wait_until(lambda: (stable := consumer.end_offsets(tps)) == uncommitted.end_offsets(tps) and stable, 60,
                          f"the last stable offsets of {topic} reaching its high watermarks")
        values = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            values += [r.value.decode() for r in consumer.poll(timeout_s=0.5)]
        return values, ends


@pytest.mark.parametrize("step", ["before_send", "after_send", "after_offsets", "during_commit", "after_commit"])
def test_each_input_affects_the_output_exactly_once_whatever_step_the_worker_dies_at(txn_cluster, step):
    bootstrap = txn_cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("input", 2), ("output", 2)])
    with Producer(bootstrap) as producer:
        for i in range(INPUTS):
            producer.send("input", f"event-{i}".encode(), key=f"k{i % 5}".encode(), partition=i % 2)
        producer.flush()

    died = run_worker(bootstrap, "--die-at", step, "--die-in-transaction", "2")
    assert died.returncode == 9, died.stderr[-2000:]
    finished = run_worker(bootstrap)
    assert finished.returncode == 0, finished.stderr[-2000:]

    output, _ = read_all(bootstrap, "output")
    assert sorted(output) == sorted(f"EVENT-{i}" for i in range(INPUTS))  # each input exactly once
    _, input_ends = read_all(bootstrap, "input")
    with Consumer(bootstrap, group_id="ctp-group") as consumer:
        committed = {tp: consumer.committed(tp) for tp in input_ends}
    assert committed == input_ends  # the group's offsets agree with the output
