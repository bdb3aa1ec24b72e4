"""The ``txlog`` command: ``main`` parses (txlog/cli/program.py), the client commands
run through the SDK (txlog/cli/commands.py)."""

from txlog.cli.program import main

__all__ = ["main"]
