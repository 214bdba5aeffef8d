"""`predictive-scaler status`'s view: a pure function of the PredictiveScaler object and the time."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import pytest

from predictive_scaler.commands.status import _one, detail, table, view
from predictive_scaler.errors import ConfigError

NOW = datetime(2026, 12, 4, 18, 0, 30, tzinfo=UTC)


def scaler(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": "llm"},
            "spec": {"mode": "scale", "prewarm": {"budget": {"maxGpus": 8}}, **spec},
            "status": status}


STATUS: dict[str, Any] = {
    "mode": "scale", "strategy": "predictive", "desiredReplicas": 7, "currentReplicas": 4, "placeholderGpus": 3,
    "budgetInUse": {"gpus": 3, "currency": "USD", "costPerHour": 7.5}, "modelVersion": "20261201T030000Z-ab12",
    "lastReconcileTime": "2026-12-04T18:00:00Z",
    "reasons": ["the forecast's P95 over the next 30 min needs 7 replicas", "3 GPUs prewarmed within the budget"],
    "forecast": {"issuedAt": "2026-12-04T18:00:00Z", "stepSeconds": 300, "quantile": 0.95, "model": "arima",
                 "p50": [12.0, 20.5, 27.7, 27.9, 26.0, 25.0], "p95": [14.0, 24.0, 31.5, 32.0, 30.0, 29.0]},
    "plannerState": {"recentDemand": [[1764870000.0, 12.1], [1764871170.0, 12.7]]},
    "conditions": [
        {"type": "Ready", "status": "True", "reason": "Scaled", "message": "predictive: 7 replicas"},
        {"type": "Predictive", "status": "True", "reason": "Forecasting", "message": "ok"},
        {"type": "BudgetLimited", "status": "True", "reason": "GpuBudget", "message": "held to 8 GPUs"},
        {"type": "ModelInvalid", "status": "False", "reason": "ModelOK", "message": "forecast is valid"},
    ],
}


def test_the_view_reads_what_the_controller_wrote() -> None:
    v = view(scaler(STATUS), NOW)
    assert (v.mode, v.strategy, v.ready_replicas, v.planned_replicas, v.placeholder_gpus) == \
        ("scale", "predictive", 4, 7, 3)
    assert (v.budget_gpus_in_use, v.budget_gpus_allowed) == (3, 8)
    assert (v.observed, v.forecast_p50, v.forecast_upper, v.quantile) == (12.7, 27.9, 32.0, 0.95)
    assert v.horizon_seconds == 1800 and v.reconciled_ago == 30.0
    assert v.attention == (), "a limit that applied as designed is not a problem"


def test_what_needs_attention_comes_first() -> None:
    status = {**STATUS, "conditions": [
        *STATUS["conditions"],
        {"type": "Predictive", "status": "False", "reason": "ReactiveFallback", "message": "forecast drift"},
        {"type": "ConflictingAutoscaler", "status": "True", "reason": "ForecastOnly", "message": "HPA/llm"}]}
    v = view(scaler(status), NOW)
    assert [a.split(" ")[0] for a in v.attention] == ["Predictive=False", "ConflictingAutoscaler=True"]
    row = table([v]).splitlines()[1]
    assert row.split()[:2] == ["ml", "llm"] and row.endswith("Predictive=False (ReactiveFallback)")
    text = detail(v)
    assert "  attention:\n    - Predictive=False (ReactiveFallback): forecast drift" in text
    assert "    - the forecast's P95 over the next 30 min needs 7 replicas" in text


def test_a_scaler_the_controller_never_reached_says_so() -> None:
    v = view(scaler(None), NOW)
    assert v.reconciled_ago is None and v.strategy is None and v.planned_replicas is None
    assert v.attention[0].startswith("never reconciled")
    assert "never" in table([v]) and "–" in table([v])


def test_garbage_in_a_status_is_shown_as_unknown_not_a_crash() -> None:
    v = view(scaler({"desiredReplicas": "seven", "forecast": {"p95": ["x", None, float("nan")]},
                     "plannerState": {"recentDemand": [["bad"]]}, "lastReconcileTime": "yesterday",
                     "conditions": ["not a mapping"]}), NOW)
    assert v.planned_replicas is None and v.forecast_upper is None and v.observed is None
    assert v.reconciled_ago is None


@pytest.mark.parametrize("text", ["llm", "ml/", "/llm", "a/b/c"])
def test_one_scaler_is_named_namespace_slash_name(text: str) -> None:
    with pytest.raises(ConfigError, match="is not NAMESPACE/NAME"):
        _one(text)
    assert _one("ml/llm") == ("ml", "llm")


def test_the_command_is_registered() -> None:
    from predictive_scaler.cli import build_parser

    args = build_parser().parse_args(["status", "ml/llm", "--json"])
    assert isinstance(args, argparse.Namespace) and args.scaler == "ml/llm" and args.json
