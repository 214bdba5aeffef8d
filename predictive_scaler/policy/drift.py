"""Forecast-versus-reality monitor, both directions, with hysteresis.

The forecast is of each model step's *mean* (5 minutes by default), so that is
what is judged: the observations made in a step are accumulated and, when the
step completes, their mean is compared with the forecast issued *before* it for
that step (kept in :class:`DriftState.pending`):

- far above: above P95 × (1 + farAboveMargin) — under-forecast, risks the SLO;
- far below: below P50 × farBelowRatio — over-forecast, wastes money;
- differences smaller than a tenth of one replica's capacity never count,
  so near-zero traffic cannot flap the monitor.

A level shift must still be caught within a few control periods, long before a
step completes, so single observations are also watched — but single
observations scatter around their step's mean, and on bursty traffic three in a
row fall outside the step-mean bands by chance every night. An observation
therefore counts as far off only beyond the bands widened by the
observations' usual scatter around their step mean (learned from the completed
steps, smoothed): the far-above band is multiplied and the far-below band
divided by 1 + ``NOISE_Z`` × that relative scatter. When observations do not
vary inside a step at all — a source no finer than the model step — single
observations are not judged, only step means. Drift starts on ``fastPeriods`` such consecutive
observations in one direction spanning at least ``fastSeconds`` (time, not reconciles: at a 15 s
interval three observations span only 30 s), on ``fastPeriods`` consecutive completed steps
far off, or when the rolling window of completed steps has more than
``maxAboveFraction`` above the P95 (a good P95 is exceeded ~5 % of the time) or
more than ``maxFarBelowFraction`` far below the P50. It ends only after the
forecast has been good (no observation nor step far off) for
``recoverySeconds``; anything far off restarts that clock.

While a predicted rise is held (``hold_until``: its onset plus ``signalLagSeconds``, see the planner),
observations made before the signal can show the rise are not counted as far below: a lagging
``rate()`` window reads the level before the onset, which says nothing about the forecast yet.
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
    StepAccumulator,
)
from predictive_scaler.spec import DriftSettings

#: Pending forecasts kept: enough steps to outlive a few missed model updates.
MAX_PENDING = 6

#: How many relative spreads widen the bands for one observation: with
#: roughly normal scatter ~0.1 % of observations fall outside by chance, 3 in a row practically never.
NOISE_Z = 3.0
#: Weight of the newest completed step in the smoothed spread (~5 steps of memory).
NOISE_ALPHA = 0.2
#: A single step's relative spread counts at most this much (one wild step cannot mute the monitor).
NOISE_CV_CAP = 1.0

#: Relative spread² below which observations inside a step count as not varying at all.
MIN_NOISE_VAR = 1e-8
#: Observations are capped here inside the step sums (no demand is near it; squares stay finite).
VALUE_CAP = 1e100

UNDER = "under-forecast"
OVER = "over-forecast"


def refresh_pending(state: DriftState, view: ForecastView, now: float, observed_at: float | None = None) -> DriftState:
    """Remember the newest forecast for the steps from the one containing ``now`` on — or from the one
    containing ``observed_at``, the time the newest observation is of (metrics lag behind ``now``)."""
    now = now if observed_at is None else min(now, observed_at)
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


def classify_single(value: float, p: PendingForecast, settings: DriftSettings, slack: float, widen: float) -> int:
    """One observation against its step's bands widened by ``widen`` (≥ 1) for its usual scatter."""
    if value > p.pq * (1 + settings.far_above_margin) * widen + slack:
        return FAR_ABOVE
    if p.p50 is not None and value < p.p50 * settings.far_below_ratio / widen - slack:
        return FAR_BELOW
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


def _close_step(state: DriftState, settings: DriftSettings, slack: float) -> tuple[DriftState, int | None]:
    """Judge the accumulated step's mean and learn its spread; (state with no open step, outcome)."""
    acc = state.step
    if acc is None or acc.count == 0:
        return replace(state, step=None), None
    mean = acc.total / acc.count
    code = classify(mean, PendingForecast(acc.step_start, acc.p50, acc.pq), settings, slack)
    noise_var = state.noise_var
    if acc.count >= 2 and mean > 0:
        cv2 = min(max(0.0, acc.total_sq / acc.count - mean * mean) / (mean * mean), NOISE_CV_CAP ** 2)
        noise_var = cv2 if noise_var is None else (1 - NOISE_ALPHA) * noise_var + NOISE_ALPHA * cv2
    outcomes = (state.outcomes + (code,))[-settings.window_periods:]
    return replace(state, step=None, noise_var=noise_var, outcomes=outcomes), code


