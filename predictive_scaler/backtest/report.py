"""Backtest outputs: a terminal table, a Markdown report, a self-contained HTML page, PNG plots.

Plots are drawn with matplotlib's Agg backend (no display needed); the HTML
embeds them as base64 data URIs so the page is one file that can be mailed.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from predictive_scaler.backtest import event_windows

if TYPE_CHECKING:
    from predictive_scaler.backtest.runner import Result

_COLUMNS = (
    ("policy", "policy"),
    ("gpu_hours", "GPU-h"),
    ("cost", "cost"),
    ("slo_attainment", "served"),
    ("unmet_minutes", "unmet min"),
    ("unserved_requests", "unserved"),
    ("prewarm_gpu_hours", "prewarm GPU-h"),
    ("wasted_prewarm_cost", "wasted prewarm"),
    ("scale_events", "scale events"),
    ("reactive_minutes", "fallback min"),
    ("vs_bound", "GPU-h / bound"),
    ("vs_oracle", "GPU-h / oracle"),
    ("vs_reactive_unmet", "unmet / reactive"),
)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key == "slo_attainment":
        return f"{100 * value:.2f} %"
    if key.startswith("vs_"):
        return f"{value:.2f}×"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def policy_rows(result: Result) -> list[dict[str, Any]]:
    ratios = result.ratios()
    rows = []
    for name, m in result.measures.items():
        row: dict[str, Any] = {"policy": name, **m.to_dict()}
        row["vs_bound"] = ratios[name]["gpu_hours_vs_bound"]
        row["vs_oracle"] = ratios[name]["gpu_hours_vs_oracle"]
        row["vs_reactive_unmet"] = ratios[name]["unmet_minutes_vs_reactive"]
        rows.append(row)
    rows.append({"policy": "physical bound", "gpu_hours": result.bound.gpu_hours, "cost": result.bound.cost,
                 "vs_bound": 1.0})
    return rows


def table_lines(result: Result) -> list[list[str]]:
    return [[_fmt(k, row.get(k)) for k, _ in _COLUMNS] for row in policy_rows(result)]


def terminal_table(result: Result) -> str:
    header = [h for _, h in _COLUMNS]
    body = table_lines(result)
    widths = [max(len(header[i]), *(len(r[i]) for r in body)) for i in range(len(header))]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))
    out = [line, "-" * len(line)]
    for r in body:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(out)


def markdown_table(result: Result) -> str:
    header = [h for _, h in _COLUMNS]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in table_lines(result)]
    return "\n".join(out)


def accuracy_table(result: Result) -> str:
    rows = [("served model (calibrated)", result.accuracy)]
    rows += list(result.baseline_accuracy.items())
    if not result.accuracy:
        return "_no forecasts (the predictive policy did not run)_"
    out = [f"| forecaster | horizon | MAE | WAPE | MASE | pinball | P{100 * result.setup.scenario.quantile:g} coverage |",
           "|---|---|---|---|---|---|---|"]
    for name, horizons in rows:
        for h, a in horizons.items():
            cells = [_num(a.mae), _pct(a.wape), _num(a.mase), _num(a.pinball), _pct(a.coverage)]
            out.append(f"| {name} | {h} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _num(v: float | None) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.3g}"


def _pct(v: float | None) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{100 * v:.1f} %"


def verdict(result: Result) -> list[str]:
    """The done-when aims, checked plainly."""
    m = result.measures.get("predictive")
    if m is None:
        return ["the predictive policy was not run"]
    lines = []
    slo = m.slo_attainment
    lines.append(f"demand served: {_pct(slo)} (aim ≥ 99.5 %) — {'met' if slo is not None and slo >= 0.995 else 'NOT met'}")
    reactive = result.measures.get("reactive")
    if reactive is not None:
        r = result.ratios()["predictive"]["unmet_minutes_vs_reactive"]
        ok = r is not None and r < 0.2 or (reactive.unmet_minutes == 0 and m.unmet_minutes == 0)
        lines.append(f"unmet minutes: {m.unmet_minutes:,.0f} vs reactive {reactive.unmet_minutes:,.0f} "
                     f"(aim < 1/5) — {'met' if ok else 'NOT met'}")
    vb = result.ratios()["predictive"]["gpu_hours_vs_bound"]
    lines.append(f"GPU-hours: {_fmt('vs_bound', vb)} the physical bound (aim ≤ 1.3×) — "
                 f"{'met' if vb is not None and vb <= 1.3 else 'NOT met'}")
    lines += _why(result)
    budget = budget_cost(result)
    if budget is not None:
        lines.append(f"wasted prewarm cost: {m.wasted_prewarm_cost:,.1f} vs budget {budget:,.1f} over the run — "
                     f"{'within' if m.wasted_prewarm_cost <= budget else 'OVER'} budget")
    return lines


def _why(result: Result) -> list[str]:
    """Where the shortfalls come from: fallback vs predictive minutes, and what even the oracle pays."""
    out = []
    run = result.runs.get("predictive")
    demand = result.setup.demand
    if run is not None and run.fallback is not None:
        known = demand.known
        unmet = known & (np.where(known, demand.values, 0.0) > run.ready * demand.capacity_per_replica + 1e-9)
        per_min = demand.tick_s / 60.0
        in_fallback = float(np.count_nonzero(unmet & run.fallback) * per_min)
        total = float(np.count_nonzero(unmet) * per_min)
        share = int(np.count_nonzero(run.fallback & known)) / max(1, int(np.count_nonzero(known)))
        out.append(f"why: {in_fallback:,.0f} of the {total:,.0f} unmet minutes fell in reactive fallback "
                   f"({100 * share:.0f} % of the time was fallback: drift or missing data)")
    known = demand.known
    total_demand = float(np.where(known, demand.values, 0.0).sum())
    ceiling = result.setup.max_replicas * demand.capacity_per_replica
    above = float(np.where(known, np.maximum(0.0, demand.values - ceiling), 0.0).sum())
    if total_demand > 0 and above > 0:
        out.append(f"why: {100 * above / total_demand:.1f} % of all demand lies above what maxReplicas "
                   f"({result.setup.max_replicas}) can serve — no policy that respects the clamp serves it")
    oracle = result.ratios().get("oracle", {}).get("gpu_hours_vs_bound")
    ours = result.ratios().get("predictive", {}).get("gpu_hours_vs_bound")
    if oracle is not None and ours is not None and ours > 1.3:
        out.append(f"why: even the oracle needs {oracle:.2f}× the bound (whole nodes held through one "
                   "lead time of per-minute peaks, and consolidation delay)")
    return out


def budget_cost(result: Result) -> float | None:
    """The prewarm budget over the evaluated time, in currency (maxGpus × price, or maxCostPerHour)."""
    budget = result.setup.spec.prewarm.budget
    hours = float(result.setup.demand.known.sum() * result.setup.tick_s / 3600.0)
    price = budget.price_per_gpu_hour if budget.price_per_gpu_hour is not None else result.setup.scenario.cluster.price_per_gpu_hour
    per_hour = []
    if budget.max_gpus is not None:
        per_hour.append(budget.max_gpus * price)
    if budget.max_cost_per_hour is not None:
        per_hour.append(budget.max_cost_per_hour)
    return min(per_hour) * hours if per_hour else None


# -- plots --------------------------------------------------------------------------------------

def plot_files(result: Result, directory: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    setup = result.setup
    times = setup.eval_start.tz_localize(None) + np.arange(setup.n_ticks) * np.timedelta64(setup.tick_s, "s")
    demand = setup.demand.values
    files: dict[str, Path] = {}

    fig, axes = plt.subplots(len(result.runs), 1, figsize=(12, 2.2 * len(result.runs)), sharex=True, squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], result.runs.items(), strict=True):
        ax.plot(times, demand, lw=0.4, color="black", label="demand")
        ax.plot(times, run.ready * setup.capacity_per_replica, lw=0.6, color="tab:blue", label="ready capacity")
        short = np.where(np.isfinite(demand) & (demand > run.ready * setup.capacity_per_replica), demand, np.nan)
        ax.plot(times, short, lw=0, marker=".", ms=1.5, color="tab:red", label="unmet")
        ax.set_ylabel(name)
        event_windows.mark_axes(ax, result)
        ax.legend(loc="upper right", fontsize=7)
    axes[0, 0].set_title("demand vs ready capacity (trace unit)")
    fig.tight_layout()
    files["capacity"] = directory / "capacity.png"
    fig.savefig(files["capacity"], dpi=90)
    plt.close(fig)

    rec = result.forecasts
    if rec is not None and rec.values.shape[0]:
        k = 1  # plot the forecast one step ahead: what the next step will be
        idx = rec.times + np.timedelta64(rec.step_seconds * k, "s")
        p50 = rec.values[:, rec.quantiles.index(0.5), k - 1]
        pq = rec.values[:, rec.quantiles.index(setup.scenario.quantile), k - 1]
        grid = setup.trace.resample(rec.step_seconds)
        g0 = grid.start
        pos = np.round((idx - g0).total_seconds() / rec.step_seconds).astype(int)
        actual = np.where((pos >= 0) & (pos < len(grid)), grid.values[np.clip(pos, 0, len(grid) - 1)], np.nan)
        fig, ax = plt.subplots(figsize=(12, 3.5))
        x = idx.tz_localize(None)
        ax.fill_between(x, p50, pq, color="tab:orange", alpha=0.35, step="mid",
                        label=f"P50–P{100 * setup.scenario.quantile:g} ({rec.step_seconds // 60} min ahead)")
        ax.plot(x, actual, lw=0.5, color="black", label=f"actual ({rec.step_seconds // 60}-min mean)")
        ax.legend(loc="upper right", fontsize=8)
        ax.set_title("forecast band vs actual demand")
        fig.tight_layout()
        files["forecast"] = directory / "forecast.png"
        fig.savefig(files["forecast"], dpi=90)
        plt.close(fig)

    names = list(result.measures)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    cost = [result.measures[n].cost for n in names] + [result.bound.cost]
    waste = [result.measures[n].wasted_prewarm_cost for n in names] + [0.0]
    xs = np.arange(len(cost))
    ax.bar(xs, cost, color="tab:blue", label="cost")
    ax.bar(xs, waste, color="tab:red", label="wasted prewarm")
    ax.set_xticks(xs, names + ["bound"], rotation=20)
    ax.set_title("cost and wasted prewarm cost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    files["cost"] = directory / "cost.png"
    fig.savefig(files["cost"], dpi=90)
    plt.close(fig)
    return files


# -- documents ----------------------------------------------------------------------------------

def markdown(result: Result, images: dict[str, Path] | None = None) -> str:
    setup = result.setup
    scenario = result.to_json()["scenario"]
    parts = [
        f"# Backtest: {setup.trace.name} — scenario `{setup.scenario.name}`",
        "",
        f"Training {scenario['training']} → walk-forward over {scenario['evaluation']} from "
        f"{scenario['evaluation_start']}; {scenario['tick']} ticks; capacity {setup.capacity_per_replica:.4g} "
        f"per replica (P95 of the training window = {setup.peak_replicas} replicas); max {setup.max_replicas} replicas.",
        "",
        "## Policies side by side",
        "",
        markdown_table(result),
        "",
        "Physical bound: whole nodes exactly fitting each tick's demand with zero lead time. "
        "Served = share of demand served by ready capacity. Wasted prewarm = speculative GPU-hours "
        "(placeholders, or replicas above what reactive holds) not needed within one node lead time, in currency. "
        "Fallback min: minutes the predictive policy ran its reactive fallback (for holt-winters: minutes the "
        "reactive recommendation, not the forecast, decided).",
        "",
        "## Against the aims",
        "",
        *[f"- {line}" for line in verdict(result)],
        "",
        "## Forecast accuracy (forecasts the predictive policy acted on)",
        "",
        accuracy_table(result),
        "",
    ]
    parts += event_windows.markdown_section(result)
    if result.model_events:
        parts += ["## Retraining", "", "| at | kind | promoted | fit s | reason |", "|---|---|---|---|---|"]
        parts += [f"| {e.at} | {e.kind} | {'yes' if e.promoted else 'no'} | {e.fit_seconds:.1f} | {e.reason} |"
                  for e in result.model_events]
        parts.append("")
    if images:
        parts += ["## Plots", ""] + [f"![{k}]({p.name})" for k, p in images.items()] + [""]
    parts += ["## Scenario", "", "```json", json.dumps(scenario, indent=2), "```", ""]
    if result.notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    wall = ", ".join(f"{k} {v:.1f} s" for k, v in result.wall_seconds.items())
    parts += [f"Wall time per policy: {wall}.", ""]
    return "\n".join(parts)


def html_page(result: Result, images: dict[str, Path]) -> str:
    """A self-contained page: the Markdown's content with tables as HTML and images inlined."""
    setup = result.setup
    head = [h for _, h in _COLUMNS]
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in table_lines(result))
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + rows + "</table>"
    acc_lines = [line for line in accuracy_table(result).splitlines() if line.startswith("|") and not line.startswith("|---")]
    acc = "<table>" + "".join(
        "<tr>" + "".join(f"<{'th' if i == 0 else 'td'}>{html.escape(c.strip())}</{'th' if i == 0 else 'td'}>"
                         for c in line.strip("|").split("|")) + "</tr>"
        for i, line in enumerate(acc_lines)) + "</table>"
    imgs = "".join(
        f'<h3>{html.escape(name)}</h3><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}">' for name, path in images.items())
    verdicts = "".join(f"<li>{html.escape(v)}</li>" for v in verdict(result))
    scenario = html.escape(json.dumps(result.to_json()["scenario"], indent=2))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Backtest {html.escape(setup.trace.name)}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}img{{max-width:100%}}</style></head>
<body><h1>Backtest: {html.escape(setup.trace.name)} — scenario {html.escape(setup.scenario.name)}</h1>
<h2>Policies side by side</h2>{table}
<h2>Against the aims</h2><ul>{verdicts}</ul>
<h2>Forecast accuracy</h2>{acc}
<h2>Plots</h2>{imgs}
<h2>Scenario</h2><pre>{scenario}</pre></body></html>
"""


def write_report(result: Result, directory: str | Path) -> Path:
    """Write report.md, report.html and the PNGs into ``directory``; return the HTML path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    images = plot_files(result, out)
    (out / "report.md").write_text(markdown(result, images))
    page = out / "report.html"
    page.write_text(html_page(result, images))
    (out / "result.json").write_text(json.dumps(result.to_json(), indent=2, allow_nan=False))
    return page
