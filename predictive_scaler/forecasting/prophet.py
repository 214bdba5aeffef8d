"""Prophet as the seasonal part, with a short autoregression that uses the latest observations.

Measured: Prophet's default collapses on request traces; on a log1p scale
with ``changepoint_prior_scale≈0.001`` and daily + weekly seasonality it is a
decent seasonal curve but ignores recent observations, so alone it loses to
persistence 10–30 minutes ahead. The fitted model here is therefore two parts:

* the deterministic Prophet curve ``f(t)`` (piecewise-linear trend + Fourier
  seasonalities, on log1p of the demand), fitted once by Prophet/Stan;
* an AR(p) with mean on the residual ``r(t) = log1p(y(t)) − f(t)``, which pulls
  the forecast towards what was just observed and decays back to the curve
  over the horizon.

Quantiles come from the empirical distribution of the in-sample h-step errors
of that residual model, per horizon step, stored on a fixed probability grid.

The artifact stores the parameters needed to evaluate ``f(t)`` ourselves (trend
k, m, changepoints and deltas, seasonality betas, scales) — not Prophet's own
serialisation — so a forecast needs neither Prophet nor Stan, takes well under
a millisecond of arithmetic, and survives a Prophet upgrade. A test checks this
evaluation against ``Prophet.predict``.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from predictive_scaler.core.values import Forecast
from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.base import FittedModel, check_quantiles
from predictive_scaler.forecasting.walkforward import refuse_constant
from predictive_scaler.series import Series

#: Probabilities at which the per-step error distribution is stored; other quantiles interpolate.
ERROR_PROBABILITIES: tuple[float, ...] = tuple(
    sorted({0.001, 0.005, 0.025, 0.975, 0.995, 0.999, *(round(p / 100, 2) for p in range(1, 100))})
)

_SECONDS_PER_DAY = 86400.0
_NS = 1_000_000_000


@dataclass(frozen=True)
class ProphetSettings:
    """How the Prophet part is fitted. Defaults follow the measurements above."""

    #: Prophet's trend flexibility; its default 0.05 chases bursts and collapses the trend.
    changepoint_prior_scale: float = 0.001
    #: Fourier orders; 10/5 resolve a morning peak and a weekend shape at 5-min resolution.
    daily_order: int = 10
    weekly_order: int = 5
    #: Horizon, as a duration, up to which per-step error quantiles are stored (beyond: the last row).
    error_horizon_seconds: int = 2 * 3600
    #: The residual correction trusts observations at most this old; older → the Prophet curve alone.
    #: A longer gap in the history also restarts the correction's state.
    max_gap_seconds: int = 3600
    #: Steps of recent data the correction re-filters at each forecast (its state is a cache of these).
    warmup_steps: int = 48
    #: Error quantiles may be kept per band of the seasonal level (log-scale errors are wider at
    #: night, when counts are small). One band by default: terciles measured no better after
    #: calibration on NASA-HTTP (30-min pinball 1.851 vs 1.844, coverage 0.959 vs 0.955).
    level_bands: int = 1
    #: Known past events as ``(name, start, end)`` epoch seconds (the scaler's ``spec.events``
    #: occurrences in the training window). They become Prophet holidays — one indicator per
    #: calendar day (UTC) an occurrence touches, Prophet's own granularity, which takes what the
    #: event does to the rest of its day — and their exact windows are left out of the fit, the
    #: residual model and the error quantiles, so an event does not bend the seasonal curve. The
    #: stored curve excludes the holiday terms: future occurrences are raised by the planner
    #: (policy/events.py), not forecast.
    holidays: tuple[tuple[str, float, float], ...] = ()

    def __post_init__(self) -> None:
        if not (self.changepoint_prior_scale > 0 and math.isfinite(self.changepoint_prior_scale)):
            raise ModelError("prophet: changepoint_prior_scale must be a positive number, e.g. 0.001")
        if self.daily_order < 1 or self.weekly_order < 1:
            raise ModelError("prophet: daily_order and weekly_order must be at least 1")
        if not (1 <= self.level_bands <= 10):
            raise ModelError("prophet: level_bands must be between 1 and 10")
        if self.error_horizon_seconds <= 0 or self.max_gap_seconds < 0 or self.warmup_steps < 1:
            raise ModelError("prophet: error_horizon_seconds must be positive, max_gap_seconds non-negative")
        for name, start, end in self.holidays:
            if not (name and math.isfinite(start) and math.isfinite(end) and end > start):
                raise ModelError(f"prophet: holiday {name!r} needs a name and an end after its start")


def _quiet_stan_logging() -> None:
    # cmdstanpy logs two INFO lines per fit and prophet.plot an ERROR when plotly is
    # absent; neither is actionable for a user of this tool.
    # cmdstanpy installs its own INFO handler lazily unless the logger already has one.
    logging.getLogger("prophet.plot").setLevel(logging.CRITICAL)
    logging.getLogger("prophet").setLevel(logging.WARNING)
    stan = logging.getLogger("cmdstanpy")
    if not any(isinstance(h, logging.NullHandler) for h in stan.handlers):
        stan.addHandler(logging.NullHandler())
    stan.setLevel(logging.WARNING)


def _epoch_seconds(times: pd.DatetimeIndex) -> np.ndarray:
    return np.asarray(times.as_unit("ns").asi8, dtype=np.int64) / _NS


class ProphetForecaster:
    """Fits Prophet on log1p(history) at the history's own step, then the residual AR."""

    kind = "prophet"

    def __init__(self, settings: ProphetSettings | None = None, **options: Any) -> None:
        self.settings = settings or ProphetSettings(**options)

    def fit(self, history: Series) -> ProphetModel:
        s = self.settings
        finite = np.isfinite(history.values)
        if finite.sum() < 2 * 86400 // history.step_seconds:
            raise ModelError(
                f"prophet: {history.name!r} has {int(finite.sum())} observed steps; it needs at least "
                "two days of observations (14 days recommended) — give a longer trace"
            )
        refuse_constant(history, "prophet")
        _quiet_stan_logging()
        try:
            from prophet import Prophet
        except ImportError as exc:  # pragma: no cover - prophet is a hard dependency
            raise ModelError("prophet is not installed; `pip install prophet`") from exc

        times = history.timestamps()
        y = np.log1p(history.values)
        # Event windows are left out of the fit: Prophet's holidays are whole days, so they alone
        # would let a three-hour launch bend the daily and weekly terms.
        usual = finite & ~_in_windows(_epoch_seconds(times), s.holidays)
        frame = pd.DataFrame({"ds": times.tz_localize(None)[usual], "y": y[usual]})
        model = Prophet(
            growth="linear",
            changepoint_prior_scale=s.changepoint_prior_scale,
            yearly_seasonality=False,
            weekly_seasonality=s.weekly_order,
            daily_seasonality=s.daily_order,
            uncertainty_samples=0,
            holidays=_holiday_frame(s.holidays),
        )
        backend: Any = model.stan_backend
        if backend is not None:
            backend.prepare_data = arrays_for_stan(backend.prepare_data)
        try:
            with warnings.catch_warnings():
                # Prophet's own pandas deprecation notices are not the user's to act on.
                warnings.filterwarnings("ignore", category=FutureWarning, module="prophet")
                warnings.filterwarnings("ignore", category=DeprecationWarning, module="prophet")
                model.fit(frame)
        except Exception as exc:  # Stan/cmdstanpy raise RuntimeError, ValueError …
            raise ModelError(f"prophet: fitting {history.name!r} failed ({exc}); check the trace for long flat or empty stretches") from exc

        curve = _curve_from_prophet(model, holidays=bool(s.holidays))
        fitted = curve.evaluate(_epoch_seconds(times))
        residual = y - fitted  # NaN where unobserved
        residual[_in_windows(_epoch_seconds(times), s.holidays)] = np.nan  # events are not the usual error
        phi, theta = _fit_arima(residual)
        max_gap = s.max_gap_seconds // history.step_seconds
        h_max = max(1, math.ceil(s.error_horizon_seconds / history.step_seconds))
        observed_level = fitted[finite]
        edges = np.quantile(observed_level, np.arange(1, s.level_bands) / s.level_bands)
        errors = _error_quantiles(residual, fitted, edges, phi, theta, max_gap, max_gap + s.warmup_steps, h_max)
        return ProphetModel(
            step_seconds=history.step_seconds,
            curve=curve,
            phi=phi,
            theta=theta,
            level_edges=tuple(float(e) for e in edges),
            error_quantiles=errors,
            max_gap_steps=max_gap,
            warmup_steps=s.warmup_steps,
        )