def _run(state: DriftState, code: int, now: float, settings: DriftSettings,
         widen: float) -> tuple[DriftState, tuple[str, str] | None]:
    """Extend (or end) the run of far-off observations by ``code``; (state, drift) once it lasted.

    Time, not reconciles: a run counts once it has ``fastPeriods`` observations spanning at least
    ``fastSeconds``, whatever the control period.
    """
    run, run_since = state.run, state.run_since
    if code == FAR_ABOVE:
        run, run_since = (run + 1, run_since) if run > 0 else (1, now)
    elif code == FAR_BELOW:
        run, run_since = (run - 1, run_since) if run < 0 else (-1, now)
    else:
        run, run_since = 0, None
    state = replace(state, run=run, run_since=run_since)
    k = settings.fast_periods
    if run_since is None or now - run_since < settings.fast_seconds:
        return state, None
    span = int(now - run_since)
    if run >= k:
        return state, (UNDER, f"the last {run} observations ({span} s) were more than "
                              f"{settings.far_above_margin:.0%} above the forecast P95, beyond their usual "
                              f"scatter (× {widen:.3g})")
    if run <= -k:
        return state, (OVER, f"the last {-run} observations ({span} s) were below {settings.far_below_ratio:.0%} "
                             f"of the forecast P50, beyond their usual scatter (÷ {widen:.3g})")
    return state, None


def observe(
    state: DriftState,
    settings: DriftSettings,
    value: float,
    now: float,
    step_seconds: int | None,
    slack: float,
    observed_at: float | None = None,
    hold_until: float | None = None,
) -> tuple[DriftState, str | None]:
    """Fold one valid observation in; returns the new state and a sentence when drift starts/ends.

    ``observed_at`` is the time the observation is of (``now`` minus the metrics delay): it is judged
    against the forecast for the step it belongs to, not the step ``now`` has reached — else the
    first observations of every step are the previous step's, and a step-wise source looks noisy.
    Until ``observed_at`` (else ``now``) reaches ``hold_until``, nothing counts as far below.
    """
    if state.last_evaluated_at is not None and now <= state.last_evaluated_at:
        return state, None  # already seen: deciding twice equals deciding once
    p = pending_for(state, now if observed_at is None else min(now, observed_at), step_seconds)
    if p is None:
        return state, None
    base = replace(state, last_evaluated_at=now)
    step_code = None
    held = hold_until is not None and (now if observed_at is None else min(now, observed_at)) < hold_until
    if base.step is not None and base.step.step_start != p.step_start:
        base, step_code = _close_step(base, settings, slack)
        if held and step_code == FAR_BELOW:
            step_code = OK
            base = replace(base, outcomes=(*base.outcomes[:-1], OK))
    # The step is judged against the newest forecast for it (none of them saw the step's own data).
    acc = StepAccumulator(p.step_start, p.p50, p.pq) if base.step is None else replace(base.step, p50=p.p50, pq=p.pq)
    x = min(value, VALUE_CAP)  # sums of squares stay finite, so the state stays JSON-able
    base = replace(base, step=replace(acc, count=acc.count + 1, total=acc.total + x, total_sq=acc.total_sq + x * x))

    # Bands widened multiplicatively by the usual scatter (bursty traffic scatters in proportion).
    widen = 1 + NOISE_Z * (base.noise_var or 0.0) ** 0.5
    # A source that never varies inside a step (no finer than the model step) repeats one value:
    # k such observations are one piece of evidence, left to the step-mean checks.
    coarse = base.noise_var is not None and base.noise_var <= MIN_NOISE_VAR
    code = OK if coarse else classify_single(value, p, settings, slack, widen)
    if held and code == FAR_BELOW:
        code = OK
    base, hit = _run(base, code, now, settings, widen)
    if hit is None and step_code is not None:
        hit = trigger(base.outcomes, settings)
        if hit is not None:
            hit = hit[0], hit[1].replace("observations", "model-step means")
    far = code in (FAR_ABOVE, FAR_BELOW) or step_code in (FAR_ABOVE, FAR_BELOW)
    if not state.drifting:
        if hit is None:
            return base, None
        direction, why = hit
        median = "n/a" if p.p50 is None else f"{p.p50:.4g}"
        note = (f"forecast drift ({direction}): {why} (latest {value:.4g} vs P50 {median}, "
                f"P95 {p.pq:.4g})")
        # Fresh evidence from here on: recovery is judged only on what follows.
        return replace(base, drifting=True, direction=direction, since=now, good_since=None, outcomes=(), run=0,
                       run_since=None, reason=note, note=note, note_at=now), note
    if hit is not None:
        return replace(base, good_since=None, outcomes=(), run=0, run_since=None), None
    if far:
        # Still far off: the forecast is not good yet, whatever the window says.
        return replace(base, good_since=None), None
    good_since = state.good_since if state.good_since is not None else now
    if now - good_since >= settings.recovery_seconds:
        note = (f"the forecast has matched demand for {int(now - good_since)} s "
                f"(recoverySeconds {settings.recovery_seconds}): drift is over, predictive again")
        return replace(base, drifting=False, direction=None, since=now, good_since=None, reason=None,
                       note=note, note_at=now), note
    return replace(base, good_since=good_since), None
