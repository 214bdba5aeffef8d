"""The report's figures, each drawn to be read at report width.

- the cost–service frontier, in money, with the equal-service comparison the headline reads;
- the cost per UTC day against the reactive baseline's (a fixed fleet, many times dearer, is given as a
  number rather than as a bar that would flatten the rest), and the unmet minutes each day bought;
- the hardest days, zoomed: capacity, demand, the minutes each policy left demand unmet (shaded) and the
  GPUs billed on a labelled axis of their own;
- the whole run per policy and the forecast band, bucketed (:func:`bucket_ticks`) so that weeks of
  per-minute points do not merge into solid ink.

Each function takes the ``pyplot`` module (Agg, chosen by the caller) and writes one PNG.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from predictive_scaler.backtest import event_windows
from predictive_scaler.backtest.headline import currency, money, price
from predictive_scaler.backtest.measures import wasted_billed_gpus

if TYPE_CHECKING:
    from predictive_scaler.backtest.frontier import FrontierResult
    from predictive_scaler.backtest.runner import Result

#: One colour per policy, in every plot.
COLORS = {"predictive": "tab:blue", "reactive": "tab:orange", "holt-winters": "tab:purple", "oracle": "tab:green",
          "static": "tab:gray"}


# -- day by day ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Daily:
    """Each policy's cost and unmet minutes per UTC day of the evaluation (the first and last may be
    partial), and the predictive policy's wasted prewarm cost per day (None without both policies)."""

    days: np.ndarray  # datetime64[D]: the UTC day each entry is for
    cost: dict[str, np.ndarray]
    unmet_minutes: dict[str, np.ndarray]
    wasted: np.ndarray | None


def daily(result: Result) -> Daily:
    """Per day, what :func:`~predictive_scaler.backtest.measures.measure_policy` sums over the whole run:
    the days add up to the tables' totals."""
    setup = result.setup
    demand, cfg = setup.demand, setup.scenario.cluster
    start = setup.eval_start.tz_localize(None)
    first_day = start.normalize()
    offset = int((start - first_day).total_seconds())
    day = (offset + np.arange(setup.n_ticks) * setup.tick_s) // 86400
    n_days = int(day[-1]) + 1 if setup.n_ticks else 0
    known = demand.known
    per_tick = setup.tick_s / 3600.0 * cfg.price_per_gpu_hour

    def per_day(x: np.ndarray) -> np.ndarray:
        return np.bincount(day, weights=np.where(known, x, 0.0).astype(float), minlength=n_days)

    d = np.where(known, demand.values, 0.0)
    cost, unmet = {}, {}
    for name, run in result.runs.items():
        cost[name] = per_day(run.billed_gpus * per_tick)
        short = d - np.minimum(d, run.ready * demand.capacity_per_replica)
        unmet[name] = per_day((short > 1e-9 * max(1.0, demand.capacity_per_replica)) * (setup.tick_s / 60.0))
    wasted = None
    if "predictive" in result.runs and "reactive" in result.runs:
        gpus, _ = wasted_billed_gpus(result.runs["predictive"], demand, cfg, result.runs["reactive"].billed_gpus,
                                     demand.need(setup.scenario.target_utilization))
        wasted = per_day(gpus * per_tick)
    days = np.datetime64(first_day.date(), "D") + np.arange(n_days)
    return Daily(days, cost, unmet, wasted)


def _signed(value: float, cur: str) -> str:
    return ("+" if value > 0 else "−" if value < 0 else "") + money(abs(value), cur)


