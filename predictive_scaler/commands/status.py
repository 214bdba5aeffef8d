"""`predictive-scaler status [NAMESPACE/NAME]`: what the scalers are doing, condensed.

One line per PredictiveScaler (mode, strategy, ready → planned replicas, placeholder GPUs, budget
in use, the forecast against the demand last observed, the model, how long ago it reconciled, and
what needs attention), or, for one scaler, the same with its last decision's reasons and every
condition that is not as it should be — what `kubectl describe` shows, read from the status the
controller writes. It reads only; the view is a pure function of the object and the time.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from predictive_scaler.errors import ConfigError, NotFoundError

#: Condition type → the status it has when all is well; any other status needs attention.
#: (BudgetLimited and ScalingLimited say a limit applied, as designed: shown in the reasons, not here.)
HEALTHY: Mapping[str, str] = {
    "Ready": "True", "Predictive": "True", "Drift": "False", "MetricsUnavailable": "False",
    "ModelInvalid": "False", "ConflictingAutoscaler": "False", "Paused": "False", "ApiDegraded": "False",
}
#: Reasons shown for one scaler (the controller keeps up to 20).
REASONS_SHOWN = 8


@dataclass(frozen=True)
class ScalerView:
    """One scaler as `status` shows it."""

    namespace: str
    name: str
    mode: str
    strategy: str | None
    ready_replicas: int | None
    planned_replicas: int | None
    placeholder_gpus: int | None
    budget_gpus_in_use: int | None
    budget_gpus_allowed: int | None
    #: The demand last observed, and when (seconds since the epoch).
    observed: float | None
    observed_at: float | None
    #: The forecast's median and upper quantile over its horizon (highest step), and that quantile.
    forecast_p50: float | None
    forecast_upper: float | None
    quantile: float | None
    horizon_seconds: int | None
    model: str | None
    model_version: str | None
    #: Seconds since the last reconcile (None: never reconciled).
    reconciled_ago: float | None
    attention: tuple[str, ...]
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["attention"], doc["reasons"] = list(self.attention), list(self.reasons)
        return doc


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(value) else None


def _peak(values: Any) -> float | None:
    numbers = [v for v in (_number(x) for x in values) if v is not None] if isinstance(values, list) else []
    return max(numbers) if numbers else None


def _time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def view(obj: Mapping[str, Any], now: datetime) -> ScalerView:
    """The view of one PredictiveScaler object (as the API server returns it) at ``now``."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = obj.get("status") or {}
    budget = status.get("budgetInUse") or {}
    allowed = ((spec.get("prewarm") or {}).get("budget") or {}).get("maxGpus")
    forecast = status.get("forecast") or {}
    state = status.get("plannerState") or {}
    recent = state.get("recentDemand") if isinstance(state, Mapping) else None
    last = recent[-1] if isinstance(recent, list) and recent and isinstance(recent[-1], list) \
        and len(recent[-1]) == 2 else (None, None)
    p50 = forecast.get("p50")
    steps = len(p50) if isinstance(p50, list) else 0
    step_s = _int(forecast.get("stepSeconds"))
    reconciled = _time(status.get("lastReconcileTime"))
    attention = tuple(
        f"{c.get('type')}={c.get('status')} ({c.get('reason')}): {c.get('message')}"
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping) and c.get("type") in HEALTHY and c.get("status") != HEALTHY[str(c.get("type"))])
    if reconciled is None:
        attention = ("never reconciled: is the controller running and watching this namespace?", *attention)
    return ScalerView(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
        mode=str(status.get("mode") or spec.get("mode") or "forecast-only"),
        strategy=status.get("strategy"), ready_replicas=_int(status.get("currentReplicas")),
        planned_replicas=_int(status.get("desiredReplicas")), placeholder_gpus=_int(status.get("placeholderGpus")),
        budget_gpus_in_use=_int(budget.get("gpus")), budget_gpus_allowed=_int(allowed),
        observed=_number(last[1]), observed_at=_number(last[0]),
        forecast_p50=_peak(p50), forecast_upper=_peak(forecast.get("p95")), quantile=_number(forecast.get("quantile")),
        horizon_seconds=steps * step_s if step_s else None, model=forecast.get("model"),
        model_version=status.get("modelVersion"),
        reconciled_ago=None if reconciled is None else max(0.0, now.timestamp() - reconciled),
        attention=attention, reasons=tuple(str(r) for r in status.get("reasons") or ())[:REASONS_SHOWN])


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _count(value: int | None) -> str:
    return "–" if value is None else str(value)


