"""Benchmark: check-back load (issue 19) - N prepared transactions whose owners
are gone, decided by the coordinator checking back at the application.

On a local cluster of real processes (ZooKeeper, one producer_id_svc, one
partition_svc, ONE coordinator_svc started with ``--transaction-check-interval-ms
--round-interval-ms`` and ``--transaction-checks-in-flight-max --bound``):

1. baseline: ``--transactions`` transactions (``direct/t{i}``, one record each,
   on a topic of ``--partitions`` partitions) prepared, then completed by their
   owner directly: CompleteTransaction, commit for even i and abort for odd i,
   ``--bound`` calls in flight (the coordinator's bound on its checks);
2. check-back: as many transactions (``bench/t{i}``) prepared with
   ``prepare_metadata`` = i while no checker is registered for group ``bench``
   (nothing is checked: every one is due by the end of the setup; a sample is
   described to show it), the group's ``transaction.check.interval.ms`` set to
   ``--group-interval-ms``. Then a TransactionChecker (the SDK's) starts and
   registers; its ``check`` sleeps ``--think-ms`` and answers COMMIT for even i
   and ABORT for odd i, counting the checks in flight at once. It allows more
   than the bound (``max_concurrent_checks`` 256), so what bounds them is the
   coordinator.

Each setup runs ``--setup-concurrency`` owners at once, each transaction raw
async gRPC (bench/transactions.py's TxnProducer): InitProducerId,
AddPartitionsToTxn, one Produce, PrepareTransaction.

For both phases, from the first call (or the checker's start) until
ListTransactions (state PREPARED, the group's prefix) lists none: the time,
transactions per second, and the CPU seconds each process used (from /proc;
the coordinator's per transaction); then until none is PrepareCommit /
PrepareAbort either (the markers written). The check-back phase adds checks per
second, checks per transaction, the checker's peak concurrent checks against
the bound (``bound_held``), and the cap the coordinator's rounds put on the rate:
it starts checks only once a round (``--round-interval-ms``), at most ``--bound``
in flight, so at most bound / round interval checks per second whatever the
checker and the log could take.

Before each phase's completions (or checker) the coordinator's CPU is also
measured at rest for ``--idle-s`` (nobody calls it: what its rounds cost with N
transactions prepared, not yet due in the baseline, all due and no checker
registered in the check-back), then per ListTransactions poll of the group
(``--cost-polls``; ``list_transactions_polls_cpu_s_at_most`` bounds what the
polls of the phase took of its CPU).

Correctness, both phases: a read_committed read of each topic holds every even
i exactly once and no odd i (``correct``).

The ratio ``check_back_vs_direct_completion`` is transactions/s decided by the
check-back over transactions/s decided by their owners, measured minutes apart
in the same run (this 2-core box is shared and noisy: only the ratio means
something elsewhere).

Prints one JSON object to stdout; progress goes to stderr. Run it as
``python -m bench.check_back [--transactions N] [--bound N] [--round-interval-ms MS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from bench.measure import Phase, progress
from bench.produce_fetch import CALL_TIMEOUT_S, create_topic
from bench.transactions import Cluster, TxnProducer
from coordinator_svc.check_rules import JITTER_FRACTION
from txlog.protocol import errors
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, partition_pb2

CHECK_GROUP, DIRECT_GROUP = "bench", "direct"
TOPICS = {CHECK_GROUP: "check-back", DIRECT_GROUP: "check-back-direct"}
PREPARED = coordinator_pb2.TRANSACTION_STATE_PREPARED
DECIDING = (coordinator_pb2.TRANSACTION_STATE_PREPARE_COMMIT, coordinator_pb2.TRANSACTION_STATE_PREPARE_ABORT)
CHECKER_CONCURRENCY_MAX = 256  # the SDK's most: the checker takes far more than the bound, so the coordinator bounds it
PRODUCE_RETRY_WAIT_S = 30.0
BACKOFF_S = 0.01
SAMPLE_DESCRIBED = 20


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=10_000, help="prepared transactions per phase (default 10000)")
    parser.add_argument("--bound", type=int, default=16,
                        help="the coordinator's --transaction-checks-in-flight-max, and the direct completions in flight (default 16)")
    parser.add_argument("--round-interval-ms", type=int, default=200,
                        help="the coordinator's --transaction-check-interval-ms: how often it starts due checks (default 200)")
    parser.add_argument("--group-interval-ms", type=int, default=1000, help="the group's transaction.check.interval.ms (default 1000)")
    parser.add_argument("--think-ms", type=float, default=5.0, help="how long the checker takes per check (default 5)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of each topic (default 4)")
    parser.add_argument("--setup-concurrency", type=int, default=64, help="transactions prepared at once in the setups (default 64)")
    parser.add_argument("--poll-interval-s", type=float, default=0.5, help="pause between ListTransactions polls (default 0.5)")
    parser.add_argument("--resolve-timeout-s", type=float, default=1800.0, help="give up on a phase after this long (default 1800)")
    parser.add_argument("--idle-s", type=float, default=3.0,
                        help="how long the coordinator's CPU is measured at rest, before each phase's checker or completions (default 3)")
    parser.add_argument("--cost-polls", type=int, default=10, help="ListTransactions calls whose CPU is measured at rest (default 10)")
    args = parser.parse_args(argv)
    if min(args.transactions, args.bound, args.round_interval_ms, args.partitions, args.setup_concurrency) < 1:
        parser.error("counts and intervals must be >= 1")
    if not 100 <= args.group_interval_ms <= 86_400_000:
        parser.error("--group-interval-ms must be 100..86,400,000 (the coordinator's range)")
    if args.think_ms < 0 or args.poll_interval_s <= 0 or args.idle_s <= 0 or args.cost_polls < 1:
        parser.error("--think-ms must be >= 0, --poll-interval-s and --idle-s > 0, --cost-polls >= 1")
    return args


# --- the owners ----------------------------------------------------------------------------------


class Owner(TxnProducer):
    """One transaction's owner: bench/transactions.py's raw steps plus one Produce, the prepare and the completion."""

    async def produce(self, leader: str, topic: str, partition: int, value: bytes) -> None:
        batch = common_pb2.RecordBatch(producer_id=self.producer_id, producer_epoch=self.producer_epoch, base_sequence=0,
                                       is_transactional=True, records=[common_pb2.Record(value=value)])
        request = partition_pb2.ProduceRequest(acks=-1, transactional_id=self.transactional_id, batches=[
            partition_pb2.PartitionBatch(topic=topic, partition=partition, batch=batch)])
        deadline = time.monotonic() + PRODUCE_RETRY_WAIT_S
        while True:
            result = (await self.cluster.partitions(leader).Produce(request, timeout=CALL_TIMEOUT_S)).results[0]
            if result.error.code == 0:
                return
            name = errors.ErrorCode.Name(result.error.code)
            if not errors.spec_of(result.error.code).retriable or time.monotonic() > deadline:
                raise RuntimeError(f"Produce {self.transactional_id!r}: {name} {result.error.message}")
            self.retries[f"Produce:{name}"] += 1
            await asyncio.sleep(self.backoff_s)

    async def prepare(self, metadata: bytes) -> coordinator_pb2.TransactionHandle:
        return (await self._call("PrepareTransaction", coordinator_pb2.PrepareTransactionRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            prepare_metadata=metadata))).handle

    async def complete(self, handle: coordinator_pb2.TransactionHandle, commit: bool) -> None:
        await self._call("CompleteTransaction", coordinator_pb2.CompleteTransactionRequest(handle=handle, committed=commit))


def index_of(transactional_id: str) -> int:
    return int(transactional_id.rsplit("/t", 1)[1])


async def each(count: int, concurrency: int, step) -> None:
    """``step(i)`` for i in 0..count-1, ``concurrency`` at once."""
    indexes = iter(range(count))

    async def runner():
        for i in indexes:
            await step(i)

    await asyncio.gather(*[runner() for _ in range(min(concurrency, count))])


async def prepare_all(cluster: Cluster, coordinator: str, group: str, pids: dict, args: argparse.Namespace) -> tuple[dict, dict]:
    """``args.transactions`` prepared transactions of ``group``, one record (i) each;
    their handles by i, and the setup's figures."""
    topic = TOPICS[group]
    leaders = await cluster.leaders(topic)
    handles, retries = {}, Counter()

    async def one(i: int) -> None:
        owner = Owner(cluster, f"{group}/t{i}", BACKOFF_S)
        owner.address = coordinator  # one coordinator owns every id: no lookup per transaction
        await owner.init()
        partition = i % args.partitions
        await owner.add(topic, [partition])
        await owner.produce(leaders[partition], topic, partition, str(i).encode())
        handles[i] = await owner.prepare(str(i).encode())
        retries.update(owner.retries)
        if len(handles) % 2000 == 0:
            progress(f"  {group}: {len(handles)} prepared")

    with Phase({"coordinator": pids["coordinator"]}) as phase:
        await each(args.transactions, args.setup_concurrency, one)
    return handles, {"seconds": round(phase.seconds, 2), "transactions_per_s": round(args.transactions / phase.seconds, 1),
                     "coordinator_cpu_seconds": phase.cpu["coordinator"] and round(phase.cpu["coordinator"], 2),
                     "retries": dict(retries)}


