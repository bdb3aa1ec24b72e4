"""The transaction admin tools (Admin.list_transactions, describe_transactions,
abort_transaction, find_hanging) and the ``txlog transactions`` commands,
against the in-memory fake coordinator and leaders."""

import json
import time
from dataclasses import replace

import pytest
from fake_cluster import FakeCluster

from txlog import Admin, Producer
from txlog.admin import state_number
from txlog.cli import commands as console_module
from txlog.cli import program as cli
from txlog.protocol.errors import ErrorCode
from txlog.structs import TopicPartition

E = ErrorCode.Value
FAST = {"retry_backoff_ms": 1, "retry_backoff_max_ms": 5, "linger_ms": 1}
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _admin(fake):
    return Admin(fake.addresses[0], transport=fake, retry_backoff_ms=1, default_api_timeout_ms=10_000)


def _producer(fake, transactional_id):
    producer = Producer(fake.addresses[0], transport=fake, transactional_id=transactional_id, **FAST)
    producer.init_transactions(timeout_s=10)
    return producer


@pytest.fixture
def fake():
    return FakeCluster({"t": 2})


@pytest.fixture
def two_producers(fake):
    """tx-open has an open transaction on t-0; tx-done committed one on t-1."""
    open_producer, done_producer = _producer(fake, "tx-open"), _producer(fake, "tx-done")
    open_producer.begin_transaction()
    open_producer.send("t", b"open", partition=0).result(timeout=10)
    done_producer.begin_transaction()
    done_producer.send("t", b"done", partition=1)
    done_producer.commit_transaction(timeout_s=10)
    yield open_producer, done_producer
    open_producer.close(timeout_s=5)
    done_producer.close(timeout_s=5)


def test_list_transactions_lists_every_id_with_its_state_and_filters(fake, two_producers):
    open_producer, done_producer = two_producers
    with _admin(fake) as admin:
        listed = admin.list_transactions()
        assert [(t.transactional_id, t.state) for t in listed] == [("tx-done", "CompleteCommit"),
                                                                   ("tx-open", "Ongoing")]
        assert [t.transactional_id for t in admin.list_transactions(states=["Ongoing"])] == ["tx-open"]
        assert [t.transactional_id for t in admin.list_transactions(states=["complete_commit", "EMPTY"])] == [
            "tx-done"]
        assert [t.transactional_id for t in admin.list_transactions(producer_ids=[done_producer.producer_id])] == [
            "tx-done"]
        assert admin.list_transactions(duration_ms=60_000) == []
        fake.now_ms = lambda: int(time.time() * 1000) + 120_000
        assert [t.transactional_id for t in admin.list_transactions(duration_ms=60_000)] == ["tx-open"]


def test_state_names_are_read_in_any_spelling_and_unknown_ones_refused():
    assert state_number("Ongoing") == state_number("ONGOING") == state_number("ongoing")
    assert state_number("PrepareCommit") == state_number("prepare_commit")
    with pytest.raises(ValueError, match="unknown transaction state 'bogus'"):
        state_number("bogus")


def test_describe_transactions_describes_each_id_at_its_coordinator(fake, two_producers):
    open_producer, _ = two_producers
    with _admin(fake) as admin:
        described = admin.describe_transactions(["tx-open", "tx-done"])
        assert [d.transactional_id for d in described] == ["tx-open", "tx-done"]
        current = described[0]
        assert current.state == "Ongoing" and current.partitions == (T0,)
        assert (current.producer_id, current.producer_epoch) == (open_producer.producer_id, 0)
        assert current.transaction_timeout_ms == 60_000 and current.transaction_start_time_ms > 0
        assert described[1].state == "CompleteCommit" and described[1].transaction_start_time_ms == -1
        with pytest.raises(Exception) as caught:
            admin.describe_transactions(["nobody"])
        assert caught.value.name == "TRANSACTIONAL_ID_NOT_FOUND"


def test_describe_follows_a_moved_coordinator(fake, two_producers):
    with _admin(fake) as admin:
        admin.describe_transactions(["tx-open"])  # caches the coordinator
        fake.move_coordinator("fake-coordinator-2:9")
        assert admin.describe_transactions(["tx-open"])[0].state == "Ongoing"
    addresses = [address for address, rpc in fake.calls if rpc == "DescribeTransactions"]
    assert addresses[-2:] == ["fake-coordinator:9", "fake-coordinator-2:9"]


def test_find_hanging_finds_a_transaction_no_coordinator_knows_and_abort_clears_it(fake, two_producers):
    now_ms = int(time.time() * 1000)
    offset = fake.inject_open_transaction(T1, producer_id=77, producer_epoch=3, last_timestamp_ms=now_ms)
    assert fake.partitions[T1].last_stable_offset == offset  # it holds read_committed back
    with _admin(fake) as admin:
        (hanging,) = admin.find_hanging(["t"])
        assert (hanging.topic, hanging.partition, hanging.producer_id, hanging.producer_epoch) == ("t", 1, 77, 3)
        assert hanging.start_offset == offset and hanging.coordinator_epoch == -1
        assert "no coordinator has an open transaction for producer id 77" in hanging.reason
        admin.abort_transaction((hanging.topic, hanging.partition), hanging.producer_id, hanging.producer_epoch,
                                hanging.coordinator_epoch)  # -1 is sent as 0
        assert admin.find_hanging() == []
    assert fake.partitions[T1].aborted == {offset}
    assert fake.committed_values(T1) == [b"done"]


