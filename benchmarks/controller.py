"""Fleet benchmark of one controller process: N PredictiveScalers on the real API server.

    python -m benchmarks.controller --scalers 100,300,1000 --out backtests/results/controller.md
    make bench-controller SCALERS=100,300,1000

Run from the repository root (it uses the test fixtures): a real kube-apiserver 1.20 with etcd and
kube-controller-manager (``tests/support/kubeapi.py``; binaries from ``scripts/build-kube-apiserver.sh``,
RBAC from ``deploy/``, the controller authenticated as its own ServiceAccount), a real Prometheus
backfilled with 14 days of the MongoDB trace as per-pod counters, and THIS process as the controller:
``ControllerService`` with the watch-fed ``ClusterCache`` (kube/cache.py), every scaler reconciled once
per 60-s period by a pool of 8 worker threads (kopf's ``max_workers``), each with its own two-stage
ARIMA (5-minute step) in the model store. The API server, etcd, the controller-manager and Prometheus
are other processes: their CPU is not counted.

Periods run back to back on the injected clock, which advances 60 s per period: a period's CPU
(``time.process_time`` of this process, all threads, the cache's watch threads included) divided by
60 s is the average number of cores needed to keep every scaler on its period. A scaler "misses its
period" when its reconcile ends more than 60 s (wall) after the period started. The first period after
scalers are added loads and verifies their models; the model step (5 min) is new in the second period
(a fresh forecast for every scaler) and unchanged in the third (forecasts reused). Steady state is one
fresh-forecast period in five.

API requests per period come from the API server's audit log (one entry per request, the
controller's ServiceAccount only), by verb and resource. Pods are created directly in the API
server (no kubelet: they stay Pending on their nodes); requests per period are measured at two
pod counts to show they do not depend on them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

from predictive_scaler.kube.manifests import GROUP, PLURAL, VERSION

PERIOD_SECONDS = 60
WORKERS = 8
NAMESPACE = "ml"
CONTROLLER_SA = "predictive-scaler-controller"
TARGET_CORES = 1.0
TARGET_RSS_MIB = 768.0
QUERY = 'sum(rate(requests_total{namespace="ml",job="inference"}[2m]))'


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class _Api:
    """Admin writes for the set-up (many at once, pooled connections)."""

    def __init__(self, kapi: Any, token: str) -> None:
        self.kapi = kapi
        self.local = threading.local()
        self.token = token

    def _session(self) -> requests.Session:
        if not hasattr(self.local, "s"):
            s = requests.Session()
            s.headers.update({"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            self.local.s = s
        return self.local.s  # type: ignore[no-any-return]

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for _ in range(5):
            answer = self._session().post(self.kapi.url + path, data=json.dumps(body), timeout=60,
                                            verify=str(self.kapi.ca))
            if answer.status_code in (201, 200, 409):
                return dict(answer.json())
            time.sleep(1.0)
        raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text[:300]}")

    def get(self, path: str) -> dict[str, Any]:
        answer = self._session().get(self.kapi.url + path, timeout=120, verify=str(self.kapi.ca))
        if answer.status_code != 200:
            raise RuntimeError(f"GET {path}: {answer.status_code} {answer.text[:300]}")
        return dict(answer.json())

    def patch_status(self, path: str, body: dict[str, Any]) -> None:
        answer = self._session().patch(self.kapi.url + path + "/status", data=json.dumps(body),
                                       headers={"Content-Type": "application/merge-patch+json"}, timeout=60,
                                       verify=str(self.kapi.ca))
        if answer.status_code != 200:
            raise RuntimeError(f"PATCH {path}/status: {answer.status_code} {answer.text[:300]}")

    def many(self, fn: Any, items: Sequence[Any], threads: int = 16) -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, items))


def _node(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{i:04d}", "labels": {"pool": "gpu"}}}


def _filler_pod(i: int, nodes: int) -> dict[str, Any]:
    # Other tenants' pods on the GPU nodes: 1 GPU each on every 4th, none on the rest.
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/app:1"}
    if i % 4 == 0:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"filler-{i:05d}", "namespace": "tenants", "labels": {"app": f"tenant-{i % 50}"}},
            "spec": {"nodeName": f"gpu-{i % nodes:04d}", "containers": [container]}}


def _target(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "server", "image": "registry.invalid/llm:1",
                                                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def _scaler(name: str, i: int) -> dict[str, Any]:

    spec = {"mode": "scale", "target": {"name": name}, "demand": {"kind": "requests", "query": QUERY},
            "capacity": {"requestsPerReplica": 300.0}, "minReplicas": 1, "maxReplicas": 12,
            "prewarm": {"enabled": i % 2 == 0, "gpusPerNode": 8,
                        "budget": {"maxGpus": 8, "pricePerGpuHour": 2.0}},
            "model": {"name": name}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PredictiveScaler",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def _audit_since(path: Path, offset: int, user: str) -> tuple[dict[str, dict[str, Any]], int]:
    """Audit entries of ``user`` after byte ``offset``, one per request (by auditID), and the new offset."""
    seen: dict[str, dict[str, Any]] = {}
    with open(path, "rb") as log:
        log.seek(offset)
        data = log.read()
    end = offset + data.rfind(b"\n") + 1
    for line in data[: end - offset].splitlines():
        if user.encode() not in line:
            continue
        event = json.loads(line)
        if (event.get("user") or {}).get("username") != user:
            continue
        seen.setdefault(event["auditID"], event)
    return seen, end


def _by_verb_resource(events: dict[str, dict[str, Any]]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for event in events.values():
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") or event.get("requestURI", "").split("?")[0]
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        out[f"{event.get('verb')} {resource}"] += 1
    return dict(sorted(out.items()))


def run(out: Path, scaler_counts: Sequence[int], pod_counts: Sequence[int], periods: int,  # noqa: C901, PLR0915
        pods_scalers: int, profile: Path | None = None) -> dict[str, Any]:
    import logging

    logging.getLogger("predictive_scaler").setLevel(logging.WARNING)  # one info line per reconcile otherwise
    sys.path.insert(0, str(Path.cwd() / "tests"))
    sys.path.insert(0, str(Path.cwd()))
    from support.kubeapi import ADMIN_TOKEN, apply_deploy, running_control_plane  # type: ignore[import-not-found]
    from support.prometheus import backfill, running_prometheus, standard_history  # type: ignore[import-not-found]

    from predictive_scaler import crd
    from predictive_scaler.clock import FakeClock
    from predictive_scaler.controller.service import ControllerService
    from predictive_scaler.controller.settings import ControllerSettings
    from predictive_scaler.forecasting.arima import ArimaForecaster
    from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
    from predictive_scaler.kube.cache import PODS, ClusterCache
    from predictive_scaler.kube.client import KubeCluster
    from predictive_scaler.kube.kubeconfig import api_client_from_environment
    from predictive_scaler.sources.prometheus import PrometheusSource
    from tests.deploy.support import OVERLAYS, render  # type: ignore[import-not-found]

    user = f"system:serviceaccount:{crd.CONTROLLER_NAMESPACE}:{CONTROLLER_SA}"
    scaler_api = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
    rss_start = _rss_mib()
    results: list[dict[str, Any]] = []
    setup: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        t0 = time.perf_counter()
        history, counters, gauges = standard_history()
        report = backfill(tmp / "tsdb", tmp / "work", counters=counters, gauges=gauges, sample_step=60)
        grid = history.trace.resample(300)
        train = grid.slice(0, 10 * 288)
        model = ArimaForecaster().fit(train)
        store = ModelStore(tmp / "models")
        names = [f"llm-{i:04d}" for i in range(max(scaler_counts))]
        for name in names:
            store.publish(name, model, series=name, window=TrainingWindow.of(train))
        setup["prometheus_and_models_s"] = time.perf_counter() - t0
        start = history.trace.start.to_pydatetime() + timedelta(days=11, hours=7)
        base = datetime.fromtimestamp(int(start.timestamp()) // 300 * 300 + 60, UTC)
        clock = FakeClock(base)
        with running_prometheus(tmp / "tsdb", tmp / "work") as prom, \
                running_control_plane(tmp / "kube") as kapi:
            t0 = time.perf_counter()
            apply_deploy(kapi, render(OVERLAYS["default"]))
            kubeconfig = kapi.service_account_kubeconfig(crd.CONTROLLER_NAMESPACE, CONTROLLER_SA)
            admin = _Api(kapi, ADMIN_TOKEN)
            for ns in (NAMESPACE, "tenants"):
                admin.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            nodes = max(8, max(pod_counts) // 80)

            def add_node(i: int) -> None:
                admin.post("/api/v1/nodes", _node(i))
                admin.patch_status(f"/api/v1/nodes/gpu-{i:04d}", {"status": {
                    "capacity": {"cpu": "64", "nvidia.com/gpu": "8", "pods": "250"},
                    "allocatable": {"cpu": "63", "nvidia.com/gpu": "8", "pods": "250"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "message": "bench", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})

            admin.many(add_node, range(nodes))
            pods_now = [0]

            def add_pods(total: int) -> None:
                admin.many(lambda i: admin.post("/api/v1/namespaces/tenants/pods", _filler_pod(i, nodes)),
                           range(pods_now[0], total))
                pods_now[0] = total

            add_pods(pod_counts[0])
            setup["cluster_s"] = time.perf_counter() - t0

            kube = KubeCluster(api_client_from_environment(str(kubeconfig)), clock=clock, sleep=time.sleep,
                               rng=random.Random(1))
            cache = ClusterCache(KubeCluster(api_client_from_environment(str(kubeconfig))), namespace=None).start()
            if not cache.wait_synced(120):
                raise RuntimeError(f"the cluster cache did not sync: {cache.stale_for()}")
            settings = ControllerSettings(prometheus_url=prom.url, model_store=store.root)
            service = ControllerService(settings, kube, PrometheusSource(prom.url, retries=0, clock=clock), store,
                                        clock, cache=cache)
            audit = kapi.root / "audit.log"
            created = 0

            def period(label: str, active: Sequence[str], uids: dict[str, str], pods: int) -> dict[str, Any]:
                # What kopf's watch hands each handler: the objects, read here before the clock starts.
                listed = admin.get(scaler_api + "?limit=5000")
                objects = {o["metadata"]["name"]: o for o in listed["items"]}
                offset = audit.stat().st_size
                load0 = os.getloadavg()[0]
                cpu0, wall0 = time.process_time(), time.perf_counter()
                started_at = datetime.now(UTC)
                own: list[float] = []
                ends: list[float] = []
                refused: list[str] = []

                def one(name: str) -> None:
                    obj = objects[name]
                    t = time.thread_time()
                    outcome = service.reconcile(name=name, namespace=NAMESPACE, uid=uids[name], spec=obj["spec"],
                                                status=obj.get("status") or {}, generation=1)
                    own.append((time.thread_time() - t) * 1000)
                    ends.append(time.perf_counter() - wall0)
                    if outcome.result is None:
                        refused.append(f"{name}: {outcome.refused}")

                if profile is not None:
                    # One thread under cProfile (it follows only the thread that enables it).
                    import cProfile

                    profiler = cProfile.Profile(time.thread_time)
                    profiler.enable()
                    for name in active:
                        one(name)
                    profiler.disable()
                    profile.parent.mkdir(parents=True, exist_ok=True)
                    profiler.dump_stats(str(profile.with_suffix(f".{len(active)}.{label.split()[0]}.prof")))
                else:
                    with ThreadPoolExecutor(WORKERS) as pool:
                        list(pool.map(one, active))
                cpu = time.process_time() - cpu0
                wall = time.perf_counter() - wall0
                events, _ = _audit_since(audit, offset, user)
                patches = []
                for e in events.values():
                    ref = e.get("objectRef") or {}
                    if e.get("verb") == "patch" and ref.get("subresource") == "scale":
                        at = datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00"))
                        patches.append((at - started_at).total_seconds())
                clock.advance(PERIOD_SECONDS)
                return {"label": label, "scalers": len(active), "pods": pods, "cpu_s": cpu, "wall_s": wall,
                        "own_ms": own, "missed": sum(1 for e in ends if e > PERIOD_SECONDS),
                        "requests": _by_verb_resource(events), "requests_total": len(events),
                        "patch_latency_s": patches, "refused": refused[:5], "rss_mib": _rss_mib(),
                        "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}

            uids: dict[str, str] = {}
            labels = ["first (load + verify models, forecast)", "new model step (fresh forecasts)",
                      "same model step (forecasts reused)"]
            for n in sorted(scaler_counts):
                t0 = time.perf_counter()
                new = names[created:n]
                admin.many(lambda name: admin.post(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
                                                   _target(name)), new)
                for name, obj in zip(new, _posted(admin, scaler_api, new), strict=True):
                    uids[name] = obj["metadata"]["uid"]
                created = n
                setup[f"create_{n}_s"] = time.perf_counter() - t0
                # Align: period 1 of this N is one minute into a model step, period 2 a new step, 3 the same.
                clock.set(base + timedelta(seconds=((clock.now() - base).total_seconds() // 300 + 1) * 300))
                rows = []
                for p in range(periods):
                    if p == 1:
                        clock.advance(240)  # to the next model step: fresh forecasts
                    rows.append(period(labels[min(p, 2)], names[:n], uids, pods_now[0]))
                results.append({"scalers": n, "pods": pods_now[0], "periods": rows})
            for pods in pod_counts[1:]:
                t0 = time.perf_counter()
                add_pods(pods)
                setup[f"pods_{pods}_s"] = time.perf_counter() - t0
                deadline = time.monotonic() + 300
                while cache.sizes()[PODS] < pods and time.monotonic() < deadline:
                    time.sleep(0.5)
                clock.set(base + timedelta(seconds=((clock.now() - base).total_seconds() // 300 + 1) * 300))
                n = min(pods_scalers, created)
                rows = []
                for p in range(periods):
                    if p == 1:
                        clock.advance(240)
                    rows.append(period(labels[min(p, 2)], names[:n], uids, pods_now[0]))
                results.append({"scalers": n, "pods": pods_now[0], "periods": rows})
            cache_sizes = cache.sizes()
            cache_health = {name: {"lists": r.lists, "watches": r.watches, "relists_after_error": r.relists_after_error,
                                   "last_error": r.last_error} for name, r in cache.reflectors.items()}
            cache.stop()
    result = {"results": results, "setup": setup, "rss_start": rss_start, "backfill_samples": report.samples,
              "cache_sizes": cache_sizes, "cache_health": cache_health, "machine": _machine(), "date": datetime.now(UTC).strftime("%Y-%m-%d"),
              "api_server": "kube-apiserver 1.20.2 (tests/support/kubeapi.py), real"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    out.write_text(markdown(result))
    return result


def _posted(admin: _Api, scaler_api: str, names: Sequence[str]) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda pair: admin.post(scaler_api, _scaler(pair[1], pair[0])),
                             [(int(n.rsplit("-", 1)[1]), n) for n in names]))


def _machine() -> str:
    import platform

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores ({model}), shared with other jobs; Python {platform.python_version()}"


def steady_state(rows: Sequence[dict[str, Any]]) -> float | None:
    """CPU seconds per period in steady state: one fresh-forecast period in five (5-min step, 60-s period)."""
    fresh = [r["cpu_s"] for r in rows if r["label"].startswith("new model step")]
    reused = [r["cpu_s"] for r in rows if r["label"].startswith("same model step")]
    if not fresh or not reused:
        return None
    return (fresh[0] + 4 * reused[0]) / 5


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "# Controller fleet benchmark",
        "",
        "Generated by `make bench-controller SCALERS=…` (`python -m benchmarks.controller`); "
        f"raw figures in `controller.json`. {r['date']}, {r['machine']}.",
        "",
        f"API server: {r['api_server']} with etcd and kube-controller-manager, RBAC from deploy/, the controller "
        "as its ServiceAccount. Prometheus 2.42 with 14 days of `ms_mongodb_machine01_rps` as per-pod counters "
        f"({r['backfill_samples']} samples). One controller process (this one): `ControllerService` + the "
        f"watch-fed cluster cache, {WORKERS} worker threads, a {PERIOD_SECONDS}-s period, a two-stage ARIMA "
        "(5-minute step) per scaler, half of them prewarming. The API server, etcd, controller-manager and "
        "Prometheus run in other processes and are not counted. Periods run back to back on the injected "
        "clock; *cores* = CPU seconds of the period / 60 s. Pods are created directly (no kubelet).",
        "",
        "*Load* is the machine's 1-minute load average at the period's start / end (2 cores shared with other "
        "jobs, the API server, etcd and Prometheus included): with more than 2 runnable tasks the controller "
        "waits for a core, so wall time (and *missed*) includes that wait while *CPU s* does not.",
        "",
        "| scalers | pods | period | CPU s (process) | cores | own ms/reconcile median | p95 | wall s | missed | "
        "API requests | scale PATCH latency p50 / max s | RSS MiB | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for block in r["results"]:
        for row in block["periods"]:
            lat = row["patch_latency_s"]
            lat_s = f"{statistics.median(lat):.1f} / {max(lat):.1f}" if lat else "— (no PATCH)"
            lines.append(
                f"| {block['scalers']} | {block['pods']} | {row['label']} | {row['cpu_s']:.1f} | "
                f"{row['cpu_s'] / PERIOD_SECONDS:.2f} | {statistics.median(row['own_ms']):.1f} | "
                f"{_pct(row['own_ms'], 0.95):.1f} | {row['wall_s']:.1f} | {row['missed']} | "
                f"{row['requests_total']} | {lat_s} | {row['rss_mib']:.0f} | {_load(row)} |")
    late = [(block, row) for block in r["results"] for row in block["periods"] if row["missed"]]
    if late:
        lines += ["", "Periods with late scalers:"]
        for block, row in late:
            why = ("CPU s < 60: the process needed less than one core but waited for one (load "
                   f"{_load(row)} on 2 cores)" if row["cpu_s"] < PERIOD_SECONDS else
                   "CPU s ≥ 60: more than one core of work")
            lines.append(f"- {block['scalers']} scalers, {block['pods']} pods, {row['label']}: {row['missed']} "
                         f"late, wall {row['wall_s']:.0f} s, CPU {row['cpu_s']:.0f} s — {why}")
    lines += ["", "## Steady state (one fresh-forecast period in five)", "",
              "| scalers | pods | CPU s / period | cores | API requests / period (reused-forecast period) | "
              "per scaler | peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    for block in r["results"]:
        ss = steady_state(block["periods"])
        reused = [row for row in block["periods"] if row["label"].startswith("same model step")]
        req = reused[0]["requests_total"] if reused else None
        rss = max(row["rss_mib"] for row in block["periods"])
        n = block["scalers"]
        ss_s = "—" if ss is None else f"{ss:.1f}"
        cores = "—" if ss is None else f"{ss / PERIOD_SECONDS:.2f}"
        per = "—" if req is None else f"{req / n:.2f}"
        lines.append(f"| {n} | {block['pods']} | {ss_s} | {cores} | {req} | {per} | {rss:.0f} |")
    lines += ["", "## API requests per period by verb and resource (reused-forecast period)", ""]
    for block in r["results"]:
        reused = [row for row in block["periods"] if row["label"].startswith("same model step")]
        if reused:
            pairs = ", ".join(f"{k}: {v}" for k, v in reused[0]["requests"].items())
            lines.append(f"- {block['scalers']} scalers, {block['pods']} pods: {pairs}")
    lines += ["", f"Set-up times (s): {json.dumps({k: round(v, 1) for k, v in r['setup'].items()})}. "
              f"Cache at the end: {r['cache_sizes']}.", ""]
    return "\n".join(lines)


def _load(row: dict[str, Any]) -> str:
    load = row.get("load")
    return "—" if not load else f"{load[0]:.1f} / {load[1]:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("backtests/results/controller.md"))
    parser.add_argument("--scalers", default="100,300,1000", help="comma-separated scaler counts")
    parser.add_argument("--pods", default="2000,20000", help="comma-separated pod counts (the first for all N)")
    parser.add_argument("--pods-scalers", type=int, default=1000,
                        help="scalers reconciled at the later pod counts (≤ the largest --scalers)")
    parser.add_argument("--periods", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None,
                        help="run each period in one thread under cProfile, stats to PROFILE.<N>.<period>.prof")
    args = parser.parse_args(argv)
    scalers = [int(x) for x in args.scalers.split(",") if x]
    pods = [int(x) for x in args.pods.split(",") if x]
    run(args.out, scalers, pods, args.periods, args.pods_scalers, args.profile)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