async def coordinator_at_rest(stub, group: str, pids: dict, args: argparse.Namespace) -> dict:
    """The coordinator's CPU while nobody calls it for ``--idle-s`` (its rounds
    alone), then per ListTransactions poll of ``group`` (``--cost-polls`` in a row)."""
    pid = {"coordinator": pids["coordinator"]}
    with Phase(pid) as idle:
        await asyncio.sleep(args.idle_s)
    with Phase(pid) as polls:
        for _ in range(args.cost_polls):
            await unresolved(stub, group)
    return {"idle_cpu_utilisation": None if idle.cpu["coordinator"] is None else round(idle.cpu["coordinator"] / idle.seconds, 3),
            "list_transactions_cpu_ms": None if polls.cpu["coordinator"] is None
            else round(polls.cpu["coordinator"] / args.cost_polls * 1000, 2)}


# --- waiting for the outcomes ------------------------------------------------------------------


async def unresolved(stub: coordinator_pb2_grpc.CoordinatorServiceStub, group: str) -> Counter:
    """How many of the group's transactions are PREPARED, PrepareCommit or PrepareAbort."""
    reply = await stub.ListTransactions(coordinator_pb2.ListTransactionsRequest(
        state_filters=[PREPARED, *DECIDING], transactional_id_prefix=f"{group}/", local_only=True), timeout=CALL_TIMEOUT_S)
    return Counter("prepared" if t.state == PREPARED else "deciding" for t in reply.transactions)


