"""Backtest outputs: a terminal table, a Markdown report, a self-contained HTML page, PNG plots.

The report answers first: a paragraph in plain words (:mod:`~predictive_scaler.backtest.headline`,
written from the ``--json`` document so that its figures are the JSON's), then the cost–service
frontier, the cost per day against the reactive baseline and the hardest days
(:mod:`~predictive_scaler.backtest.plots`); the tables, the aims, the forecast accuracy and the
scenario follow. Every amount carries its currency.

Plots are drawn with matplotlib's Agg backend (no display needed); the HTML
embeds them as base64 data URIs so the page is one file that can be mailed.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from predictive_scaler.backtest import event_windows, plots
from predictive_scaler.backtest.headline import (
    currency,
    duration_words,
    headline,
    money,
    price,
    share,
)

if TYPE_CHECKING:
    from predictive_scaler.backtest.frontier import FrontierResult
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
#: Columns that are amounts of money: printed with the currency.
_MONEY = ("cost", "wasted_prewarm_cost")
def _fmt(key: str, value: Any, cur: str = "") -> str:
    if value is None:
        return "–"
    if key in _MONEY:
        return money(value, cur)
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
    cur = currency(result)
    return [[_fmt(k, row.get(k), cur) for k, _ in _COLUMNS] for row in policy_rows(result)]


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


def report_headline(result: Result, frontier: FrontierResult | None = None) -> str:
    """The report's opening paragraph, from the document ``backtest --json`` prints for this run."""
    doc = result.to_json() if frontier is None else frontier.to_json()
    allowed = _allowed_gpus(result) if "predictive" in result.measures else None
    return headline(doc, currency=currency(result), allowed_gpus=allowed)


# -- the aims ----------------------------------------------------------------------------------

def verdict(result: Result, frontier: FrontierResult | None = None) -> list[str]:
    """The aims, each with its figure and whether it is met, in the reader's terms: demand served, the
    frontier's (when it ran), the prewarm budget, unmet minutes against reactive and GPU-hours against
    the physical bound; then where the shortfalls come from."""
    m = result.measures.get("predictive")
    if m is None:
        return ["the predictive policy was not run"]
    lines = []
    slo = m.slo_attainment
    oracle = result.measures.get("oracle")
    oracle_full = oracle is not None and oracle.slo_attainment is not None and oracle.slo_attainment >= 1 - 1e-9
    served = "–" if slo is None else f"{100 * slo:.2f} %"
    reached = slo is not None and slo >= 0.995
    if oracle is None or oracle_full:
        lines.append(f"demand served: {served} of all requests found a ready replica (aim: at least 99.5 %) — "
                     f"{'met' if reached else 'not met'}")
    else:
        # The aim is judged only where the oracle serves everything; say so instead of a verdict.
        lines.append(f"demand served: {served} — not judged: the aim of 99.5 % applies where perfect foresight "
                     f"(the oracle) serves everything, and here even it serves {_pct(oracle.slo_attainment)}"
                     + ("" if reached else f"; {served} is below 99.5 %"))
    if frontier is not None:
        lines += frontier_verdict(frontier)
    if m.minutes_over_budget is not None:
        allowed = _allowed_gpus(result)
        lines.append(f"prewarm budget: at most {m.max_speculative_gpus} GPUs held ahead of what the HPA rule alone "
                     f"would have run (allowed: {allowed}), {m.minutes_over_budget:,.0f} minutes over it, checked "
                     f"every minute — {'met' if m.minutes_over_budget == 0 else 'not met'}")
    reactive = result.measures.get("reactive")
    if reactive is not None:
        r = result.ratios()["predictive"]["unmet_minutes_vs_reactive"]
        ok = r is not None and r < 0.2 or (reactive.unmet_minutes == 0 and m.unmet_minutes == 0)
        lines.append(f"minutes with demand unmet: {m.unmet_minutes:,.0f} against reactive's "
                     f"{reactive.unmet_minutes:,.0f} at its {100 * result.setup.scenario.target_utilization:g} % "
                     f"target (aim: under a fifth of reactive's) — {'met' if ok else 'not met'}")
    vb = result.ratios()["predictive"]["gpu_hours_vs_bound"]
    lines.append(f"GPU-hours: {_fmt('vs_bound', vb)} the physical bound, the whole nodes that exactly fit each "
                 f"minute's demand with no start-up time (aim: at most 1.3×) — "
                 f"{'met' if vb is not None and vb <= 1.3 else 'not met'}")
    lines += _why(result)
    return lines


