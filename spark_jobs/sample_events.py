"""Sample input for ``windowed_counts``: deterministic page-view events.

    python -m spark_jobs.sample_events --bootstrap 127.0.0.1:7300 --topic events --count 20000
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from spark_jobs.writing import SendFailures
from txlog import Producer

PAGES = ("/", "/docs/intro", "/docs/api", "/blog/launch", "/pricing", "/signup", "/account/settings", "/about")
START_MS = 1_795_000_000_000  # a fixed instant, so that windows are the same on every run
SPREAD_MS = 10 * 60_000


def events(count: int, seed: int = 1, start_ms: int = START_MS) -> list[tuple[str, str]]:
    """``count`` (key, JSON value) pairs: key = user, ts within 10 minutes of ``start_ms``;
    about one in a thousand values is not JSON (the job counts it as malformed)."""
    rng = random.Random(seed)
    generated = []
    for i in range(count):
        user = f"u{rng.randrange(500)}"
        if rng.random() < 0.001:
            generated.append((user, f"not json {i}"))
            continue
        event = {"user": user, "page": rng.choice(PAGES), "ts": start_ms + rng.randrange(SPREAD_MS),
                 "bytes": rng.randrange(200, 5000), "n": i}
        generated.append((user, json.dumps(event)))
    return generated


def load(bootstrap: str, topic: str, generated: list[tuple[str, str]], **client_tls: str) -> None:
    """Produces the events with an idempotent producer, keyed by user; raises if any failed."""
    failures = SendFailures()
    with Producer(bootstrap, linger_ms=20, **client_tls) as producer:
        for key, value in generated:
            failures.watch(producer.send(topic, value=value, key=key))
        producer.flush()
    failures.raise_first()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:7300")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tls-ca", help="PEM CA bundle of a TLS cluster")
    parser.add_argument("--tls-cert", help="PEM client certificate (mutual TLS)")
    parser.add_argument("--tls-key", help="PEM key of --tls-cert")
    parser.add_argument("--token-file", help="bearer token, for a cluster that authenticates by token (with --tls-ca)")
    args = parser.parse_args(argv)
    load(args.bootstrap, args.topic, events(args.count, args.seed), tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
         token_file=args.token_file)
    print(f"produced {args.count} events to {args.topic}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
