"""The `txlog` command's usage errors: told by the subcommand that was given
the bad flag, with the flag it most likely meant (no cluster involved)."""

import io

import pytest

from services import cli
from services.client import console


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


def test_negative_numbers_are_values_not_flags(capsys):
    err = usage_error(capsys, "groups", "reset-offsets", "g", "--shift-by", "-100", "--topic", "t")  # no --dir
    assert "one of the arguments --bootstrap --dir is required" in err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_empty_listing_is_said_on_a_terminal_and_silent_in_a_pipe():
    terminal, pipe = Terminal(), io.StringIO()
    console.say_none(terminal, "no hanging transactions")
    console.say_none(pipe, "no hanging transactions")
    assert terminal.getvalue() == "(no hanging transactions)\n" and pipe.getvalue() == ""