def _allowed_gpus(result: Result) -> int:
    from predictive_scaler.policy.budget import allowance

    return allowance(result.setup.spec.prewarm.budget).gpus


def frontier_verdict(frontier: FrontierResult) -> list[str]:
    h = frontier.headline
    pred = frontier.predictive_default
    cur, gpu_price = currency(frontier.base), price(frontier.base)
    lines = []
    if frontier.dominated_by:
        worst = ", ".join(f"{b['policy']} at {_setting(b['knob'])} ({money(b['gpu_hours'] * gpu_price, cur)}, "
                          f"{_pct(b['slo_attainment'])} served)" for b in frontier.dominated_by)
        lines.append(f"no other setting both cheaper and serving more: not met — cheaper than predictive's default "
                     f"({money(pred.gpu_hours * gpu_price, cur)}, {_pct(pred.slo_attainment)} served) and serving "
                     f"more: {worst}")
    else:
        lines.append("no other setting both cheaper and serving more: no reactive or Holt-Winters target and no "
                     "static fleet size tried is both cheaper than predictive's default and serves more — met")
    gap = h.get("gap_closed_vs_reactive")
    if gap is None:
        lines.append("share of the possible saving reached: undefined (predictive serves more than every reactive "
                     "target tried, or the oracle is no cheaper than reactive at that service)")
    else:
        lines.append(f"share of the possible saving reached: {gap:.2f} of the way from reactive's cost at equal "
                     f"service down to the oracle's (aim: at least 0.5; stretch: 0.7) — {'met' if gap >= 0.5 else 'not met'}")
    cr = h.get("cost_ratio_vs_reactive")
    if cr is not None:
        lines.append(f"cost at equal service: {cr:.2f}× reactive's (stretch aim: at most 0.85× where the oracle "
                     "leaves that much room)")
    hw_gap, hw_cr = h.get("gap_closed_vs_holt_winters"), h.get("cost_ratio_vs_holt_winters")
    if hw_gap is not None and hw_cr is not None:
        lines.append(f"against Holt-Winters (a seasonal forecast under the HPA rule) at equal service: cost "
                     f"{hw_cr:.2f}×, {hw_gap:.2f} of the way to the oracle")
    ur = h.get("unmet_ratio_vs_reactive")
    if ur is not None:
        lines.append(f"unmet minutes at equal cost: {ur:.2f}× reactive's")
    if frontier.service_alternative is not None:
        lines.append(service_alternative_line(frontier))
    return lines


def service_alternative_line(frontier: FrontierResult) -> str:
    """What switching the service tracker (``spec.service.enabled``) would have done on this history: the
    figures, side by side with the run's own; whether they are worth it is the service's SLO."""
    alt = frontier.service_alternative
    assert alt is not None
    pred, cur, gpu_price = frontier.predictive_default, currency(frontier.base), price(frontier.base)
    ratio = f"{alt.point.gpu_hours / pred.gpu_hours:.2f}×" if pred.gpu_hours > 0 else "–"
    gap = alt.headline.get("gap_closed_vs_reactive")
    beaten = "" if not alt.dominated_by else (
        "; then " + ", ".join(f"{b['policy']} at {_setting(b['knob'])}" for b in alt.dominated_by[:3])
        + (f" (+{len(alt.dominated_by) - 3})" if len(alt.dominated_by) > 3 else "") + " would be cheaper and serve more")
    return (f"with spec.service.enabled {str(alt.enabled).lower()} instead (the service tracker "
            f"{'on' if alt.enabled else 'off'}): {share(alt.point.slo_attainment)} served against "
            f"{share(pred.slo_attainment)}, {money(alt.point.gpu_hours * gpu_price, cur)} against "
            f"{money(pred.gpu_hours * gpu_price, cur)} ({ratio} the GPU-hours), share of the possible saving "
            f"{'undefined' if gap is None else f'{gap:.2f}'}{beaten} — the SLO decides which is worth it")


def _knob(knob: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in knob.items()) or "-"


def _setting(knob: dict[str, Any]) -> str:
    """An operating point's knob in words: "HPA target 60 %", "planning target 90 %", "12 replicas"."""
    words = {"target_utilization": "HPA target", "predictive_target_utilization": "planning target"}
    out = []
    for k, v in knob.items():
        if k in words:
            out.append(f"{words[k]} {100 * v:g} %")
        elif k == "replicas":
            out.append(f"{v} replicas")
        else:
            out.append(f"{k} {v}")
    return ", ".join(out) or "perfect foresight"