async def wait_resolved(stub, group: str, started: float, args: argparse.Namespace) -> dict:
    """Seconds from ``started`` until none of ``group`` is PREPARED, and until none is deciding either."""
    decided_s = None
    polls = 0
    while True:
        counts = await unresolved(stub, group)
        polls += 1
        now = time.perf_counter() - started
        if decided_s is None and not counts["prepared"]:
            decided_s = now
        if decided_s is not None and not counts["deciding"]:
            return {"decided_s": decided_s, "markers_written_s": now, "polls": polls}
        if now > args.resolve_timeout_s:
            raise RuntimeError(f"{group}: still {dict(counts)} after {now:.0f} s")
        if polls % max(1, int(10 / args.poll_interval_s)) == 0:
            progress(f"  {group}: {counts['prepared']} prepared, {counts['deciding']} deciding after {now:.0f} s")
        await asyncio.sleep(args.poll_interval_s)


def figures(phase: Phase, resolved: dict, transactions: int, coordinator: str) -> dict:
    cpu = phase.cpu.get(coordinator)
    return {
        "decided_s": round(resolved["decided_s"], 2),
        "markers_written_s": round(resolved["markers_written_s"], 2),
        "transactions_per_s": round(transactions / resolved["decided_s"], 1),
        "list_transactions_polls": resolved["polls"],
        "cpu_seconds": {name: None if spent is None else round(spent, 2) for name, spent in phase.cpu.items()},
        "coordinator_cpu_ms_per_transaction": None if cpu is None else round(cpu / transactions * 1000, 3),
        "cpu_utilisation_outside_the_cluster": phase.others_cpu_utilisation(),
    }


