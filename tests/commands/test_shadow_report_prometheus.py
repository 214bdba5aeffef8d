"""`shadow-report` against a real Prometheus holding a week of demand, kube-state-metrics' replica series of the
live autoscaler and the controller's forecast-only decisions: both sides' GPU-hours, cost and unmet minutes equal
a calculation written here from the same series, read back from Prometheus over its plain HTTP API."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
import requests
import yaml

from predictive_scaler.cli import main
from predictive_scaler.series import Series
from tests.support.openmetrics import GaugeFamily

DAYS = 7
NS, NAME = "ml", "llm"
PER_REPLICA, PRICE = 10.0, 2.5
END = datetime(2024, 3, 11, tzinfo=UTC)


@pytest.fixture(scope="module")
def recorded(prometheus_factory):
    start = END - timedelta(days=DAYS, hours=1)
    n = (DAYS * 24 + 2) * 60
    minute = np.arange(n)
    rng = np.random.default_rng(5)
    demand = 40 + 30 * np.sin(2 * np.pi * minute / 1440) ** 2 + rng.uniform(0, 5, n)
    yours = np.ceil(np.roll(demand, 5) / PER_REPLICA)  # an HPA at a 100 % target, five minutes late
    ready = np.minimum(yours, np.roll(yours, 2))
    ours = np.ceil(demand / PER_REPLICA)
    placeholder = np.where(minute % 240 < 30, 2.0, 0.0)

    def gauge(name: str, values: np.ndarray, labels: dict[str, str]) -> GaugeFamily:
        return GaugeFamily(name=name, per_series=[({}, Series(values, pd.Timestamp(start), 60, name=name))],
                           labels=labels)
    scaler = {"namespace": NS, "scaler": NAME}
    kube = {"namespace": NS, "deployment": NAME}
    server = prometheus_factory(gauges=[
        gauge("inference_demand", demand, {"namespace": NS}),
        gauge("kube_deployment_spec_replicas", yours, kube),
        gauge("kube_deployment_status_replicas_ready", ready, kube),
        gauge("predictive_scaler_desired_replicas", ours, scaler),
        gauge("predictive_scaler_planned_placeholder_gpus", placeholder, scaler)], sample_step=60)
    return server.url


def _range(url: str, query: str, start: float, steps: int) -> np.ndarray:
    """The query over the report's grid: step i from start holds the evaluation at its end (as pull_history)."""
    answer = requests.get(f"{url}/api/v1/query_range", params={
        "query": query, "start": start + 60, "end": start + 60 * steps, "step": 60}, timeout=30).json()
    out = np.full(steps, np.nan)
    for t, v in answer["data"]["result"][0]["values"]:
        out[int((float(t) - start) // 60) - 1] = float(v)
    return out


def test_shadow_report_equals_a_calculation_from_the_same_series(recorded, tmp_path, capsys):
    manifest = tmp_path / "scaler.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "predictive-scaler.io/v1alpha1", "kind": "PredictiveScaler",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"mode": "forecast-only", "target": {"name": NAME},
                 "demand": {"query": f'sum(inference_demand{{namespace="{NS}"}})'},
                 "capacity": {"requestsPerReplica": PER_REPLICA},
                 "leadTimes": {"podStartSeconds": 120, "nodeStartSeconds": 600},
                 "prewarm": {"budget": {"pricePerGpuHour": PRICE}}}}))
    code = main(["shadow-report", "--prometheus", recorded, "--scaler", f"{NS}/{NAME}", "--since", f"{DAYS}d",
                 "--end", END.isoformat(), "--manifest", str(manifest), "--no-replay", "--json",
                 "--report", str(tmp_path / "report")])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    start, steps = pd.Timestamp(doc["start"]).timestamp(), doc["steps_counted"] + doc["steps_left_out"]
    assert steps == DAYS * 1440 and start == (END - timedelta(days=DAYS)).timestamp()

    demand = _range(recorded, f'sum(inference_demand{{namespace="{NS}"}})', start, steps)
    yours = _range(recorded, f'max(kube_deployment_spec_replicas{{namespace="{NS}",deployment="{NAME}"}})', start, steps)
    ready = _range(recorded, f'max(kube_deployment_status_replicas_ready{{namespace="{NS}",deployment="{NAME}"}})', start, steps)
    ours = _range(recorded, f'max(predictive_scaler_desired_replicas{{namespace="{NS}",scaler="{NAME}"}})', start, steps)
    held = _range(recorded, f'max(predictive_scaler_planned_placeholder_gpus{{namespace="{NS}",scaler="{NAME}"}})', start, steps)
    expected = {"yours": [0.0, 0.0, 0.0], "ours": [0.0, 0.0, 0.0]}  # GPU-hours, cost, unmet minutes
    for i in range(len(demand)):
        if not all(math.isfinite(x[i]) for x in (demand, yours, ready, ours)):
            continue
        ours_ready = min(x for x in ours[max(0, i - 2): i + 1] if math.isfinite(x))  # pod start: 2 steps
        for side, billed, capacity in (("yours", yours[i], ready[i] * PER_REPLICA),
                                       ("ours", ours[i] + held[i], ours_ready * PER_REPLICA)):
            expected[side][0] += billed / 60
            expected[side][1] += billed * PRICE / 60
            expected[side][2] += demand[i] > capacity
    for side in ("yours", "ours"):
        got = doc["total"][side]
        assert math.isclose(got["gpu_hours"], expected[side][0], rel_tol=1e-9), side
        assert math.isclose(got["cost"], expected[side][1], rel_tol=1e-9), side
        assert got["unmet_minutes"] == expected[side][2], side
    assert doc["total"]["yours"]["unmet_minutes"] > 0 and len(doc["days"]) >= DAYS
    assert (tmp_path / "report" / "report.html").read_text().count("<table>") >= 2
