"""Shadow mode end to end: an HPA (autoscaling/v2beta2, what Kubernetes 1.20 serves) targets a Deployment while a
forecast-only PredictiveScaler observes it; a real Prometheus scrapes the controller process; the real
`predictive-scaler shadow-report` CLI compares the two from Prometheus.

What is real and what the test stands in for:

- the API server, controller-manager (its HPA controller included), the HPA object, the PredictiveScaler and the
  controller process (namespaced, ``--team-label=team``, the controller's own ServiceAccount and RBAC from deploy/);
- the test control plane has no metrics API and no kubelet, so the HPA controller never computes a recommendation
  and no pod ever runs: the test driver changes the Deployment's replicas through ``/scale`` in the HPA controller's
  place (within the HPA's min/max, which the HPA controller does enforce), one value per live minute;
- kube-state-metrics is a small exporter here that reads the Deployment from the real API server at every scrape
  (``kube_deployment_spec_replicas``, ``kube_deployment_status_replicas_ready`` — 0: no kubelet) and continues the
  demand counter;
- Prometheus scrapes the controller's /metrics (its desired replicas, what it saw on /scale, the FinOps series) for
  the live minutes; the week before is backfilled with promtool: demand, kube-state-metrics' replica series and the
  controller's decisions, in series of the same labels as the scraped ones, so both parts are one series each.

The report's totals are checked against a calculation written here from the same series read back over
Prometheus' HTTP API; the live minutes against the replicas the driver set.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import requests

from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.series import Series
from tests.e2e.conftest import (
    INTERVAL_SECONDS,
    MODEL,
    PER_REPLICA,
    ControllerProcess,
    RecentDemand,
    condition,
    events,
    get_scaler,
    make_target,
    scaler_manifest,
)
from tests.e2e.test_real_apiserver import SA_USER, reconciled, replicas, scale_writes
from tests.support.kubeapi import KubeApiServer
from tests.support.openmetrics import CounterFamily, GaugeFamily
from tests.support.prometheus import backfill, free_port, running_prometheus

pytestmark = pytest.mark.prometheus

NS, TEAM, HPA = "e2e-shadow", "search", "llm-hpa"
PRICE = 2.5  # scaler_manifest's pricePerGpuHour; gpusPerReplica is 1
#: The replicas the driver sets, in the HPA controller's place, one per live minute (within the HPA's 1–8).
SCHEDULE = (3, 5, 2)
WEEK = timedelta(days=7)
CONTROLLER_JOB, KSM_JOB = "predictive-scaler", "kube-state-metrics"
KSM = {"namespace": NS, "deployment": MODEL, "job": KSM_JOB, "instance": "ksm"}
SCALER = {"namespace": NS, "scaler": MODEL}
DEMAND = 'sum(rate(requests_total{namespace="e2e",job="inference"}[2m]))'  # the scaler's query (conftest.QUERY)
Q = {
    "yours": f'max(kube_deployment_spec_replicas{{namespace="{NS}",deployment="{MODEL}"}})',
    "ready": f'max(kube_deployment_status_replicas_ready{{namespace="{NS}",deployment="{MODEL}"}})',
    "ours": f'max(predictive_scaler_desired_replicas{{namespace="{NS}",scaler="{MODEL}"}})',
    "held": f'max(predictive_scaler_planned_placeholder_gpus{{namespace="{NS}",scaler="{MODEL}"}})',
    "seen": f'max(predictive_scaler_target_replicas{{namespace="{NS}",scaler="{MODEL}"}})',
}


def start_controller(kubeconfig: Path, prometheus_url: str, store: ModelStore, log: Path) -> ControllerProcess:
    """conftest's controller, namespaced, with the FinOps team label."""
    import os

    exe = Path(sys.executable).with_name("predictive-scaler")
    port = free_port()
    argv = [str(exe), "controller", f"--kubeconfig={kubeconfig}", f"--prometheus-url={prometheus_url}",
            f"--model-store={store.root}", f"--interval={INTERVAL_SECONDS}", f"--metrics-port={port}",
            f"--health-port={free_port()}", f"--namespace={NS}", "--team-label=team"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREDICTIVE_SCALER_")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with open(log, "ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return ControllerProcess(popen, log, port, argv, env)


class KubeStateMetrics:
    """kube-state-metrics' two Deployment series, read from the real API server at every scrape, and the demand
    counter continued at LIVE_RATE req/s from when it started (its own pod label: a new series)."""

    LIVE_RATE = 45.0

    def __init__(self, api: KubeApiServer) -> None:
        started = time.time()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 — http.server's name
                obj = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{MODEL}") or {}
                labels = ",".join(f'{k}="{v}"' for k, v in KSM.items())
                body = (f"kube_deployment_spec_replicas{{{labels}}} {obj.get('spec', {}).get('replicas', 0)}\n"
                        f"kube_deployment_status_replicas_ready{{{labels}}} "
                        f"{(obj.get('status') or {}).get('readyReplicas', 0)}\n"
                        f'requests_total{{namespace="e2e",job="inference",pod="llm-live"}} '
                        f"{KubeStateMetrics.LIVE_RATE * (time.time() - started):.3f}\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def week(start: datetime, minutes: int, controller_port: int) -> tuple[list[CounterFamily], list[GaugeFamily]]:
    """The backfilled week: demand, an HPA at a 100 % target five minutes late, ready two minutes after it, and
    forecast-only decisions with placeholder GPUs four hours a day."""
    minute = np.arange(minutes)
    rng = np.random.default_rng(11)
    demand = 40 + 30 * np.sin(2 * np.pi * minute / 1440) ** 2 + rng.uniform(0, 5, minutes)
    yours = np.clip(np.ceil(np.roll(demand, 5) / PER_REPLICA), 1, 8)
    ready = np.minimum(yours, np.roll(yours, 2))
    ours = np.ceil(demand * 1.1 / PER_REPLICA)
    held = np.where(minute % 1440 < 240, 2.0, 0.0)

    def series(values: np.ndarray) -> Series:
        return Series(values, pd.Timestamp(start), 60)
    controller = {**SCALER, "job": CONTROLLER_JOB, "instance": f"127.0.0.1:{controller_port}"}
    counters = [CounterFamily(name="requests_total", series=series(demand), pods=("llm-week",),
                              labels={"namespace": "e2e", "job": "inference"}, reset_every=None)]
    gauges = [GaugeFamily(name=name, per_series=[({}, series(values))], labels=labels)
              for name, values, labels in (("kube_deployment_spec_replicas", yours, KSM),
                                           ("kube_deployment_status_replicas_ready", ready, KSM),
                                           ("predictive_scaler_desired_replicas", ours, controller),
                                           ("predictive_scaler_planned_placeholder_gpus", held, controller))]
    return counters, gauges


@dataclass(frozen=True)
class Shadow:
    prometheus: str
    #: End of the report's window: the end of the last live minute.
    end: datetime
    controller: ControllerProcess


def _minute(t: float) -> float:
    return math.floor(t / 60) * 60


def scale(api: KubeApiServer, n: int) -> None:
    """What the HPA controller would do: a merge patch of the Deployment's /scale."""
    answer = api.request("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/{MODEL}/scale",
                         body={"spec": {"replicas": n}}, content_type="application/merge-patch+json")
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def shadow(kube_api: KubeApiServer, controller_kubeconfig: Path, recent_demand: RecentDemand, model_store: ModelStore,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shadow]:
    make_target(kube_api, NS, replicas=1)
    kube_api.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {"team": TEAM}}}])
    kube_api.apply([{"apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler",
                     "metadata": {"name": HPA, "namespace": NS},
                     "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": MODEL},
                              "minReplicas": 1, "maxReplicas": 8,
                              "metrics": [{"type": "Resource", "resource": {
                                  "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}}])
    kube_api.apply([scaler_manifest(NS, mode="forecast-only")])
    root = tmp_path_factory.mktemp("shadow")
    controller = start_controller(controller_kubeconfig, recent_demand.url, model_store, root / "controller.log")
    ksm = KubeStateMetrics(kube_api)
    try:
        reconciled(kube_api, NS)
        backfilled_to = _minute(time.time())
        start = datetime.fromtimestamp(backfilled_to, UTC) - WEEK - timedelta(hours=1)
        counters, gauges = week(start, int((backfilled_to - start.timestamp()) // 60), controller.metrics_port)
        backfill(root / "tsdb", root / "work", counters=counters, gauges=gauges, sample_step=60)
        jobs = [{"job_name": job, "scrape_interval": f"{INTERVAL_SECONDS}s", "scrape_timeout": "4s",
                 "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in ((CONTROLLER_JOB, controller.metrics_port), (KSM_JOB, ksm.port))]
        with running_prometheus(root / "tsdb", root / "work", scrape_configs=jobs) as prom:
            live_from = _minute(time.time()) + 60
            for k, n in enumerate(SCHEDULE):
                time.sleep(max(0.0, live_from + 60 * k + 10 - time.time()))
                scale(kube_api, n)  # 10 s into live minute k: its end (a report step) shows n
            end = live_from + 60 * len(SCHEDULE)
            time.sleep(max(0.0, end + 2 * INTERVAL_SECONDS - time.time()))
            assert controller.alive(), controller.log_text()[-3000:]
            yield Shadow(prom.url, datetime.fromtimestamp(end, UTC), controller)
    finally:
        ksm.stop()
        controller.stop()


def shadow_report(api: KubeApiServer, shadow: Shadow, since: str, report: Path | None = None) -> dict[str, Any]:
    exe = Path(sys.executable).with_name("predictive-scaler")
    argv = [str(exe), "shadow-report", "--prometheus", shadow.prometheus, "--scaler", f"{NS}/{MODEL}",
            "--since", since, "--end", shadow.end.isoformat(), f"--kubeconfig={api.admin_kubeconfig}",
            "--no-replay", "--json", *(["--report", str(report)] if report else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def _range(url: str, query: str, start: float, steps: int) -> np.ndarray:
    """The query on the report's grid: step i holds the evaluation at its end (as pull_history)."""
    answer = requests.get(f"{url}/api/v1/query_range", params={
        "query": query, "start": start + 60, "end": start + 60 * steps, "step": 60}, timeout=30).json()
    out = np.full(steps, np.nan)
    for result in answer["data"]["result"]:
        for t, v in result["values"]:
            out[int((float(t) - start) // 60) - 1] = float(v)
    return out


def expected(url: str, start: float, steps: int) -> dict[str, list[float]]:
    """GPU-hours, cost and unmet minutes per side (docs/shadow.md), from the series read back."""
    demand = _range(url, DEMAND, start, steps)
    got = {name: _range(url, q, start, steps) for name, q in Q.items()}
    yours, ready, ours, held = got["yours"], got["ready"], got["ours"], np.nan_to_num(got["held"])
    pod_start_steps = 2  # scaler_manifest: podStartSeconds 120
    out = {"yours": [0.0, 0.0, 0.0], "ours": [0.0, 0.0, 0.0]}
    for i in range(steps):
        if not all(math.isfinite(x[i]) for x in (demand, yours, ready, ours)):
            continue
        ours_ready = min(x for x in ours[max(0, i - pod_start_steps): i + 1] if math.isfinite(x))
        for side, billed, capacity in (("yours", yours[i], ready[i] * PER_REPLICA),
                                       ("ours", ours[i] + held[i], ours_ready * PER_REPLICA)):
            out[side][0] += billed / 60
            out[side][1] += billed * PRICE / 60
            out[side][2] += float(demand[i] > capacity)
    return out


def _assert_totals(doc: dict[str, Any], want: dict[str, list[float]]) -> None:
    for side in ("yours", "ours"):
        got = doc["total"][side]
        assert math.isclose(got["gpu_hours"], want[side][0], rel_tol=1e-9), (side, got, want[side])
        assert math.isclose(got["cost"], want[side][1], rel_tol=1e-9), (side, got, want[side])
        assert got["unmet_minutes"] == want[side][2], (side, got, want[side])


def test_forecast_only_beside_the_hpa_is_allowed_and_never_writes_scale(kube_api: KubeApiServer,
                                                                          shadow: Shadow) -> None:
    obj = get_scaler(kube_api, NS)
    conflict = condition(obj, "ConflictingAutoscaler")
    assert conflict is not None and conflict["status"] == "True" and conflict["reason"] == "ForecastOnly", conflict
    assert f"HorizontalPodAutoscaler {NS}/{HPA}" in conflict["message"], conflict
    ready = condition(obj, "Ready")
    assert ready is not None and ready["reason"] != "Refused", ready
    assert not [e for e in events(kube_api, NS) if e["reason"] == "ConflictingAutoscaler" and e["type"] == "Warning"]
    assert scale_writes(kube_api, NS) == [], "the controller wrote /scale beside the HPA"
    assert replicas(kube_api, NS) == SCHEDULE[-1]  # what the driver, in the HPA controller's place, set last
    mine = [e for e in kube_api.audit(SA_USER) if e.get("objectRef", {}).get("resource") == "namespaces"]
    assert mine and {e["verb"] for e in mine} == {"get"}  # the team label, read with get only
    assert all(e.get("responseStatus", {}).get("code", 200) == 200 for e in mine), mine[:3]


def test_the_report_over_the_week_equals_a_calculation_from_the_same_series(
        kube_api: KubeApiServer, shadow: Shadow, tmp_path: Path) -> None:
    doc = shadow_report(kube_api, shadow, "7d", tmp_path / "report")
    start, steps = pd.Timestamp(doc["start"]).timestamp(), doc["steps_counted"] + doc["steps_left_out"]
    assert steps == 7 * 1440 and start == (shadow.end - WEEK).timestamp()
    assert doc["steps_counted"] >= 7 * 1440 - 5, doc["steps_left_out"]  # backfill and scrape meet
    _assert_totals(doc, expected(shadow.prometheus, start, steps))
    assert doc["total"]["yours"]["unmet_minutes"] > 0 and len(doc["days"]) >= 7
    assert (tmp_path / "report" / "report.html").read_text().count("<table>") >= 2


def test_the_live_minutes_show_the_replicas_the_hpa_side_set(kube_api: KubeApiServer, shadow: Shadow) -> None:
    live = len(SCHEDULE)
    doc = shadow_report(kube_api, shadow, f"{live}m")
    start = pd.Timestamp(doc["start"]).timestamp()
    assert doc["steps_counted"] == live, doc
    # Scraped: kube-state-metrics' view and the controller's own reading of /scale both show the driver's values.
    for query in (Q["yours"], Q["seen"]):
        assert list(_range(shadow.prometheus, query, start, live)) == list(SCHEDULE), query
    yours = doc["total"]["yours"]
    assert math.isclose(yours["gpu_hours"], sum(SCHEDULE) / 60, rel_tol=1e-9), yours
    assert math.isclose(yours["cost"], sum(SCHEDULE) * PRICE / 60, rel_tol=1e-9), yours
    assert yours["unmet_minutes"] == live  # no kubelet: none of those replicas is ever ready
    _assert_totals(doc, expected(shadow.prometheus, start, live))
    ours = _range(shadow.prometheus, Q["ours"], start, live)
    assert np.isfinite(ours).all() and (ours >= 1).all(), ours  # the controller's live decisions, scraped


def test_the_finops_series_carry_the_namespace_team(shadow: Shadow) -> None:
    answer = requests.get(f"{shadow.prometheus}/api/v1/query", params={
        "query": f'predictive_scaler_gpu_hours_billed_total{{namespace="{NS}",scaler="{MODEL}"}}',
        "time": shadow.end.timestamp()}, timeout=10).json()
    teams = {r["metric"].get("team") for r in answer["data"]["result"]}
    assert teams == {TEAM}, answer["data"]["result"]
