"""What the console tests (test_console.py over HTTP, test_console_browser.py in
Chromium) share: the console started as a user starts it, and the cluster
state they look at, made through the SDK."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from services.tooling.cluster import free_port
from txlog import Admin, Consumer, Producer
from txlog.two_phase import wait_until


def answered(url: str) -> tuple[int, str] | None:
    """The status and page a GET of ``url`` is answered with (an error page too); None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def started_console(connection: list[str], log_path: Path, *flags: str) -> tuple[str, subprocess.Popen]:
    """`txlog console` with ``connection`` (--bootstrap ... and TLS options) on a free loopback port: its URL
    and its process, once it answers (its output in ``log_path``)."""
    address = f"127.0.0.1:{free_port()}"
    log_file = open(log_path, "wb")  # noqa: SIM115 - the process writes it until it ends
    process = subprocess.Popen([sys.executable, "-m", "txlog.cli", "console", *connection, "--listen", address, *flags],
                               stdout=log_file, stderr=subprocess.STDOUT)

    def serving() -> bool:
        assert process.poll() is None, log_path.read_text()
        return answered(f"http://{address}/") is not None

    try:
        wait_until(serving, 60, "the console serving")
    except BaseException:
        stopped(process)  # not left running after the test
        raise
    return f"http://{address}", process


def stopped(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=30)


def made_state(bootstrap: str, prefix: str, partitions: int) -> tuple[dict, Producer]:
    """A topic of ``partitions`` with one committed record on each, a group that committed offset 1 on
    partition 0, and a transaction left open on partition 1 by the producer returned (its owner closes it)."""
    topic, transactional_id, group = (f"{prefix}-{uuid.uuid4().hex[:6]}", f"{prefix}-txn-{uuid.uuid4().hex[:6]}",
                                      f"{prefix}-group-{uuid.uuid4().hex[:6]}")
    with Admin(bootstrap) as admin:
        admin.create_topics([(topic, partitions)])
    with Producer(bootstrap) as plain:
        for partition in range(partitions):
            plain.send(topic, value=b"committed", partition=partition).result(timeout=60)
    with Consumer(bootstrap, group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        wait_until(lambda: bool(consumer.poll(0.5)), 60, "a record polled")
        consumer.commit()
    # open for as long as the tests look at it: the coordinators' largest timeout, not the 60 s default
    producer = Producer(bootstrap, transactional_id=transactional_id, transaction_timeout_ms=900_000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, value=b"left open", partition=1).result(timeout=60)
    return {"topic": topic, "transactional_id": transactional_id, "group": group}, producer