def _row(v: ScalerView) -> list[str]:
    budget = f"{_count(v.budget_gpus_in_use)}/{_count(v.budget_gpus_allowed)}" \
        if v.budget_gpus_allowed is not None else _count(v.budget_gpus_in_use)
    quantile = "P95" if v.quantile is None else f"P{v.quantile * 100:g}"
    forecast = f"{_fmt(v.observed)} → {_fmt(v.forecast_p50)} ({quantile} {_fmt(v.forecast_upper)})"
    return [v.namespace, v.name, v.mode, v.strategy or "–",
            f"{_count(v.ready_replicas)} → {_count(v.planned_replicas)}", _count(v.placeholder_gpus), budget,
            forecast, _ago(v.reconciled_ago), v.attention[0].split(":")[0] if v.attention else "–"]


HEADER = ["NAMESPACE", "NAME", "MODE", "STRATEGY", "READY → PLANNED", "PLACEHOLDER GPUS", "BUDGET GPUS",
          "OBSERVED → FORECAST PEAK", "RECONCILED", "ATTENTION"]


def table(views: Sequence[ScalerView]) -> str:
    rows = [HEADER, *(_row(v) for v in views)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def detail(v: ScalerView) -> str:
    row = dict(zip(HEADER, _row(v), strict=True))
    when = "–" if v.observed_at is None else datetime.fromtimestamp(v.observed_at, UTC).strftime("%H:%M:%SZ")
    horizon = "" if v.horizon_seconds is None else f" over the next {v.horizon_seconds // 60} min"
    lines = [
        f"{v.namespace}/{v.name}: mode {v.mode}, strategy {v.strategy or '– (not decided yet)'}",
        f"  replicas:      {row['READY → PLANNED']} (ready → planned), placeholder GPUs {row['PLACEHOLDER GPUS']}, "
        f"budget GPUs in use {row['BUDGET GPUS']}",
        f"  demand:        {_fmt(v.observed)} observed at {when}; forecast peak{horizon}: "
        f"P50 {_fmt(v.forecast_p50)}, {'P95' if v.quantile is None else f'P{v.quantile * 100:g}'} "
        f"{_fmt(v.forecast_upper)}",
        f"  model:         {v.model or '–'} (version {v.model_version or '–'}); reconciled {_ago(v.reconciled_ago)}",
    ]
    if v.reasons:
        lines += ["  last decision:", *(f"    - {r}" for r in v.reasons)]
    lines += ["  attention:", *(f"    - {a}" for a in v.attention)] if v.attention else ["  attention:     none"]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="what the PredictiveScalers are doing (reads the cluster, changes nothing)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scaler", nargs="?", metavar="NAMESPACE/NAME", help="one scaler, in detail (default: all)")
    p.add_argument("-n", "--namespace", help="only this namespace (default: all namespaces)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: its current context)")
    p.add_argument("--json", action="store_true", help="print the view as JSON")
    p.set_defaults(func=run)


def _one(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ConfigError(f"{text[:80]!r} is not NAMESPACE/NAME: name one scaler as ml/llm, or leave it out to "
                          "list them all", field="scaler")
    return namespace, name


def run(args: argparse.Namespace, now: datetime | None = None) -> int:
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.kube.kubeconfig import api_client_from_environment

    one = _one(args.scaler) if args.scaler else None
    kube = KubeCluster(api_client_from_environment(args.kubeconfig, args.context))
    at = now or datetime.now(UTC)
    if one is not None:
        try:
            objs = [kube.get_scaler(one[1], one[0])]
        except NotFoundError as exc:
            raise ConfigError(f"no PredictiveScaler {one[0]}/{one[1]}: `predictive-scaler status` lists them "
                              "all") from exc
    else:
        objs = sorted(kube.list_scalers(args.namespace),
                      key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))
    views = [view(o, at) for o in objs]
    if args.json:
        print(json.dumps([v.to_dict() for v in views], indent=2))
    elif one is not None:
        print(detail(views[0]))
    elif views:
        print(table(views))
    else:
        print(f"no PredictiveScalers in {args.namespace or 'any namespace'}")
    return 0
