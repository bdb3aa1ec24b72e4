"""The `txlog` command's usage errors: told by the subcommand that was given
the bad flag, with the flag it most likely meant (no cluster involved)."""

import io
import json

import pytest

from txlog.cli import commands as console
from txlog.cli import program as cli
from txlog.errors import ClientError
from txlog.structs import ConsumerRecord


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_flag_is_reported_by_its_subcommand_with_a_suggestion(capsys):
    err = usage_error(capsys, "topics", "create", "t", "--partitions", "3", "--replicaton-factor", "2")
    assert err.startswith("usage: txlog topics create")
    assert "unrecognized argument --replicaton-factor; did you mean --replication-factor?" in err


def test_an_unknown_flag_after_a_complete_command_names_the_subcommand(capsys):
    err = usage_error(capsys, "groups", "describe", "g", "--dir", "d", "--verbose")
    assert err.startswith("usage: txlog groups describe") and "unrecognized argument --verbose\n" in err


def test_negative_numbers_are_values_not_flags():
    args = cli.parse(["groups", "reset-offsets", "g", "--shift-by", "-100", "--topic", "t"])
    assert args.shift_by == -100 and args.topic == ["t"]


def test_where_the_cluster_is_comes_from_a_flag_a_client_config_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TXLOG_BOOTSTRAP", raising=False)
    with pytest.raises(ClientError, match="say where the cluster is"):
        cli._bootstrap(cli.parse(["topics", "list"]))
    monkeypatch.setenv("TXLOG_BOOTSTRAP", "envhost:7300")
    assert cli._bootstrap(cli.parse(["topics", "list"])).bootstrap == "envhost:7300"
    assert cli._bootstrap(cli.parse(["topics", "list", "--bootstrap", "flaghost:1"])).bootstrap == "flaghost:1"
    config = tmp_path / "client.properties"
    config.write_text("# as Kafka's tools take\nbootstrap.servers = filehost:7300,filehost:7301\ntls.ca=ca.pem\n")
    target = cli._bootstrap(cli.parse(["topics", "list", "--command-config", str(config), "--tls-cert", "mine.pem"]))
    assert target.bootstrap == "filehost:7300,filehost:7301"
    assert target.tls_ca == str(tmp_path / "ca.pem") and target.tls_cert == "mine.pem"
    config.write_text("bootstrap.servers=h:1\nssl.truststore.location=x\n")
    with pytest.raises(ClientError, match="line 2: expected KEY=VALUE with KEY one of bootstrap.servers"):
        cli._bootstrap(cli.parse(["topics", "list", "--command-config", str(config)]))


def test_records_print_as_kafka_console_consumer_prints_them_or_as_json():
    record = ConsumerRecord("t", 2, 41, b"k", b"v\xff", [("h", b"1"), ("n", None)], 1_795_000_000_000)
    plain = console.format_record(record, "plain", True, b"\t", frozenset({"offset", "headers", "timestamp", "partition"}))
    assert plain == b"CreateTime:1795000000000\tPartition:2\tOffset:41\th:1,n:null\tk\tv\xff\n"
    assert console.format_record(record._replace(headers=[]), "plain", False, b"|", frozenset({"headers"})) == b"NO_HEADERS|v\xff\n"
    assert json.loads(console.format_record(record, "json", False, b"\t", frozenset())) == {
        "topic": "t", "partition": 2, "offset": 41, "timestamp_ms": 1_795_000_000_000, "key": "k",
        "value": {"base64": "dv8="}, "headers": [["h", "1"], ["n", None]]}


