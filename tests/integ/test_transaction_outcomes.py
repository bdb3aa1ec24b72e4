"""Each record's transactional outcome through real processes (issue 17): one
partition holding a plain record and the records of a committed, an aborted
and an open transaction, read by the SDK (sync and asyncio) and by
`txlog consume --print-outcome` (plain and JSON); the open transaction, once
committed, reads "committed"."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from txlog import Admin, AIOConsumer, Consumer, Producer, TopicPartition
from txlog.two_phase import wait_until

TOPIC = "outcomes"
TP = TopicPartition(TOPIC, 0)


def read_all(bootstrap: str, **options) -> list[tuple[bytes, str | None, int]]:
    """Every record of the partition up to its high watermark, read_uncommitted: (value, outcome, producer id)."""
    with Consumer(bootstrap, isolation_level="read_uncommitted", **options) as consumer:
        consumer.assign([TP])
        consumer.seek_to_beginning()
        end = consumer.end_offsets([TP])[TP]
        records = []
        while consumer.position(TP) < end:
            records += consumer.poll(timeout_s=1.0)
    return [(r.value, r.transaction_outcome, r.producer_id) for r in records]


async def read_all_aio(bootstrap: str) -> list[tuple[bytes, str | None]]:
    async with AIOConsumer(bootstrap, isolation_level="read_uncommitted", include_transaction_outcomes=True) as consumer:
        await consumer.assign([TP])
        await consumer.seek(TP, 0)
        records = []
        while len(records) < 4:
            records += (await consumer.getmany(timeout_ms=1000)).get(TP, [])
    return [(r.value, r.transaction_outcome) for r in records]


def wait_for_outcomes(bootstrap: str, expected: list, what: str) -> None:
    """Reads again until the records read as ``expected`` (markers are written a moment after commit/abort
    return); then, or after 30 s, asserts the last read against it."""
    last: list = []

    def read_as_expected() -> bool:
        last[:] = read_all(bootstrap, include_transaction_outcomes=True)
        return last == expected

    try:
        wait_until(read_as_expected, 30, what)
    except TimeoutError:
        pass
    assert last == expected, what


def txlog(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txlog.cli", *args], capture_output=True, timeout=120)


def transactional(bootstrap: str, tid: str, value: bytes) -> Producer:
    producer = Producer(bootstrap, transactional_id=tid)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(TOPIC, value=value, partition=0).result(timeout=30)
    return producer


def test_each_record_reads_with_its_transactions_outcome_and_an_open_one_reads_committed_once_it_commits(txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([(TOPIC, 1)])
    with Producer(bootstrap) as plain:
        plain.send(TOPIC, value=b"plain", partition=0).result(timeout=30)
        plain_id = plain.producer_id
    committer = transactional(bootstrap, "outcomes-committed", b"committed")
    committer.commit_transaction()
    aborter = transactional(bootstrap, "outcomes-aborted", b"aborted")
    aborter.abort_transaction()
    opener = transactional(bootstrap, "outcomes-open", b"open")
    ids = {"committed": committer.producer_id, "aborted": aborter.producer_id, "open": opener.producer_id}
    committer.close()
    aborter.close()
    try:
        expected = [(b"plain", "none", plain_id), (b"committed", "committed", ids["committed"]),
                    (b"aborted", "aborted", ids["aborted"]), (b"open", "open", ids["open"])]
        wait_for_outcomes(bootstrap, expected, "each record's outcome")
        assert len(set(ids.values()) | {plain_id}) == 4 and plain_id >= 0
        assert read_all(bootstrap) == [(value, None, producer_id) for value, _, producer_id in expected]  # not asked
        assert asyncio.run(read_all_aio(bootstrap)) == [(value, outcome) for value, outcome, _ in expected]

        where = ("--bootstrap", bootstrap)
        plain_lines = txlog("consume", TOPIC, "--from-beginning", "--to-end", "--print-offset", "--print-outcome", *where)
        assert plain_lines.returncode == 0, plain_lines.stderr.decode()
        assert plain_lines.stdout.splitlines() == [b"Offset:0\tOutcome:none\tplain", b"Offset:1\tOutcome:committed\tcommitted",
                                                   b"Offset:3\tOutcome:aborted\taborted", b"Offset:5\tOutcome:open\topen"]
        printed = txlog("consume", TOPIC, "--from-beginning", "--to-end", "--format", "json", "--print-outcome", *where)
        assert [(r["value"], r["outcome"]) for r in map(json.loads, printed.stdout.splitlines())] == \
            [(value.decode(), outcome) for value, outcome, _ in expected]
        without = txlog("consume", TOPIC, "--from-beginning", "--to-end", "--format", "json", "--isolation", "read_uncommitted", *where)
        assert all("outcome" not in json.loads(line) for line in without.stdout.splitlines()) and without.stdout
        refused = txlog("consume", TOPIC, "--from-beginning", "--to-end", "--print-outcome", "--isolation", "read_committed", *where)
        assert refused.returncode == 2 and refused.stdout == b""
        assert b"--print-outcome reads read_uncommitted" in refused.stderr

        opener.commit_transaction()
        now_committed = expected[:3] + [(b"open", "committed", ids["open"])]
        wait_for_outcomes(bootstrap, now_committed, "the open transaction's record, once committed")
    finally:
        opener.close()
