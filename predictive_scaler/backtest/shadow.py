"""The shadow report: the live autoscaler ("yours") against this scaler in forecast-only ("ours"),
step by step over recorded series, and the counterfactual replay of the same window. Pure.

Per step ``i`` of ``step_s`` seconds (docs/shadow.md gives the same definitions):

- a step counts when demand, your spec and ready replicas and our desired replicas are all known;
  the others are left out of every figure (and counted);
- GPUs billed: yours ``spec_replicas × gpusPerReplica``; ours ``desired × gpusPerReplica +
  placeholder GPUs`` (what we decided, held or not: forecast-only holds nothing);
- capacity: yours ``ready_replicas × capacityPerReplica``; ours, replicas we decided at least one pod
  start ago: ``min(desired over the last ceil(podStart / step) + 1 steps) × capacityPerReplica``
  (a scale-up is ready a pod start later, a scale-down at once);
- served ``min(demand, capacity)``; the step is *unmet* when ``demand > capacity``;
- GPU-hours ``Σ billed × step / 3600``, cost ``Σ billed × price × step / 3600``;
- wasted prewarm: placeholder GPUs no demand used within one node start: per step
  ``placeholder − min(placeholder, max(0, replicas_for(max demand over the next node start) × g − desired × g))``
  priced like the rest. The live autoscaler holds no placeholders: its wasted prewarm is 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from predictive_scaler.backtest.headline import money, share
from predictive_scaler.backtest.report import _STYLE, markdown_to_html

SIDES = ("yours", "ours")


@dataclass(frozen=True)
class ShadowInput:
    """The recorded series on one grid (NaN: not recorded) and what converts replicas to GPUs and service."""

    start: pd.Timestamp
    step_s: int
    demand: np.ndarray
    yours_replicas: np.ndarray
    yours_ready: np.ndarray
    ours_replicas: np.ndarray
    ours_placeholder_gpus: np.ndarray
    #: Price of one GPU-hour per step (NaN where unknown: ``default_price`` applies).
    price: np.ndarray
    default_price: float
    capacity_per_replica: float
    gpus_per_replica: int
    pod_start_s: float
    node_start_s: float
    currency: str = "USD"
    #: What the live autoscaler is (e.g. "HorizontalPodAutoscaler ml/llm"), for the report's words.
    live: str = "the live autoscaler"
    scaler: str = ""


@dataclass(frozen=True)
class Figures:
    gpu_hours: float
    cost: float
    demand: float
    served: float
    unmet_minutes: float
    wasted_prewarm_cost: float

    @property
    def served_share(self) -> float | None:
        return self.served / self.demand if self.demand > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "served_share": self.served_share}


@dataclass(frozen=True)
class ShadowResult:
    input: ShadowInput
    total: Mapping[str, Figures]
    #: UTC day (YYYY-MM-DD) → side → figures.
    days: Mapping[str, Mapping[str, Figures]]
    steps_counted: int
    steps_left_out: int
    #: The counterfactual replay of the same demand (the backtest's --json ``policies``), when run.
    replay: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        i = self.input
        return {
            "scaler": i.scaler, "live_autoscaler": i.live, "currency": i.currency,
            "start": i.start.isoformat(), "step_seconds": i.step_s,
            "steps_counted": self.steps_counted, "steps_left_out": self.steps_left_out,
            "total": {s: f.to_dict() for s, f in self.total.items()},
            "days": {d: {s: f.to_dict() for s, f in by.items()} for d, by in self.days.items()},
            "replay": dict(self.replay),
        }


def _ready_after(desired: np.ndarray, lag_steps: int) -> np.ndarray:
    """The least desired count over the last ``lag_steps`` + 1 steps (NaN ignored; all NaN → NaN)."""
    out = np.full(desired.shape, np.nan)
    for i in range(len(desired)):
        window = desired[max(0, i - lag_steps): i + 1]
        known = window[np.isfinite(window)]
        if known.size:
            out[i] = known.min()
    return out


def _ahead_max(values: np.ndarray, steps: int) -> np.ndarray:
    """The largest known value over this step and the next ``steps`` (NaN when none is known)."""
    out = np.full(values.shape, np.nan)
    for i in range(len(values)):
        window = values[i: i + steps + 1]
        known = window[np.isfinite(window)]
        if known.size:
            out[i] = known.max()
    return out


def per_step(inp: ShadowInput) -> dict[str, dict[str, np.ndarray]]:
    """Billed GPUs, capacity, served, unmet and wasted GPUs per step and side, and the mask of counted steps."""
    g, c = inp.gpus_per_replica, inp.capacity_per_replica
    counted = (np.isfinite(inp.demand) & np.isfinite(inp.yours_replicas) & np.isfinite(inp.yours_ready)
               & np.isfinite(inp.ours_replicas))
    demand = np.where(counted, inp.demand, 0.0)
    placeholder = np.nan_to_num(inp.ours_placeholder_gpus, nan=0.0)
    ours_ready = _ready_after(inp.ours_replicas, math.ceil(inp.pod_start_s / inp.step_s))
    need = np.ceil(np.maximum(0.0, _ahead_max(inp.demand, math.ceil(inp.node_start_s / inp.step_s))) / c - 1e-9) * g
    used = np.minimum(placeholder, np.maximum(0.0, np.nan_to_num(need) - np.nan_to_num(inp.ours_replicas) * g))
    sides = {
        "yours": (inp.yours_replicas * g, inp.yours_ready * c, np.zeros_like(demand)),
        "ours": (inp.ours_replicas * g + placeholder, ours_ready * c, placeholder - used),
    }
    out: dict[str, dict[str, np.ndarray]] = {}
    for side, (billed, capacity, wasted) in sides.items():
        billed = np.where(counted, billed, 0.0)
        capacity = np.where(counted, np.nan_to_num(capacity), 0.0)
        out[side] = {"billed": billed, "served": np.minimum(demand, capacity),
                     "unmet": counted & (demand > capacity), "wasted": np.where(counted, wasted, 0.0)}
    out["_"] = {"counted": counted, "demand": demand,
                "price": np.where(np.isfinite(inp.price), inp.price, inp.default_price)}
    return out


def _figures(steps: dict[str, np.ndarray], demand: np.ndarray, price: np.ndarray, step_s: int,
             mask: np.ndarray) -> Figures:
    hours = step_s / 3600.0
    return Figures(gpu_hours=float(steps["billed"][mask].sum() * hours),
                   cost=float((steps["billed"] * price)[mask].sum() * hours),
                   demand=float(demand[mask].sum()), served=float(steps["served"][mask].sum()),
                   unmet_minutes=float(steps["unmet"][mask].sum() * step_s / 60.0),
                   wasted_prewarm_cost=float((steps["wasted"] * price)[mask].sum() * hours))


def compare(inp: ShadowInput, replay: Mapping[str, Any] | None = None) -> ShadowResult:
    steps = per_step(inp)
    common = steps["_"]
    counted, demand, price = common["counted"], common["demand"], common["price"]
    every = np.ones(counted.shape, dtype=bool)
    total = {s: _figures(steps[s], demand, price, inp.step_s, every) for s in SIDES}
    stamps = inp.start + pd.to_timedelta(np.arange(len(counted)) * inp.step_s, unit="s")
    day_of = np.array([t.strftime("%Y-%m-%d") for t in stamps])
    days = {d: {s: _figures(steps[s], demand, price, inp.step_s, day_of == d) for s in SIDES}
            for d in dict.fromkeys(day_of[counted])}
    return ShadowResult(inp, total, days, int(counted.sum()), int((~counted).sum()), dict(replay or {}))


# -- the report ------------------------------------------------------------------------------------

def _diff(ours: float, yours: float, fmt: Any) -> str:
    d = ours - yours
    sign = "+" if d > 0 else ("−" if d < 0 else "")
    return f"{sign}{fmt(abs(d))}"


def headline(result: ShadowResult) -> str:
    y, o = result.total["yours"], result.total["ours"]
    cur = result.input.currency
    days = len(result.days)
    return (f"Over {days} day{'s' if days != 1 else ''} observed, {result.input.live} ran "
            f"{y.gpu_hours:,.1f} GPU-hours ({money(y.cost, cur)}) and left demand unmet in "
            f"{y.unmet_minutes:,.0f} minutes, serving {share(y.served_share)}; in forecast-only beside it, "
            f"predictive-scaler decided {o.gpu_hours:,.1f} GPU-hours ({money(o.cost, cur)}, of which prewarm "
            f"no demand used {money(o.wasted_prewarm_cost, cur)}) with demand unmet in {o.unmet_minutes:,.0f} "
            f"minutes, serving {share(o.served_share)}.")


def _row(name: str, f: Figures, cur: str) -> str:
    return (f"| {name} | {f.gpu_hours:,.1f} | {money(f.cost, cur)} | {share(f.served_share)} | "
            f"{f.unmet_minutes:,.0f} | {money(f.wasted_prewarm_cost, cur)} |")


_HEAD = ("| | GPU-hours | cost | demand served | unmet minutes | wasted prewarm |\n"
         "|---|---|---|---|---|---|")


def markdown(result: ShadowResult) -> str:
    i, cur = result.input, result.input.currency
    y, o = result.total["yours"], result.total["ours"]
    lines = [f"# Shadow report: {i.scaler}", "", headline(result), "",
             f"Recorded at a {i.step_s} s step from {i.start.isoformat()}: {result.steps_counted} steps counted, "
             f"{result.steps_left_out} left out (demand or a decision not recorded). Capacity "
             f"{i.capacity_per_replica:g} per replica, {i.gpus_per_replica} GPU(s) per replica; docs/shadow.md "
             "defines every figure.", "", "## In total", "", _HEAD,
             _row(f"yours ({i.live})", y, cur), _row("ours (forecast-only)", o, cur),
             f"| ours − yours | {_diff(o.gpu_hours, y.gpu_hours, lambda v: f'{v:,.1f}')} | "
             f"{_diff(o.cost, y.cost, lambda v: money(v, cur))} | "
             f"{_diff(o.served_share or 0, y.served_share or 0, lambda v: f'{100 * v:.2f} %')} | "
             f"{_diff(o.unmet_minutes, y.unmet_minutes, lambda v: f'{v:,.0f}')} | "
             f"{_diff(o.wasted_prewarm_cost, y.wasted_prewarm_cost, lambda v: money(v, cur))} |",
             "", "## Day by day", "",
             "| day (UTC) | GPU-hours yours | ours | cost yours | ours | unmet min yours | ours | wasted prewarm ours |",
             "|---|---|---|---|---|---|---|---|"]
    for day, by in result.days.items():
        dy, do = by["yours"], by["ours"]
        lines.append(f"| {day} | {dy.gpu_hours:,.1f} | {do.gpu_hours:,.1f} | {money(dy.cost, cur)} | "
                     f"{money(do.cost, cur)} | {dy.unmet_minutes:,.0f} | {do.unmet_minutes:,.0f} | "
                     f"{money(do.wasted_prewarm_cost, cur)} |")
    lines += _replay_section(result)
    return "\n".join(lines) + "\n"


def _replay_section(result: ShadowResult) -> list[str]:
    policies = result.replay.get("policies") or {}
    pred, react = policies.get("predictive"), policies.get("reactive")
    if not pred:
        return []
    cur, o = result.input.currency, result.total["ours"]
    lines = ["", "## The same window replayed", "",
             "The demand of the window replayed through the backtest's simulated cluster (`run_backtest`): the "
             "predictive policy acting on its decisions, reactive scaling the HPA rule. Beside it, what the "
             "recorded decisions came to; the difference is replayed − recorded.", "",
             "| | GPU-hours | cost | demand served | unmet minutes | wasted prewarm |", "|---|---|---|---|---|---|",
             _row("ours, recorded", o, cur)]
    for name, p in (("predictive, replayed", pred), ("reactive, replayed", react)):
        if p:
            lines.append(f"| {name} | {p['gpu_hours']:,.1f} | {money(p['cost'], cur)} | "
                         f"{share(p.get('slo_attainment'))} | {p['unmet_minutes']:,.0f} | "
                         f"{money(p['wasted_prewarm_cost'], cur)} |")
    lines.append(f"| replayed − recorded (predictive) | {_diff(pred['gpu_hours'], o.gpu_hours, lambda v: f'{v:,.1f}')} "
                 f"| {_diff(pred['cost'], o.cost, lambda v: money(v, cur))} | – | "
                 f"{_diff(pred['unmet_minutes'], o.unmet_minutes, lambda v: f'{v:,.0f}')} | "
                 f"{_diff(pred['wasted_prewarm_cost'], o.wasted_prewarm_cost, lambda v: money(v, cur))} |")
    return lines


def html_page(result: ShadowResult) -> str:
    import html

    body = markdown_to_html(markdown(result), {})
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>Shadow report '
            f"{html.escape(result.input.scaler)}</title>\n<style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")
