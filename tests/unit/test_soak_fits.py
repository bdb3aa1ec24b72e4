"""The soak's fits (bench/soak.py): a series that moves with something the
design makes it follow (a partition_svc's CPU with the partitions it leads) is
judged on the drift left once that is taken out, and a real drift beside it
still shows."""

from __future__ import annotations

import random

from bench.soak import fitted, within_slope

HOURS = [i / 60 for i in range(60)]
# Leadership moved by faults: an instance leads 2 partitions, then 4, then 6 (never back).
LED = [2] * 20 + [4] * 20 + [6] * 20


def noisy(values: list[float], seed: int) -> list[float]:
    rng = random.Random(seed)
    return [v + rng.gauss(0, 0.002) for v in values]


def test_a_series_that_only_follows_leadership_is_flat_once_leadership_is_taken_out():
    cpu = noisy([0.10 + 0.05 * led for led in LED], seed=1)
    alone = fitted(cpu, HOURS, warmup=5)
    assert alone["verdict"] == "grows"  # by its slope alone it looks like a leak
    controlled = fitted(cpu, HOURS, warmup=5, covariate=LED, covariate_name="partitions_led")
    assert controlled["verdict"] == "flat" and controlled["controlled_for"] == "partitions_led"
    assert abs(controlled["per_covariate_unit"] - 0.05) < 0.005
    assert controlled["uncontrolled"]["verdict"] == "grows"


def test_a_drift_beside_leadership_still_grows():
    cpu = noisy([0.10 + 0.05 * led + 0.2 * t for led, t in zip(LED, HOURS, strict=True)], seed=2)
    controlled = fitted(cpu, HOURS, warmup=5, covariate=LED, covariate_name="partitions_led")
    assert controlled["verdict"] == "grows"
    assert abs(controlled["slope_per_hour"] - 0.2) < 0.02


def test_samples_without_the_covariate_are_left_out_and_a_constant_one_changes_nothing():
    values = noisy([1.0 + 0.5 * t for t in HOURS], seed=3)
    plain = within_slope([(t, v, 0) for t, v in zip(HOURS, values, strict=True)])
    constant = within_slope([(t, v, 0) for t, v in zip(HOURS, values, strict=True)], [3.0] * 60)
    assert constant == plain and "covariate_coefficient" not in constant
    gaps = fitted(values, HOURS, warmup=5, covariate=[None if i % 2 else led for i, led in enumerate(LED)],
                  covariate_name="partitions_led")
    assert gaps["fitted_samples"] == len([i for i in range(5, 60) if i % 2 == 0])
