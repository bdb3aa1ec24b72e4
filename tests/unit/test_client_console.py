"""The console tools' pieces that need no server: the progress bar and --config parsing."""

import io

import pytest

from txlog.cli.commands import Progress, parse_configs


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_drawn_on_a_terminal_and_ends_with_a_newline():
    stream = Terminal()
    progress = Progress(stream, total=200)
    progress.update(50, force=True)
    assert "50/200 records" in stream.getvalue() and "25.0%" in stream.getvalue()
    progress.finish(200)
    assert stream.getvalue().endswith("200/200 records 100.0%\n")
    assert "#" * 40 in stream.getvalue()


def test_progress_is_silent_when_not_a_terminal_or_without_a_range():
    piped = io.StringIO()
    Progress(piped, total=10).finish(10)
    assert piped.getvalue() == ""
    terminal = Terminal()
    Progress(terminal, total=0).finish(5)
    assert terminal.getvalue() == ""


def test_config_options_parse_as_key_value():
    assert parse_configs(["retention.ms=1000", "cleanup.policy=compact", "empty="]) == {
        "retention.ms": "1000", "cleanup.policy": "compact", "empty": ""}
    with pytest.raises(Exception, match="key=value"):
        parse_configs(["novalue"])
