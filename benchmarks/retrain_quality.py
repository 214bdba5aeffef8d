"""Does the retraining job's reuse of earlier weeks (its selection ledger: losers skipped, settled
scales, Holt-Winters warm starts) change what it serves? Every bundled trace long enough for a
weekly retraining, replayed week by week through the job's own function twice — cold (every week
scores every candidate from scratch, ``retrain --cold``) and with reuse (the default) — on one
in-memory store each.

    python -m benchmarks.retrain_quality --out backtests/results/retrain-quality.md

For each scaler-week: the decision (promoted or kept) and the model then serving (its kind, and a
combination's members); the served model's 30-minute pinball loss at P95 over the following week
(data no training had seen); and the CPU seconds of the week's training, children (cmdstan)
included. Agreement is the share of scaler-weeks whose decision and served model are the same
with reuse as cold; the pinball change is per trace, mean over its weeks.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from benchmarks.common import reexec_with_one_blas_thread, write_markdown
from benchmarks.forecast import machine

#: The bundled traces long enough for a weekly training and a following week to score it on (the
#: four 14-day traces allow one training, at their very end; the 11-day ingress series none).
TRACES = ("nasa_http_1995", "nab_twitter_aapl", "nab_nyc_taxi")
FIRST_WEEK = timedelta(days=14)  # the job's minimum history
AGREEMENT_TARGET = 0.95
PINBALL_TOLERANCE = 0.02


@dataclass(frozen=True)
class Week:
    now: datetime
    result: str
    served: str
    pinball: float | None
    cpu: float


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def served_name(model: object) -> str:
    kind = str(getattr(model, "kind", "?"))
    members = getattr(model, "members", None)
    if kind == "combination" and members:
        inner = sorted(str(getattr(getattr(m, "base", m), "kind", "?")) for m in members)
        return f"combination({'+'.join(inner)})"
    return str(getattr(getattr(model, "base", model), "kind", kind))


def replay(path: Path, reuse: bool, limit: int | None = None) -> list[Week]:
    from predictive_scaler.backtest.adapters import TraceHistory
    from predictive_scaler.forecasting.evaluation import model_series
    from predictive_scaler.forecasting.walkforward import clear_fit_memo
    from predictive_scaler.retrain.settings import RetrainSettings, scaler_from_manifest
    from predictive_scaler.retrain.stores import MemoryStore
    from predictive_scaler.retrain.training import score_window, train_and_promote
    from predictive_scaler.series import load_trace

    series = load_trace(path, name=path.stem)
    target = scaler_from_manifest({
        "metadata": {"name": path.stem.replace("_", "-"), "namespace": "bench"},
        "spec": {"target": {"name": "svc"}, "capacity": {"requestsPerReplica": 50},
                 "demand": {"kind": "requests", "query": "sum(rate(x[5m]))"}},
    })
    assert target.spec is not None, target.problem
    settings = replace(RetrainSettings(), reuse_earlier_weeks=reuse)
    store = MemoryStore()
    history = TraceHistory(series)
    start = series.start.to_pydatetime()
    end = series.end.to_pydatetime()
    weeks: list[Week] = []
    now = start + FIRST_WEEK
    while now + timedelta(days=7) <= end + timedelta(seconds=series.step_seconds) and len(weeks) != limit:
        clear_fit_memo()
        c0 = _cpu()
        outcome = train_and_promote(target, history, store, settings, now, f"w{len(weeks)}")
        cpu = _cpu() - c0
        version = store.serving_version(target.model_name)
        pinball = None
        served = "none"
        if version is not None:
            model = store.load_serving(target.model_name).model
            served = served_name(model)
            grid = model_series(series.slice(0, series.index_at(now + timedelta(days=7))), model.step_seconds)
            scores = score_window(model, grid, grid.index_at(now), (timedelta(minutes=30),), target.spec.quantile)
            value = (scores["horizons"].get("30m") or {}).get("normalised_pinball")
            pinball = float(value) if value is not None else None
        weeks.append(Week(now, outcome.result, served, pinball, cpu))
        print(f"{path.stem} reuse={reuse} {now:%Y-%m-%d}: {outcome.result} {served} pinball={pinball} "
              f"cpu={cpu:.2f}s", file=sys.stderr, flush=True)
        now += timedelta(days=7)
    return weeks


def main(argv: Sequence[str] | None = None) -> int:
    reexec_with_one_blas_thread("benchmarks.retrain_quality", argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=Path, default=Path("backtests/traces"))
    p.add_argument("--only", default="", help="comma-separated trace names (default: every bundled one)")
    p.add_argument("--out", type=Path, help="write the Markdown report here")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(TRACES)
    started = datetime.now(UTC)
    header = machine()
    t0 = time.perf_counter()
    replay(args.traces / f"{names[0]}.csv", reuse=False, limit=1)  # imports and first fits: not timed
    rows = []
    same = total = 0
    verdicts = []
    cpu = {True: 0.0, False: 0.0}
    for name in names:
        cold = replay(args.traces / f"{name}.csv", reuse=False)
        warm = replay(args.traces / f"{name}.csv", reuse=True)
        agree = sum(c.result == w.result and c.served == w.served for c, w in zip(cold, warm, strict=True))
        same += agree
        total += len(cold)
        paired = [(c.pinball, w.pinball) for c, w in zip(cold, warm, strict=True)
                  if c.pinball is not None and w.pinball is not None]
        pc = float(np.mean([c for c, _ in paired])) if paired else float("nan")
        pw = float(np.mean([w for _, w in paired])) if paired else float("nan")
        change = pw / pc - 1 if paired and pc > 0 else float("nan")
        verdicts.append(abs(change) <= PINBALL_TOLERANCE if np.isfinite(change) else False)
        cc, cw = sum(w.cpu for w in cold), sum(w.cpu for w in warm)
        cpu[False] += cc
        cpu[True] += cw
        rows.append(f"| {name} | {len(cold)} | {agree}/{len(cold)} | {pc:.4f} | {pw:.4f} | {change:+.2%} | "
                    f"{cc / len(cold):.2f} | {cw / len(cold):.2f} |")
        diffs = [f"{c.now:%Y-%m-%d}: cold {c.result} {c.served}, reuse {w.result} {w.served}"
                 for c, w in zip(cold, warm, strict=True) if (c.result, c.served) != (w.result, w.served)]
        if diffs:
            rows.append(f"|  | differs: {'; '.join(diffs)} |  |  |  |  |  |  |")
    share = same / total if total else float("nan")
    lines = [
        "# Retraining: what reusing earlier weeks changes in what is served",
        "",
        f"`python -m benchmarks.retrain_quality` (`make bench-retrain-quality`), {started:%Y-%m-%d %H:%M} UTC, "
        f"{time.perf_counter() - t0:.0f} s wall:",
        "",
        *header,
        "",
        "Each bundled trace replayed week by week through the job's own training function (28 days pulled, "
        "14 required, the default candidates), cold (`retrain --cold`: every candidate scored, every fit from "
        "its default start) and with reuse (the default: the selection ledger's losers skipped, settled "
        "scales, Holt-Winters warm starts). The ledger's rules are fixed in advance (retrain/ledger.py), "
        "not tuned on these traces. The first three weeks of a trace have no ledger deep enough to skip a "
        "candidate or settle a scale (warm starts begin in week 2). The four 14-day traces allow one training, "
        "at their very end, with no earlier week to reuse and no later week to score it on; the five 11-day "
        "ingress series are shorter than the job's 14-day minimum: neither is run.",
        "",
        "| trace | scaler-weeks | same decision and served model | served 30-min normalised pinball, cold | "
        "with reuse | change | CPU-s per week, cold | with reuse |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"- **Same decision and served model on {same} of {total} scaler-weeks ({share:.1%})**; target ≥ "
        f"{AGREEMENT_TARGET:.0%}: {'met' if share >= AGREEMENT_TARGET else 'NOT met'}.",
        f"- **Served 30-minute pinball within ±{PINBALL_TOLERANCE:.0%} of cold on {sum(verdicts)} of "
        f"{len(verdicts)} traces**: {'met' if all(verdicts) else 'NOT met'}.",
        f"- CPU over all scaler-weeks: cold {cpu[False]:.0f} s, with reuse {cpu[True]:.0f} s "
        f"({cpu[True] / cpu[False]:.2f}×; the first weeks of each trace have nothing to reuse yet).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_markdown(args.out, lines)
    return 0 if share >= AGREEMENT_TARGET and all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
