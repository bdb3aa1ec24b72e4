"""Transaction check-back through the SDK and the CLI (issue 19), against a
real local cluster: the check-back guide's order-service example run as a user runs it
-- crashed after its SQLite commit, crashed before it, not crashed -- with its
own checker process answering the coordinator; a TransactionChecker in this
process whose answers ``describe_transactions`` shows; ``txlog transactions
group-config`` through the real coordinator; and a checker registering again
at the coordinator that takes its group over when its own is killed."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from txlog import Admin, Producer, TransactionChecker
from txlog.two_phase import wait_until
from txlog.v1 import partition_pb2, partition_pb2_grpc

GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "check-back.md"
EXAMPLE_MARK = "<!-- example: check-back-sqlite -->"
ORDERS_GROUP, ORDERS_TOPIC = "orders", "order-events"  # the example's
INTERVAL_MS, MAX, EXHAUSTED, TIMEOUT_MS = ("transaction.check.interval.ms", "transaction.check.max",
                                           "transaction.check.exhausted", "transaction.check.timeout.ms")
DEFAULTS = {INTERVAL_MS: "60000", MAX: "15", EXHAUSTED: "abort", TIMEOUT_MS: "5000"}
SETTLE_S = 60  # the longest an outcome may take to show


@pytest.fixture
def cluster(txn_cluster):
    return txn_cluster  # a cluster of its own per test: the last one kills a coordinator


@pytest.fixture
def admin(cluster):
    with Admin(cluster.state.bootstrap) as client:
        yield client


def readme_example() -> str:
    """The program in the fenced block right after the check-back guide's example mark."""
    text = GUIDE.read_text()
    assert EXAMPLE_MARK in text, f"docs/guides/check-back.md lost its {EXAMPLE_MARK} block"
    block = re.match(r"\s*```python\n(.*?)\n```", text.split(EXAMPLE_MARK, 1)[1], re.S)
    assert block, f"{EXAMPLE_MARK} is not followed by a ```python block"
    return block.group(1) + "\n"


