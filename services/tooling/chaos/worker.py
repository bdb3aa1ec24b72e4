"""The chaos workload's processes, each recording its history (``history.py``):

    python -m services.tooling.chaos.worker producer --name p0 ...   transactions of random records, committed or aborted
    python -m services.tooling.chaos.worker ctp --name ctp0 ...      a subscribing consume-transform-produce member, offsets in its transactions
    python -m services.tooling.chaos.worker poller --name rc0 --isolation read_committed ...
    python -m services.tooling.chaos.worker silent --name s0 ...     transactions prepared, then left to the check-back
    python -m services.tooling.chaos.worker checker --name chk0 ...  the silent owners' TransactionChecker (silent.py)

Each runs until ``--stop-file`` exists, but the checker: it answers until
``DIR/stop-checker`` exists (CHECKER_STOP_FILE), so that the run can wait for
the silent owners' last transactions to be decided after they stopped.
Every client gets a seeded :class:`~txlog.FaultInjection`
(``--cut-probability``): calls whose request is dropped, or whose answer is
lost after the server handled it -- a connection cut mid-call (the checker's
calls excepted).

A producer worker also carries out the nemesis's replay orders (``replay.py``):
a copy of one of its transaction's marker, EndTxn or Produce requests sent again
seconds later, while that transaction or the next one is open. The next
transaction is then shaped for it: it writes on the replayed transaction's
partitions, holds itself open for the order's delay once its records are
written, and (marker, EndTxn) takes the opposite outcome.

Outcome rules (what ``end`` says)
---------------------------------
* ``committed``: ``commit_transaction()`` returned.
* ``aborted``: the transaction never asked to commit (abort intended, or a send
  failed before the commit): nothing may make it visible.
* ``indefinite``: ``commit_transaction()`` raised (a timeout, a lost answer, a
  fenced zombie): the transaction may be committed or aborted. The producer is
  then closed and a new one takes the transactional id over (its
  ``init_transactions()`` completes or aborts the old transaction).

A silent owner's transaction (``silent``) never asks to commit; its decision,
recorded before the prepare, is what the check-back must apply:

* ``committed``: decided commit and ``prepare_transaction()`` returned.
* ``aborted``: decided abort, or a send failed before the decision.
* ``indefinite``: decided commit but ``prepare_transaction()`` raised (the
  prepare may have landed, or the transaction times out).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from services.tooling.chaos import security, silent
from services.tooling.chaos.history import History, decode_uid, encode_value, tp_key
from services.tooling.chaos.replay import RecordingTransport, Replayer
from txlog import Consumer, FaultInjection, Producer, TransactionChecker
from txlog.net.tls import TlsFiles
from txlog.structs import TopicPartition
from txlog.transport import Transport, tls_files

PRODUCER_RPCS = frozenset({"Produce", "AddPartitionsToTxn", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn",
                           "InitProducerId", "FindCoordinator", "PrepareTransaction"})
CONSUMER_RPCS = frozenset({"Fetch", "ListOffsets", "OffsetFetch"})
CALL_TIMEOUT_S = 20.0
STATS_INTERVAL_S = 2.0
CTP_GROUP = "chaos-ctp"
CTP_SESSION_MS = 4000  # a killed member's partitions move this long after its death
CHECKER_STOP_FILE = "stop-checker"
CHECKER_LEASE_MS = 3000  # renewed every second: a coordinator that took the group over learns of it within ~1 s
SILENT_RECORDS_MAX = 4
SILENT_PAUSE_S_MAX = 0.3  # between a silent owner's transactions


def parse_topics(spec: str) -> dict[str, int]:
    """``a:3,b:2`` -> {"a": 3, "b": 2}."""
    return {name: int(count) for name, count in (item.split(":") for item in spec.split(","))}


class Worker:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.history = History(args.dir, args.name)
        self.stop_file = Path(args.stop_file)
        self.cuts = [FaultInjection(drop_request_probability=args.cut_probability / 2,
                                    drop_response_probability=args.cut_probability / 2,
                                    rng=random.Random(args.seed + 1), rpcs=PRODUCER_RPCS),
                     FaultInjection(drop_request_probability=args.cut_probability / 2,
                                    drop_response_probability=args.cut_probability / 2,
                                    rng=random.Random(args.seed + 2), rpcs=CONSUMER_RPCS)]
        self.last_stats_s = 0.0
        self.transport: RecordingTransport | None = None

    def stopping(self) -> bool:
        if time.monotonic() - self.last_stats_s > STATS_INTERVAL_S:
            self.write_stats()
        return self.stop_file.exists()

    def write_stats(self) -> None:
        self.last_stats_s = time.monotonic()
        self.history.record("stats", requests_dropped=sum(c.requests_dropped for c in self.cuts),
                            responses_dropped=sum(c.responses_dropped for c in self.cuts))

    def tls_options(self) -> dict[str, str]:
        return security.options(self.args)

    def tls_files(self) -> TlsFiles | None:
        return tls_files(self.args.tls_ca, self.args.tls_cert, self.args.tls_key)

    def new_producer(self, transactional_id: str) -> Producer:
        transport = RecordingTransport(request_timeout_ms=5000, fault_injection=self.cuts[0], tls_files=self.tls_files())
        producer = Producer(self.args.bootstrap, transactional_id=transactional_id, linger_ms=2,
                            transaction_timeout_ms=self.args.txn_timeout_ms, request_timeout_ms=5000,
                            delivery_timeout_ms=30_000, max_block_ms=CALL_TIMEOUT_S * 1000, transport=transport)
        self.transport = transport  # the last producer's, for the replays
        return producer

    def new_consumer(self, **kwargs) -> Consumer:
        transport = Transport(request_timeout_ms=5000, fault_injection=self.cuts[1], tls_files=self.tls_files())
        return Consumer(self.args.bootstrap, fetch_max_wait_ms=200, request_timeout_ms=5000,
                        default_api_timeout_ms=CALL_TIMEOUT_S * 1000, transport=transport, **kwargs)

    def init_producer(self, transactional_id: str) -> Producer | None:
        producer = self.new_producer(transactional_id)
        try:
            producer.init_transactions(timeout_s=CALL_TIMEOUT_S)
            return producer
        except Exception as exc:  # noqa: BLE001 - any failure: try again with a new producer
            self.history.record("init_failed", error=repr(exc)[:300])
            close_quietly(producer)
            time.sleep(0.5)
            return None

    def record_ack(self, txn: int, idx: int, uid: str, topic: str, partition: int, future) -> None:
        try:
            metadata = future.result()
        except Exception as exc:  # noqa: BLE001
            self.history.record("send_failed", txn=txn, idx=idx, uid=uid, error=repr(exc)[:300])
            return
        self.history.record("ack", txn=txn, idx=idx, uid=uid, topic=topic, partition=partition,
                            offset=metadata.offset)

    def end_transaction(self, producer: Producer, txn: int, intent: str) -> bool:
        """Commits or aborts; records the outcome; False when the producer must be replaced."""
        phase = "before_end"
        try:
            if intent == "commit":
                phase = "commit"
                self.history.record("commit_start", txn=txn)
                producer.commit_transaction(timeout_s=CALL_TIMEOUT_S)
                self.history.record("end", txn=txn, outcome="committed")
            else:
                producer.flush(timeout_s=CALL_TIMEOUT_S)  # so that the aborted records are in the log
                self.history.record("abort_start", txn=txn)
                producer.abort_transaction(timeout_s=CALL_TIMEOUT_S)
                self.history.record("end", txn=txn, outcome="aborted")
            return True
        except Exception as exc:  # noqa: BLE001 - see the module docstring's outcome rules
            outcome = "indefinite" if phase == "commit" else "aborted"
            self.history.record("end", txn=txn, outcome=outcome, error=repr(exc)[:300])
            return False


def close_quietly(client) -> None:
    try:
        client.close(timeout_s=5) if isinstance(client, Producer) else client.close()
    except Exception:  # noqa: BLE001, S110 - a client of a broken cluster; nothing to do
        pass


def run_producer(worker: Worker) -> None:
    args = worker.args
    topics = parse_topics(args.topics)
    transactional_id = f"chaos-{args.name}"
    replayer = Replayer(args.dir, args.name, transactional_id, worker.history)
    producer, instance, txn = None, 0, 0
    while not worker.stopping():
        if producer is None:
            producer = worker.init_producer(transactional_id)
            if producer is not None:
                replayer.producer_replaced(worker.transport)
            instance += 1
            continue
        txn += 1
        plan = replayer.plan(txn)
        intent = "abort" if worker.rng.random() < args.abort_probability else "commit"
        intent = plan.intent or intent
        worker.history.record("begin", txn=txn, instance=instance, intent=intent)
        try:
            producer.begin_transaction()
            count = worker.rng.randint(1, 6)
            writes = [*plan.partitions]
            for _ in range(count):
                topic = worker.rng.choice(sorted(topics))
                writes.append((topic, worker.rng.randrange(topics[topic])))
            for idx, (topic, partition) in enumerate(writes):
                uid = f"{args.name}/{txn}/{idx}"
                worker.history.record("send", txn=txn, idx=idx, uid=uid, topic=topic, partition=partition)
                future = producer.send(topic, encode_value(args.name, txn, idx, uid), partition=partition)
                future.add_done_callback(
                    lambda f, t=txn, i=idx, u=uid, tp=topic, p=partition: worker.record_ack(t, i, u, tp, p, f))
            if plan.deliver:  # the records in the log, the transaction open: the late copy arrives
                producer.flush(timeout_s=CALL_TIMEOUT_S)
                time.sleep(plan.delay_s)
                replayer.deliver(txn)
        except Exception as exc:  # noqa: BLE001 - it never asked to commit
            worker.history.record("end", txn=txn, outcome="aborted", error=repr(exc)[:300])
            close_quietly(producer)
            producer = None
            continue
        ok = worker.end_transaction(producer, txn, intent)
        replayer.ended(txn, ok, "committed" if intent == "commit" else "aborted")
        if not ok:
            close_quietly(producer)
            producer = None
        time.sleep(worker.rng.random() * 0.05)
    if producer is not None:
        close_quietly(producer)


def run_ctp(worker: Worker) -> None:
    """A member of the consume-transform-produce group: subscribes to
    ``--input`` (read_committed), writes one output record per input record,
    and commits both in one transaction with the member's group metadata, so
    the group refuses the offsets of a member it has fenced (KIP-447). Several
    run at once; the nemesis kills and replaces them (kill_member), so
    partitions move between members while transactions are open."""
    args = worker.args
    output_partitions = parse_topics(args.topics)[args.output]
    producer, consumer, instance, txn = None, None, 0, 0
    while not worker.stopping():
        if producer is None:
            producer = worker.init_producer(f"chaos-{args.member or args.name}")
            instance += 1
            continue
        try:
            if consumer is None:  # positions start from the group's committed offsets
                consumer = worker.new_consumer(group_id=CTP_GROUP, isolation_level="read_committed",
                                               max_poll_records=8, session_timeout_ms=CTP_SESSION_MS)
                consumer.subscribe([args.input], on_revoke=lambda tps: worker.history.record(
                    "revoked", partitions=sorted(tp_key(*tp) for tp in tps)))
            records = consumer.poll(timeout_s=0.3)
        except Exception as exc:  # noqa: BLE001
            worker.history.record("consumer_error", error=repr(exc)[:300])
            close_quietly(consumer)
            consumer = None
            time.sleep(0.2)
            continue
        if not records:
            continue
        txn += 1
        intent = "abort" if worker.rng.random() < args.abort_probability else "commit"
        worker.history.record("begin", txn=txn, instance=instance, intent=intent)
        # the offsets are the batch's own: a partition revoked since the poll is still this member's until
        # its next poll, and its records are in this transaction
        offsets, first = {}, {}
        try:
            producer.begin_transaction()
            for idx, record in enumerate(records):
                tp = TopicPartition(record.topic, record.partition)
                offsets[tp] = record.offset + 1
                first.setdefault(tp, record.offset)
                uid = f"{args.name}/{txn}/{idx}"
                src = decode_uid(record.value)
                partition = record.partition % output_partitions
                worker.history.record("send", txn=txn, idx=idx, uid=uid, topic=args.output, partition=partition,
                                      src=src, src_topic=record.topic, src_partition=record.partition,
                                      src_offset=record.offset)
                future = producer.send(args.output, encode_value(args.name, txn, idx, uid, src), partition=partition)
                future.add_done_callback(
                    lambda f, t=txn, i=idx, u=uid, p=partition: worker.record_ack(t, i, u, args.output, p, f))
            worker.history.record("offsets", txn=txn, offsets={tp_key(*tp): o for tp, o in offsets.items()})
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata(), timeout_s=CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - it never asked to commit
            worker.history.record("end", txn=txn, outcome="aborted", error=repr(exc)[:300])
            close_quietly(producer)
            producer = None
            close_quietly(consumer)
            consumer = None
            continue
        ok = worker.end_transaction(producer, txn, intent)
        if not ok:  # indefinite: rejoin, reading from the group's offsets once the outcome is settled
            close_quietly(producer)
            producer = None
            close_quietly(consumer)
            consumer = None
        elif intent == "abort":  # read the aborted batch again (a partition revoked meanwhile: its next owner will)
            for tp, offset in first.items():
                if tp in consumer.assignment():
                    consumer.seek(tp, offset)
    for client in (producer, consumer):
        if client is not None:
            close_quietly(client)


def run_silent_owner(worker: Worker) -> None:
    """Transactions decided only by the check-back (silent.py): each on a new
    producer with its own transactional id; records sent, the decision written
    to the local store, the transaction prepared with the decision's key as
    metadata, the producer closed without completing it."""
    args = worker.args
    topics = parse_topics(args.topics)
    decisions = silent.DecisionLog(args.dir, args.name)
    txn = 0
    try:
        while not worker.stopping():
            txn += 1
            transactional_id = silent.transactional_id_of(args.name, txn)
            producer = worker.init_producer(transactional_id)
            if producer is None:
                continue
            decision = "abort" if worker.rng.random() < args.abort_probability else "commit"
            worker.history.record("begin", txn=txn, instance=txn, intent=decision, transactional_id=transactional_id)
            try:
                producer.begin_transaction()
                futures = []
                for idx in range(worker.rng.randint(1, SILENT_RECORDS_MAX)):
                    topic = worker.rng.choice(sorted(topics))
                    partition, uid = worker.rng.randrange(topics[topic]), f"{args.name}/{txn}/{idx}"
                    worker.history.record("send", txn=txn, idx=idx, uid=uid, topic=topic, partition=partition)
                    futures.append(producer.send(topic, encode_value(args.name, txn, idx, uid), partition=partition))
                    futures[-1].add_done_callback(
                        lambda f, t=txn, i=idx, u=uid, tp=topic, p=partition: worker.record_ack(t, i, u, tp, p, f))
                producer.flush(timeout_s=CALL_TIMEOUT_S)
                for future in futures:
                    future.result(timeout=0)  # a record not written: no decision, the transaction is abandoned
            except Exception as exc:  # noqa: BLE001 - it was never prepared: close() aborts it, or it times out
                worker.history.record("end", txn=txn, outcome="aborted", error=repr(exc)[:300])
                close_quietly(producer)
                continue
            key = silent.key_of(args.name, txn)
            decisions.record(key, transactional_id, decision)  # the local transaction, on disk before the prepare
            worker.history.record("decide", txn=txn, key=key, transactional_id=transactional_id, decision=decision)
            try:
                handle = producer.prepare_transaction(timeout_s=CALL_TIMEOUT_S, metadata=key.encode())
                worker.history.record("prepared", txn=txn, producer_id=handle.producer_id,
                                      producer_epoch=handle.producer_epoch)
                worker.history.record("end", txn=txn, outcome="committed" if decision == "commit" else "aborted",
                                      via="check-back")
            except Exception as exc:  # noqa: BLE001 - the prepare may have landed: decided by the check-back then
                worker.history.record("end", txn=txn, outcome="indefinite" if decision == "commit" else "aborted",
                                      error=repr(exc)[:300])
            close_quietly(producer)  # leaves a prepared transaction as it is
            time.sleep(worker.rng.random() * SILENT_PAUSE_S_MAX)
    finally:
        decisions.close()


def run_checker(worker: Worker) -> None:
    """The silent owners' application: a TransactionChecker of their group,
    answering from their stores, until CHECKER_STOP_FILE exists. It renews its
    registration itself, at whichever coordinator owns the group by then."""
    args = worker.args
    stop_file = Path(args.dir) / CHECKER_STOP_FILE
    answers = silent.Answers(silent.Decisions(args.dir), worker.history)
    checker = None
    while checker is None and not stop_file.exists():
        candidate = TransactionChecker(args.bootstrap, silent.GROUP, answers, lease_ms=CHECKER_LEASE_MS, **worker.tls_options(),
                                       max_concurrent_checks=32)
        try:
            checker = candidate.start()
        except Exception as exc:  # noqa: BLE001 - the cluster may be failing over: a new checker, again
            worker.history.record("checker_start_failed", error=repr(exc)[:300])
            time.sleep(0.5)
    worker.history.record("checker_started", address=checker.address if checker else None)
    while not stop_file.exists():
        time.sleep(0.2)
    if checker is not None:
        checker.stop()
        worker.history.record("checker_stats", answered=checker.checks_answered, renewals=checker.renewals,
                              renewal_failures=checker.renewal_failures)


def run_poller(worker: Worker) -> None:
    """Polls every partition from the beginning, recording each poll's records;
    a new consumer (after an error) starts a new ``session``."""
    args = worker.args
    tps = [TopicPartition(t, p) for t, count in parse_topics(args.topics).items() for p in range(count)]
    consumer, session = None, 0
    while not worker.stopping():
        try:
            if consumer is None:
                session += 1
                consumer = worker.new_consumer(isolation_level=args.isolation)
                consumer.assign(tps)
                consumer.seek_to_beginning()
            t0 = time.time()
            records = consumer.poll(timeout_s=0.5)
        except Exception as exc:  # noqa: BLE001
            worker.history.record("consumer_error", session=session, error=repr(exc)[:300])
            close_quietly(consumer)
            consumer = None
            time.sleep(0.2)
            continue
        if records:
            worker.history.record("poll", isolation=args.isolation, session=session, t0=t0,
                                  records=[[r.topic, r.partition, r.offset, decode_uid(r.value)] for r in records])
    if consumer is not None:
        close_quietly(consumer)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.tooling.chaos.worker")
    parser.add_argument("kind", choices=("producer", "ctp", "poller", "silent", "checker"))
    parser.add_argument("--name", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--dir", required=True, help="the run's folder (history/ goes there)")
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topics", required=True, help="name:partitions,... (a poller reads all of them)")
    parser.add_argument("--input", help="ctp: the input topic")
    parser.add_argument("--output", help="ctp: the output topic")
    parser.add_argument("--member", help="ctp: the member this process is an incarnation of (its transactional id); "
                                         "default: --name")
    parser.add_argument("--isolation", default="read_committed", choices=("read_committed", "read_uncommitted"))
    parser.add_argument("--txn-timeout-ms", type=int, default=6000)
    parser.add_argument("--abort-probability", type=float, default=0.3)
    parser.add_argument("--cut-probability", type=float, default=0.02)
    security.add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    worker = Worker(args)
    try:
        {"producer": run_producer, "ctp": run_ctp, "poller": run_poller, "silent": run_silent_owner,
         "checker": run_checker}[args.kind](worker)
    finally:
        worker.write_stats()
        worker.history.record("exit")
        worker.history.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
