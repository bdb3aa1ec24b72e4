"""Service configuration from flags and environment, with documented defaults.

Each setting has one name; it is read, in order of precedence, from the flag
``--name-with-dashes``, the environment variable ``TXLOG_NAME_IN_CAPITALS``, and
its default. ``python -m <service> --help`` lists every setting with its
environment variable and default; README.md has the same table.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from txlog.errors import ConfigError  # noqa: F401  (raised by the settings below; defined on the SDK side, which TLS shares)

ENV_PREFIX = "TXLOG_"




@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    switch: bool = False  # a flag without a value (``--once``); its environment variable takes true/false

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise ValueError(f"must be positive, got {text!r}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be >= 0, got {text!r}")
    return value


boolean = _bool
positive_int = _positive(int)
positive_float = _positive(float)

# Settings every service has.
COMMON_SETTINGS: tuple[Setting, ...] = (
    Setting("zookeeper", "127.0.0.1:2181", "ZooKeeper connection string (host:port[,host:port...])"),
    Setting("zookeeper_root", "/txlog", "ZooKeeper path under which all txlog metadata lives"),
    Setting("zookeeper_session_timeout_s", 10.0, "ZooKeeper session timeout, seconds", positive_float),
    Setting("zookeeper_auth_file", "", "file holding user:password, a ZooKeeper digest identity: the service "
            "authenticates with it and creates every znode readable by anyone, changeable only by that identity; "
            "empty: no ZooKeeper authentication"),
    Setting("node_id", 0, "this instance's node id, unique per service kind (>= 0)", non_negative_int),
    Setting(
        "advertised_address",
        "",
        "host:port other processes use to reach this instance; a host alone (or port 0) takes the bound port "
        "(default: the listen host, or this machine's host name when listening on 0.0.0.0, with the bound port)",
    ),
    Setting("log_level", "INFO", "log level", str, ("DEBUG", "INFO", "WARNING", "ERROR")),
    Setting(
        "otel_exporter",
        "none",
        "where traces go: console (JSON lines on stderr), otlp (metrics too), or none (no spans are recorded)",
        str,
        ("none", "console", "otlp"),
    ),
    Setting("otel_endpoint", "http://127.0.0.1:4317", "OTLP/gRPC endpoint when otel_exporter=otlp (https: TLS); left at "
            "this default, the standard OTEL_EXPORTER_OTLP_* variables decide when set"),
    Setting("shutdown_grace_s", 10.0, "on SIGTERM, how long in-flight calls may take to finish", positive_float),
)


def load(
    description: str,
    settings: Sequence[Setting],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> SimpleNamespace:
    """Parses flags over environment over defaults; exits with status 2 and a
    message naming the setting on a bad value."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    names = set()
    for setting in settings:
        if setting.name in names:
            raise ValueError(f"setting {setting.name} declared twice")
        names.add(setting.name)
        default = setting.default
        if setting.env in environ:
            try:
                default = setting.type(environ[setting.env])
            except ValueError as exc:
                parser.error(f"environment variable {setting.env}: {exc}")
            if setting.choices and default not in setting.choices:
                parser.error(f"environment variable {setting.env}: {default!r} is not one of {setting.choices}")
        if setting.switch:
            parser.add_argument(setting.flag, dest=setting.name, default=default, action="store_true",
                                help=f"{setting.help} [env {setting.env}]")
            continue
        parser.add_argument(
            setting.flag,
            dest=setting.name,
            default=default,
            type=setting.type,
            choices=setting.choices,
            help=f"{setting.help} [env {setting.env}]",
        )
    return parser.parse_args(argv)


def markdown_table(settings: Sequence[Setting]) -> str:
    """The settings as a Markdown table, for README.md."""
    rows = ["| flag | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for s in settings:
        rows.append(f"| `{s.flag}` | `{s.env}` | `{s.default}` | {s.help} |")
    return "\n".join(rows)
