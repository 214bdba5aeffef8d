"""The field's standard forecasters (statsforecast) as peers inside this project's protocol.

A user choosing a forecaster asks whether the project beats what ``statsforecast``
gives in ten lines. :func:`run_peer` answers for one peer and one refit of the
protocol (:mod:`protocol`, docs/forecast-protocol.md): the peer is fitted on the
same fit window as the project's candidates, its P95 is calibrated on the same
calibration window and it forecasts from the same origins, each forecast
reading observations up to its origin only.

Each peer gives two P95s, both reported:

* ``NAME``: the upper bound of the model's own 90 % interval (a symmetric
  interval's upper bound is its 95 % quantile);
* ``NAME+conformal``: the point forecast plus the 90 % quantile of the absolute
  errors per horizon step, statsforecast's ``conformal_distribution`` formula,
  with the scores taken from forecasts over the calibration window (the
  library's own ``ConformalIntervals`` would refit the model once per window;
  here the fitted model forecasts each calibration origin, as for the project).

Forecasts update the fitted model's state without refitting: ``forward`` for
AutoARIMA, AutoETS, Naive and SeasonalNaive; for MSTL, whose ``forward``
recomputes the whole decomposition (18 s per call on 21 days at 5 minutes), the
seasonal components fitted are extended as MSTL itself forecasts them and the
trend model is run ``forward`` on the deseasonalised recent data.

statsforecast needs no gaps: values are forward-filled (causal; leading gaps
take the first observed value). Actuals that are missing are not scored, on
either side.

statsforecast is an optional extra (``pip install -e '.[peers]'``; it requires
``pandas<3``): nothing else in the project imports this module, and it imports
statsforecast only when a peer runs. Fits run in a forked child process so a
fit that takes longer than :data:`FIT_LIMIT_SECONDS` can be stopped and
reported as skipped with its measured time.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictive_scaler.errors import ModelError

#: The statsforecast models compared against.
PEER_NAMES: tuple[str, ...] = ("AutoARIMA", "AutoETS", "MSTL", "Naive", "SeasonalNaive")
#: A peer whose fit takes longer than this is stopped and reported as skipped.
FIT_LIMIT_SECONDS = 120.0
#: The model interval whose upper bound is the P95 (a central 90 % interval).
LEVEL = 90
#: Seasonal AutoARIMA is not tried on a season longer than this many steps: with a 288-step day
#: (5 minutes) it never finished within 120 s and its process grew past 7 GB, and with a 48-step
#: one (nab_nyc_taxi, 30 minutes) it never finished either. It is fitted without a season there,
#: and the report says so (:attr:`PeerBlock.capped`).
MAX_ARIMA_SEASON = 24
#: A peer's process may not grow beyond this (address space): one that would is stopped and
#: reported as skipped, so the protocol's memory stays bounded whatever a peer does.
PEER_MEMORY_BYTES = 3 * 1024**3
INSTALL_HINT = (
    "install the optional peers extra: `pip install -e '.[peers]'` (statsforecast requires "
    "pandas<3), or run `make bench-peers`, which creates .venv-peers with it"
)


def require_statsforecast() -> str:
    """statsforecast's version; a clear error naming the fix when it is not installed."""
    try:
        import statsforecast
    except ImportError as exc:
        raise ModelError(f"the statsforecast peers are not available ({exc}); {INSTALL_HINT}") from exc
    return str(statsforecast.__version__)


def fill_gaps(values: np.ndarray) -> np.ndarray:
    """Causal forward fill; steps before the first observation take its value (all-NaN → zeros)."""
    v = np.asarray(values, dtype=float)
    ok = np.isfinite(v)
    if not ok.any():
        return np.zeros_like(v)
    pos = np.where(ok, np.arange(v.size), -1)
    np.maximum.accumulate(pos, out=pos)
    first = int(np.flatnonzero(ok)[0])
    return np.where(pos >= 0, v[np.maximum(pos, 0)], v[first])


def _factory(name: str, steps_per_day: int, fit_steps: int) -> Any:
    from statsforecast.models import MSTL, AutoARIMA, AutoETS, Naive, SeasonalNaive

    day = max(1, steps_per_day)
    week = 7 * day
    if name == "Naive":
        return Naive()
    if name == "SeasonalNaive":
        return SeasonalNaive(season_length=day)
    if name == "AutoETS":
        # statsforecast (like R's ets) fits no seasonal component beyond 24 steps a season.
        return AutoETS(season_length=day)
    if name == "AutoARIMA":
        return AutoARIMA(season_length=day if day <= MAX_ARIMA_SEASON else 1)
    if name == "MSTL":
        seasons = [day, week] if fit_steps > 2 * week else [day]
        return MSTL(season_length=seasons if len(seasons) > 1 else day)
    raise ModelError(f"unknown peer {name!r}; peers are {', '.join(PEER_NAMES)}")