@dataclass(frozen=True, eq=False)
class ProphetCurve:
    """Prophet's deterministic additive curve on log1p scale: scaled trend + seasonalities, × y_scale."""

    start_epoch: float
    t_scale_seconds: float
    y_scale: float
    k: float
    m: float
    changepoints_t: np.ndarray
    deltas: np.ndarray
    #: (period in days, fourier order, betas[2*order]) per seasonality, in Prophet's column order.
    seasonalities: tuple[tuple[float, int, np.ndarray], ...]

    def evaluate(self, epoch_seconds: np.ndarray) -> np.ndarray:
        t = (np.asarray(epoch_seconds, dtype=float) - self.start_epoch) / self.t_scale_seconds
        active = self.changepoints_t[None, :] <= t[:, None]
        k_t = self.k + (active * self.deltas).sum(axis=1)
        m_t = self.m - (active * self.deltas * self.changepoints_t).sum(axis=1)
        total = k_t * t + m_t
        days = np.asarray(epoch_seconds, dtype=float) / _SECONDS_PER_DAY
        for period, order, betas in self.seasonalities:
            n = np.arange(1, order + 1)
            angle = 2.0 * np.pi * days[:, None] * n[None, :] / period
            # Prophet interleaves columns sin(1), cos(1), sin(2), cos(2) …
            total = total + np.sin(angle) @ betas[0::2] + np.cos(angle) @ betas[1::2]
        return np.asarray(total * self.y_scale)

    def to_params(self) -> dict[str, Any]:
        return {
            "start_epoch": self.start_epoch,
            "t_scale_seconds": self.t_scale_seconds,
            "y_scale": self.y_scale,
            "k": self.k,
            "m": self.m,
            "changepoints_t": [float(x) for x in self.changepoints_t],
            "deltas": [float(x) for x in self.deltas],
            "seasonalities": [
                {"period_days": p, "fourier_order": o, "betas": [float(b) for b in betas]}
                for p, o, betas in self.seasonalities
            ],
        }

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> ProphetCurve:
        cps = _floats(p, "changepoints_t")
        deltas = _floats(p, "deltas")
        if cps.shape != deltas.shape:
            raise ModelError(f"prophet artifact: {cps.size} changepoints but {deltas.size} deltas; retrain the model")
        seas = []
        raw = p.get("seasonalities")
        if not isinstance(raw, list):
            raise ModelError("prophet artifact: 'seasonalities' must be a list; retrain the model")
        for item in raw:
            if not isinstance(item, Mapping):
                raise ModelError("prophet artifact: each seasonality must be an object; retrain the model")
            order = item.get("fourier_order")
            if not isinstance(order, int) or isinstance(order, bool) or order < 1:
                raise ModelError("prophet artifact: a seasonality's fourier_order must be a positive integer")
            betas = _floats(item, "betas")
            if betas.size != 2 * order:
                raise ModelError(
                    f"prophet artifact: seasonality of order {order} needs {2 * order} betas, has {betas.size}"
                )
            seas.append((_positive(item, "period_days"), order, betas))
        return cls(
            start_epoch=_finite(p, "start_epoch"),
            t_scale_seconds=_positive(p, "t_scale_seconds"),
            y_scale=_positive(p, "y_scale"),
            k=_finite(p, "k"),
            m=_finite(p, "m"),
            changepoints_t=cps,
            deltas=deltas,
            seasonalities=tuple(seas),
        )


