"""Render docs/reliability.md from the scenario table: ``python -m tests.reliability.render_doc``.

``test_doc.py`` fails when the committed file differs from this rendering, so the
document always says what the tests run and assert.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.reliability.scenarios import COMMON_INVARIANTS, SCENARIOS, Scenario

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _expected(s: Scenario) -> str:
    parts = []
    if s.fault[1] > s.fault[0] and s.during:
        seq = [str(x or "step fails, retried") for x in s.during]
        parts.append(f"periods {s.fault[0]}–{s.fault[1] - 1}: {' → '.join(seq)} (last repeats)")
    if s.recovery is not None and s.fault[1] > s.fault[0]:
        parts.append(f"predictive {s.recovery} period(s) after the fault")
    return "; ".join(parts) or "—"


def _signals(s: Scenario) -> str:
    sig = s.signals
    items = [f"condition `{sig.condition}`" if sig.condition else "",
             f"Event `{sig.event}`" if sig.event else "",
             f"metric `{sig.metric}`" if sig.metric else ""]
    if any(items):
        return ", ".join(i for i in items if i)
    return "— (absorbed by retries: nothing changes)" if s.kind == "api" else "— (no fault to report)"


def render() -> str:
    lines = [
        "# Reliability: the fault matrix",
        "",
        "Generated from `tests/reliability/scenarios.py` by `python -m tests.reliability.render_doc "
        "> docs/reliability.md` — do not edit by hand; `tests/reliability/test_doc.py` fails when "
        "this file and the table differ.",
        "",
        "Every scenario runs through the controller's own reconcile path — the kopf timer handler "
        "over `ControllerService` and `Reconciler.step` — with the real adapters: "
        "`PrometheusSource` on a real Prometheus (14 days of a shared trace backfilled with promtool, "
        "per-pod counters with resets) behind a loopback fault proxy (`tests/support/proxy.py`), "
        "`KubeCluster` on the stateful fake API server, and the model store on disk. Time is a "
        "`FakeClock`: control periods are 60 s, retry waits advance the clock, nothing sleeps for "
        "real (client timeouts are scaled to 0.25 s where a hang is injected). All of it runs in "
        "`make test`.",
        "",
        "## Checked in every period of every scenario",
        "",
        *[f"- {inv}" for inv in COMMON_INVARIANTS],
        "",
        "For metric and model faults the planner's promise is asserted period by period: "
        "`hold` for `missingDataPeriods` (3) periods, then `reactive`, and `predictive` again after "
        "the fault; for Kubernetes API faults, retries with backoff and an unchanged strategy.",
        "",
        "Signals are due within one period: of the first non-predictive period for metric and model "
        "faults; of the first faulted period where so marked; for API faults absorbed by retries, of "
        "the first period with a retried call (a retry of the status write itself is reported by the "
        "next period's write); for an API outage, during which nothing can be written, the condition "
        "and the Event within one period of the fault's end and the metric within one period of its "
        "start. `ApiDegraded` is also asserted False before every fault, never True in a scenario "
        "without an API fault, and False again by the end of every run.",
        "",
        "## The matrix",
        "",
        "| Scenario | Kind | Periods (fault) | What happens | Strategy asserted | Signals within one period "
        "| What else the test asserts | Test |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in SCENARIOS:
        fault = f"{s.periods} ({s.fault[0]}–{s.fault[1] - 1})" if s.fault[1] > s.fault[0] else f"{s.periods}"
        if s.periods == 0:
            fault = "random"
        lines.append(
            f"| **{_cell(s.title)}** (`{s.id}`) | {s.kind} | {fault} | {_cell(s.happens)} | "
            f"{_cell(_expected(s))} | {_cell(_signals(s))} | {_cell(s.asserts)} | `{s.test}` |")
    lines += [
        "",
        "## Known gaps (found by this suite)",
        "",
        "- Two controller replicas each keep their own cluster-wide budget ledger, so together they "
        "could book up to twice `clusterBudgetGpus`. Per-scaler budgets still hold (the placeholder "
        "is one Deployment sized absolutely, and `/scale` writes carry the read `resourceVersion`, "
        "so a stale write is a 409 that is re-read). The deployment runs one replica with the "
        "`Recreate` strategy, so two replicas overlap only if that is changed.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