class _MstlForward:
    """MSTL with a state update that keeps the fitted seasonal components (see module doc)."""

    def __init__(self, model: Any, fit_steps: int) -> None:
        self.model = model
        self.fit_steps = fit_steps
        comps = model.model_.filter(regex="seasonal*")
        seasons = model.season_length if isinstance(model.season_length, list) else [model.season_length]
        self.profiles = [(int(m), np.asarray(comps.iloc[-int(m):, j], dtype=float))
                         for j, m in enumerate(sorted(seasons))]

    def seasonal(self, start: int, stop: int) -> np.ndarray:
        """Sum of seasonal components at steps [start, stop) counted from the fit's first step."""
        t = np.arange(start, stop)
        out = np.zeros(t.size)
        for m, last in self.profiles:
            # The fitted component, repeated past the fit as MSTL forecasts it (its last season).
            out += last[(t - (self.fit_steps - m)) % m]
        return out

    def forward(self, y: np.ndarray, h: int) -> dict[str, np.ndarray]:
        n = y.size
        seas_in = self.seasonal(0, n)
        fitted = self.model.model_
        # Inside the fit window the decomposition's own components; after it, the extension.
        k = min(n, self.fit_steps)
        seas_in[:k] = fitted.filter(regex="seasonal*").sum(axis=1).to_numpy()[:k]
        res = self.model.trend_forecaster.forward(y=y - seas_in, h=h, level=[LEVEL])
        seas_h = self.seasonal(n, n + h)
        return {key: np.asarray(val) + seas_h for key, val in res.items()}


@dataclass(frozen=True)
class PeerBlock:
    """One peer's forecasts for one refit: P50 and the two P95s at each scored origin."""

    fit_seconds: float
    #: Median seconds of one forecast with state update.
    forecast_seconds: float
    point: np.ndarray  # (n, h)
    model_upper: np.ndarray  # (n, h) upper bound of the 90 % model interval
    conformal_upper: np.ndarray  # (n, h) point + conformal margin
    #: How the peer was cut down to fit the protocol's budget ("" when it was not).
    capped: str = ""


def cap_of(name: str, steps_per_day: int) -> str:
    """What :func:`_factory` changes of peer ``name`` to keep it within the budget ("" if nothing)."""
    if name == "AutoARIMA" and steps_per_day > MAX_ARIMA_SEASON:
        return (f"fitted without a season (a {steps_per_day}-step daily season is beyond the "
                f"{MAX_ARIMA_SEASON}-step limit: seasonal AutoARIMA does not finish in the fit limit here)")
    return ""


@dataclass(frozen=True)
class PeerSkipped:
    reason: str
    seconds: float