async def direct_completion(cluster: Cluster, coordinator: str, handles: dict, pids: dict, args: argparse.Namespace) -> dict:
    stub = coordinator_pb2_grpc.CoordinatorServiceStub(cluster.channel(coordinator))
    retries = Counter()

    async def complete(i: int) -> None:
        owner = Owner(cluster, handles[i].transactional_id, BACKOFF_S)
        owner.address = coordinator
        await owner.complete(handles[i], commit=i % 2 == 0)
        retries.update(owner.retries)

    at_rest = await coordinator_at_rest(stub, DIRECT_GROUP, pids, args)
    with Phase(pids) as phase:
        started = time.perf_counter()
        await each(args.transactions, args.bound, complete)
        answered_s = time.perf_counter() - started
        resolved = await wait_resolved(stub, DIRECT_GROUP, started, args)
    return {**figures(phase, resolved, args.transactions, "coordinator"), "coordinator_at_rest_before": at_rest,
            "all_answered_s": round(answered_s, 2),
            "completions_in_flight_max": args.bound, "retries": dict(retries)}


class CountingCheck:
    """The checker's ``check``: COMMIT for an even i, ABORT for an odd one, after
    ``think_s``; counts checks, answers and the most in flight at once."""

    def __init__(self, think_s: float):
        self.think_s = think_s
        self.lock = threading.Lock()
        self.in_flight = self.peak = self.checks = 0
        self.per_transaction: Counter[int] = Counter()
        self.mismatched_metadata = 0

    def __call__(self, transactional_id: str, metadata: bytes) -> str:
        i = index_of(transactional_id)
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.checks += 1
            self.per_transaction[i] += 1
            if metadata != str(i).encode():
                self.mismatched_metadata += 1
        try:
            time.sleep(self.think_s)
            return "COMMIT" if i % 2 == 0 else "ABORT"
        finally:
            with self.lock:
                self.in_flight -= 1


