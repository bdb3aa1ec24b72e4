"""What the Spark tests check a job's output against: the expected totals,
computed from the generated events without Spark, and the output and offsets
as a plain Consumer sees them."""

from __future__ import annotations

import collections
import json

from spark_jobs import sample_events
from spark_jobs.windowed_counts import MALFORMED, section_of
from txlog import Admin, Consumer
from txlog.admin import OPEN_STATES
from txlog.two_phase import wait_until

WINDOW_MS = 60_000


def expected_views(count: int, seed: int = 1) -> dict[str, int]:
    """Views per section over all windows (malformed events are counted in the
    window of their append time, so only their number is known in advance)."""
    views = collections.Counter()
    for _, value in sample_events.events(count, seed):
        try:
            views[section_of(json.loads(value)["page"])] += 1
        except ValueError:
            views[MALFORMED] += 1
    return dict(views)


def expected_windows(count: int, seed: int = 1, start_ms: int = sample_events.START_MS) -> dict[tuple[str, int], tuple[int, int]]:
    """(views, bytes) per (section, window start) of the well-formed events."""
    totals = collections.defaultdict(lambda: [0, 0])
    for _, value in sample_events.events(count, seed, start_ms):
        try:
            event = json.loads(value)
        except ValueError:
            continue
        entry = totals[(section_of(event["page"]), event["ts"] - event["ts"] % WINDOW_MS)]
        entry[0] += 1
        entry[1] += event["bytes"]
    return {key: tuple(v) for key, v in totals.items()}


MARKERS_SETTLE_S = 15  # how long a read_committed read waits for the markers of transactions already committed


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed", **client_tls: str) -> list:
    with Consumer(bootstrap, isolation_level=isolation, **client_tls) as consumer:
        tps = [(topic, p) for p in consumer.partitions_for(topic)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        if isolation == "read_committed":
            settle(bootstrap, tps, client_tls)
        ends = consumer.end_offsets(tps)
        records = []
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            records.extend(r for r in consumer.poll(timeout_s=1.0) if r.offset < ends[(r.topic, r.partition)])
        return records


def settle(bootstrap: str, tps: list, client_tls: dict) -> None:
    """Waits (at most MARKERS_SETTLE_S) until no transaction holds the topic's
    last stable offset below its high watermark. A commit answers once its
    decision is written; its markers follow (as in Kafka), and until they are
    written read_committed readers stop short of the transaction. A test that
    leaves a transaction open on purpose reads what is stable after the wait."""
    with Admin(bootstrap, **client_tls) as admin:
        try:
            wait_until(lambda: {tp: o.offset for tp, o in admin.list_offsets(dict.fromkeys(tps, "last_stable")).items()}
                       == {tp: o.offset for tp, o in admin.list_offsets(dict.fromkeys(tps, "latest")).items()},
                       MARKERS_SETTLE_S, "the committed transactions' markers")
        except TimeoutError:
            pass


def counts(bootstrap: str, topic: str, **client_tls: str) -> list[dict]:
    return [json.loads(r.value) for r in read_all(bootstrap, topic, **client_tls)]


def windows_of(counted: list[dict]) -> dict[tuple[str, int], tuple[int, int]]:
    totals = collections.defaultdict(lambda: [0, 0])
    for c in counted:
        if c["section"] != MALFORMED:
            entry = totals[(c["section"], c["window_start_ms"])]
            entry[0] += c["views"]
            entry[1] += c["bytes"]
    return {key: tuple(v) for key, v in totals.items()}


def views_of(counted: list[dict]) -> dict[str, int]:
    views = collections.Counter()
    for c in counted:
        views[c["section"]] += c["views"]
    return dict(views)


def source_ranges(counted: list[dict]) -> dict[int, list[tuple[int, int]]]:
    """Per input partition, the distinct input ranges the committed output came from, sorted."""
    ranges = collections.defaultdict(set)
    for c in counted:
        ranges[c["source"]["partition"]].add((c["source"]["from"], c["source"]["to"]))
    return {p: sorted(r) for p, r in ranges.items()}


def assert_tiles(ranges: list[tuple[int, int]], end: int) -> None:
    """The ranges cover [0, end) with no gap and no overlap: each input offset counted once."""
    position = 0
    for start, stop in ranges:
        assert start == position, f"ranges {ranges}: a gap or an overlap at {position}"
        position = stop
    assert position == end, f"ranges {ranges} stop at {position}, not at the end {end}"


def committed_offsets(bootstrap: str, group: str, topic: str, **client_tls: str) -> dict[int, int | None]:
    with Consumer(bootstrap, group_id=group, **client_tls) as consumer:
        return {p: consumer.committed((topic, p)) for p in consumer.partitions_for(topic)}


def end_offsets(bootstrap: str, topic: str, **client_tls: str) -> dict[int, int]:
    with Consumer(bootstrap, **client_tls) as consumer:
        ends = consumer.end_offsets([(topic, p) for p in consumer.partitions_for(topic)])
    return {p: end for (_, p), end in ends.items()}


def open_transactions(bootstrap: str, prefix: str, **client_tls: str) -> list:
    with Admin(bootstrap, **client_tls) as admin:
        return [t for t in admin.list_transactions(states=["Ongoing", "PrepareCommit", "PrepareAbort"])
                if t.transactional_id.startswith(prefix)]


def undecided_transactions(bootstrap: str, prefix: str) -> list:
    """The transactions of ids starting with ``prefix`` that are not decided yet: open,
    Prepared (two-phase, waiting for a decision) or between a decision and its markers."""
    with Admin(bootstrap) as admin:
        return [t for t in admin.list_transactions(prefix=prefix) if t.state in OPEN_STATES]


def key_totals(bootstrap: str, topic: str, isolation: str = "read_committed") -> dict[str, int]:
    """The counts of a ``key_counts`` output ({"key": k, "count": n} values) summed per key."""
    totals = collections.Counter()
    for record in read_all(bootstrap, topic, isolation):
        value = json.loads(record.value)
        totals[value["key"]] += value["count"]
    return dict(totals)
