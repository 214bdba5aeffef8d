"""Forecast-versus-reality monitor, both directions, with hysteresis.

Each valid demand observation is compared with the forecast issued *before*
it for the model step it falls in (kept in :class:`DriftState.pending`):

- far above: above P95 × (1 + farAboveMargin) — under-forecast, risks the SLO;
- far below: below P50 × farBelowRatio — over-forecast, wastes money;
- differences smaller than a tenth of one replica's capacity never count,
  so near-zero traffic cannot flap the monitor.

Drift starts on ``fastPeriods`` consecutive far-off observations in one
direction (a level shift is caught within a few control periods), or when the
rolling window's share above P95 exceeds ``maxAboveFraction`` (a good P95 is
exceeded ~5 % of the time) or its share far below P50 exceeds
``maxFarBelowFraction``. It ends only after the forecast has been good (no
observation far off) for ``recoverySeconds``; any far-off observation restarts that clock.
"""

from __future__ import annotations

from dataclasses import replace

from predictive_scaler.policy.capacity import ForecastView
from predictive_scaler.policy.state import (
    ABOVE,
    FAR_ABOVE,
    FAR_BELOW,
    OK,
    DriftState,
    PendingForecast,
)
from predictive_scaler.spec import DriftSettings

#: Pending forecasts kept: enough steps to outlive a few missed model updates.
MAX_PENDING = 6

UNDER = "under-forecast"
OVER = "over-forecast"


def refresh_pending(state: DriftState, view: ForecastView, now: float) -> DriftState:
    """Remember the newest forecast for the steps from the one containing ``now`` on."""
    first = max(0, view.index_at(now))
    n = min(len(view.pq), first + MAX_PENDING)
    fresh = tuple(
        PendingForecast(view.step_start(h), None if view.p50 is None else float(view.p50[h]), float(view.pq[h]))
        for h in range(first, n)
    )
    if not fresh:
        return state
    kept = tuple(p for p in state.pending if p.step_start < fresh[0].step_start
                 and p.step_start + view.step_seconds > now)
    pending = (kept + fresh)[-MAX_PENDING:]
    return state if pending == state.pending else replace(state, pending=pending)


def pending_for(state: DriftState, now: float, step_seconds: int | None) -> PendingForecast | None:
    """The forecast issued for the step containing ``now``, if one is remembered."""
    if step_seconds is None and len(state.pending) >= 2:
        step_seconds = int(state.pending[1].step_start - state.pending[0].step_start)
    best = None
    for p in state.pending:
        if p.step_start <= now and (step_seconds is None or now < p.step_start + step_seconds):
            best = p
    return best


def classify(value: float, p: PendingForecast, settings: DriftSettings, slack: float) -> int:
    if value > p.pq * (1 + settings.far_above_margin) + slack:
        return FAR_ABOVE
    if p.p50 is not None and value < p.p50 * settings.far_below_ratio - slack:
        return FAR_BELOW
    if value > p.pq + slack:
        return ABOVE
    return OK


def trigger(outcomes: tuple[int, ...], settings: DriftSettings) -> tuple[str, str] | None:
    """(direction, explanation) if ``outcomes`` show drift."""
    k = settings.fast_periods
    recent = outcomes[-k:]
    if len(recent) == k and all(o == FAR_ABOVE for o in recent):
        return UNDER, (f"the last {k} observations were more than {settings.far_above_margin:.0%} above "
                       "the forecast P95")
    if len(recent) == k and all(o == FAR_BELOW for o in recent):
        return OVER, (f"the last {k} observations were below {settings.far_below_ratio:.0%} of the "
                      "forecast P50")
    window = outcomes[-settings.window_periods:]
    if len(window) >= settings.min_window_periods:
        above = sum(o in (ABOVE, FAR_ABOVE) for o in window) / len(window)
        below = sum(o == FAR_BELOW for o in window) / len(window)
        if above > settings.max_above_fraction:
            return UNDER, (f"{above:.0%} of the last {len(window)} observations were above the forecast "
                           f"P95 (limit {settings.max_above_fraction:.0%}; a good P95 is exceeded ~5 %)")
        if below > settings.max_far_below_fraction:
            return OVER, (f"{below:.0%} of the last {len(window)} observations were below "
                          f"{settings.far_below_ratio:.0%} of the forecast P50 "
                          f"(limit {settings.max_far_below_fraction:.0%})")
    return None


def observe(
    state: DriftState,
    settings: DriftSettings,
    value: float,
    now: float,
    step_seconds: int | None,
    slack: float,
) -> tuple[DriftState, str | None]:
    """Fold one valid observation in; returns the new state and a sentence when drift starts/ends."""
    if state.last_evaluated_at is not None and now <= state.last_evaluated_at:
        return state, None  # already seen: deciding twice equals deciding once
    p = pending_for(state, now, step_seconds)
    if p is None:
        return state, None
    code = classify(value, p, settings, slack)
    outcomes = (state.outcomes + (code,))[-settings.window_periods:]
    hit = trigger(outcomes, settings)
    base = replace(state, outcomes=outcomes, last_evaluated_at=now)
    if not state.drifting:
        if hit is None:
            return base, None
        direction, why = hit
        median = "n/a" if p.p50 is None else f"{p.p50:.4g}"
        note = (f"forecast drift ({direction}): {why} (latest {value:.4g} vs P50 {median}, "
                f"P95 {p.pq:.4g})")
        # Fresh evidence from here on: recovery is judged only on what follows.
        return replace(base, drifting=True, direction=direction, since=now, good_since=None, outcomes=(),
                       reason=note, note=note, note_at=now), note
    if hit is not None:
        return replace(base, good_since=None, outcomes=()), None
    if code in (FAR_ABOVE, FAR_BELOW):
        # Still far off: the forecast is not good yet, whatever the window says.
        return replace(base, good_since=None), None
    good_since = state.good_since if state.good_since is not None else now
    if now - good_since >= settings.recovery_seconds:
        note = (f"the forecast has matched demand for {int(now - good_since)} s "
                f"(recoverySeconds {settings.recovery_seconds}): drift is over, predictive again")
        return replace(base, drifting=False, direction=None, since=now, good_since=None, reason=None,
                       note=note, note_at=now), note
    return replace(base, good_since=good_since), None