async def check_back(cluster: Cluster, coordinator: str, pids: dict, args: argparse.Namespace) -> dict:
    from txlog import TransactionChecker

    stub = coordinator_pb2_grpc.CoordinatorServiceStub(cluster.channel(coordinator))
    await asyncio.sleep(args.group_interval_ms * (1 + 1 / JITTER_FRACTION) / 1000 + 0.2)  # until the last prepared is due too
    last = args.transactions - 1
    sample = sorted({*(f"{CHECK_GROUP}/t{i}" for i in range(min(SAMPLE_DESCRIBED, args.transactions))), f"{CHECK_GROUP}/t{last}"})
    described = (await stub.DescribeTransactions(coordinator_pb2.DescribeTransactionsRequest(transactional_ids=sample),
                                                 timeout=CALL_TIMEOUT_S)).transactions
    now_ms = time.time() * 1000
    before = {"sample": len(described), "prepared": sum(d.state == PREPARED for d in described),
              "checked": sum(d.checks_done > 0 for d in described),
              "due": sum(0 <= d.next_check_time_ms <= now_ms for d in described)}
    at_rest = await coordinator_at_rest(stub, CHECK_GROUP, pids, args)
    check = CountingCheck(args.think_ms / 1000)
    checker = TransactionChecker(cluster.state.bootstrap, CHECK_GROUP, check, max_concurrent_checks=CHECKER_CONCURRENCY_MAX)
    with Phase(pids) as phase:
        started = time.perf_counter()
        await asyncio.to_thread(checker.start)
        resolved = await wait_resolved(stub, CHECK_GROUP, started, args)
    await asyncio.to_thread(checker.stop)
    cap = args.bound * 1000 / args.round_interval_ms
    coordinator_cpu = phase.cpu.get("coordinator")
    polls_cpu_s = None if at_rest["list_transactions_cpu_ms"] is None else at_rest["list_transactions_cpu_ms"] * resolved["polls"] / 1000
    checks_per_s = check.checks / resolved["decided_s"]
    return {
        **figures(phase, resolved, args.transactions, "coordinator"),
        "before_the_checker": before,
        "coordinator_at_rest_before": at_rest,
        "list_transactions_polls_cpu_s_at_most": polls_cpu_s and round(polls_cpu_s, 2),
        "checks": check.checks,
        "checks_per_transaction": round(check.checks / args.transactions, 3),
        "transactions_checked_more_than_once": sum(1 for n in check.per_transaction.values() if n > 1),
        "checks_with_other_metadata": check.mismatched_metadata,
        "checks_per_s": round(checks_per_s, 1),
        "coordinator_cpu_ms_per_check": None if coordinator_cpu is None else round(coordinator_cpu / check.checks * 1000, 3),
        "coordinator_cpu_ms_per_check_without_the_polls_at_least": None if None in (coordinator_cpu, polls_cpu_s)
        else round(max(coordinator_cpu - polls_cpu_s, 0) / check.checks * 1000, 3),
        "checker_answers": checker.checks_answered,
        "peak_concurrent_checks": check.peak,
        "bound": args.bound,
        "bound_held": check.peak <= args.bound,
        "round_cap_checks_per_s": round(cap, 1),
        "checks_per_s_vs_round_cap": round(checks_per_s / cap, 3),
        "checker_think_ms": args.think_ms,
    }


# --- correctness ---------------------------------------------------------------------------------