def _holiday_frame(holidays: Sequence[tuple[str, float, float]]) -> pd.DataFrame | None:
    """Prophet's holidays table: one row per (event, UTC day an occurrence touches)."""
    rows = []
    for name, start, end in holidays:
        first = pd.Timestamp(start, unit="s").normalize()
        last = pd.Timestamp(end - 1e-3, unit="s").normalize()
        rows += [{"holiday": name, "ds": day, "lower_window": 0, "upper_window": 0}
                 for day in pd.date_range(first, last, freq="D")]
    return pd.DataFrame(rows).drop_duplicates(["holiday", "ds"]) if rows else None


def _in_windows(epoch: np.ndarray, holidays: Sequence[tuple[str, float, float]]) -> np.ndarray:
    mask = np.zeros(epoch.shape, dtype=bool)
    for _, start, end in holidays:
        mask |= (epoch >= start) & (epoch < end)
    return mask


def _curve_from_prophet(model: Any, *, holidays: bool = False) -> ProphetCurve:
    if model.growth != "linear" or model.scaling != "absmax" or model.logistic_floor:
        raise ModelError("prophet: only linear growth with absmax scaling is supported")
    params = model.params
    betas = np.asarray(params["beta"], dtype=float).mean(axis=0)
    seas = []
    col = 0
    for props in model.seasonalities.values():
        if props["mode"] != "additive" or props["condition_name"] is not None:
            raise ModelError("prophet: only additive, unconditional seasonalities are supported")
        width = 2 * int(props["fourier_order"])
        seas.append((float(props["period"]), int(props["fourier_order"]), betas[col:col + width].copy()))
        col += width
    # Holiday columns follow the seasonalities in Prophet's design matrix; they are left out.
    if col != betas.size and not (holidays and col < betas.size and not model.extra_regressors):
        raise ModelError("prophet: unexpected extra regressors or holidays in the fitted model")
    return ProphetCurve(
        start_epoch=pd.Timestamp(model.start).tz_localize(None).value / _NS,
        t_scale_seconds=pd.Timedelta(model.t_scale).total_seconds(),
        y_scale=float(model.y_scale),
        k=float(np.mean(params["k"])),
        m=float(np.mean(params["m"])),
        changepoints_t=np.asarray(model.changepoints_t, dtype=float).copy(),
        deltas=np.asarray(params["delta"], dtype=float).mean(axis=0),
        seasonalities=tuple(seas),
    )


