"""What one replica serves within its latency SLO, learned from the server's own serving history. Pure.

Why not from GPU utilisation. DCGM's ``GPU_UTIL`` is the share of time *a* kernel ran,
not the share of the GPU's capacity in use. A continuous-batching server (vLLM, TGI)
keeps a kernel running whenever anything is in flight, so it reads 97 % at a tenth
of its capacity; a server bound by its CPU (kernel launches, tokenisation, Python)
queues requests while the GPU reads 13 %. Requests per busy GPU is right only for
a server that runs one request at a time on the GPU, and only below 100 %.

The model. A GPU server has two regimes:

- **below the knee**, extra load is absorbed by batching: the running batch ``N``
  grows, each forward pass gets a little slower (batching economies: a full batch
  costs a small multiple of a single request), and a request waits at most for
  the batch in flight, so the requests waiting are at most about one batch;
- **above the knee**, the batch is full (or the one server busy): the served rate
  stops growing, and the rest queues — latency grows with the queue, not with
  the work.

Little's law ties the three signals a server exports: requests in the server =
served rate × mean latency. Of those, ``running`` are in the batch; the rest wait:
``waiting = served × mean latency − running``. So the queue a scaler must never
read is recovered from what it may read.

The estimate. The history is cut into windows as Prometheus reports them (a rate
and a latency over a range). A window *queues* when more than
:data:`QUEUE_BATCHES` batches' worth of requests wait (Little's law, when the
running batch is exported) or its mean latency is :data:`LATENCY_INFLATION` times
the unloaded latency. Nothing serves faster than its capacity, so the capacity is
at least the highest served rate seen; when requests queued at that rate (within
:data:`PLATEAU_BAND` of it) it is that rate — a server that queues serves all it
can — and the knee was observed. When none did, it was not: the result is a **lower bound** (the most the replica was seen to
serve), never an extrapolation — neither a line through utilisation nor a
batching curve past the largest batch seen, since the batch limit (KV cache,
``max_num_seqs``) is the server's and not in the history.

A latency SLO (p95 ≤ L) caps it further: the highest served rate whose windows met
the SLO, a point when windows at a higher rate broke it (the crossing was
observed), else a lower bound.

Utilisation is reported as evidence and used for nothing unless it tracks load:
whether it rises with the served rate, whether it was already pinned at low load,
and what requests per busy GPU would have said.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from predictive_scaler.errors import DataError
from predictive_scaler.series import Series

__all__ = ["CapacityEvidence", "Slo", "SloCapacity", "UtilisationEvidence", "estimate_slo_capacity"]

#: A window queues when more than this many running batches' worth of requests wait. Below the knee a
#: request waits at most for the batch in flight: the arrivals during one forward pass, about one batch
#: (dynamic batching) or nearly none (continuous batching, which admits at every step). Twice that
#: cannot be absorbed by the next batch; for a one-at-a-time server (batch 1) it is an M/D/1 queue at
#: about 83 % load, M/M/1 at 73 %.
QUEUE_BATCHES = 2.0
#: Without a running-batch gauge: a window queues when its mean latency is this many times the
#: unloaded latency. A full batch costs a small multiple of one request (1.5–2× on the bundled H200
#: servers: that is what makes batching pay), so batching alone does not make requests 4× slower;
#: queueing does, from 75 % load (M/M/1: latency = service / (1 − load)) or 86 % (M/D/1).
LATENCY_INFLATION = 4.0
#: Queueing windows within this fraction of the highest served rate make the plateau. A server past its
#: knee serves its capacity whatever the queue, within counting noise and the batch mix's wobble; a
#: window that straddles a queue's start or a backlog's end serves less and is left out, and queueing
#: only further below (a stall, a pause) is no knee.
PLATEAU_BAND = 0.10
#: A batching server's batch is full at the knee: the queueing windows ran at least this share of the
#: largest batch the replica ever ran (a window that straddles the queue's start averages in a smaller one).
BATCH_FULL_SHARE = 0.8
#: Without a full batch to say the server was saturated, queueing may have begun below saturation: a
#: one-at-a-time server has two requests waiting (or 4× latency) from 73–75 % load with exponential
#: service times, and from about 55 % when their variance is four times that (M/G/1, C² = 4). So the
#: saturation lies at most the queueing rate / this.
QUEUE_LOAD_FLOOR = 0.55
#: A window's mean latency says something only over this many requests (its standard error is then
#: ≤ 22 % for exponential latencies, far inside the 4× inflation a queue makes).
MIN_REQUESTS = 20
#: The unloaded latency: this quantile of the windows' mean latency (the quiet windows, not the
#: quietest one, which may hold a single lucky request).
UNLOADED_QUANTILE = 0.10
#: Fewer windows with requests than this say nothing.
MIN_WINDOWS = 4
#: Utilisation (%) at or above which DCGM reads "busy all the time".
PINNED_PERCENT = 90.0
#: Utilisation is pinned when it reads PINNED_PERCENT at a served rate at most this share of a rate the
#: replica later served without queueing. Were it the share of capacity in use, a GPU 90 % busy could
#: serve at most 1/0.9 = 1.11× more; serving twice as much says it measured something else.
PINNED_LOAD_SHARE = 0.5
#: Utilisation tracks load when its correlation with the served rate is at least this.
TRACKS_CORRELATION = 0.8
#: Standard errors of a Poisson count added around a window's served rate.
COUNT_SIGMAS = 2.0


@dataclass(frozen=True)
class Slo:
    """What serving within the SLO means: no waiting requests (the knee), or a latency quantile bound."""

    kind: Literal["knee", "latency"] = "knee"
    #: For ``latency``: the quantile (0.95 = p95) and its bound in seconds.
    quantile: float | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.kind == "latency":
            if self.quantile is None or not 0 < self.quantile < 1:
                raise DataError(f"a latency SLO needs a quantile in (0, 1), e.g. 0.95; got {self.quantile}")
            if self.seconds is None or not (self.seconds > 0 and math.isfinite(self.seconds)):
                raise DataError(f"a latency SLO needs a positive bound in seconds, e.g. 0.5; got {self.seconds}")

    @classmethod
    def knee(cls) -> Slo:
        return cls("knee")

    @classmethod
    def latency(cls, seconds: float, quantile: float = 0.95) -> Slo:
        return cls("latency", quantile, seconds)

    def describe(self) -> str:
        if self.kind == "knee":
            return "no requests waiting beyond the running batch"
        assert self.quantile is not None and self.seconds is not None
        return f"p{self.quantile * 100:g} ≤ {self.seconds * 1000:g} ms"


@dataclass(frozen=True)
class UtilisationEvidence:
    """What DCGM utilisation said, and whether it could be trusted (it is never used unless it tracks load)."""

    signal: str  # "gpu_util" | "sm_util"
    #: Correlation of utilisation with the served rate over the windows that did not queue.
    correlation: float | None
    #: Mean utilisation (%) over the quietest and the busiest third of those windows.
    at_low_load: float
    at_high_load: float
    #: It read ≥ PINNED_PERCENT at half or less of a rate later served without queueing: not load.
    pinned: bool
    #: The lowest served rate at which it read ≥ PINNED_PERCENT (None: never).
    pinned_from: float | None
    tracks_load: bool
    #: Requests/s per fully busy GPU (Σ rate / Σ utilisation over windows under PINNED_PERCENT):
    #: what the utilisation ratio would have said. None without such windows.
    ratio_estimate: float | None


@dataclass(frozen=True)
class CapacityEvidence:
    """The figures the estimate stands on."""

    windows: int
    window_seconds: int
    #: Mean latency of the quiet windows (s).
    unloaded_latency: float
    highest_served: float
    #: Windows where requests queued, and of them those on the plateau (the top queueing throughput).
    queueing_windows: int
    plateau_windows: int
    #: Served rate and mean latency range over the plateau's windows (None: no plateau).
    plateau_served: tuple[float, float] | None
    plateau_latency: tuple[float, float] | None
    #: Requests waiting (Little's law) and running at the plateau, medians (None: not exported / no plateau).
    plateau_waiting: float | None
    plateau_running: float | None
    #: Largest running batch seen in any window (None: not exported).
    largest_batch: float | None
    #: The plateau ran a full batch (a batching server, its batch at its largest, requests waiting).
    batch_full: bool
    #: For a latency SLO: the highest served rate that met it, and the lowest higher one that broke it.
    slo_met_up_to: float | None
    slo_broken_at: float | None
    #: Which signals were read (served and mean latency always).
    signals: tuple[str, ...]
    utilisation: tuple[UtilisationEvidence, ...]


@dataclass(frozen=True)
class SloCapacity:
    """Requests (or tokens) per second one replica serves within ``slo``: a point, or a lower bound."""

    kind: Literal["point", "lower-bound"]
    value: float
    #: The interval: for a point, where the value lies; for a lower bound, [value, inf).
    low: float
    high: float
    slo: Slo
    #: The served rate while requests queued: the knee (None: not observed).
    knee: float | None
    unit: str
    evidence: CapacityEvidence
    explanation: str

    @property
    def knee_observed(self) -> bool:
        return self.knee is not None

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["slo"] = {"kind": self.slo.kind, "quantile": self.slo.quantile, "seconds": self.slo.seconds,
                      "text": self.slo.describe()}
        doc["high"] = None if math.isinf(self.high) else self.high
        return doc


@dataclass(frozen=True)
class _Windows:
    """The aligned windows that served anything."""

    served: np.ndarray
    mean_latency: np.ndarray
    quantile_latency: np.ndarray | None
    running: np.ndarray | None
    util: dict[str, np.ndarray]
    #: Windows with enough requests for their latency to say something (MIN_REQUESTS).
    counted: np.ndarray
    #: Each window's start, in seconds from the first.
    at: np.ndarray


@dataclass(frozen=True)
class _Knee:
    """The plateau: its windows, its served rate and the interval around it."""

    windows: np.ndarray
    rate: float
    low: float
    high: float
    batch_full: bool


def estimate_slo_capacity(
    served: Series,
    mean_latency: Series,
    *,
    slo: Slo | None = None,
    latency_quantile: Series | None = None,
    running: Series | None = None,
    gpu_util: Series | None = None,
    sm_util: Series | None = None,
    window_seconds: int | None = None,
    unit: str = "req/s",
) -> SloCapacity:
    """Capacity per replica at ``slo`` (default: the knee) from the replica's served rate and latency.

    All series are per replica, on one grid, each step a Prometheus window of ``window_seconds``
    (default: the step; shorter steps make overlapping windows, as ``query_range`` does): ``served``
    the completed requests/s (or tokens/s), ``mean_latency`` in seconds (histogram sum ÷ count),
    ``latency_quantile`` the SLO's quantile in seconds (needed for a latency SLO), ``running`` the
    mean running batch (vLLM ``num_requests_running``, TGI's batch size), ``gpu_util``/``sm_util``
    in % (evidence only). Raises :class:`DataError` when fewer than :data:`MIN_WINDOWS` windows
    served anything, or a latency SLO has no quantile series.
    """
    slo = slo or Slo.knee()
    if slo.kind == "latency" and latency_quantile is None:
        raise DataError(f"a latency SLO ({slo.describe()}) needs the latency quantile series it names")
    width = int(window_seconds or served.step_seconds)
    w = _windows(served, mean_latency, latency_quantile, running, {"gpu_util": gpu_util, "sm_util": sm_util},
                 width)
    x, m = w.served, w.mean_latency
    unloaded = float(np.quantile(m[w.counted] if w.counted.any() else m, UNLOADED_QUANTILE))
    waiting = None if w.running is None else x * m - w.running
    queue = m >= LATENCY_INFLATION * unloaded
    if waiting is not None and w.running is not None:
        queue |= waiting >= np.maximum(QUEUE_BATCHES * w.running, 1.0)
    queue &= w.counted
    knee = _knee(x, queue, w.running, w.at, width)
    plateau = knee.windows if knee is not None else np.zeros_like(queue)
    met, broken = _slo_crossing(slo, w, knee)
    evidence = CapacityEvidence(
        windows=int(x.size), window_seconds=width, unloaded_latency=unloaded, highest_served=float(x.max()),
        queueing_windows=int(queue.sum()), plateau_windows=int(plateau.sum()),
        plateau_served=_range(x[plateau]), plateau_latency=_range(m[plateau]),
        plateau_waiting=None if waiting is None or not plateau.any() else float(np.median(waiting[plateau])),
        plateau_running=None if w.running is None or not plateau.any() else float(np.median(w.running[plateau])),
        largest_batch=None if w.running is None else float(np.max(w.running)),
        batch_full=knee is not None and knee.batch_full, slo_met_up_to=met, slo_broken_at=broken,
        signals=tuple(name for name, s in (("served", served), ("mean latency", mean_latency),
                                           ("latency quantile", latency_quantile), ("running batch", running),
                                           ("gpu_util", gpu_util), ("sm_util", sm_util)) if s is not None),
        utilisation=tuple(_utilisation(name, u, x, ~queue) for name, u in w.util.items()),
    )
    return _result(slo, knee, evidence, unit)


def _windows(served: Series, mean_latency: Series, quantile: Series | None, running: Series | None,
             util: dict[str, Series | None], width: int) -> _Windows:
    named = {"served": served, "mean latency": mean_latency}
    if quantile is not None:
        named["latency quantile"] = quantile
    if running is not None:
        named["running batch"] = running
    named |= {k: v for k, v in util.items() if v is not None}
    if len({s.step_seconds for s in named.values()}) != 1:
        raise DataError("serving capacity: the series must share one step; pull them with the same query step")
    start = max(s.start for s in named.values())
    end = min(s.end for s in named.values())
    if end <= start:
        raise DataError("serving capacity: the served-rate and latency histories do not overlap")
    steps = int((end - start) / served.step)
    cols = {k: np.asarray(s.slice(s.index_at(start), s.index_at(start) + steps).values, dtype=float)
            for k, s in named.items()}
    x, m = cols["served"], cols["mean latency"]
    keep = np.isfinite(x) & (x > 0) & np.isfinite(m) & (m > 0)
    for k in ("latency quantile", "running batch"):
        if k in cols:
            keep &= np.isfinite(cols[k])
    n = int(keep.sum())
    if n < MIN_WINDOWS:
        raise DataError(f"serving capacity: only {n} windows served requests with a latency (need {MIN_WINDOWS}); "
                        "check the served-rate and latency queries cover the replica")
    return _Windows(
        served=x[keep], mean_latency=m[keep],
        quantile_latency=cols["latency quantile"][keep] if "latency quantile" in cols else None,
        running=cols["running batch"][keep] if "running batch" in cols else None,
        util={k: cols[k][keep] for k in util if k in cols},
        counted=x[keep] * width >= MIN_REQUESTS, at=np.flatnonzero(keep) * float(served.step_seconds))


def _noise(rate: float, width: int) -> float:
    """COUNT_SIGMAS Poisson standard errors of a rate counted over ``width`` seconds."""
    return COUNT_SIGMAS * math.sqrt(max(rate, 0.0) / width)


def _knee(x: np.ndarray, queue: np.ndarray, running: np.ndarray | None, at: np.ndarray,
          width: int) -> _Knee | None:
    """The knee when requests queued at the top of the served rates seen; None when they did not.

    Nothing serves faster than its capacity, so the capacity is at least the highest served rate, and
    where requests queue at that rate it is that rate: the point. The plateau is the queueing windows
    within PLATEAU_BAND of it; queueing only well below it (a stall, a GC pause) is no knee.

    The interval's top: a full batch with requests waiting is saturation, so the point plus counting
    noise — when that rate held (within noise) for two window lengths, so that a window lay wholly inside
    the saturation; shorter, every window may straddle its start or end and read low, by up to the band.
    Without a full batch,
    queueing may have begun below saturation (QUEUE_LOAD_FLOOR)."""
    if not queue.any():
        return None
    rate = float(np.max(x))
    plateau = queue & (x >= (1 - PLATEAU_BAND) * rate)
    if not plateau.any():
        return None
    full = (running is not None and float(np.max(running)) >= 2
            and float(np.median(running[plateau])) >= BATCH_FULL_SHARE * float(np.max(running)))
    top = plateau & (x >= rate - 2 * _noise(rate, width))
    lasted = float(np.max(at[top]) - np.min(at[top])) >= width
    low = max(0.0, rate - _noise(rate, width))
    if not full:
        high = rate / QUEUE_LOAD_FLOOR
    else:
        high = (rate if lasted else rate / (1 - PLATEAU_BAND)) + _noise(rate, width)
    return _Knee(plateau, rate, low, high, full)


def _slo_crossing(slo: Slo, w: _Windows, knee: _Knee | None) -> tuple[float | None, float | None]:
    """(highest served rate meeting a latency SLO, lowest higher rate breaking it); (None, None) for the knee."""
    if slo.kind != "latency":
        return None, None
    assert w.quantile_latency is not None and slo.seconds is not None
    counted = w.counted if w.counted.any() else np.ones_like(w.counted)
    ok = (w.quantile_latency <= slo.seconds) & counted
    if not ok.any():
        raise DataError(f"no window met {slo.describe()}: the lowest was "
                        f"{float(np.min(w.quantile_latency[counted])) * 1000:.0f} ms, so no load meets it; "
                        "loosen the SLO or check the latency quantile is in seconds")
    met = float(np.max(w.served[ok]))
    above = ~ok & counted & (w.served > met)
    broken = float(np.min(w.served[above])) if above.any() else None
    if broken is None and knee is not None and knee.rate > met:
        broken = knee.rate
    return met, broken


def _range(values: np.ndarray) -> tuple[float, float] | None:
    return (float(np.min(values)), float(np.max(values))) if values.size else None


def _utilisation(name: str, util: np.ndarray, x: np.ndarray, calm: np.ndarray) -> UtilisationEvidence:
    u, r = util[calm], x[calm]
    ok = np.isfinite(u)
    u, r = u[ok], r[ok]
    if u.size < 3:
        return UtilisationEvidence(name, None, math.nan, math.nan, False, None, False, None)
    order = np.argsort(r)
    third = max(1, u.size // 3)
    low, high = float(np.mean(u[order[:third]])), float(np.mean(u[order[-third:]]))
    corr = float(np.corrcoef(r, u)[0, 1]) if np.std(u) > 0 and np.std(r) > 0 else None
    busy = u >= PINNED_PERCENT
    pinned_from = float(np.min(r[busy])) if busy.any() else None
    pinned = pinned_from is not None and pinned_from <= PINNED_LOAD_SHARE * float(np.max(r))
    tracks = corr is not None and corr >= TRACKS_CORRELATION and not pinned
    under = (u < PINNED_PERCENT) & (u > 0)
    ratio = float(r[under].sum() / (u[under].sum() / 100)) if under.any() else None
    return UtilisationEvidence(name, corr, low, high, pinned, pinned_from, tracks, ratio)


def _result(slo: Slo, knee: _Knee | None, ev: CapacityEvidence, unit: str) -> SloCapacity:
    rate = None if knee is None else knee.rate
    if slo.kind == "knee":
        if knee is not None:
            return SloCapacity("point", knee.rate, knee.low, knee.high, slo, rate, unit, ev,
                               _explain_knee(ev, knee, unit))
        return SloCapacity("lower-bound", ev.highest_served, ev.highest_served, math.inf, slo, None, unit, ev,
                           _explain_no_knee(ev, unit))
    met, broken = ev.slo_met_up_to, ev.slo_broken_at
    assert met is not None
    value = met if knee is None else min(met, knee.rate)
    if broken is not None:
        return SloCapacity("point", value, value, max(value, broken), slo, rate, unit, ev,
                           _explain_latency(ev, slo, value, broken, rate, unit))
    if knee is not None:  # it met the SLO even while queueing: the knee caps it
        return SloCapacity("point", knee.rate, knee.low, knee.high, slo, rate, unit, ev,
                           _explain_latency(ev, slo, knee.rate, None, rate, unit))
    return SloCapacity("lower-bound", value, value, math.inf, slo, rate, unit, ev,
                       _explain_latency(ev, slo, value, None, rate, unit))


def _util_text(ev: CapacityEvidence) -> str:
    parts = []
    for u in ev.utilisation:
        if u.pinned and u.pinned_from is not None:
            parts.append(f"{u.signal} read ≥ {PINNED_PERCENT:g} % already at {u.pinned_from:.3g} req/s, under half "
                         "of what the replica later served without queueing, so it does not measure load and was "
                         "not used")
        elif u.tracks_load:
            parts.append(f"{u.signal} tracks the served rate (r = {u.correlation:.2f}, {u.at_low_load:.0f} → "
                         f"{u.at_high_load:.0f} %)")
        elif u.correlation is not None:
            parts.append(f"{u.signal} does not track the served rate (r = {u.correlation:.2f}, "
                         f"{u.at_low_load:.0f} → {u.at_high_load:.0f} %) and was not used")
    return ("; " + "; ".join(parts)) if parts else ""


def _explain_knee(ev: CapacityEvidence, knee: _Knee, unit: str) -> str:
    assert ev.plateau_served is not None and ev.plateau_latency is not None
    lo, hi = ev.plateau_served
    why = (f"{ev.plateau_waiting:.0f} requests waited beside {ev.plateau_running:.0f} running (Little's law: "
           "served × mean latency − running)" if ev.plateau_waiting is not None and ev.plateau_running is not None
           else f"mean latency reached {ev.plateau_latency[1] / ev.unloaded_latency:.0f}× the unloaded "
                f"{ev.unloaded_latency * 1000:.0f} ms")
    bound = (f"the batch was full ({ev.plateau_running:.3g} running, the most it ran), so this is its saturation; "
             f"interval {knee.low:.4g}–{knee.high:.4g} {unit} (the plateau's spread, counting noise, and — for a "
             "plateau shorter than two windows — windows that straddle its start)"
             if knee.batch_full else
             f"no full batch says it was saturated, so queueing may have begun below saturation (from "
             f"{QUEUE_LOAD_FLOOR:.0%} load for a one-at-a-time server): interval {knee.low:.4g}–{knee.high:.4g} {unit}")
    return (f"point: {knee.rate:.4g} {unit} per replica, the knee: in {ev.plateau_windows} of {ev.windows} windows "
            f"of {ev.window_seconds} s requests queued ({why}) while the served rate held at {lo:.4g}–{hi:.4g} "
            f"{unit}; {bound}" + _util_text(ev))


def _explain_no_knee(ev: CapacityEvidence, unit: str) -> str:
    batch = (f"; the running batch reached {ev.largest_batch:.3g} with no queue behind it"
             if ev.largest_batch is not None else "")
    return (f"lower bound: at least {ev.highest_served:.4g} {unit} per replica, the most it served; the knee was "
            f"not observed: in none of {ev.windows} windows of {ev.window_seconds} s did requests queue beyond the "
            f"running batch or latency reach {LATENCY_INFLATION:g}× the unloaded {ev.unloaded_latency * 1000:.0f} ms"
            f"{batch}. Nothing is extrapolated past what was seen (not a line through utilisation, not a batching "
            "curve past the largest batch): load it closer to its knee, or set the capacity by hand"
            + _util_text(ev))


def _explain_latency(ev: CapacityEvidence, slo: Slo, value: float, broken: float | None, knee: float | None,
                     unit: str) -> str:
    head = f"{value:.4g} {unit} per replica at {slo.describe()}"
    if broken is not None:
        return (f"point: {head}: windows served up to {ev.slo_met_up_to:.4g} {unit} within it and broke it at "
                f"{broken:.4g} {unit}" + (f"; the knee is at {knee:.4g} {unit}" if knee is not None else "")
                + _util_text(ev))
    if knee is not None:
        return (f"point: {head}: the SLO held up to the knee at {knee:.4g} {unit}, where requests queue"
                + _util_text(ev))
    return (f"lower bound: {head}: every window met it up to the most it served; the crossing was not observed "
            "and nothing is extrapolated" + _util_text(ev))