def committed_values(bootstrap: str, topic: str, partitions: int) -> Counter:
    """Every value read_committed from ``topic``, once the last stable offsets reached the high watermarks."""
    from txlog import Consumer
    from txlog.structs import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    deadline = time.monotonic() + 60
    with Consumer(bootstrap, isolation_level="read_committed", fetch_max_wait_ms=50) as committed, \
            Consumer(bootstrap, isolation_level="read_uncommitted") as uncommitted:
        while (ends := committed.end_offsets(tps)) != uncommitted.end_offsets(tps):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: the last stable offsets stay below the high watermarks")
            time.sleep(0.1)
        committed.assign(tps)
        committed.seek_to_beginning()
        values = Counter()
        while any(committed.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: read_committed did not reach the end")
            values.update(int(r.value) for r in committed.poll(timeout_s=0.5))
    return values


def verdict(values: Counter, transactions: int) -> dict:
    evens = range(0, transactions, 2)
    return {
        "committed_expected": len(evens),
        "committed_read_once": sum(1 for i in evens if values[i] == 1),
        "committed_missing": sum(1 for i in evens if values[i] == 0),
        "committed_read_more_than_once": sum(1 for i in evens if values[i] > 1),
        "aborted_read": sum(n for i, n in values.items() if i % 2),
        "unexpected_read": sum(n for i, n in values.items() if not 0 <= i < transactions),
        "correct": all(values[i] == 1 for i in evens) and set(values) == set(evens),
    }


# --- the run --------------------------------------------------------------------------------------


async def measure_all(state, args: argparse.Namespace) -> dict:
    cluster = Cluster(state)
    coordinator = next(info.address for info in state.services.values() if info.kind == "coordinator_svc")
    pids = {"coordinator": next(i.pid for i in state.services.values() if i.kind == "coordinator_svc"),
            "partition_svc": next(i.pid for i in state.services.values() if i.kind == "partition_svc"),
            "producer_id_svc": next(i.pid for i in state.services.values() if i.kind == "producer_id_svc"),
            "zookeeper": state.services["zookeeper"].pid, "bench": os.getpid()}
    stub = coordinator_pb2_grpc.CoordinatorServiceStub(cluster.channel(coordinator))
    try:
        for topic in TOPICS.values():
            await create_topic(cluster.channel(cluster.bootstrap), topic, args.partitions)
        await stub.AlterTransactionGroupConfig(coordinator_pb2.AlterTransactionGroupConfigRequest(
            group_id=CHECK_GROUP, set={"transaction.check.interval.ms": str(args.group_interval_ms)}), timeout=CALL_TIMEOUT_S)

        progress(f"baseline: {args.transactions} transactions prepared, then completed by their owners, {args.bound} at once")
        handles, direct_setup = await prepare_all(cluster, coordinator, DIRECT_GROUP, pids, args)
        direct = {"setup": direct_setup, **await direct_completion(cluster, coordinator, handles, pids, args)}
        progress(f"  decided in {direct['decided_s']} s ({direct['transactions_per_s']}/s)")

        progress(f"check-back: {args.transactions} transactions prepared, no checker registered")
        _, check_setup = await prepare_all(cluster, coordinator, CHECK_GROUP, pids, args)
        progress("  the checker starts")
        checked = {"setup": check_setup, **await check_back(cluster, coordinator, pids, args)}
        progress(f"  decided in {checked['decided_s']} s ({checked['checks_per_s']} checks/s, peak {checked['peak_concurrent_checks']} "
                 f"in flight, bound {args.bound})")
    finally:
        await cluster.close()
    progress("reading both topics read_committed")
    for phase, group in ((direct, DIRECT_GROUP), (checked, CHECK_GROUP)):
        values = await asyncio.to_thread(committed_values, state.bootstrap, TOPICS[group], args.partitions)
        phase["read_committed"] = verdict(values, args.transactions)
    return {"direct_completion": direct, "check_back": checked}


def main(argv=None) -> int:
    args = parse_args(argv)
    from services.tooling.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="txlog-bench-check-back-") as workdir:
        cluster = LocalCluster(Path(workdir) / "cluster")
        try:
            progress(f"starting ZooKeeper, 1 producer_id_svc, 1 partition_svc, 1 coordinator_svc in {cluster.dir}")
            state = cluster.up(partition_svcs=1, coordinator_svcs=1, service_args={"coordinator_svc": [
                "--transaction-check-interval-ms", str(args.round_interval_ms),
                "--transaction-checks-in-flight-max", str(args.bound)]})
            cluster.wait_until_coordinators_settle()
            measured = asyncio.run(measure_all(state, args))
        except grpc.RpcError as exc:
            progress(f"failed: {exc}")
            raise
        finally:
            progress("stopping the cluster")
            cluster.down()
    direct, checked = measured["direct_completion"], measured["check_back"]
    report = {
        "benchmark": "check_back: prepared transactions whose owners are gone, decided by check-back vs by their owners",
        "parameters": {
            "transactions": args.transactions,
            "checks_in_flight_max": args.bound,
            "coordinator_round_interval_ms": args.round_interval_ms,
            "group_check_interval_ms": args.group_interval_ms,
            "checker_think_ms": args.think_ms,
            "partitions": args.partitions,
            "setup_concurrency": args.setup_concurrency,
        },
        "machine": {"cpus": os.cpu_count()},
        **measured,
        "check_back_vs_direct_completion": round(checked["transactions_per_s"] / direct["transactions_per_s"], 3),
        "coordinator_cpu_per_transaction_check_back_vs_direct": None
        if None in (checked["coordinator_cpu_ms_per_transaction"], direct["coordinator_cpu_ms_per_transaction"])
        else round(checked["coordinator_cpu_ms_per_transaction"] / direct["coordinator_cpu_ms_per_transaction"], 2),
        "bound_held": checked["bound_held"],
        "correct": direct["read_committed"]["correct"] and checked["read_committed"]["correct"],
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