# -- the residual correction: ARIMA(1,1,1) on the log residual --------------------------------
#
# Why integrated: Prophet's stiff trend (needed so it does not collapse) lags real level
# changes for days — on NASA-HTTP the residual sits at +0.5 for most of August. A
# mean-reverting AR pulls the forecast back to the stale curve within minutes and loses to
# persistence; ARIMA(1,1,1) keeps the current (smoothed) level and adds the curve's shape.

@dataclass(frozen=True)
class _FilterState:
    """State of the residual model at the end of each window (arrays over origins)."""

    level: np.ndarray  # smoothed residual level (NaN: nothing observed in the window)
    diff: np.ndarray  # last difference
    innov: np.ndarray  # last innovation
    age: np.ndarray  # steps since the window's last observation (window length if none)


def _windows(values: np.ndarray, origins: np.ndarray, width: int) -> np.ndarray:
    """rows[i] = values[origins[i]-width+1 : origins[i]+1], NaN-padded before the start."""
    padded = np.concatenate([np.full(width - 1, np.nan), np.asarray(values, dtype=float)])
    return np.asarray(padded[origins[:, None] + np.arange(width)[None, :]])


def _filter(windows: np.ndarray, phi: float, theta: float, reset_after: int) -> _FilterState:
    """The ARIMA(1,1,1) recursion over each row of ``windows`` (NaN = unobserved), all rows at once.

    Serving, evaluation and the error quantiles all run this same windowed filter, so what
    is evaluated is exactly what serves. A missing step is replaced by its prediction
    (innovation 0); after a gap longer than ``reset_after`` steps the next observation
    restarts the state — a jump across an outage is not a trend to extrapolate.
    """
    n, width = windows.shape
    lv = np.full(n, np.nan)
    d = np.zeros(n)
    e = np.zeros(n)
    gap = np.zeros(n, dtype=int)
    age = np.full(n, width)
    for j in range(width):
        v = windows[:, j]
        obs = np.isfinite(v)
        started = np.isfinite(lv)
        fresh = obs & (~started | (gap > reset_after))
        cont = obs & ~fresh
        missing = ~obs & started
        pred = phi * d + theta * e
        with np.errstate(invalid="ignore"):
            step = np.where(cont, v - lv, pred)
        e = np.where(cont, step - pred, 0.0)
        d = np.where(cont | missing, step, np.where(fresh, 0.0, d))
        lv = np.where(obs, v, np.where(missing, lv + pred, lv))
        gap = np.where(obs, 0, np.where(started, gap + 1, gap))
        age = np.where(obs, width - 1 - j, age)
    return _FilterState(lv, d, e, age)


