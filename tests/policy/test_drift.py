"""Drift monitor: triggers in both directions, hysteresis on recovery, idempotence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from predictive_scaler.policy.drift import OVER, UNDER, observe
from predictive_scaler.policy.state import DriftState, PendingForecast
from predictive_scaler.spec import DriftSettings

SETTINGS = DriftSettings()
STEP = 300


def run(values: list[float], p50: float = 100.0, p95: float = 110.0, state: DriftState | None = None,
        start: float = 0.0) -> tuple[DriftState, list[DriftState]]:
    pending = tuple(PendingForecast(start + i * STEP, p50, p95) for i in range(len(values) // 5 + 2))
    s = state if state is not None else DriftState()
    s = replace(s, pending=pending)
    trail = []
    for i, v in enumerate(values):
        s, _ = observe(s, SETTINGS, v, start + 60 * i + 1, STEP, slack=1.0)
        trail.append(s)
    return s, trail


GOOD_STEP = [100.0, 104.0, 96.0, 102.0, 98.0]  # one model step, scatter ~3 %: the monitor learns the spread

CASES = [
    ("good", [100, 104, 96, 108, 99] * 6, None),
    ("under-fast", GOOD_STEP + [100, 100, 140, 141, 139], UNDER),
    ("over-fast", GOOD_STEP + [100, 100, 70, 72, 69], OVER),
    # Step means: half the steps above the P95 (112 > 110) though none far above it — > 30 % of the window.
    ("under-window", ([112.0] * 5 + [100.0] * 5) * 6, UNDER),
    ("over-window", ([75.0] * 5 + [100.0] * 5) * 6 + [75.0] * 5, OVER),
    ("one-spike-is-not-drift", GOOD_STEP + [100, 100, 200, 100, 100, 100], None),
    # Bursty minutes (cv ~40 %) whose step means match the forecast: three low minutes in a row
    # are far below 0.8 × P50 one by one, but well within their usual spread.
    ("bursty-minutes-good-means", [160.0, 60.0, 160.0, 60.0, 60.0] + [60.0, 60.0, 60.0, 160.0, 160.0] * 12, None),
    # On such noisy traffic a drop to 30 % is still beyond the scatter; a dip to 45 % is within it.
    ("bursty-minutes-shift-down", [160.0, 60.0, 160.0, 60.0, 60.0] + [60.0, 60.0, 60.0, 160.0, 160.0] * 6
     + [30.0] * 16, OVER),
    # A source as coarse as the model step repeats one value per step: one far step is not 3 pieces of evidence.
    ("coarse-source-one-far-step", [100.0] * 10 + [60.0] * 5 + [100.0] * 10, None),
    ("coarse-source-three-far-steps", [100.0] * 10 + [60.0] * 16, OVER),
    ("bursty-minutes-short-dip", [160.0, 60.0, 160.0, 60.0, 60.0] + [60.0, 60.0, 60.0, 160.0, 160.0] * 6
     + [45.0] * 10 + [100.0] * 6, None),
]


@pytest.mark.parametrize(("values", "direction"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_triggers(values: list[float], direction: str | None) -> None:
    s, _ = run(values)
    assert s.drifting == (direction is not None)
    assert s.direction == direction


def test_recovery_needs_the_configured_while_and_far_values_restart_it() -> None:
    s, _ = run(GOOD_STEP + [140, 140, 140])
    assert s.drifting
    t0 = s.last_evaluated_at or 0.0
    # Good for 10 minutes, then one far-off value, then good again: recovery counts from after it.
    good = [100.0] * 10 + [150.0] + [100.0] * 16
    s2, trail = run(good, state=s, start=t0 + 59)
    back = next(i for i, st in enumerate(trail) if not st.drifting)
    assert back == 11 + SETTINGS.recovery_seconds // 60


def test_same_time_is_evaluated_once() -> None:
    s, _ = run(GOOD_STEP + [140, 140])
    again, _ = observe(s, SETTINGS, 130.0, s.last_evaluated_at or 0.0, STEP, slack=1.0)
    assert again == s


def test_steps_are_judged_on_their_mean_and_spread_is_learned() -> None:
    s, trail = run([90.0, 110.0] * 5 + [100.0])
    assert s.outcomes and all(o == 0 for o in s.outcomes)  # means of 100 vs P50 100 / P95 110
    assert s.noise_var is not None and 0.005 < s.noise_var < 0.02  # ±10 % scatter
    assert all(t.run == 0 for t in trail)


@pytest.mark.parametrize("lagged", [True, False], ids=["observed-at", "now"])
def test_delayed_observations_are_judged_in_the_step_they_belong_to(lagged: bool) -> None:
    """A source as coarse as the model step, seen 60 s late: each step's first observation is the previous
    step's value. Judged at the time it is of, the source stays coarse (one value per step: single
    observations are left to the step means) and the step changes the forecast predicted are fine; judged
    at ``now``, every step mixes two values and the source looks like scatter."""
    from predictive_scaler.policy.drift import MIN_NOISE_VAR

    levels = [100.0, 100.0, 40.0, 40.0, 40.0, 100.0, 100.0, 40.0]  # the forecast knows every level
    pending = tuple(PendingForecast(i * STEP, lv, lv * 1.1) for i, lv in enumerate(levels))
    s = replace(DriftState(), pending=pending)
    for i in range(len(levels) * 5):
        now = 60.0 * i + 1
        seen = now - 60
        value = levels[max(0, int(seen // STEP))]
        s, _ = observe(s, SETTINGS, value, now, STEP, slack=1.0, observed_at=seen if lagged else None)
    assert not s.drifting
    assert s.noise_var is not None
    assert (s.noise_var <= MIN_NOISE_VAR) == lagged
