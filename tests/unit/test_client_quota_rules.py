"""Client quotas' pure rules (partition_svc/client_quotas.py): entities and
their names, which configured entity applies and who shares it, the sampled
rate and the hold it calls for, and, on a simulated clock, that holding the
answers keeps a greedy client to its quota."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_svc.client_quotas import (
    SAMPLES,
    THROTTLE_MAX_MS,
    WINDOW_MS,
    QuotaTracker,
    Rate,
    applying,
    checked_values,
    entity_of,
    entity_of_node,
    node_name,
    request_amount,
    throttle_ms,
)
from txlog.protocol.errors import TxlogError

P = "producer_byte_rate"


def test_entities_are_checked_and_named_for_zookeeper_whatever_their_names_hold():
    entity = entity_of({"client-id": "a/b,c=d", "user": "alice"})
    assert entity == (("user", "alice"), ("client-id", "a/b,c=d")), "users first"
    assert entity_of_node(node_name(entity)) == entity
    default = entity_of({"user": None})
    assert node_name(default) == "user=<default>" and entity_of_node(node_name(default)) == default
    for bad in ({}, {"host": "x"}, {"user": ""}, {"user": "<default>"}, {"client-id": "x" * 256}):
        with pytest.raises(TxlogError):
            entity_of(bad)


def test_values_are_positive_byte_rates_of_known_keys_and_none_removes():
    assert checked_values({P: 10, "consumer_byte_rate": None}) == {P: 10.0, "consumer_byte_rate": None}
    for bad in ({"request_rate": 1}, {P: 0}, {P: -5}, {P: 0.5}, {P: float("inf")}, {P: True}, {P: "5"}):
        with pytest.raises(TxlogError):
            checked_values(bad)


def test_a_request_percentage_is_any_positive_share_of_the_handler_thread():
    assert checked_values({"request_percentage": 0.5}) == {"request_percentage": 0.5}, "half a percent: 5 ms a second"
    for bad in ({"request_percentage": 0}, {"request_percentage": -1}, {"request_percentage": float("nan")}):
        with pytest.raises(TxlogError, match="request_percentage"):
            checked_values(bad)


def test_handler_time_over_its_request_percentage_is_throttled_as_bytes_are():
    """A client whose handlers took 300 ms of the loop within a second has taken 30 % of it: under a 10 %
    quota it is held (30 - 10) / 10 of the second."""
    tracker = QuotaTracker()
    configs = {(("client-id", "busy"),): {"request_percentage": 10.0}}
    assert request_amount(0.3) == pytest.approx(30)
    held = tracker.record(configs, "", "busy", [(P, 100), ("request_percentage", request_amount(0.3))], 500)
    assert held == 2_000
    assert tracker.throttled_ms(configs, "", "busy", "request_percentage", 600)[1] == 1_900
    assert tracker.record(configs, "", "calm", [("request_percentage", request_amount(0.3))], 500) == 0, "no quota"


def test_the_most_specific_entity_applies_and_defaults_are_each_names_own():
    configs = {(("client-id", None),): {P: 10.0},
               (("user", "alice"),): {P: 20.0},
               (("user", "alice"), ("client-id", "batch")): {P: 30.0},
               (("user", None), ("client-id", "batch")): {P: 40.0}}
    assert applying(configs, "alice", "batch", P) == ((("user", "alice"), ("client-id", "batch")), 30.0)
    assert applying(configs, "alice", "web", P) == ((("user", "alice"),), 20.0), "alice's clients share her quota"
    assert applying(configs, "bob", "batch", P) == ((("user", "bob"), ("client-id", "batch")), 40.0)
    assert applying(configs, "bob", "web", P) == ((("client-id", "web"),), 10.0), "the default client-id: each id its own"
    assert applying(configs, "bob", "web", "consumer_byte_rate") is None


def test_a_rate_is_over_the_windows_kept_and_the_hold_is_kafkas():
    rate = Rate(started_ms=0)
    rate.record(5_000, 100)
    assert rate.per_second(500) == 5_000, "a young rate is over one window at least"
    assert throttle_ms(rate, 5_000, 500) == 0
    rate.record(5_000, 900)
    assert throttle_ms(rate, 5_000, 900) == 1_000, "(10000 - 5000) / 5000 * 1000 ms"
    assert throttle_ms(rate, 1, 900) == THROTTLE_MAX_MS
    later = SAMPLES * WINDOW_MS + 2_000
    rate.record(0, later)
    assert rate.per_second(later) == 0 and throttle_ms(rate, 1, later) == 0, "windows older than the span are dropped"


@settings(max_examples=40, deadline=None)
@given(quota=st.integers(10_000, 10_000_000), share=st.floats(0.05, 1.0), lanes=st.integers(1, 32),
       gap_ms=st.integers(0, 50))
def test_waiting_turns_keeps_a_greedy_client_within_a_fifth_of_its_quota(quota, share, lanes, gap_ms):
    """A client with ``lanes`` calls in flight, each sent again as soon as the
    last is answered, on a simulated clock for two minutes; as the server does,
    a call of a throttled entity waits until it is not before it is applied.
    What it got applied over the last minute is within 20% of its quota (or it
    sends less than its quota anyway), however many calls it keeps in flight."""
    request_bytes = max(1, int(quota * share / lanes))
    configs = {(("client-id", "greedy"),): {P: float(quota)}}
    tracker = QuotaTracker()
    due = [(0.0, lane) for lane in range(lanes)]
    applied = []
    while due:
        now, lane = heapq.heappop(due)
        if now >= 120_000:
            break
        _, left = tracker.throttled_ms(configs, "ANONYMOUS", "greedy", P, now)
        if left:
            heapq.heappush(due, (now + left, lane))
            continue
        tracker.record(configs, "ANONYMOUS", "greedy", [(P, request_bytes)], now)
        applied.append((now, request_bytes))
        heapq.heappush(due, (now + gap_ms + 1, lane))
    last_minute = sum(size for at, size in applied if at >= 60_000) / 60
    slack = lanes * request_bytes / 60
    assert last_minute <= quota * 1.2 + slack, (last_minute, quota)
    if lanes * request_bytes * 1000 / (gap_ms + 1) > quota * 2:  # it could send at least twice its quota unthrottled
        assert last_minute >= quota * 0.8 - slack, (last_minute, quota)


def test_the_tracker_keeps_its_most_recently_used_rates_only():
    tracker = QuotaTracker(tracked_max=3)
    configs = {(("client-id", None),): {P: 1.0}}
    for n in range(5):
        tracker.record(configs, "u", f"c{n}", [(P, 100)], 1_000)
    assert [entity for (entity, _) in tracker.rates] == [(("client-id", f"c{n}"),) for n in (2, 3, 4)]
    assert set(tracker.throttled_until) <= set(tracker.rates)
