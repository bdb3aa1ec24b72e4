"""The chaos workload's client side of mutual TLS: the three PEM files the
CLI takes (--tls-ca, --tls-cert, --tls-key), carried from the command line
of ``external`` to every worker and to the final read, so the workload runs
against a cluster that requires client certificates (the chart's default)."""

from __future__ import annotations

import argparse

OPTIONS = ("tls_ca", "tls_cert", "tls_key")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-ca", help="PEM of the CA that verifies the services (TLS on when given)")
    parser.add_argument("--tls-cert", help="this client's certificate (PEM), for mutual TLS")
    parser.add_argument("--tls-key", help="its private key (PEM)")


def options(args: argparse.Namespace) -> dict[str, str]:
    """The SDK's keyword arguments for what was given (nothing: plaintext)."""
    return {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None)}


def arguments(tls: dict[str, str]) -> list[str]:
    """``tls`` (as options() gives it) as command-line arguments again, for a worker."""
    return [arg for name, value in sorted(tls.items()) for arg in (f"--{name.replace('_', '-')}", value)]