def txlog(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "txlog.cli", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def state_of(admin: Admin, transactional_id: str) -> str:
    return admin.describe_transactions([transactional_id])[0].state


def checker_addresses(admin: Admin, group: str) -> set[str]:
    return {c.address for c in admin.describe_transaction_group_config(group).checkers}


def test_the_readme_order_service_keeps_its_row_and_its_event_together_through_crashes(cluster, admin, tmp_path):
    script, db_path = tmp_path / "orders.py", tmp_path / "orders.db"
    script.write_text(readme_example())
    env = {**os.environ, "TXLOG_BOOTSTRAP": cluster.state.bootstrap, "ORDERS_DB": str(db_path)}
    admin.alter_transaction_group_config(ORDERS_GROUP, {INTERVAL_MS: "500"})
    checker_log = tmp_path / "checker.err"
    with checker_log.open("w") as err:
        checker = subprocess.Popen([sys.executable, str(script), "checker"], env=env, stdout=subprocess.PIPE,
                                   stderr=err, text=True)
    try:
        started = checker.stdout.readline()
        assert started, f"the example's checker did not start: {checker_log.read_text()}"
        address = json.loads(started)["checker"]
        wait_until(lambda: address in checker_addresses(admin, ORDERS_GROUP), 30, "the checker registered")

        placed = {}
        for crash_at, exit_code in (("after-sqlite-commit", 1), ("before-sqlite-commit", 1), ("none", 0)):
            run = subprocess.run([sys.executable, str(script), "order", f"order-{crash_at}"], capture_output=True,
                                 text=True, timeout=120, env={**env, "ORDER_CRASH_AT": crash_at})
            assert run.returncode == exit_code, run.stderr
            placed[crash_at] = json.loads(run.stdout.splitlines()[0])["transactional_id"]

        outcomes = {"after-sqlite-commit": "CompleteCommit", "before-sqlite-commit": "CompleteAbort",
                    "none": "CompleteCommit"}
        for crash_at, outcome in outcomes.items():
            wait_until(lambda tid=placed[crash_at], outcome=outcome: state_of(admin, tid) == outcome, SETTLE_S,
                       f"the order crashed at {crash_at} ending {outcome}")
    finally:
        checker.send_signal(signal.SIGTERM)
        stopped = checker.wait(30)
    assert stopped == 0, checker_log.read_text()
    assert address not in checker_addresses(admin, ORDERS_GROUP)  # it unregistered as it stopped

    with sqlite3.connect(db_path) as db:
        rows = sorted(order_id for (order_id,) in db.execute("SELECT order_id FROM orders"))
    assert rows == ["order-after-sqlite-commit", "order-none"]
    consumed = txlog("consume", ORDERS_TOPIC, "--from-beginning", "--to-end", "--dir", str(cluster.dir)).stdout
    events = sorted(json.loads(line)["order_id"] for line in consumed.splitlines())
    assert events == rows  # read_committed: each committed order's event once, the other's never


def test_describe_shows_the_checks_a_transaction_checker_answered_until_it_decided(cluster, admin):
    bootstrap, group, transactional_id = cluster.state.bootstrap, "inproc", "inproc/order-7"
    metadata = b"\xffdb-txn-7"
    admin.create_topics([("inproc-events", 1)])
    admin.alter_transaction_group_config(group, {INTERVAL_MS: "300", MAX: "100"})
    with Producer(bootstrap, transactional_id=transactional_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("inproc-events", b"the event")
        producer.prepare_transaction(metadata=metadata)
    prepared = admin.describe_transactions([transactional_id])[0]
    assert prepared.state == "Prepared" and prepared.prepare_metadata == metadata
    assert prepared.checks_done == 0 and prepared.last_check_answer == ""
    assert prepared.next_check_time_ms >= prepared.prepared_time_ms + 300
    shown = json.loads(txlog("transactions", "describe", transactional_id, "--dir", str(cluster.dir)).stdout)
    assert shown["prepare_metadata"] == {"base64": "/2RiLXR4bi03"} and shown["checks_done"] == 0
    assert shown["last_check_answer"] == "" and shown["next_check_time_ms"] == prepared.next_check_time_ms

    decided, seen = threading.Event(), []

    def check(tid: str, given: bytes) -> str:
        seen.append((tid, given))
        return "COMMIT" if decided.is_set() else "UNKNOWN"

    with TransactionChecker(bootstrap, group, check, lease_ms=3_000) as checker:
        wait_until(lambda: admin.describe_transactions([transactional_id])[0].checks_done >= 2, 30, "two checks")
        undecided = admin.describe_transactions([transactional_id])[0]
        assert undecided.state == "Prepared" and undecided.last_check_answer == "UNKNOWN"
        assert undecided.next_check_time_ms > undecided.prepared_time_ms
        decided.set()
        wait_until(lambda: state_of(admin, transactional_id) == "CompleteCommit", SETTLE_S, "the COMMIT answer applied")
        wait_until(lambda: checker.renewals >= 1, 10, "a renewal of the 3 s lease")
        answered = checker.checks_answered
    assert answered["COMMIT"] == 1 and answered["UNKNOWN"] >= 2 and answered["ABORT"] == 0
    assert set(seen) == {(transactional_id, metadata)}
    assert checker_addresses(admin, group) == set()
    consumed = txlog("consume", "inproc-events", "--from-beginning", "--to-end", "--dir", str(cluster.dir)).stdout
    assert consumed.splitlines() == ["the event"]


def test_cli_group_config_round_trip_through_the_coordinator(cluster):
    where = ("--dir", str(cluster.dir))

    def group_config(*args: str) -> dict:
        return json.loads(txlog("transactions", "group-config", "cli-group", *args, *where).stdout)

    assert group_config() == {"group_id": "cli-group", "configs": DEFAULTS, "overridden": [], "checkers": []}
    changed = group_config("--set", f"{INTERVAL_MS}=2000", "--set", f"{EXHAUSTED}=keep")
    assert changed["configs"] == {**DEFAULTS, INTERVAL_MS: "2000", EXHAUSTED: "keep"}
    assert changed["overridden"] == [EXHAUSTED, INTERVAL_MS]
    assert group_config() == changed

    for bad, expected in ((f"{MAX}=0", MAX), (f"{EXHAUSTED}=sometimes", EXHAUSTED), (f"{INTERVAL_MS}=soon", INTERVAL_MS),
                          ("transaction.check.colour=red", "transaction.check.colour")):
        refused = txlog("transactions", "group-config", "cli-group", "--set", bad, *where, check=False)
        assert refused.returncode == 1 and refused.stderr.startswith("error: INVALID_CONFIG: "), refused.stderr
        assert expected in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert group_config() == changed  # a refused change changed nothing
    malformed = txlog("transactions", "group-config", "cli-group", "--set", "transaction.check.max", *where, check=False)
    assert malformed.returncode == 2 and "--set takes key=value" in malformed.stderr

    with TransactionChecker(cluster.state.bootstrap, "cli-group", lambda tid, metadata: "UNKNOWN", lease_ms=60_000) as checker:
        (registered,) = group_config()["checkers"]
    assert registered["address"] == checker.address and 0 < registered["lease_remaining_ms"] <= 60_000

    reset = group_config("--delete", INTERVAL_MS)
    assert reset["configs"] == {**DEFAULTS, EXHAUSTED: "keep"} and reset["overridden"] == [EXHAUSTED]
    assert reset["checkers"] == []  # the checker unregistered as it stopped


def coordinator_of(cluster, key: str) -> str | None:
    """The address of the coordinator a partition_svc names for ``key`` now (None: none yet)."""
    with grpc.insecure_channel(cluster.state.bootstrap.split(",")[0]) as channel:
        found = partition_pb2_grpc.PartitionServiceStub(channel).Metadata(
            partition_pb2.MetadataRequest(transactional_ids=[key]), timeout=10).transaction_coordinators[0]
    return found.address if found.error.code == 0 and found.address else None


def test_a_checker_registers_again_at_the_coordinator_that_takes_its_group_over(cluster, admin):
    group = "failover"
    with TransactionChecker(cluster.state.bootstrap, group, lambda tid, metadata: "UNKNOWN", lease_ms=3_000) as checker:
        old = coordinator_of(cluster, group)
        assert old is not None and checker.address in checker_addresses(admin, group)
        name = next(n for n, info in cluster.state.services.items() if info.address == old)
        cluster.kill(name)
        wait_until(lambda: coordinator_of(cluster, group) not in (None, old), SETTLE_S,
                   "another coordinator owning the group")
        wait_until(lambda: checker.address in checker_addresses(admin, group), 30,
                   "the checker registered at the new coordinator")
    assert checker.renewals >= 1


def test_a_checker_at_its_own_bound_of_concurrent_checks_does_not_use_up_the_checks(cluster, admin):
    """Found reviewing the two sides together: a TransactionChecker refuses a check over its
    max_concurrent_checks (RESOURCE_EXHAUSTED), and the coordinator sends up to
    --transaction-checks-in-flight-max (16) at once; counted as attempts, those refusals aborted
    transactions the application would have committed once it had a free thread."""
    group, count = "busy", 6
    admin.create_topics([("busy-events", 1)])
    admin.alter_transaction_group_config(group, {INTERVAL_MS: "200", MAX: "1"})  # a single counted attempt aborts
    for i in range(count):
        with Producer(cluster.state.bootstrap, transactional_id=f"{group}/t{i}") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("busy-events", f"e{i}".encode())
            producer.prepare_transaction(metadata=f"t{i}".encode())
    release = threading.Event()

    def slow_commit(tid: str, metadata: bytes) -> str:
        release.wait(0.3)  # holds the checker's only thread while the other checks arrive
        return "COMMIT"

    with TransactionChecker(cluster.state.bootstrap, group, slow_commit, max_concurrent_checks=1):
        wait_until(lambda: all(state_of(admin, f"{group}/t{i}") == "CompleteCommit" for i in range(count)), SETTLE_S,
                   "every transaction committed by the busy checker")
    consumed = txlog("consume", "busy-events", "--from-beginning", "--to-end", "--dir", str(cluster.dir)).stdout
    assert sorted(consumed.splitlines()) == sorted(f"e{i}" for i in range(count))