def _paths(state: _FilterState, phi: float, theta: float, steps: int) -> np.ndarray:
    """h-step residual predictions for every origin: out[n, steps]."""
    out = np.empty((state.level.size, steps))
    d = phi * state.diff + theta * state.innov
    lv = state.level.copy()
    for h in range(steps):
        lv = lv + d
        out[:, h] = lv
        d = phi * d
    return out


def arrays_for_stan(prepare: Callable[[Any, Any], tuple[dict[str, Any], dict[str, Any]]]
                    ) -> Callable[[Any, Any], tuple[dict[str, Any], dict[str, Any]]]:
    """Prophet's ``prepare_data`` with its lists handed on as arrays.

    Prophet gives cmdstanpy its data as Python lists, which cmdstanpy's JSON writer (stanio)
    then walks number by number: about 0.09 CPU-s for three weeks at 5 minutes, a fifth of the
    fit. Arrays take stanio's vectorised path and write the same file."""
    def arrays(d: dict[str, Any]) -> dict[str, Any]:
        return {k: np.asarray(v) if isinstance(v, list) else v for k, v in d.items()}

    def prepare_arrays(init: Any, data: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        inits, values = prepare(init, data)
        return arrays(inits), arrays(values)
    return prepare_arrays


def _fit_arima(residual: np.ndarray) -> tuple[float, float]:
    """Maximum-likelihood (phi, theta) of ARIMA(1,1,1) on the residual, the MA inside the ARIMA
    candidate's limit (:func:`~predictive_scaler.forecasting.arima.fit_residual_arima`: this
    model's filter also starts from a finite window); NaN gaps handled by Kalman."""
    from predictive_scaler.forecasting.arima import fit_residual_arima

    try:
        params = fit_residual_arima(residual, (1, 1, 1))
        phi, theta = float(params[0]), float(params[1])
    except (np.linalg.LinAlgError, ValueError) as exc:
        raise ModelError(f"prophet: the residual ARIMA(1,1,1) failed to fit ({exc}); check the trace for long constant stretches") from exc
    if not (math.isfinite(phi) and math.isfinite(theta)) or abs(phi) >= 1 or abs(theta) >= 1:
        return 0.0, 0.0  # random walk on the residual: always stable, never explosive
    return phi, theta


def _error_quantiles(residual: np.ndarray, level: np.ndarray, edges: np.ndarray, phi: float, theta: float,
                     max_gap: int, width: int, h_max: int) -> np.ndarray:
    """Empirical quantiles of the in-sample h-step error of the residual model: table[band, h-1, p].

    Origins are the observed steps, each forecast from its own window exactly as when serving;
    an error is filed under the band of the seasonal level at the step it forecast.
    """
    r = np.asarray(residual, dtype=float)
    origins = np.flatnonzero(np.isfinite(r))
    st = _filter(_windows(r, origins, width), phi, theta, max_gap)
    preds = _paths(st, phi, theta, h_max)
    probs = np.asarray(ERROR_PROBABILITIES)
    bands = edges.size + 1
    table = np.empty((bands, h_max, probs.size))
    previous: np.ndarray | None = None
    for h in range(h_max):
        idx = origins + h + 1
        valid = idx < r.size
        err = r[idx[valid]] - preds[valid, h]
        band = np.searchsorted(edges, level[idx[valid]], side="right")
        ok = np.isfinite(err)
        if ok.sum() >= 20:
            previous = np.quantile(err[ok], probs)
        elif previous is None:
            # Too few errors to estimate anything: fall back on the residual's own spread.
            spread = r[np.isfinite(r)] - np.nanmean(r) if np.isfinite(r).any() else np.zeros(1)
            previous = np.quantile(spread, probs)
        for b in range(bands):
            mine = ok & (band == b)
            # A thin band borrows the all-band distribution rather than guess from a handful.
            table[b, h] = np.quantile(err[mine], probs) if mine.sum() >= 50 else previous
    # np.quantile is monotone already; this guards against rounding so quantiles never cross.
    return np.asarray(np.maximum.accumulate(table, axis=2))


# -- the fitted model -------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ProphetModel(FittedModel):
    kind: ClassVar[str] = "prophet"
    step_seconds: int
    curve: ProphetCurve
    #: ARIMA(1,1,1) on the log residual: AR and MA coefficients of its differences.
    phi: float
    theta: float
    #: Boundaries (log1p scale) between the seasonal-level bands of ``error_quantiles``.
    level_edges: tuple[float, ...]
    #: error_quantiles[band, h-1, j]: quantile ERROR_PROBABILITIES[j] of the h-step log-scale error.
    error_quantiles: np.ndarray
    max_gap_steps: int
    warmup_steps: int

    def seasonal_curve(self, times: pd.DatetimeIndex) -> np.ndarray:
        """Prophet's fitted value (log1p scale) at ``times``."""
        return self.curve.evaluate(_epoch_seconds(times))

    @property
    def window_steps(self) -> int:
        """Recent steps a forecast reads; older observations cannot change it."""
        return self.max_gap_steps + self.warmup_steps

    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        """Quantiles (len(origins), len(quantiles), horizon_steps); origin t reads steps ≤ t only."""
        qs = check_quantiles(quantiles)
        if horizon_steps < 1:
            raise ModelError(f"prophet: horizon must be at least one step, got {horizon_steps}")
        if series.step_seconds != self.step_seconds:
            raise ModelError(
                f"prophet: model works at {self.step_seconds}s steps but the series is at "
                f"{series.step_seconds}s; resample it to the model's step"
            )
        idx = np.asarray(origins, dtype=int)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(series))):
            raise ModelError(f"prophet: forecast origins must be indices into the {len(series)}-step series")
        step = pd.Timedelta(seconds=self.step_seconds)
        times = pd.date_range(series.start, periods=len(series) + horizon_steps, freq=step)
        curve = self.curve.evaluate(_epoch_seconds(times))
        residual = np.log1p(series.values) - curve[: len(series)]
        st = _filter(_windows(residual, idx, self.window_steps), self.phi, self.theta, self.max_gap_steps)
        stale = st.age > self.max_gap_steps
        path = _paths(st, self.phi, self.theta, horizon_steps)
        # Nothing recent to correct with: the seasonal curve alone, with the widest errors.
        path = np.where(stale[:, None], 0.0, path)
        future = curve[idx[:, None] + 1 + np.arange(horizon_steps)[None, :]]
        last_row = self.error_quantiles.shape[1] - 1
        rows = np.where(stale[:, None], last_row,
                        np.minimum(st.age[:, None] + np.arange(horizon_steps)[None, :], last_row))
        probs = np.asarray(ERROR_PROBABILITIES)
        # Interpolate each requested probability in the stored grid, per error row.
        per_q = np.array([[[np.interp(q, probs, row) for row in band] for band in self.error_quantiles]
                          for q in qs])  # (k, bands, H)
        band = np.searchsorted(np.asarray(self.level_edges), future, side="right")  # (n, h)
        err = per_q[:, band, rows]  # (k, n, h)
        values = np.expm1(np.clip((future + path)[None, :, :] + err, -50.0, 700.0))
        return np.asarray(np.transpose(values, (1, 0, 2)))

    def forecast(self, recent: Series, horizon_steps: int, quantiles: Sequence[float]) -> Forecast:
        qs = check_quantiles(quantiles)
        if len(recent) == 0:
            raise ModelError("prophet: no recent observations given; pass at least the last step's time")
        if recent.step_seconds != self.step_seconds:
            if recent.step_seconds < self.step_seconds and self.step_seconds % recent.step_seconds == 0:
                recent = recent.resample(self.step_seconds)
            else:
                raise ModelError(
                    f"prophet: model works at {self.step_seconds}s steps but recent data is at "
                    f"{recent.step_seconds}s; resample it to the model's step"
                )
        window = recent.tail(self.window_steps)
        values = self.walk_forward(window, np.array([len(window) - 1]), horizon_steps, qs)[0]
        return self.issue(window, qs, values)

    def to_params(self) -> dict[str, Any]:
        return {
            "step_seconds": self.step_seconds,
            "transform": "log1p",
            "curve": self.curve.to_params(),
            "phi": self.phi,
            "theta": self.theta,
            "error_probabilities": list(ERROR_PROBABILITIES),
            "level_edges": list(self.level_edges),
            "error_quantiles": [[[float(v) for v in row] for row in band] for band in self.error_quantiles],
            "max_gap_steps": self.max_gap_steps,
            "warmup_steps": self.warmup_steps,
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ProphetModel:
        if not isinstance(params, Mapping):
            raise ModelError("prophet artifact: parameters must be a JSON object; retrain the model")
        if params.get("transform") != "log1p":
            raise ModelError(f"prophet artifact: unknown transform {params.get('transform')!r}; retrain the model")
        step = params.get("step_seconds")
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
            raise ModelError("prophet artifact: step_seconds must be a positive integer; retrain the model")
        gap = params.get("max_gap_steps")
        if not isinstance(gap, int) or isinstance(gap, bool) or gap < 0:
            raise ModelError("prophet artifact: max_gap_steps must be a non-negative integer; retrain the model")
        curve = params.get("curve")
        if not isinstance(curve, Mapping):
            raise ModelError("prophet artifact: 'curve' must be an object; retrain the model")
        probs = _floats(params, "error_probabilities")
        if probs.shape != (len(ERROR_PROBABILITIES),) or not np.allclose(probs, ERROR_PROBABILITIES):
            raise ModelError("prophet artifact: error probabilities differ from this version's grid; retrain the model")
        edges = _floats(params, "level_edges")
        if np.any(np.diff(edges) < 0):
            raise ModelError("prophet artifact: 'level_edges' must be increasing; retrain the model")
        raw = params.get("error_quantiles")
        try:
            table = np.array(raw, dtype=float) if isinstance(raw, list) and raw else None
        except (TypeError, ValueError):
            table = None  # ragged or non-numeric
        if table is None or table.ndim != 3 or table.shape[0] != edges.size + 1 or table.shape[2] != probs.size:
            raise ModelError(
                "prophet artifact: 'error_quantiles' must be [band][horizon step][probability] matching "
                "the level bands and the probability grid; retrain the model"
            )
        if table.shape[1] < 1 or not np.isfinite(table).all():
            raise ModelError("prophet artifact: 'error_quantiles' must hold finite numbers; retrain the model")
        warmup = params.get("warmup_steps")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
            raise ModelError("prophet artifact: warmup_steps must be a positive integer; retrain the model")
        phi, theta = _finite(params, "phi"), _finite(params, "theta")
        if abs(phi) >= 1 or abs(theta) >= 1:
            raise ModelError("prophet artifact: phi and theta must lie in (-1, 1); retrain the model")
        return cls(
            step_seconds=step,
            curve=ProphetCurve.from_params(curve),
            phi=phi,
            theta=theta,
            level_edges=tuple(float(e) for e in edges),
            error_quantiles=table,
            max_gap_steps=gap,
            warmup_steps=warmup,
        )


# -- parameter validation -----------------------------------------------------------------------

def _finite(p: Mapping[str, Any], key: str) -> float:
    v = p.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ModelError(f"prophet artifact: {key!r} must be a finite number, got {v!r}; retrain the model")
    return float(v)


def _positive(p: Mapping[str, Any], key: str) -> float:
    v = _finite(p, key)
    if v <= 0:
        raise ModelError(f"prophet artifact: {key!r} must be positive, got {v}; retrain the model")
    return v


def _float_list(v: Any, key: str) -> list[float]:
    if not isinstance(v, list) or any(
        isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) for x in v
    ):
        raise ModelError(f"prophet artifact: {key!r} must be a list of finite numbers; retrain the model")
    return [float(x) for x in v]


def _floats(p: Mapping[str, Any], key: str) -> np.ndarray:
    return np.asarray(_float_list(p.get(key), key), dtype=float)