def frontier_table(frontier: FrontierResult) -> str:
    cur, gpu_price = currency(frontier.base), price(frontier.base)
    out = ["| policy | setting | GPU-h | cost | served | unmet min |", "|---|---|---|---|---|---|"]
    for name, points in frontier.frontier.items():
        for p in points:
            mark = " (default)" if p.default else ""
            out.append(f"| {name}{mark} | {_setting(p.knob)} | {p.gpu_hours:,.0f} | {money(p.gpu_hours * gpu_price, cur)} "
                       f"| {_pct(p.slo_attainment)} | {p.unmet_minutes:,.0f} |")
    alt = frontier.service_alternative
    if alt is not None:
        p = alt.point
        out.append(f"| predictive, spec.service.enabled {str(alt.enabled).lower()} | {_setting(p.knob)} | "
                   f"{p.gpu_hours:,.0f} | {money(p.gpu_hours * gpu_price, cur)} | {_pct(p.slo_attainment)} | "
                   f"{p.unmet_minutes:,.0f} |")
    return "\n".join(out)


def frontier_text(frontier: FrontierResult) -> str:
    """The frontier for a terminal: one line per policy (GPU-h @ served per operating point), the headline."""
    lines = ["cost–service frontiers (GPU-h @ demand served):"]
    for name, points in frontier.frontier.items():
        cells = [f"{_knob(p.knob).split(' ')[-1] if p.knob else '-'}: {p.gpu_hours:,.0f}@{_pct(p.slo_attainment)}"
                 + ("*" if p.default else "") for p in points]
        lines.append(f"  {name:>12}  " + "  ".join(cells))
    alt = frontier.service_alternative
    if alt is not None:
        lines.append(f"  {'':>12}  spec.service.enabled {str(alt.enabled).lower()}: "
                     f"{alt.point.gpu_hours:,.0f}@{_pct(alt.point.slo_attainment)}")
    lines.append("  (* = the default point)")
    lines.append("headline: " + ", ".join(f"{k} {'–' if v is None else f'{v:.3f}'}"
                                          for k, v in frontier.headline.items()))
    return "\n".join(lines)


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
        fallback_share = int(np.count_nonzero(run.fallback & known)) / max(1, int(np.count_nonzero(known)))
        out.append(f"why: {in_fallback:,.0f} of the {total:,.0f} unmet minutes fell while the forecast was set aside "
                   f"for the reactive rule ({100 * fallback_share:.0f} % of the time: the forecast drifted from demand, or "
                   "data was missing)")
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
                   "start-up time of per-minute peaks, and the delay before idle nodes are removed)")
    return out


# -- plots --------------------------------------------------------------------------------------

def require_matplotlib() -> Any:
    """The matplotlib module, or a ConfigError naming the extra that installs it: the plots are the only
    user of matplotlib, so it is the ``report`` extra, not a dependency of the controller's image."""
    try:
        import matplotlib
    except ImportError as exc:
        from predictive_scaler.errors import ConfigError

        raise ConfigError("--report draws its plots with matplotlib, which is not installed; install the "
                          "report extra: pip install 'predictive-scaler[report]' (or leave out --report)",
                          field="report") from exc
    return matplotlib


