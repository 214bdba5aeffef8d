"""Bursty validation: the 11-day ingress traces, as bundled and with 3× bursts overlaid.

    python benchmarks/bursty.py --out backtests/results/bursty.md [--before DIR] [--json-dir DIR]

Validation only: nothing in the policy is tuned on these traces. Each bundled ``ms_ingress0*_rate``
trace runs as it is and with bursts overlaid (seeded, so the set is the same every run): every
90–150 minutes demand is multiplied by 3 for 5–20 minutes — the shape of the bursty one-minute
traffic on which the predictive default once spent half its time in reactive fallback. Each trace
runs the default scenario with ``--frontier``; the table gives served, gap closed vs reactive,
minutes over budget, minutes in reactive fallback and the peer points (static fleets included)
both cheaper and serving more. ``--before DIR`` adds the same figures from ``<stem>.json``
documents an earlier version wrote with ``--json-dir``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

SEED = 20180425
BURST_FACTOR = 3.0


def bursty(values: np.ndarray, step_s: int, seed: int) -> np.ndarray:
    """``values`` with 3× bursts of 5–20 minutes every 90–150 minutes (seeded)."""
    rng = np.random.default_rng(seed)
    out = values.astype(float).copy()
    per_min = max(1, 60 // step_s) if step_s < 60 else 1
    i = int(rng.integers(60, 150)) * per_min
    while i < len(out):
        length = int(rng.integers(5, 21)) * per_min
        out[i:i + length] *= BURST_FACTOR
        i += length + int(rng.integers(90, 151)) * per_min
    return out


def _row(doc: dict[str, Any]) -> dict[str, Any]:
    pol = doc["policies"]
    p, o, r = pol["predictive"], pol.get("oracle", {}), pol.get("reactive", {})
    checks = doc["frontier_checks"]
    beaten = [f"{b['policy']} {b['knob'].get('replicas', b['knob'].get('target_utilization', ''))}"
              .replace(f"static {b['knob'].get('replicas')}", f"static {b['knob'].get('replicas')} replicas")
              for b in checks["dominated_by"]]
    return {"served": p["slo_attainment"], "oracle": o.get("slo_attainment"), "gap": doc["headline"].get(
        "gap_closed_vs_reactive"), "room": r.get("gpu_hours", 0.0) >= 1.05 * o.get("gpu_hours", float("inf")),
        "over": p["minutes_over_budget"], "fallback": p["reactive_minutes"], "gpu_h": p["gpu_hours"],
        "dominated": beaten}


def _dominated(doc: dict[str, Any]) -> list[str]:
    """Peer points (static fleets included, not the oracle) both cheaper and serving more, recomputed from
    the frontier (a document written before static fleets were checked lists only the autoscalers)."""
    pred = doc["frontier_checks"]["predictive_default"]
    share = pred["slo_attainment"] or 0.0
    out = []
    for name, points in doc["frontier"].items():
        if name in ("predictive", "oracle"):
            continue
        for pt in points:
            if pt["gpu_hours"] < pred["gpu_hours"] and (pt["slo_attainment"] or 0.0) > share:
                knob = pt["knob"]
                out.append(f"static {knob['replicas']}" if "replicas" in knob
                           else f"{name} {knob.get('target_utilization', '')}")
    return out


def _cells(doc: dict[str, Any] | None) -> list[str]:
    if doc is None:
        return ["–"] * 6
    x = _row(doc)
    dom = _dominated(doc)
    gap = "–" if x["gap"] is None else f"{x['gap']:.2f}"
    return [f"{100 * x['served']:.2f} %", gap, f"{x['over']:.0f}", f"{x['fallback']:.0f}", f"{x['gpu_h']:,.0f}",
            (", ".join(dom[:3]) + (f" (+{len(dom) - 3})" if len(dom) > 3 else "")) or "none"]


def main(argv: list[str] | None = None) -> int:
    from predictive_scaler.backtest.frontier import run_frontier
    from predictive_scaler.backtest.scenario import load_scenario
    from predictive_scaler.errors import ScalerError
    from predictive_scaler.series import load_trace

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=Path("backtests/traces"))
    parser.add_argument("--out", type=Path, default=Path("backtests/results/bursty.md"))
    parser.add_argument("--scenario", type=Path, default=Path("backtests/default.yaml"))
    parser.add_argument("--json-dir", type=Path, default=None, help="also write each trace's --json document here")
    parser.add_argument("--before", type=Path, default=None, help="documents of an earlier version (--json-dir)")
    parser.add_argument("--only", default=None, help="comma-separated stems (bursty variants end in _bursty)")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    only = {s.strip() for s in args.only.split(",")} if args.only else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for k, path in enumerate(sorted(args.traces.glob("ms_ingress0*_rate.csv"))):
            paths.append(path)
            trace = load_trace(path, min_history=None)
            rows_in = [line.split(",", 1) for line in path.read_text().splitlines()[1:] if line.strip()]
            values = bursty(np.array([float(v) for _, v in rows_in]), trace.step_seconds, SEED + k)
            burst = Path(tmp) / f"{path.stem}_bursty.csv"
            burst.write_text("timestamp,value\n" + "".join(f"{t},{float(v)!r}\n" for (t, _), v in zip(rows_in, values, strict=True)))
            paths.append(burst)
        for path in paths:
            if only and path.stem not in only:
                continue
            print(f"{path.stem} …", file=sys.stderr, flush=True)
            before = None
            if args.before is not None and (args.before / f"{path.stem}.json").exists():
                before = json.loads((args.before / f"{path.stem}.json").read_text())
            try:
                doc = run_frontier(load_trace(path, min_history=None), scenario).to_json()
            except ScalerError as exc:
                rows.append(f"| {path.stem} | failed: {str(exc)[:80]} |" + " |" * 13)
                continue
            if args.json_dir is not None:
                args.json_dir.mkdir(parents=True, exist_ok=True)
                (args.json_dir / f"{path.stem}.json").write_text(json.dumps(doc))
            o = doc["policies"].get("oracle", {})
            r = doc["policies"].get("reactive", {})
            room = r.get("gpu_hours", 0.0) >= 1.05 * o.get("gpu_hours", float("inf"))
            oracle = o.get("slo_attainment")
            rows.append(f"| {path.stem} | {'–' if oracle is None else f'{100 * oracle:.2f} %'} | "
                        f"{'yes' if room else 'no'} | " + " | ".join(_cells(before)) + " | "
                        + " | ".join(_cells(doc)) + " |")
    lines = [
        "# Bursty validation",
        "",
        "Generated by `python benchmarks/bursty.py` (default scenario, `--frontier`). Validation only: the "
        "drift rule was tuned on the bundled long traces, never on these. `_bursty`: 3× bursts of 5–20 min every "
        "90–150 min overlaid (seeded). Room: reactive's GPU-hours ≥ 1.05 × the oracle's (the gap-closed aim "
        "applies). Dominated by: peer points, static fleets included, both cheaper and serving more.",
        "",
        "| trace | oracle served | room | before: served | gap closed | min over budget | fallback min | GPU-h | "
        "dominated by | after: served | gap closed | min over budget | fallback min | GPU-h | dominated by |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
