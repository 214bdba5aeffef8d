"""GPU waste a serving history shows, in GPU-hours and money over a window. Pure: series in, findings out.

Four kinds, each a :class:`WasteFinding`:

- **cpu-bound** — requests queue while the GPUs read ≤ 30 % busy: the bottleneck is the CPU
  (kernel launches, tokenisation, Python), and the GPU time left idle meanwhile is waste. Counted:
  Σ GPUs × (1 − utilisation) over those steps. The steps are
  :func:`predictive_scaler.policy.saturation.gpu_blind_steps`, the same test the dcgm-busy-gpus
  guard applies.
- **saturated-at-low-load** — utilisation reads ≥ 90 % while each GPU serves a fraction of what it
  can (continuous batching keeps a kernel running whenever anything is in flight): the fleet looks
  full and is not; scaled on utilisation it grows further. Counted: the capacity left unused,
  Σ GPUs × (1 − served per GPU ÷ capacity per GPU), over the steps that read pinned. Without a
  capacity the most one GPU was seen to serve stands in: a lower bound of the capacity, so the
  waste counted is a lower bound too (the finding says so).
- **kv-cache-pressure** — the KV cache ≥ 90 % full with requests waiting: admission is capped by
  memory, not compute, so the GPUs run short batches while work queues. Counted: the GPU-hours
  spent so (they serve less than they could; a larger cache or more replicas would not).
- **idle** — allocated GPUs under 5 % for 10 minutes or more, counted by PromQL
  (:func:`predictive_scaler.sources.dcgm.idle_allocated_gpus`) and summarised by
  :func:`predictive_scaler.capacity_estimate.summarise_idle`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from predictive_scaler.capacity_estimate import summarise_idle
from predictive_scaler.errors import DataError
from predictive_scaler.policy import saturation
from predictive_scaler.policy.saturation import ServingHistory
from predictive_scaler.series import Series

__all__ = ["KV_CACHE_FULL", "WasteFinding", "cpu_bound", "idle", "kv_cache_pressure", "saturated_at_low_load"]

#: KV cache share (0–1) at or above which a waiting request is waiting for memory: vLLM admits a request
#: only when its blocks fit, and preempts running ones when the cache runs out.
KV_CACHE_FULL = 0.90
#: Mean requests waiting over a step from which a step counts as waiting (one request on average).
WAITING = 1.0

Kind = Literal["cpu-bound", "saturated-at-low-load", "kv-cache-pressure", "idle"]


@dataclass(frozen=True)
class WasteFinding:
    """One kind of waste over a window: whether it showed, how many GPU-hours, and what they cost."""

    kind: Kind
    fired: bool
    #: GPU-hours wasted over the window (see the module's docstring for what each kind counts).
    gpu_hours: float
    #: ``gpu_hours × price per GPU-hour``; None without a price.
    cost: float | None
    currency: str
    #: Steps where it showed, of the steps observed; and the hours observed.
    steps: int
    observed_steps: int
    observed_hours: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finding(kind: Kind, hours: float, steps: int, observed: int, observed_hours: float, price: float | None,
             currency: str, message: str) -> WasteFinding:
    return WasteFinding(kind, steps > 0, hours, None if price is None else hours * float(price), currency, steps,
                        observed, observed_hours, message)


def _money(hours: float, price: float | None, currency: str) -> str:
    return f"{hours:.3g} GPU-hours" + ("" if price is None else f" ({hours * price:.2f} {currency})")


@dataclass(frozen=True)
class _Aligned:
    throughput: np.ndarray
    gpus: np.ndarray
    util: np.ndarray
    latency: np.ndarray
    step_hours: float


def _aligned(h: ServingHistory) -> _Aligned:
    series = (h.throughput, h.gpus, h.utilisation, h.latency)
    if len({s.step_seconds for s in series}) != 1:
        raise DataError("waste: throughput, GPUs, utilisation and latency must share one step")
    start, end = max(s.start for s in series), min(s.end for s in series)
    if end <= start:
        raise DataError("waste: the throughput, GPU and latency histories do not overlap")
    n = int((end - start) / h.throughput.step)
    x, g, u, lat = (np.asarray(s.slice(s.index_at(start), s.index_at(start) + n).values, dtype=float)
                    for s in series)
    keep = np.isfinite(x) & (x > 0) & np.isfinite(g) & (g > 0) & np.isfinite(u) & np.isfinite(lat) & (lat > 0)
    if keep.sum() < saturation.MIN_STEPS:
        raise DataError(f"waste: only {int(keep.sum())} steps with requests, GPUs, utilisation and latency "
                        f"(need {saturation.MIN_STEPS})")
    return _Aligned(x[keep], g[keep], u[keep], lat[keep], h.throughput.step_seconds / 3600)


def _unloaded(a: _Aligned) -> float | None:
    reference = a.util <= saturation.REFERENCE_PERCENT
    return float(np.median(a.latency[reference])) if reference.any() else None


def cpu_bound(history: ServingHistory, *, price_per_gpu_hour: float | None = None,
              currency: str = "USD") -> WasteFinding:
    """GPU time left idle while requests queued behind something else (latency up, GPUs ≤ 30 % busy)."""
    a = _aligned(history)
    unloaded = _unloaded(a)
    blind = saturation.gpu_blind_steps(a.throughput / a.gpus, a.util, a.latency, unloaded)
    hours = float(np.sum(a.gpus[blind] * (1 - a.util[blind] / 100))) * a.step_hours
    n, total = int(blind.sum()), int(a.throughput.size)
    if not n:
        return _finding("cpu-bound", 0.0, 0, total, total * a.step_hours, price_per_gpu_hour, currency,
                        "no step where latency rose while the GPUs stayed under "
                        f"{saturation.BLIND_PERCENT:g} % busy")
    assert unloaded is not None
    worst = float(np.max(a.latency[blind]) / unloaded)
    return _finding("cpu-bound", hours, n, total, total * a.step_hours, price_per_gpu_hour, currency,
                    f"CPU-bound serving in {n} of {total} steps: latency up to {worst:.1f}× its unloaded "
                    f"{unloaded * 1000:.0f} ms while the GPUs read at most {float(np.max(a.util[blind])):.0f} % "
                    f"busy; {_money(hours, price_per_gpu_hour, currency)} of GPU time idle meanwhile. More "
                    "replicas on the same CPU share do not help: give each replica more CPU, batch, or use "
                    "CUDA graphs")


def saturated_at_low_load(history: ServingHistory, *, capacity_per_gpu: float | None = None,
                          price_per_gpu_hour: float | None = None, currency: str = "USD") -> WasteFinding:
    """Capacity left unused while utilisation read pinned (≥ 90 % at a fraction of what a GPU serves).

    ``capacity_per_gpu``: requests/s one GPU serves (e.g. ``estimate_slo_capacity(...).value``);
    None: the most one GPU was seen to serve here, a lower bound (so is the waste then)."""
    a = _aligned(history)
    check = saturation.check_demand_signal(history)
    total = int(a.throughput.size)
    per_gpu = a.throughput / a.gpus
    if check.verdict != "pinned":
        return _finding("saturated-at-low-load", 0.0, 0, total, total * a.step_hours, price_per_gpu_hour,
                        currency, f"utilisation is not pinned: {check.message}")
    bound = capacity_per_gpu is None
    # A GPU serves at least what it was seen to serve: that stands in for an unknown (or lower) capacity.
    capacity = max(capacity_per_gpu or 0.0, float(np.max(per_gpu)))
    pinned = (a.util >= saturation.PINNED_PERCENT) & (per_gpu < capacity)
    unused = 1 - per_gpu[pinned] / capacity
    hours = float(np.sum(a.gpus[pinned] * unused)) * a.step_hours
    n = int(pinned.sum())
    share = float(np.mean(per_gpu[pinned] / capacity)) if n else 1.0
    return _finding("saturated-at-low-load", hours, n, total, total * a.step_hours, price_per_gpu_hour, currency,
                    f"utilisation read ≥ {saturation.PINNED_PERCENT:g} % in {n} of {total} steps while each GPU "
                    f"served on average {share * 100:.0f} % of the {capacity:.3g} req/s it "
                    + ("was seen to serve (a lower bound of its capacity, so this waste is a lower bound too)"
                       if bound else "can serve")
                    + f": {_money(hours, price_per_gpu_hour, currency)} of capacity unused. Scale on the request "
                    "rate, not on utilisation")


def kv_cache_pressure(kv_cache_usage: Series, waiting: Series, gpus: Series, *,
                      price_per_gpu_hour: float | None = None, currency: str = "USD") -> WasteFinding:
    """GPU-hours with the KV cache ≥ 90 % full and requests waiting (``kv_cache_usage`` 0–1, e.g. vLLM's
    ``gpu_cache_usage_perc``; ``waiting`` the mean requests waiting, ``num_requests_waiting``)."""
    series = (kv_cache_usage, waiting, gpus)
    if len({s.step_seconds for s in series}) != 1:
        raise DataError("KV-cache pressure: cache usage, waiting requests and GPUs must share one step")
    start, end = max(s.start for s in series), min(s.end for s in series)
    if end <= start:
        raise DataError("KV-cache pressure: the cache, waiting and GPU histories do not overlap")
    n = int((end - start) / kv_cache_usage.step)
    kv, w, g = (np.asarray(s.slice(s.index_at(start), s.index_at(start) + n).values, dtype=float) for s in series)
    if np.nanmax(kv, initial=0.0) > 1.0 + 1e-9:
        raise DataError("KV-cache pressure: cache usage must be a share in [0, 1] (vLLM's gpu_cache_usage_perc "
                        "is one); divide a percentage by 100")
    seen = np.isfinite(kv) & np.isfinite(w) & np.isfinite(g) & (g > 0)
    pressed = seen & (kv >= KV_CACHE_FULL) & (w >= WAITING)
    step_h = kv_cache_usage.step_seconds / 3600
    hours = float(np.sum(g[pressed])) * step_h
    k, total = int(pressed.sum()), int(seen.sum())
    message = (f"KV cache ≥ {KV_CACHE_FULL * 100:.0f} % full with requests waiting in {k} of {total} steps (up to "
               f"{float(np.max(w[pressed])):.0f} waiting): {_money(hours, price_per_gpu_hour, currency)} served "
               "with admission capped by memory, not compute; shorten max model length, quantise the KV cache, "
               "or give replicas more memory" if k else
               f"the KV cache never reached {KV_CACHE_FULL * 100:.0f} % with requests waiting")
    return _finding("kv-cache-pressure", hours, k, total, total * step_h, price_per_gpu_hour, currency, message)


def idle(idle_gpus: Series, *, allocated: Series | None = None, price_per_gpu_hour: float | None = None,
         currency: str = "USD") -> WasteFinding:
    """Idle allocated GPUs (PromQL's count of GPUs under 5 % for 10 min) as GPU-hours over the window."""
    summary = summarise_idle(idle_gpus, allocated=allocated, price_per_gpu_hour=price_per_gpu_hour,
                             currency=currency)
    hours = summary.mean * summary.observed_hours
    vals = np.asarray(idle_gpus.values, dtype=float)
    seen = np.isfinite(vals)
    k = int((vals[seen] > 0).sum())
    share = ("" if summary.allocated_mean is None
             else f" of {summary.allocated_mean:.3g} allocated")
    message = (f"{summary.mean:.3g} GPUs{share} idle on average over {summary.observed_hours:.3g} h: "
               f"{_money(hours, price_per_gpu_hour, currency)} ({summary.idle_gpu_hours_per_day:.3g} GPU-hours a day)"
               if k else "no allocated GPU stayed idle")
    return _finding("idle", hours, k, int(seen.sum()), summary.observed_hours, price_per_gpu_hour, currency, message)