def plot_files(result: Result, directory: Path, frontier: FrontierResult | None = None) -> dict[str, Path]:
    """Every figure of the report, in the order it shows them; the keys name them."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    if frontier is not None:
        files["frontier"] = plots.frontier_plot(frontier, directory, plt)
    daily_path = plots.daily_plot(result, directory, plt)
    if daily_path is not None:
        files["daily_cost"] = daily_path
    files.update(plots.zoom_panels(result, directory, plt))
    files["capacity"] = plots.capacity_plot(result, directory, plt)
    forecast = plots.forecast_plot(result, directory, plt)
    if forecast is not None:
        files["forecast"] = forecast
    return files


# -- documents ----------------------------------------------------------------------------------

WASTE_DEFINITION = (
    "Wasted prewarm cost (billed): each minute, the GPUs a policy is billed for (whole nodes) above what the "
    "reactive peer is billed for are what the forecast added; the part of them that demand does not use within "
    "one node lead time — the whole nodes the highest need over the next cold start takes, beyond the reactive "
    "peer's — is waste, priced at the GPU-hour price. *Placeholder* waste is the whole nodes that exist only "
    "because of placeholders (packed: the nodes replicas + placeholders take beyond those the replicas alone "
    "take); *replica* waste is the rest (extra replicas); the two add up to the total.")

BUDGET_DEFINITION = (
    "Prewarm budget audit: every minute, speculative GPUs = placeholder GPUs + GPUs of replicas above the "
    "counterfactual — the HPA rule replayed on the demand alone, stepped on its own replica count, so "
    "speculation cannot raise it — or, if more, the GPUs of the whole nodes they need beyond the "
    "counterfactual's; a minute over `maxGpus`/`maxCostPerHour` counts as over budget.")

POLICY_WORDS = {
    "predictive": "this scaler: forecasts demand and scales ahead of it, within the prewarm budget",
    "reactive": "the HPA rule on the demand the metrics show: the baseline",
    "holt-winters": "a seasonal forecast under the HPA rule, as the Predictive HPA does",
    "static": "a fixed fleet sized for the training window's peak",
    "oracle": "perfect foresight of demand with the same start-up times: the floor no policy can beat",
}

#: An absolute path in free text (a note, a reason): shown as its file name, so a report says nothing of
#: the machine it was made on and reads the same wherever it is mailed.
_PATH = re.compile(r"(?<![\w.~])(?:[A-Za-z]:)?[/\\](?:[\w.~-]+[/\\])+([\w.-]+)")


def without_paths(text: str) -> str:
    return _PATH.sub(r"\1", text)


def _flat(spec: Any, prefix: str = "") -> list[str]:
    """The scenario's spec overrides as ``a.b: value`` pairs."""
    if isinstance(spec, dict):
        return [x for k, v in spec.items() for x in _flat(v, f"{prefix}{k}.")]
    value = json.dumps(spec) if not isinstance(spec, str) else spec
    return [f"{prefix.rstrip('.')}: {value}"]


