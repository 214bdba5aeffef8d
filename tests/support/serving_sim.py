"""Simulated inference servers under an open-loop Poisson ladder, written as the bundled telemetry is.

Two servers whose capacity is known exactly, so an estimator can be judged on more than the four
real ladders:

- :func:`one_at_a_time` — an M/M/1 queue: one request on the GPU at a time, exponential service
  times; capacity ``mu`` requests/s. The GPU's busy share is its load, so utilisation tracks it.
- :func:`dynamic_batching` — Triton's dynamic batcher: whenever the GPU is free it takes every
  waiting request, up to ``max_batch``, into one forward pass of ``fixed + per_request × batch``
  seconds; capacity ``max_batch / (fixed + per_request × max_batch)``. Once requests arrive faster
  than one per forward pass the GPU never idles, so its utilisation pins at 100 % far below capacity
  (as the real continuous-batching decoder's does).

Each returns one row per second with the columns of backtests/telemetry/*.csv that the lab's
:func:`benchmarks.gpu_ladders.windows` reads: ``t, mode, offered_rate, served, p50_ms, p95_ms,
queue, mean_batch, gpu_util, sm_util``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def _arrivals(rates: Sequence[float], rung_seconds: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Poisson arrival times over the ladder, and the offered rate of each second."""
    times = []
    for k, rate in enumerate(rates):
        n = rng.poisson(rate * rung_seconds)
        times.append(k * rung_seconds + np.sort(rng.uniform(0, rung_seconds, n)))
    offered = np.repeat(np.asarray(rates, dtype=float), rung_seconds)
    return np.concatenate(times), offered


def one_at_a_time(mu: float, loads: Sequence[float], *, rung_seconds: int = 60, drain_seconds: int = 30,
                  seed: int = 0) -> pd.DataFrame:
    """An M/M/1 server of capacity ``mu`` req/s under a ladder of ``loads`` (fractions of ``mu``)."""
    rng = np.random.default_rng(seed)
    arrive, offered = _arrivals([f * mu for f in loads], rung_seconds, rng)
    service = rng.exponential(1 / mu, arrive.size)
    done = np.empty_like(arrive)
    free = 0.0
    for i, (a, s) in enumerate(zip(arrive, service, strict=True)):
        free = max(a, free) + s
        done[i] = free
    began = done - service
    return _rows(arrive, began, done, np.ones_like(arrive), offered, drain_seconds, "serial")


def dynamic_batching(fixed: float, per_request: float, max_batch: int, loads: Sequence[float], *,
                     rung_seconds: int = 60, drain_seconds: int = 30, seed: int = 0) -> pd.DataFrame:
    """A dynamically batching server under a ladder of ``loads`` (fractions of its capacity)."""
    capacity = max_batch / (fixed + per_request * max_batch)
    rng = np.random.default_rng(seed)
    arrive, offered = _arrivals([f * capacity for f in loads], rung_seconds, rng)
    began = np.empty_like(arrive)
    done = np.empty_like(arrive)
    batch = np.empty_like(arrive)
    t, head, n = 0.0, 0, arrive.size
    while head < n:
        t = max(t, arrive[head])
        waiting = int(np.searchsorted(arrive, t, side="right")) - head
        size = min(waiting, max_batch)
        end = t + fixed + per_request * size
        began[head:head + size], done[head:head + size], batch[head:head + size] = t, end, size
        head += size
        t = end
    return _rows(arrive, began, done, batch, offered, drain_seconds, "batched")


def _rows(arrive: np.ndarray, began: np.ndarray, done: np.ndarray, batch: np.ndarray, offered: np.ndarray,
          drain_seconds: int, mode: str) -> pd.DataFrame:
    """One row per second (FIFO: ``began`` and ``done`` are sorted, as ``arrive`` is)."""
    seconds = offered.size + drain_seconds
    edges = np.arange(seconds + 1, dtype=float)
    latency_ms = (done - arrive) * 1000
    cut = np.searchsorted(done, edges, side="left")
    queue = np.searchsorted(arrive, edges[1:], side="right") - np.searchsorted(began, edges[1:], side="right")
    rows = []
    for k in range(seconds):
        lat = latency_ms[cut[k]:cut[k + 1]]
        rows.append({
            "t": float(k), "mode": mode if k < offered.size else "idle",
            "offered_rate": float(offered[k]) if k < offered.size else 0.0,
            "served": int(lat.size),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else np.nan,
            "p95_ms": float(np.percentile(lat, 95)) if lat.size else np.nan,
            "queue": int(queue[k]), "mean_batch": float(np.mean(batch[cut[k]:cut[k + 1]])) if lat.size else np.nan,
        })
    frame = pd.DataFrame(rows)
    # Busy share of each second: the forward passes run one after another, so the busy time up to an
    # instant is the passes finished by then plus the running one's part.
    starts, first = np.unique(began, return_index=True)
    ends = done[first]
    spent = np.concatenate([[0.0], np.cumsum(ends - starts)])
    j = np.searchsorted(starts, edges, side="right") - 1
    running = np.where(j >= 0, np.minimum(edges - starts[np.maximum(j, 0)], ends[np.maximum(j, 0)] - starts[np.maximum(j, 0)]), 0.0)
    busy_until = spent[np.maximum(j, 0)] * (j >= 0) + running
    frame["gpu_util"] = np.round(100 * np.diff(busy_until))
    frame["sm_util"] = frame["gpu_util"]
    return frame
