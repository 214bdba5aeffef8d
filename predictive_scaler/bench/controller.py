"""Benchmark the controller: CPU of one reconcile, and resident memory with 100 PredictiveScalers.

    python -m predictive_scaler.bench.controller --out backtests/results/controller.md

Run from the repository root: it uses the test stand-ins (a real Prometheus
backfilled by ``tests/support/prometheus.py`` with 14 days of the MongoDB
trace as per-pod counters; the stateful fake Kubernetes API of
``tests/kube/fake_apiserver.py``), so it needs the Debian ``prometheus``
package and the dev dependencies. Every scaler reconciles through
``ControllerService.reconcile`` — the kopf handler's code — with a two-stage
ARIMA model (5-minute step) loaded from a model store.

CPU is measured two ways: ``time.process_time`` (the whole process, which here
also runs the fake API server's threads — a real API server would not charge
us for those) and ``time.thread_time`` of the reconciling thread (the
controller's own work). Prometheus runs in its own process and is not counted.
"""

from __future__ import annotations

import argparse
import importlib
import random
import resource
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

SCALERS = 100
TARGET_CPU_MS = 200.0
TARGET_RSS_MIB = 500.0


def _rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(out: Path, scalers: int = SCALERS) -> dict[str, Any]:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access line per fake API request
    sys.path.insert(0, str(Path.cwd() / "tests"))
    sys.path.insert(0, str(Path.cwd()))
    from pytest_httpserver import HTTPServer
    from support.prometheus import backfill, running_prometheus, standard_history  # type: ignore[import-not-found]

    from predictive_scaler.clock import FakeClock
    from predictive_scaler.controller.service import ControllerService
    from predictive_scaler.controller.settings import ControllerSettings
    from predictive_scaler.forecasting.arima import ArimaForecaster
    from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.kube.retry import RetryPolicy
    from predictive_scaler.sources.prometheus import PrometheusSource
    # Imported by name: the stand-in is test code (mypy checks it with the tests, not with the package).
    fake_apiserver = importlib.import_module("tests.kube.fake_apiserver")

    rss_start = _rss_mib()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        history, counters, gauges = standard_history()
        report = backfill(tmp / "tsdb", tmp / "work", counters=counters, gauges=gauges, sample_step=60)
        grid = history.trace.resample(300)
        train = grid.slice(0, 10 * 288)
        model = ArimaForecaster().fit(train)
        store = ModelStore(tmp / "models")
        names = [f"llm-{i:03d}" for i in range(scalers)]
        for name in names:
            store.publish(name, model, series=name, window=TrainingWindow.of(train))
        start = history.trace.start.to_pydatetime() + timedelta(days=11, hours=7)
        now = datetime.fromtimestamp(int(start.timestamp()) // 300 * 300 + 60, UTC)
        clock = FakeClock(now)
        with running_prometheus(tmp / "tsdb", tmp / "work") as prom:
            server = HTTPServer(host="127.0.0.1", port=0)
            server.start()
            try:
                api = fake_apiserver.FakeApiServer(server)
                query = 'sum(rate(requests_total{namespace="ml",job="inference"}[2m]))'
                uids = {}
                for i, name in enumerate(names):
                    labels = {"app": name}
                    api.add_deployment("ml", name, replicas=4, labels=labels)
                    api.add_gpu_node(f"gpu-{i}", 8)
                    for k in range(4):
                        api.add_pod("ml", f"{name}-x-{k}", labels, node=f"gpu-{i}", gpus=1)
                    spec = {"mode": "scale", "target": {"name": name},
                            "demand": {"kind": "requests", "query": query},
                            "capacity": {"requestsPerReplica": 300.0}, "maxReplicas": 12,
                            "prewarm": {"enabled": i % 2 == 0, "gpusPerNode": 8,
                                        "budget": {"maxGpus": 8, "pricePerGpuHour": 2.0}},
                            "model": {"name": name}}
                    uids[name] = (api.add_scaler("ml", name, spec)["metadata"]["uid"], spec)
                kube = KubeCluster(api.api_client, retry=RetryPolicy(), clock=clock, sleep=clock.advance,
                                   rng=random.Random(1))
                settings = ControllerSettings(prometheus_url=prom.url, model_store=store.root)
                service = ControllerService(settings, kube, PrometheusSource(prom.url, retries=0, clock=clock),
                                            store, clock)
                rss_before = _rss_mib()

                def round_of(label: str) -> dict[str, Any]:
                    cpu: list[float] = []
                    own: list[float] = []
                    wall: list[float] = []
                    for name in names:
                        uid, spec = uids[name]
                        obj = api.get("autoscaling.predictive-scaler.io/v1alpha1", "PredictiveScaler", "ml", name)
                        p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
                        outcome = service.reconcile(name=name, namespace="ml", uid=uid, spec=spec,
                                                    status=(obj or {}).get("status") or {}, generation=1)
                        cpu.append((time.process_time() - p0) * 1000)
                        own.append((time.thread_time() - t0) * 1000)
                        wall.append((time.perf_counter() - w0) * 1000)
                        if outcome.result is None:
                            raise RuntimeError(f"{name}: reconcile refused: {outcome.refused}")
                    return {"label": [label], "process": cpu, "thread": own, "wall": wall}

                rounds = [round_of("first (load + verify model, forecast)")]
                clock.advance(300)
                rounds.append(round_of("new model step (forecast)"))
                clock.advance(60)
                rounds.append(round_of("same model step (cached forecast)"))
                clock.advance(240)
                rounds.append(round_of("new model step (forecast), again"))
                rss_after = _rss_mib()
                maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                status_example = (api.get("autoscaling.predictive-scaler.io/v1alpha1", "PredictiveScaler",
                                          "ml", names[0]) or {}).get("status") or {}
            finally:
                server.stop()
        result = {
            "scalers": scalers, "rounds": rounds, "rss_start": rss_start, "rss_before": rss_before,
            "rss_after": rss_after, "maxrss": maxrss, "backfill": report, "strategy": status_example["strategy"],
        }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(result))
    return result


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "# Controller benchmark",
        "",
        "Generated by `python -m predictive_scaler.bench.controller --out backtests/results/controller.md`.",
        f"{r['scalers']} PredictiveScalers (half with prewarm) reconciled through `ControllerService.reconcile` "
        "(the kopf handler's code) against a real Prometheus 2.42 holding 14 days of "
        "`ms_mongodb_machine01_rps` as per-pod request counters with resets (60 s samples, "
        f"{r['backfill'].samples} samples backfilled) and the stateful fake Kubernetes API "
        "(tests/kube/fake_apiserver.py, in-process). Each scaler serves its own copy of a two-stage ARIMA "
        f"(5-minute step) from the model store. Last strategy seen: {r['strategy']}.",
        "",
        "## CPU of one reconcile (ms)",
        "",
        "`process` = `time.process_time` of the whole process (includes the in-process fake API server's "
        "threads); `thread` = `time.thread_time` of the reconciling thread (the controller's own work); "
        "`wall` includes Prometheus and the API round trips.",
        "",
        "| round | process median | process p95 | thread median | thread p95 | wall median |",
        "|---|---|---|---|---|---|",
    ]
    for rnd in r["rounds"]:
        lines.append(f"| {rnd['label'][0]} | {statistics.median(rnd['process']):.1f} | {_pct(rnd['process'], 0.95):.1f} "
                     f"| {statistics.median(rnd['thread']):.1f} | {_pct(rnd['thread'], 0.95):.1f} "
                     f"| {statistics.median(rnd['wall']):.1f} |")
    forecast_round = r["rounds"][1]
    ok_cpu = statistics.median(forecast_round["process"]) <= TARGET_CPU_MS
    ok_rss = r["rss_after"] <= TARGET_RSS_MIB
    lines += [
        "",
        f"Target: one reconcile with a forecast ≤ {TARGET_CPU_MS:.0f} ms CPU — median "
        f"{statistics.median(forecast_round['process']):.1f} ms (process): **{'met' if ok_cpu else 'NOT met'}**; "
        f"p95 {_pct(forecast_round['process'], 0.95):.1f} ms (process, with the in-process API stand-in, on a "
        f"2-core machine shared with other jobs), {_pct(forecast_round['thread'], 0.95):.1f} ms (controller thread).",
        "",
        "## Resident memory",
        "",
        "| point | RSS (MiB) |",
        "|---|---|",
        f"| interpreter + imports | {r['rss_start']:.0f} |",
        f"| service built, {r['scalers']} scalers created in the fake API | {r['rss_before']:.0f} |",
        f"| after 4 reconcile rounds of {r['scalers']} scalers (models, forecasts, state cached) | {r['rss_after']:.0f} |",
        f"| peak (ru_maxrss) | {r['maxrss']:.0f} |",
        "",
        f"Target: one process with {r['scalers']} scalers ≤ {TARGET_RSS_MIB:.0f} MiB — "
        f"**{'met' if ok_rss else 'NOT met'}** ({r['rss_after']:.0f} MiB, including the in-process fake API "
        "server). Per-scaler model state is the model's parameters (JSON-sized), not statsmodels results.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("backtests/results/controller.md"))
    parser.add_argument("--scalers", type=int, default=SCALERS)
    args = parser.parse_args(argv)
    result = run(args.out, args.scalers)
    print(args.out.read_text())
    return 0 if result["rss_after"] <= TARGET_RSS_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