def scenario_table(result: Result) -> str:
    """The scenario as a short table of what shaped the figures, in words."""
    setup = result.setup
    doc = result.to_json()["scenario"]
    cfg = setup.scenario.cluster
    cur = currency(result)
    chain = doc["measurement"]
    seen = ("each trace step's exact value" if chain["exact"] else
            f"a rate over {chain.get('effective_rate_window', chain['rate_window'])} of counters scraped every "
            f"{chain['scrape_interval']}")
    budget = setup.spec.prewarm.budget
    limits = [f"at most {budget.max_gpus} speculative GPUs" if budget.max_gpus is not None else "",
              money(budget.max_cost_per_hour, cur) + " per hour" if budget.max_cost_per_hour is not None else ""]
    rows = [
        ("scenario", f"{doc['name']} (node autoscaler: {doc['preset']})"),
        ("trace", f"{Path(str(doc['trace'])).name}, one value {_every(doc['trace_step'])}"),
        ("training", f"the first {duration_words(doc['training'])} (history only: they size the replicas and train "
                     "the first model)"),
        ("evaluated", f"{duration_words(doc['evaluation'])} from {setup.eval_start.strftime('%Y-%m-%d %H:%M')} UTC, "
                      f"{_every(doc['tick'])}"),
        ("price", f"{money(cfg.price_per_gpu_hour, cur)} per GPU-hour; {cfg.gpus_per_node}-GPU nodes, billed whole; "
                  f"{cfg.gpus_per_replica} GPU per replica"),
        ("start-up times", f"a new node {cfg.cold_start_s:g} s (provision {cfg.node_provision_s:g} + image pull "
                           f"{cfg.image_pull_s:g} + pod start {cfg.pod_start_s:g} + model load {cfg.model_load_s:g}); "
                           f"a pod on a warm node {cfg.warm_start_s:g} s; idle nodes go after "
                           f"{cfg.consolidation_delay_s:g} s"),
        ("replicas", f"one serves {setup.capacity_per_replica:.4g} (trace unit); the training window's P95 needs "
                     f"{setup.peak_replicas}; {setup.bounds.min_replicas}–{setup.max_replicas} allowed"),
        ("demand the policies see", f"{seen}, {chain['delay']} late, read {_every(chain['reconcile_interval'])} "
                                    "(the oracle sees it exactly)"),
        ("reactive (HPA) target", f"{100 * setup.scenario.target_utilization:g} % of a replica's capacity"),
        ("predictive", f"plans on the calibrated P{100 * setup.scenario.quantile:g} forecast "
                       f"({', '.join(doc['horizons'])} ahead) at {100 * setup.scenario.planning_utilization:g} % of "
                       f"a replica's capacity; retrained every {doc['retrain_every']}"),
        ("prewarm budget", " and ".join(x for x in limits if x) or "none (no speculation)"),
        ("forecasters tried", ", ".join(doc["forecasters"]) or "the retraining job's"),
        ("spec settings", "; ".join(f"`{x}`" for x in _flat(doc.get("spec") or {})) or "–"),
    ]
    return "\n".join(["| setting | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]])


def _when(iso: str) -> str:
    """An ISO-8601 UTC time as the report writes times: "1995-07-22 04:00 UTC"."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d):00(\+00:00|Z)", iso)
    return f"{m.group(1)} {m.group(2)} UTC" if m else iso


def _every(duration: str) -> str:
    """ "every minute", "every 5 minutes"."""
    return "every " + duration_words(duration).removeprefix("1 ")


def _context(result: Result) -> str:
    """One line under the headline: what was replayed and the price every amount comes from."""
    setup = result.setup
    cfg = setup.scenario.cluster
    doc = result.to_json()["scenario"]
    names = ", ".join(f"**{n}** ({POLICY_WORDS.get(n, n)})" for n in result.measures)
    return (f"A replay of `{Path(str(doc['trace'])).name}` through each policy on a simulated GPU cluster: "
            f"{duration_words(doc['training'])} of history train the models, then {duration_words(doc['evaluation'])} "
            f"from {setup.eval_start.strftime('%Y-%m-%d %H:%M')} UTC are walked forward {_every(doc['tick'])}; "
            f"{cfg.gpus_per_node}-GPU nodes are billed whole at {money(cfg.price_per_gpu_hour, currency(result))} "
            f"per GPU-hour. Policies: {names}.")


def markdown(result: Result, images: dict[str, Path] | None = None, frontier: FrontierResult | None = None) -> str:
    setup = result.setup
    images = images or {}
    cur = currency(result)
    parts = [
        f"# Backtest: {setup.trace.name} — scenario `{setup.scenario.name}`",
        "",
        report_headline(result, frontier),
        "",
        _context(result),
        "",
    ]
    if frontier is not None:
        parts += ["## Cost–service frontiers", ""]
        if "frontier" in images:
            parts += [f"![frontier]({images['frontier'].name})", ""]
        parts += [
            "Each adaptive policy run at several settings of its own knob (reactive and Holt-Winters: the HPA "
            "target; predictive: its planning target; static: the fleet size), so that they can be compared at "
            "equal service rather than each at its default. A policy's reference curve is the cheapest of its "
            "points serving at least a given share, linearly interpolated and undefined beyond its highest point; "
            "the comparisons are read at the share the predictive default serves. Share of the saving reached = "
            "(reference − predictive) ÷ (reference − oracle).",
            "",
        ]
        n_points = sum(len(p) for p in frontier.frontier.values())
        parts += [f"<details><summary>Every operating point ({n_points}), cost in {cur}</summary>", "",
                  frontier_table(frontier), "", "</details>", ""]
    if "daily_cost" in images:
        parts += ["## Day by day", "",
                  f"Cost per UTC day against the reactive baseline's ({cur}; above zero: dearer than reactive that "
                  "day), the part of predictive's that went on prewarmed capacity demand did not use, and the "
                  "minutes with demand unmet each policy had that day.", "",
                  f"![cost per day]({images['daily_cost'].name})", ""]
    if "hard_days" in images:
        parts += ["## The hardest days", "",
                  "The largest peaks and the largest misses of the predictive policy, zoomed: demand, the ready "
                  "capacity of predictive, reactive and the oracle (dotted), the capacity the predictive policy "
                  "requested (dashed: it rises ahead of the peak by the node start-up time), the minutes predictive "
                  "(red) and reactive (orange strip) left demand unmet, and below each panel the GPUs predictive and "
                  "reactive were billed for.", "",
                  f"![hard days]({images['hard_days'].name})", ""]
    parts += [
        "## Policies side by side",
        "",
        markdown_table(result),
        "",
        f"Cost and wasted prewarm in {cur} at {money(price(result), cur)} per GPU-hour. "
        "Physical bound: whole nodes exactly fitting each tick's demand with zero lead time. "
        "Served = share of demand served by ready capacity. "
        "Fallback min: minutes the predictive policy ran its reactive fallback (for holt-winters: minutes the "
        "reactive recommendation, not the forecast, decided).",
        "",
        WASTE_DEFINITION,
        "",
        BUDGET_DEFINITION,
        "",
        "## Against the aims",
        "",
        *[f"- {line}" for line in verdict(result, frontier)],
        "",
        "## Forecast accuracy (forecasts the predictive policy acted on)",
        "",
        accuracy_table(result),
        "",
    ]
    parts += event_windows.markdown_section(result)
    if result.model_events:
        parts += ["## Retraining", "", "| at | kind | promoted | fit s | reason |", "|---|---|---|---|---|"]
        parts += [f"| {_when(e.at)} | {e.kind} | {'yes' if e.promoted else 'no'} | {e.fit_seconds:.1f} | "
                  f"{without_paths(e.reason)} |" for e in result.model_events]
        parts.append("")
    rest = {k: p for k, p in images.items() if k not in ("frontier", "daily_cost", "hard_days")}
    if rest:
        parts += ["## The whole run", ""] + [f"![{k}]({p.name})" for k, p in rest.items()] + [""]
    parts += ["## Scenario", "", scenario_table(result), ""]
    if result.notes:
        parts += ["## Notes", ""] + [f"- {without_paths(n)}" for n in result.notes] + [""]
    wall = ", ".join(f"{k} {v:.1f} s" for k, v in result.wall_seconds.items())
    parts += [f"Wall time per policy: {wall}." + ("" if frontier is None else
                                                   f" Frontier (all points): {frontier.wall_seconds:.1f} s."), ""]
    return "\n".join(parts)


def _inline(text: str) -> str:
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    return re.sub(r"\*([^*]+)\*", r"<i>\1</i>", out)


#: A table cell that is a figure (right-aligned, kept on one line): a number with at most a short unit, or a dash.
_FIGURE = re.compile(r"^([−+-]?[\d.,]+(\s?(%|×|\S{1,4}))?|–|-)$")


def _cell(text: str) -> str:
    return f'<td class="n">{_inline(text)}</td>' if _FIGURE.match(text) else f"<td>{_inline(text)}</td>"


#: The HTML the report's Markdown carries as is (GitHub renders it too): a collapsed block.
_RAW_HTML = re.compile(r"^(<details>(<summary>[^<]*</summary>)?|</details>)$")


def markdown_to_html(md: str, images: dict[str, Path]) -> str:
    """The report's Markdown as HTML (the subset it uses: headings, lists, tables, images, code, paragraphs,
    a collapsed block), images inlined — so the page carries exactly what the Markdown has."""
    by_name = {p.name: p for p in images.values()}
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:j])) + "</pre>")
            i = j + 1
            continue
        if _RAW_HTML.match(line):
            summary = re.match(r"<details><summary>([^<]*)</summary>", line)
            out.append(f"<details><summary>{_inline(html.unescape(summary.group(1)))}</summary>" if summary else line)
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                if not lines[i].startswith("|---"):
                    rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            head, *body = rows
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in body)
                       + "</table>")
            continue
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif line.startswith("!["):
            m = re.match(r"!\[([^\]]*)\]\(([^)]+)\)", line)
            if m and m.group(2) in by_name:
                data = base64.b64encode(by_name[m.group(2)].read_bytes()).decode()
                out.append(f'<img alt="{html.escape(m.group(1))}" src="data:image/png;base64,{data}">')
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


_STYLE = """body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1150px;margin:auto;padding:0 1em 2em;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.4em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
h1+p{font-size:1.12em;background:#f2f6fb;border-left:4px solid #1f77b4;padding:.8em 1em;margin-top:0}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}td.n{text-align:right;white-space:nowrap}
th{background:#f4f4f4;text-align:left}img{max-width:100%}code{font-size:.9em}
details{margin:.6em 0}summary{cursor:pointer;color:#1f5f99}"""


def html_page(result: Result, images: dict[str, Path], frontier: FrontierResult | None = None) -> str:
    """A self-contained page: the Markdown report rendered as HTML, images inlined."""
    body = markdown_to_html(markdown(result, images, frontier), images)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Backtest {html.escape(result.setup.trace.name)}</title>
<style>{_STYLE}</style></head>
<body>
{body}
</body></html>
"""


def write_report(result: Result, directory: str | Path, frontier: FrontierResult | None = None) -> Path:
    """Write report.md, report.html and the PNGs into ``directory``; return the HTML path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    images = plot_files(result, out, frontier)
    (out / "report.md").write_text(markdown(result, images, frontier))
    page = out / "report.html"
    page.write_text(html_page(result, images, frontier))
    doc = result.to_json() if frontier is None else frontier.to_json()
    (out / "result.json").write_text(json.dumps(doc, indent=2, allow_nan=False))
    return page