def test_print_outcome_reads_read_uncommitted_and_is_refused_with_read_committed(capsys):
    record = ConsumerRecord("t", 0, 5, None, b"v", [], 1, producer_id=7, transaction_outcome="aborted")
    assert console.format_record(record, "plain", False, b"\t", frozenset({"offset", "outcome"})) == b"Offset:5\tOutcome:aborted\tv\n"
    assert json.loads(console.format_record(record, "json", False, b"\t", frozenset({"outcome"})))["outcome"] == "aborted"
    assert "outcome" not in json.loads(console.format_record(record, "json", False, b"\t", frozenset()))
    assert cli.consume_isolation(cli.parse(["consume", "t", "--print-outcome"])) == "read_uncommitted"
    assert cli.consume_isolation(cli.parse(["consume", "t"])) == "read_committed"
    err = usage_error(capsys, "consume", "t", "--print-outcome", "--isolation", "read_committed", "--bootstrap", "h:1")
    assert err.startswith("usage: txlog consume") and "--print-outcome reads read_uncommitted" in err
    with pytest.raises(ClientError, match="--print-outcome reads read_uncommitted, not read_committed"):
        console.consume("h:1", "t", from_beginning=True, group=None, max_records=None, isolation="read_committed",
                        partition=None, to_end=True, timeout_ms=None, print_key=False, key_separator="\t",
                        out=io.BytesIO(), err=io.StringIO(), print_fields=frozenset({"outcome"}))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_empty_listing_is_said_on_a_terminal_and_silent_in_a_pipe():
    terminal, pipe = Terminal(), io.StringIO()
    console.say_none(terminal, "no hanging transactions")
    console.say_none(pipe, "no hanging transactions")
    assert terminal.getvalue() == "(no hanging transactions)\n" and pipe.getvalue() == ""


def test_listings_are_a_table_on_a_terminal_and_json_lines_in_a_pipe():
    rows = [{"group_id": "billing", "state": "Stable", "members": 3}, {"group_id": "audit-long-name", "state": "Empty", "members": 0}]
    terminal, pipe = Terminal(), io.StringIO()
    console.write_rows(terminal, rows, "auto", "no consumer groups")
    console.write_rows(pipe, rows, "auto", "no consumer groups")
    assert terminal.getvalue().splitlines() == ["GROUP_ID         STATE   MEMBERS",
                                                "billing          Stable  3",
                                                "audit-long-name  Empty   0"]
    assert [json.loads(line) for line in pipe.getvalue().splitlines()] == rows
    forced = io.StringIO()
    console.write_rows(forced, rows[:1], "table", "none")
    assert forced.getvalue().startswith("GROUP_ID")


def test_progress_counts_lines_on_a_terminal_when_there_is_no_total():
    terminal = Terminal()
    progress = console.Progress(terminal, 0, counting=True, what="lines sent")
    progress.update(5, force=True)
    progress.finish(7)
    assert terminal.getvalue() == "\r5 lines sent\r7 lines sent\n"
    assert not console.Progress(io.StringIO(), 0, counting=True).enabled


def test_a_mistyped_command_is_an_invalid_choice_even_with_flags_after_it(capsys):
    err = usage_error(capsys, "topic", "list", "--bootstrap", "x:1")
    assert "invalid choice: 'topic'" in err and "unrecognized argument" not in err
    err = usage_error(capsys, "topics", "lst", "--bootstrap", "x:1")
    assert "invalid choice: 'lst'" in err and "unrecognized argument" not in err


def test_a_bad_time_names_the_flag_it_came_with(capsys):
    assert cli.main(["offsets", "t", "--time", "yesterday", "--bootstrap", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert "--time takes an ISO 8601" in err and "--to-datetime" not in err


def test_group_config_set_without_an_equals_sign_is_a_usage_error_of_its_subcommand(capsys):
    err = usage_error(capsys, "transactions", "group-config", "orders", "--set", "transaction.check.max", "--bootstrap", "h:1")
    assert err.startswith("usage: txlog transactions group-config")
    assert "--set takes key=value, not 'transaction.check.max'" in err
    err = usage_error(capsys, "transactions", "group-config", "orders", "--set", "=5", "--bootstrap", "h:1")
    assert "--set takes key=value, not '=5'" in err


def test_group_config_may_not_set_and_delete_the_same_key(capsys):
    err = usage_error(capsys, "transactions", "group-config", "orders", "--set", "transaction.check.max=3",
                      "--delete", "transaction.check.max", "--bootstrap", "h:1")
    assert "either set or deleted, not both: transaction.check.max" in err


def test_group_config_parses_repeated_sets_and_deletes_and_describes_without_them():
    args = cli.parse(["transactions", "group-config", "orders", "--set", "transaction.check.interval.ms=500",
                      "--set", "transaction.check.exhausted=keep", "--delete", "transaction.check.max"])
    assert args.group == "orders" and args.delete == ["transaction.check.max"]
    assert console.parse_configs(args.set, "--set") == {"transaction.check.interval.ms": "500",
                                                       "transaction.check.exhausted": "keep"}
    bare = cli.parse(["transactions", "group-config", "orders"])
    assert bare.set is None and bare.delete is None