def _forecasts(forward: Callable[[np.ndarray, int], dict[str, np.ndarray]], y: np.ndarray,
               lo: int, origins: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
    mean = np.full((origins.size, h), np.nan)
    upper = np.full((origins.size, h), np.nan)
    times = []
    for i, t in enumerate(origins):
        t0 = time.perf_counter()
        res = forward(y[lo: int(t) + 1], h)
        times.append(time.perf_counter() - t0)
        mean[i] = np.asarray(res["mean"], dtype=float)[:h]
        upper[i] = np.asarray(res.get(f"hi-{LEVEL}", np.full(h, np.nan)), dtype=float)[:h]
    return mean, upper, times


def _conformal_margin(errors: np.ndarray) -> np.ndarray:
    """statsforecast's conformal_distribution margin: the 90 % quantile of |error| per step."""
    out = np.full(errors.shape[1], np.nan)
    for j in range(errors.shape[1]):
        e = errors[:, j][np.isfinite(errors[:, j])]
        if e.size:
            out[j] = float(np.quantile(e, LEVEL / 100))
    return out


def _actuals(values: np.ndarray, origins: np.ndarray, h: int) -> np.ndarray:
    target = origins[:, None] + np.arange(1, h + 1)[None, :]
    inside = target < values.size
    return np.where(inside, values[np.minimum(target, values.size - 1)], np.nan)


def _block_in_process(name: str, values: np.ndarray, fit: tuple[int, int], cal_origins: np.ndarray,
                      origins: np.ndarray, h: int, steps_per_day: int,
                      on_fitted: Callable[[float], None]) -> dict[str, np.ndarray]:
    y = fill_gaps(values)
    lo, hi = fit
    model = _factory(name, steps_per_day, hi - lo)
    t0 = time.perf_counter()
    model.fit(y[lo:hi])
    fit_seconds = time.perf_counter() - t0
    on_fitted(fit_seconds)
    forward: Callable[[np.ndarray, int], dict[str, np.ndarray]]
    if name == "MSTL":
        forward = _MstlForward(model, hi - lo).forward
    else:
        def forward(window: np.ndarray, steps: int) -> dict[str, np.ndarray]:
            return dict(model.forward(y=window, h=steps, level=[LEVEL]))
    cal_mean, _, _ = _forecasts(forward, y, lo, cal_origins, h)
    margin = _conformal_margin(np.abs(_actuals(values, cal_origins, h) - cal_mean))
    mean, upper, times = _forecasts(forward, y, lo, origins, h)
    return {
        "fit_seconds": np.array([fit_seconds]),
        "forecast_seconds": np.array([float(np.median(times)) if times else math.nan]),
        "point": mean,
        "model_upper": upper,
        "conformal_upper": mean + margin[None, :],
    }


def run_peer(
    name: str,
    values: np.ndarray,
    fit: tuple[int, int],
    cal_origins: np.ndarray,
    origins: np.ndarray,
    horizon_steps: int,
    steps_per_day: int,
    *,
    fit_limit: float = FIT_LIMIT_SECONDS,
) -> PeerBlock | PeerSkipped:
    """Fit peer ``name`` on ``values[fit[0]:fit[1]]``, calibrate on ``cal_origins``, forecast ``origins``.

    ``values`` is the series on the model grid (NaN = missing); origins index it and the
    forecast at origin t reads ``values[fit[0]: t + 1]`` only. Runs in a forked child: a fit
    longer than ``fit_limit`` seconds is stopped and returned as :class:`PeerSkipped`.
    """
    require_statsforecast()
    # Imported once here, before the fork: each peer's process otherwise spent ~2.5 s importing it.
    import statsforecast.models  # noqa: F401

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def work() -> None:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (PEER_MEMORY_BYTES, PEER_MEMORY_BYTES))
            arrays = _block_in_process(name, values, fit, cal_origins, origins, horizon_steps,
                                       steps_per_day, lambda s: child.send_bytes(f"fitted {s!r}".encode()))
            # Raw float64 bytes with a JSON header of shapes: nothing here is ever unpickled.
            child.send_bytes(b"done " + json.dumps({k: list(v.shape) for k, v in arrays.items()}).encode())
            for key in arrays:
                child.send_bytes(np.ascontiguousarray(arrays[key], dtype=np.float64).tobytes())
        except MemoryError:
            child.send_bytes(f"error the peer needed more than {PEER_MEMORY_BYTES / 1024**3:g} GiB".encode())
        except Exception as exc:  # the peer's own failure, reported by name
            child.send_bytes(f"error {type(exc).__name__}: {exc}".encode()[:2000])

    proc = ctx.Process(target=work, name=f"peer-{name}", daemon=True)
    started = time.perf_counter()
    try:
        proc.start()
        child.close()
        if not parent.poll(fit_limit):
            elapsed = time.perf_counter() - started
            return PeerSkipped(f"fit took longer than {fit_limit:g} s (stopped after {elapsed:.0f} s)", elapsed)
        message = parent.recv_bytes().decode()
        if message.startswith("fitted"):
            message = parent.recv_bytes().decode()
        if not message.startswith("done "):
            return PeerSkipped(message.removeprefix("error ").strip(), time.perf_counter() - started)
        shapes = json.loads(message.removeprefix("done "))
        data = {k: np.frombuffer(parent.recv_bytes(), dtype=np.float64).reshape(shape)
                for k, shape in shapes.items()}
        return PeerBlock(
            fit_seconds=float(data["fit_seconds"][0]),
            forecast_seconds=float(data["forecast_seconds"][0]),
            point=np.maximum(data["point"], 0.0),
            model_upper=np.maximum(data["model_upper"], 0.0),
            conformal_upper=np.maximum(data["conformal_upper"], 0.0),
            capped=cap_of(name, steps_per_day),
        )
    except EOFError:
        return PeerSkipped("the peer's process ended without a result", time.perf_counter() - started)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)
        parent.close()