def test_an_open_transaction_of_a_live_producer_is_not_hanging_until_it_outlives_every_timeout(fake, two_producers):
    with _admin(fake) as admin:
        assert admin.find_hanging() == []
        producers = fake.partitions[T0].producers
        pid = two_producers[0].producer_id
        producers[pid] = replace(producers[pid], last_timestamp_ms=producers[pid].last_timestamp_ms - 20 * 60 * 1000)
        (hanging,) = admin.find_hanging()
        assert hanging.partition == 0 and "max_transaction_timeout_ms" in hanging.reason
        assert admin.find_hanging(max_transaction_timeout_ms=60 * 60 * 1000) == []


def test_an_open_transaction_older_than_the_coordinators_current_one_is_hanging(fake):
    with _producer(fake, "tx-late") as producer:
        producer.begin_transaction()
        producer.send("t", b"first", partition=0)
        producer.commit_transaction(timeout_s=10)  # epoch 0 -> 1
        producer.begin_transaction()
        producer.send("t", b"second", partition=0).result(timeout=10)  # Ongoing at epoch 1, on t-0 only
        # t-1 still has an epoch-0 transaction of the same producer open: its marker was lost
        fake.inject_open_transaction(T1, producer.producer_id, 0, last_timestamp_ms=int(time.time() * 1000))
        with _admin(fake) as admin:
            (hanging,) = admin.find_hanging()
        assert (hanging.partition, hanging.producer_epoch) == (1, 0) and "a later one (epoch 1)" in hanging.reason
        producer.abort_transaction(timeout_s=10)


def test_admin_abort_checks_its_arguments(fake):
    with _admin(fake) as admin:
        with pytest.raises(ValueError, match="producer_id and producer_epoch"):
            admin.abort_transaction(("t", 0), -1, 0, 0)
        with pytest.raises(ValueError, match="must be an int"):
            admin.abort_transaction(("t", 0), 1, "0", 0)


# --- the CLI -----------------------------------------------------------------------------------------------


@pytest.fixture
def run_cli(fake, monkeypatch, capsys):
    monkeypatch.setattr(console_module, "_admin", lambda bootstrap, timeout_s: _admin(fake))

    def run(*argv):
        code = cli.main([*argv, "--bootstrap", fake.addresses[0]])
        out, err = capsys.readouterr()
        return code, [json.loads(line) for line in out.splitlines()], err

    return run


def test_cli_lists_and_describes_transactions_as_json_lines(run_cli, two_producers):
    code, lines, _ = run_cli("transactions", "list")
    assert code == 0 and [line["transactional_id"] for line in lines] == ["tx-done", "tx-open"]
    code, lines, _ = run_cli("transactions", "list", "--state", "Ongoing", "--producer-id",
                             str(two_producers[0].producer_id))
    assert code == 0 and lines == [{"transactional_id": "tx-open", "producer_id": two_producers[0].producer_id,
                                    "state": "Ongoing", "producer_epoch": two_producers[0].producer_epoch}]
    code, lines, _ = run_cli("transactions", "list", "--min-duration-ms", "3600000")
    assert code == 0 and lines == []
    code, lines, _ = run_cli("transactions", "describe", "tx-open", "tx-done")
    assert code == 0 and [line["state"] for line in lines] == ["Ongoing", "CompleteCommit"]
    assert lines[0]["partitions"] == [{"topic": "t", "partition": 0}]


def test_cli_finds_and_aborts_a_hanging_transaction(run_cli, fake, two_producers):
    fake.inject_open_transaction(T1, producer_id=77, producer_epoch=3, last_timestamp_ms=int(time.time() * 1000))
    code, lines, _ = run_cli("transactions", "find-hanging", "--topic", "t")
    assert code == 0 and len(lines) == 1
    found = lines[0]
    code, lines, _ = run_cli("transactions", "abort", "--topic", found["topic"], "--partition", str(found["partition"]),
                             "--producer-id", str(found["producer_id"]), "--producer-epoch",
                             str(found["producer_epoch"]), "--coordinator-epoch", str(found["coordinator_epoch"]))
    assert code == 0 and lines[0]["aborted"] is True
    code, lines, _ = run_cli("transactions", "find-hanging")
    assert code == 0 and lines == []


def test_cli_errors_are_one_line_with_the_code_and_exit_1(run_cli):
    code, lines, err = run_cli("transactions", "describe", "nobody")
    assert code == 1 and lines == []
    assert err.startswith("error: TRANSACTIONAL_ID_NOT_FOUND: ") and err.count("\n") == 1
    code, _, err = run_cli("transactions", "list", "--state", "bogus")
    assert code == 1 and err.startswith("error: INVALID_REQUEST: unknown transaction state 'bogus'")
