"""A consume-transform-produce worker for the tests: reads ``input`` from the
group's committed offsets (read_committed), upper-cases each value into
``output``, and commits the output and the input offsets in one transaction per
poll. With ``--die-at STEP --die-in-transaction K`` it exits abruptly (os._exit,
no clean-up, as kill -9 would) at that step of its K-th transaction."""

import argparse
import os
import sys
import threading
import time

from txlog import Consumer, Producer

STEPS = ("before_send", "after_send", "after_offsets", "during_commit", "after_commit")


def die() -> None:
    sys.stdout.flush()
    os._exit(9)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--die-at", choices=STEPS)
    parser.add_argument("--die-in-transaction", type=int, default=1)
    parser.add_argument("--idle-s", type=float, default=3.0, help="stop after this long without input")
    args = parser.parse_args()
    partitions = [("input", p) for p in range(args.partitions)]
    producer = Producer(args.bootstrap, transactional_id="ctp-worker", linger_ms=1, transaction_timeout_ms=10_000)
    producer.init_transactions(timeout_s=60)
    consumer = Consumer(args.bootstrap, group_id="ctp-group", isolation_level="read_committed", max_poll_records=7)
    consumer.assign(partitions)
    transactions = 0
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < args.idle_s:
        records = consumer.poll(timeout_s=0.3)
        if not records:
            continue
        idle_since = time.monotonic()
        transactions += 1
        dying = args.die_at if transactions == args.die_in_transaction else None
        producer.begin_transaction()
        if dying == "before_send":
            die()
        for record in records:
            producer.send("output", record.value.upper(), key=record.key, partition=record.partition)
        producer.flush()
        if dying == "after_send":
            die()
        producer.send_offsets_to_transaction({tp: consumer.position(tp) for tp in partitions}, "ctp-group")
        if dying == "after_offsets":
            die()
        if dying == "during_commit":
            threading.Timer(0.002, die).start()  # EndTxn is on its way, its answer may not be
        producer.commit_transaction(timeout_s=60)
        if dying == "after_commit":
            die()
    producer.close()
    consumer.close()
    print(f"done after {transactions} transactions", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