def daily_plot(result: Result, directory: Path, plt: Any) -> Path | None:
    """Cost per day against the reactive baseline's (bars: predictive; lines: the other adaptive policies),
    the part of predictive's that was wasted prewarm, and the unmet minutes each day bought."""
    if "reactive" not in result.runs or len(result.runs) < 2:
        return None
    dd, cur = daily(result), currency(result)
    x = dd.days.astype("datetime64[s]") + np.timedelta64(43200, "s")  # each bar over the middle of its day
    base = dd.cost["reactive"]
    fig, (top, low) = plt.subplots(2, 1, figsize=(12, 6.2), sharex=True, layout="constrained",
                                   gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8
    totals = []
    if "predictive" in dd.cost:
        diff = dd.cost["predictive"] - base
        top.bar(x, diff, width=width, color=COLORS["predictive"], alpha=0.8, label="predictive − reactive")
        totals.append(f"predictive {_signed(float(diff.sum()), cur)}")
        if dd.wasted is not None:
            top.bar(x, dd.wasted, width=width * 0.45, color="tab:red", label="of which wasted prewarm")
            totals[-1] += f" (wasted prewarm {money(float(dd.wasted.sum()), cur)})"
    for name in ("holt-winters", "oracle"):
        if name in dd.cost:
            diff = dd.cost[name] - base
            top.plot(x, diff, marker="o", ms=3, lw=1, color=COLORS[name], label=f"{name} − reactive")
            totals.append(f"{name} {_signed(float(diff.sum()), cur)}")
    top.axhline(0, color="black", lw=0.8)
    top.set_ylabel(f"cost per day − reactive's ({cur})")
    top.set_title(f"Cost per day against reactive's; over the whole run: {', '.join(totals)}", fontsize=10)
    if "static" in result.measures:
        # A fixed fleet costs several times the rest: as bars it would flatten every other one.
        s = result.measures["static"].cost
        top.text(0.01, 0.97, f"static (a fixed fleet for the training peak): {money(s, cur)} in all, "
                 f"{_signed(s - result.measures['reactive'].cost, cur)} against reactive — off this scale",
                 transform=top.transAxes, va="top", fontsize=8, color="0.3")
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    shown = [n for n in ("reactive", "predictive", "holt-winters") if n in dd.unmet_minutes]
    step = width / len(shown)
    for k, name in enumerate(shown):
        shift = np.timedelta64(int(86400 * step * (k - (len(shown) - 1) / 2)), "s")
        low.bar(x + shift, dd.unmet_minutes[name], width=step,
                color=COLORS[name], label=name)
    low.set_ylabel("minutes with demand unmet")
    low.set_title("What each day bought: minutes with demand unmet", fontsize=10)
    low.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    path = directory / "daily_cost.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# -- the whole run, bucketed ------------------------------------------------------------------------

#: At most this many points per line in a plot of the whole run: more is solid ink at report width.
MAX_POINTS = 400


def bucket_ticks(n_ticks: int, tick_s: int, most: int = MAX_POINTS) -> int:
    """Ticks per bucket for a plot of ``n_ticks``: the shortest of 5 min, 15 min, 1 h … 1 day (at least one
    tick) that leaves at most ``most`` buckets."""
    for seconds in (tick_s, 300, 900, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400):
        k = max(1, seconds // tick_s)
        if seconds >= tick_s and math.ceil(n_ticks / k) <= most:
            return k
    return max(1, math.ceil(n_ticks / most))


def bucketed(values: np.ndarray, k: int, how: str) -> np.ndarray:
    """``values`` reduced over consecutive buckets of ``k`` (the last may be short): max, min, mean or sum,
    NaN-aware (an all-NaN bucket stays NaN, or sums to 0)."""
    v = np.asarray(values, dtype=float)
    pad = (-len(v)) % k
    grid = np.concatenate([v, np.full(pad, np.nan)]).reshape(-1, k)
    if how == "sum":
        return np.asarray(np.nansum(grid, axis=1))
    with warnings.catch_warnings():
        # An all-NaN bucket (a trace gap) is NaN, drawn as a gap; numpy's warning about it is not news.
        warnings.simplefilter("ignore", RuntimeWarning)
        if how == "max":
            return np.asarray(np.nanmax(grid, axis=1))
        if how == "min":
            return np.asarray(np.nanmin(grid, axis=1))
        return np.asarray(np.nanmean(grid, axis=1))


def _bucket_words(k: int, tick_s: int) -> str:
    seconds = k * tick_s
    if seconds % 86400 == 0:
        return f"{seconds // 86400}-day" if seconds > 86400 else "daily"
    if seconds % 3600 == 0:
        return f"{seconds // 3600}-hour" if seconds > 3600 else "hourly"
    return f"{seconds // 60}-minute" if seconds >= 60 else f"{seconds}-second"


def capacity_plot(result: Result, directory: Path, plt: Any) -> Path:
    """The whole run per policy, bucketed so it reads at report width: demand's range within each bucket,
    the mean ready capacity, and the minutes demand went unmet in each bucket (bars from the top, on one
    scale for every policy)."""
    setup = result.setup
    cap = setup.capacity_per_replica
    k = bucket_ticks(setup.n_ticks, setup.tick_s)
    words = _bucket_words(k, setup.tick_s)
    start = setup.eval_start.tz_localize(None).to_datetime64()
    x = start + np.arange(0, setup.n_ticks, k) * np.timedelta64(setup.tick_s, "s")
    demand = setup.demand.values
    d = np.where(setup.demand.known, demand, 0.0)
    lo, hi = bucketed(demand, k, "min"), bucketed(demand, k, "max")
    unmet = {name: bucketed(((d - np.minimum(d, run.ready * cap)) > 1e-9 * max(1.0, cap)) * (setup.tick_s / 60.0),
                            k, "sum") for name, run in result.runs.items()}
    most = max((float(u.max(initial=0.0)) for u in unmet.values()), default=0.0) or 1.0
    fig, axes = plt.subplots(len(result.runs), 1, figsize=(12, 1.9 * len(result.runs) + 0.8), sharex=True,
                             squeeze=False, layout="constrained")
    for ax, (name, run) in zip(axes[:, 0], result.runs.items(), strict=True):
        ax.fill_between(x, lo, hi, step="post", color="0.75", lw=0, label=f"demand ({words} low–high)")
        ax.step(x, bucketed(run.ready * cap, k, "mean"), where="post", lw=1.0, color=COLORS.get(name, "tab:blue"),
                label=f"ready capacity ({words} mean)")
        ax.fill_between(x, 1 - 0.35 * unmet[name] / most, 1, step="post", transform=ax.get_xaxis_transform(),
                        color="tab:red", alpha=0.7, lw=0,
                        label=f"minutes unmet per bucket (from the top; the longest bar: {most:,.0f} min)")
        event_windows.mark_axes(ax, result)
        ax.set_ylabel(name, fontsize=9)
        ax.set_ylim(bottom=0)
        total = result.measures[name].unmet_minutes
        ax.text(0.005, 0.04, f"{name}: {total:,.0f} minutes unmet in all", transform=ax.transAxes, fontsize=8,
                bbox={"boxstyle": "round", "fc": "white", "ec": "none", "alpha": 0.8})
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(f"The whole run: demand against ready capacity (trace unit), {words} buckets", fontsize=10)
    path = directory / "capacity.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def forecast_plot(result: Result, directory: Path, plt: Any) -> Path | None:
    """The forecast band the predictive policy acted on (one model step ahead) against actual demand,
    bucketed like the capacity plot."""
    setup = result.setup
    rec = result.forecasts
    if rec is None or not rec.values.shape[0]:
        return None
    ahead = 1  # one step ahead: what the next step will be
    idx = rec.times + np.timedelta64(rec.step_seconds * ahead, "s")
    p50 = rec.values[:, rec.quantiles.index(0.5), ahead - 1]
    pq = rec.values[:, rec.quantiles.index(setup.scenario.quantile), ahead - 1]
    grid = setup.trace.resample(rec.step_seconds)
    pos = np.round((idx - grid.start).total_seconds() / rec.step_seconds).astype(int)
    actual = np.where((pos >= 0) & (pos < len(grid)), grid.values[np.clip(pos, 0, len(grid) - 1)], np.nan)
    k = bucket_ticks(len(idx), rec.step_seconds)
    words = _bucket_words(k, rec.step_seconds)
    x = idx.tz_localize(None)[::k].to_numpy().astype("datetime64[s]")
    fig, ax = plt.subplots(figsize=(12, 3.4), layout="constrained")
    q = f"P{100 * setup.scenario.quantile:g}"
    ax.fill_between(x, bucketed(p50, k, "mean"), bucketed(pq, k, "mean"), step="post", color="tab:orange",
                    alpha=0.35, lw=0, label=f"forecast P50–{q}, {rec.step_seconds // 60} min ahead ({words} mean)")
    ax.step(x, bucketed(actual, k, "mean"), where="post", lw=0.8, color="black", label=f"actual demand ({words} mean)")
    ax.set_ylabel("demand (trace unit)")
    ax.set_ylim(bottom=0)
    ax.set_title("Forecast band against actual demand", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    path = directory / "forecast.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


#: Hours shown around each hard moment in the zoomed panels.
ZOOM_HOURS = 6


def hard_days(result: Result, k: int = 2) -> list[tuple[str, int]]:
    """(label, tick) of the hardest moments: the ``k`` largest peaks and the ``k`` largest predictive misses,
    on different days."""
    setup = result.setup
    demand = setup.demand
    d = np.where(demand.known, demand.values, 0.0)
    per_day = max(1, 86400 // setup.tick_s)
    picked: list[tuple[str, int]] = []
    days: set[int] = set()

    def take(score: np.ndarray, label: str) -> None:
        n = 0
        for i in np.argsort(score)[::-1]:
            if n >= k or score[i] <= 0:
                break
            if int(i) // per_day in days:
                continue
            days.add(int(i) // per_day)
            picked.append((label, int(i)))
            n += 1

    take(d, "largest peak")
    run = result.runs.get("predictive")
    if run is not None:
        short = np.maximum(0.0, d - run.ready * demand.capacity_per_replica)
        # The largest miss: the most unserved demand within an hour.
        window = max(1, 3600 // setup.tick_s)
        take(np.convolve(short, np.ones(window), mode="same"), "largest miss")
    return picked


#: The policies the zoomed panels draw: predictive, the baseline and the floor (static is flat and far above
#: the rest; a fourth line would hide the first three).
_ZOOMED = ("predictive", "reactive", "oracle")


def zoom_panels(result: Result, directory: Path, plt: Any) -> dict[str, Path]:
    """Zoomed panels of the hardest days: demand, the ready capacity of predictive, reactive and the oracle,
    the capacity the predictive policy requested, the minutes each of predictive and reactive left demand
    unmet (shaded), and under each panel the GPUs they were billed for."""
    from matplotlib.dates import DateFormatter
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    setup = result.setup
    moments = hard_days(result)
    if not moments:
        return {}
    cap = setup.capacity_per_replica
    half = ZOOM_HOURS * 3600 // (2 * setup.tick_s)
    fig, axes = plt.subplots(2 * len(moments), 1, figsize=(12, 3.9 * len(moments) + 0.5), layout="constrained",
                             gridspec_kw={"height_ratios": [3, 1] * len(moments)})
    pred, react = result.runs.get("predictive"), result.runs.get("reactive")
    d = np.where(setup.demand.known, setup.demand.values, 0.0)
    for n, (label, i) in enumerate(moments):
        ax, gpus = axes[2 * n], axes[2 * n + 1]
        gpus.sharex(ax)
        lo, hi = max(0, i - half), min(setup.n_ticks, i + half)
        x = (setup.eval_start.tz_localize(None).to_datetime64()
             + np.arange(lo, hi) * np.timedelta64(setup.tick_s, "s"))
        for name in _ZOOMED:
            run = result.runs.get(name)
            if run is None:
                continue
            main = name == "predictive"
            ax.step(x, run.ready[lo:hi] * cap, where="post", color=COLORS[name], lw=1.6 if main else 1.0,
                    ls=":" if name == "oracle" else "-", alpha=1.0 if main else 0.8, label=f"{name} ready capacity")
        if pred is not None:
            ax.step(x, pred.desired[lo:hi] * cap, where="post", color=COLORS["predictive"], ls="--", lw=0.9,
                    label="predictive requested (rises ahead of the peak)")
        ax.plot(x, setup.demand.values[lo:hi], color="black", lw=1.1, label="demand")
        for run, y0, y1, alpha in ((pred, 0.0, 1.0, 0.25), (react, 0.0, 0.05, 0.7)):
            if run is None:
                continue
            short = (d[lo:hi] - run.ready[lo:hi] * cap) > 1e-9 * max(1.0, cap)
            ax.fill_between(x, y0, y1, where=short, step="post", transform=ax.get_xaxis_transform(),
                            color="tab:red" if run is pred else COLORS["reactive"], alpha=alpha, lw=0)
        day = setup.tick_time(i).strftime("%Y-%m-%d %H:%M")
        ax.set_title(f"{label}: {day} UTC (±{ZOOM_HOURS // 2} h)", fontsize=10, loc="left")
        ax.set_ylabel("demand (trace unit)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelbottom=False)
        for run, name in ((pred, "predictive"), (react, "reactive")):
            if run is not None:
                gpus.step(x, run.billed_gpus[lo:hi], where="post", color=COLORS[name], lw=1.0)
        gpus.set_ylabel("GPUs billed", fontsize=8)
        gpus.set_ylim(bottom=0)
        gpus.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        gpus.xaxis.set_major_formatter(DateFormatter("%H:%M"))
    handles, labels = axes[0].get_legend_handles_labels()
    handles += [Patch(color="tab:red", alpha=0.25), Patch(color=COLORS["reactive"], alpha=0.7)]
    labels += ["predictive short of demand (full height)", "reactive short of demand (strip at the bottom)"]
    fig.legend(handles, labels, loc="outside upper center", ncol=4, fontsize=8, frameon=False)
    path = directory / "hard_days.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {"hard_days": path}


def frontier_plot(frontier: FrontierResult, directory: Path, plt: Any) -> Path:
    """Cost against demand served, one curve per policy (GPU-hours on the right axis); default points, the
    oracle, the bound and the equal-service comparison the headline reads marked."""
    cur, gpu_price = currency(frontier.base), price(frontier.base)
    fig, ax = plt.subplots(figsize=(12, 5.4), layout="constrained")
    shares = []
    for name, points in frontier.frontier.items():
        pts = sorted((p for p in points if p.slo_attainment is not None), key=lambda p: p.slo_attainment or 0.0)
        xs = [100 * (p.slo_attainment or 0.0) for p in pts]
        ys = [p.gpu_hours * gpu_price for p in pts]
        if name == "oracle":
            ax.scatter(xs, ys, marker="*", s=200, color=COLORS["oracle"], label="oracle (perfect foresight)", zorder=5)
            continue
        ax.plot(xs, ys, marker="o", ms=3, lw=1.2 if name == "predictive" else 1, color=COLORS.get(name), label=name)
        for p in pts:
            if p.default:
                ax.scatter([100 * (p.slo_attainment or 0.0)], [p.gpu_hours * gpu_price], s=110, facecolors="none",
                           edgecolors=COLORS.get(name), linewidths=2, zorder=4)
                shares.append(100 * (p.slo_attainment or 0.0))
    bound = frontier.base.bound.gpu_hours * gpu_price
    ax.axhline(bound, color="black", ls=":", lw=1, label="physical bound")
    pred = frontier.predictive_default
    ratio = frontier.headline.get("cost_ratio_vs_reactive")
    if ratio and pred.slo_attainment is not None:
        # The headline's comparison: reactive tuned to serve as much, straight above the predictive point.
        x, own = 100 * pred.slo_attainment, pred.gpu_hours * gpu_price
        ax.annotate("", xy=(x, own), xytext=(x, own / ratio),
                    arrowprops={"arrowstyle": "->", "color": "black", "lw": 1.2})
        ax.scatter([x], [own / ratio], marker="s", s=30, color=COLORS["reactive"], zorder=5)
        ax.annotate(f"at equal service ({100 * pred.slo_attainment:.2f} % served):\nreactive "
                    f"{money(own / ratio, cur)}, predictive {money(own, cur)} ({100 * (ratio - 1):+.1f} %)",
                    xy=(x, (own + own / ratio) / 2), xytext=(-18, 0), textcoords="offset points", ha="right",
                    va="center", fontsize=8, bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"}, zorder=6)
    if shares:
        left = min(shares) - 2.0
        ax.set_xlim(max(left, 80.0), 100.05)
        # Static's large fleets run off the top: scaled to them, the curves that matter would be flat.
        inside = [p.gpu_hours * gpu_price for name, pts in frontier.frontier.items() if name != "static" for p in pts
                  if p.slo_attainment is not None and 100 * p.slo_attainment >= ax.get_xlim()[0]]
        if inside:
            ax.set_ylim(0.9 * bound, 1.1 * max(inside))
    ax.set_xlabel("demand served (%)")
    ax.set_ylabel(f"cost ({cur})")
    ax.secondary_yaxis("right", functions=(lambda c: c / gpu_price, lambda g: g * gpu_price)).set_ylabel("GPU-hours")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    ax.set_title("Cost against service: each policy over its own setting (circled: the default)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.09, 1.0), frameon=False)
    path = directory / "frontier.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
