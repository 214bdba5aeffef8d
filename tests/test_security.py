"""Security checks: RBAC against what is really called, no pickle anywhere, models verified before parsing.

1. RBAC — every request a realistic controller run makes on the fake API server (scale,
   placeholders, Events, status, conflicting-autoscaler lists) and every request kopf itself
   makes with the settings ``handlers.configure`` applies (list/watch the custom resource, patch
   it and its status, post Events; standalone: no peering objects, no Leases; scanning off: no
   CRD watch) is granted by deploy/base/rbac-controller.yaml; nothing touches Secrets.
2. No pickle — no module of the package imports pickle-like libraries or calls a pickle loader
   (AST scan), and loading + forecasting with stored models works with pickle disabled.
3. Verified before parsing — a model file whose hash does not match its manifest is never handed
   to ``json.loads``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import pickle
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kopf
import numpy as np
import pandas as pd
import pytest
import yaml
from pytest_httpserver import HTTPServer

import predictive_scaler
from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.handlers import configure
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting import store as store_module
from predictive_scaler.forecasting.baselines import (
    HoltWintersForecaster,
    PersistenceForecaster,
    SeasonalNaiveForecaster,
)
from predictive_scaler.forecasting.store import MODEL_FILE, ModelStore, TrainingWindow
from predictive_scaler.kube import api_calls, discovery, manifests
from predictive_scaler.kube.api_calls import api_call_for
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.manifests import GROUP, KIND, PLURAL
from predictive_scaler.kube.placeholders import PlaceholderSpec
from predictive_scaler.kube.retry import RetryPolicy
from predictive_scaler.series import Series
from predictive_scaler.sources.prometheus import PrometheusSource
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeMetrics

ROOT = Path(__file__).resolve().parents[1]
RBAC = ROOT / "deploy" / "base" / "rbac-controller.yaml"
PACKAGE = Path(predictive_scaler.__file__).parent
START = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
NS, TARGET = "ml", "llm"

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)


def granted() -> set[Permission]:
    out: set[Permission] = set()
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc and doc.get("kind") in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                for g in rule.get("apiGroups", ()):
                    for r in rule.get("resources", ()):
                        for v in rule.get("verbs", ()):
                            out.add((g, r, v))
    return out


def permission_for(method: str, path: str) -> Permission | None:
    """The RBAC permission a request needs (None: a discovery path, granted to everyone)."""
    call = api_call_for(method, path)
    assert call is not None, f"{method} {path} is not in kube/api_calls.API_CALLS"
    if not call.resource:
        return None
    parts = [p for p in path.split("/") if p]
    group = "" if parts[0] == "api" else parts[1]
    resource = call.resource
    if "{plural}" in resource:
        plural = parts[parts.index("namespaces") + 2]
        resource = resource.replace("{plural}", plural)
    return group, resource, call.verb


# -- a realistic run, recorded -----------------------------------------------------------------------

def history() -> Series:
    t = np.arange(3 * 288)
    return Series(40 * (1 + 0.3 * np.sin(2 * np.pi * t / 288)), pd.Timestamp(START - timedelta(days=3)), 300,
                  name=TARGET)


@pytest.fixture
def recorded(httpserver: HTTPServer, tmp_path: Path) -> Iterator[FakeApiServer]:
    """Thirty periods of a scaling scaler (HPA refusal at 20), then the placeholder life cycle."""
    with FakeApiServer(httpserver, keda_installed=True) as api:
        store = ModelStore(tmp_path / "models")
        h = history()
        store.publish(TARGET, PersistenceForecaster().fit(h), series=TARGET, window=TrainingWindow.of(h))
        clock = FakeClock(START)
        kube = KubeCluster(api.api_client, retry=RetryPolicy(), clock=clock, sleep=clock.advance,
                           rng=random.Random(1), request_timeout=5.0)
        # The history's daily wave, continued: rising from START, so the forecast asks for prewarming.
        metrics = FakeMetrics(lambda t: 40 * (1 + 0.3 * np.sin(2 * np.pi * (t - START).total_seconds() / 86400)))
        settings = ControllerSettings(prometheus_url="http://127.0.0.1:9", model_store=store.root)
        service = ControllerService(settings, kube, PrometheusSource("http://127.0.0.1:9", retries=0), store, clock,
                                    metrics_factory=lambda spec, ref: metrics)
        api.add_deployment(NS, TARGET, replicas=2, labels={"app": TARGET})
        api.add_gpu_node("gpu-0", 2)  # full: prewarming needs new nodes, hence placeholders
        for i in range(2):
            api.add_pod(NS, f"{TARGET}-{i}", {"app": TARGET}, node="gpu-0", gpus=1)
        spec = {"mode": "scale", "target": {"name": TARGET}, "demand": {"kind": "requests", "query": "q"},
                "capacity": {"requestsPerReplica": 10}, "maxReplicas": 12, "model": {"name": TARGET},
                "leadTimes": {"nodeStartSeconds": 1500},
                "prewarm": {"enabled": True, "gpusPerNode": 2, "budget": {"maxGpus": 4}}}
        obj = api.add_scaler(NS, TARGET, spec)
        service.seed_budget()
        for i in range(30):
            clock.set(START + timedelta(minutes=i))
            if i == 20:
                api.add_hpa(NS, "other", "Deployment", TARGET)  # a conflict: refused, placeholder removed
            current = api.get(obj["apiVersion"], obj["kind"], NS, TARGET)
            assert current is not None
            service.reconcile(name=TARGET, namespace=NS, uid=current["metadata"]["uid"], spec=current["spec"],
                              status=current.get("status") or {}, annotations={})
        # The placeholder's life cycle as the cluster port drives it: create, resize, re-template, delete.
        uid = obj["metadata"]["uid"]
        kube.ensure_placeholder(PlaceholderSpec(TARGET, NS, uid, gpus_per_pod=1), 2)
        kube.ensure_placeholder(PlaceholderSpec(TARGET, NS, uid, gpus_per_pod=1), 1)
        kube.ensure_placeholder(PlaceholderSpec(TARGET, NS, uid, gpus_per_pod=2), 1)
        kube.delete_placeholder(TARGET, NS)
        yield api


def kopf_needs() -> set[Permission]:
    """What kopf does with the settings ``configure`` applies (and nothing it would do otherwise)."""
    settings = kopf.OperatorSettings()
    configure(settings, service=None)  # type: ignore[arg-type]
    assert settings.peering.standalone, "peering would need kopf.dev peering objects"
    assert settings.scanning.disabled, "scanning would list/watch customresourcedefinitions"
    assert isinstance(settings.persistence.progress_storage, kopf.StatusProgressStorage)
    needs = {
        (GROUP, PLURAL, "list"), (GROUP, PLURAL, "watch"),  # the watch
        (GROUP, PLURAL, "patch"),  # last-handled-configuration annotation
        (GROUP, f"{PLURAL}/status", "patch"),  # status.kopf.progress
    }
    if settings.posting.enabled:
        needs.add(("", "events", "create"))  # kopf's own Warning/Error Events
    return needs


def test_every_call_of_a_real_run_is_granted(recorded: FakeApiServer) -> None:
    have = granted()
    used = {p for r in recorded.requests if (p := permission_for(r.method, r.path)) is not None}
    writes = {(r.method, r.path.rsplit("/", 1)[-1]) for r in recorded.writes()}
    # The run exercised the writes that matter: scale, placeholder create/resize/delete, Events, status.
    assert ("PATCH", "scale") in writes and ("POST", "events") in writes and ("PATCH", "status") in writes
    assert any(m == "POST" and p == "deployments" for m, p in writes), sorted(writes)
    assert any(m == "DELETE" for m, _ in writes) and any(m == "PUT" for m, _ in writes), sorted(writes)
    missing = used - have
    assert not missing, f"called but not granted: {sorted(missing)}"


def test_kopf_own_calls_are_granted() -> None:
    missing = kopf_needs() - granted()
    assert not missing, f"kopf needs but is not granted: {sorted(missing)}"


@pytest.mark.kubectl
def test_nothing_granted_beyond_the_calls_and_kopf() -> None:
    # Imported here: importing test_rbac renders deploy/ with kubectl.
    from tests.deploy.test_rbac import admission_needs

    # Everything the adapter can call (API_CALLS, templated /scale for the built-in kinds) plus kopf,
    # plus what admission asks for (update on the finalizers: the placeholder's blockOwnerDeletion).
    possible: set[Permission] = set(kopf_needs()) | set(admission_needs())
    for call in api_calls.API_CALLS:
        if not call.resource:
            continue
        if "{plural}" in call.resource:
            for (group, _kind), plural in discovery.BUILTIN_SCALABLE.items():
                if (group == "") == call.path.startswith("/api/v1/"):
                    possible.add((group, call.resource.replace("{plural}", plural), call.verb))
        else:
            possible.add((call.group, call.resource, call.verb))
    extra = granted() - possible
    assert not extra, f"granted but never called: {sorted(extra)}"


def test_no_secrets_no_wildcards_and_leases_only_for_shards() -> None:
    for group, resource, verb in granted():
        assert resource not in ("secrets", "customresourcedefinitions"), resource
        # A namespace's labels name its team (--team-label): read one by name, never list, watch or write.
        assert resource != "namespaces" or verb == "get", (resource, verb)
        assert "*" not in (group, resource, verb)
        assert group not in ("kopf.dev", "zalando.org")
        if resource == "leases":  # the shard fence (controller/shards.py): never delete, never kopf's peering
            assert (group, verb) in {("coordination.k8s.io", v) for v in ("list", "create", "update")}, verb
    assert not any("secret" in c.path.lower() for c in api_calls.API_CALLS)
    assert all(c.why.startswith("sharding") for c in api_calls.API_CALLS if "lease" in c.path.lower())


def test_the_placeholder_owner_reference_is_the_scaler() -> None:
    body = manifests.placeholder_deployment(TARGET, NS, "uid-1", 1, 1, "pc", "img", {}, [])
    (owner,) = body["metadata"]["ownerReferences"]
    assert owner["kind"] == KIND and owner["uid"] == "uid-1"


# -- no pickle -----------------------------------------------------------------------------------------

PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "joblib", "cloudpickle", "shelve", "marshal"}
PICKLE_CALLS = {"load_pickle", "read_pickle", "loads", "load", "Unpickler"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_pickle_in_the_package(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
            assert not names & PICKLE_MODULES, f"{path}:{node.lineno} imports {names & PICKLE_MODULES}"
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            assert mod not in PICKLE_MODULES, f"{path}:{node.lineno} imports from {mod}"
            assert "smpickle" not in (node.module or ""), f"{path}:{node.lineno} statsmodels pickle loader"
            assert not {a.name for a in node.names} & {"load_pickle", "read_pickle"}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            assert attr not in ("load_pickle", "read_pickle"), f"{path}:{node.lineno} .{attr}()"
            # statsmodels results/models .load() unpickles; numpy .load(allow_pickle=True) may.
            if attr == "load" and owner_name not in ("json", "yaml"):
                kwargs = {k.arg: k.value for k in node.keywords}
                assert owner_name != "sm" and "allow_pickle" not in kwargs, f"{path}:{node.lineno} {owner_name}.load"
                assert owner_name not in ("np", "numpy", "torch"), f"{path}:{node.lineno} {owner_name}.load"
            if attr in PICKLE_CALLS and owner_name in PICKLE_MODULES:
                pytest.fail(f"{path}:{node.lineno} {owner_name}.{attr}()")


def test_models_load_and_forecast_with_pickle_disabled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    h = history()
    names = []
    for forecaster in (PersistenceForecaster(), SeasonalNaiveForecaster(), HoltWintersForecaster()):
        name = f"m-{forecaster.kind}"
        store.publish(name, forecaster.fit(h), series=name, window=TrainingWindow.of(h))
        names.append(name)

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("pickle was used")

    # From here on (what the controller does: verify, load, forecast) any unpickling fails the test.
    for name in ("load", "loads"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(pd, "read_pickle", refuse)
    for name in names:
        loaded = store.serving(name, expected_series=name)
        f = loaded.model.forecast(h, 6, (0.5, 0.95))
        assert np.isfinite(f.values).all()


# -- verified before parsing -------------------------------------------------------------------------

def test_a_model_with_a_bad_hash_is_never_parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    h = history()
    version = store.publish(TARGET, PersistenceForecaster().fit(h), series=TARGET, window=TrainingWindow.of(h))
    path = store.version_dir(TARGET, version) / MODEL_FILE
    doc = json.loads(path.read_bytes())
    doc["params"]["window"] = 1  # valid JSON, different bytes: the hash no longer matches
    tampered = json.dumps(doc)
    path.write_text(tampered)
    parsed: list[str] = []

    class CountingJson:
        dumps = staticmethod(json.dumps)
        JSONDecodeError = json.JSONDecodeError

        @staticmethod
        def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
            parsed.append(text if isinstance(text, str) else bytes(text).decode("utf-8", "replace"))
            return json.loads(text, *args, **kwargs)

    monkeypatch.setattr(store_module, "json", CountingJson)
    with pytest.raises(ModelError, match="sha256"):
        store.load(TARGET, version)
    assert parsed, "the manifest is parsed (it holds the hash)"
    assert tampered not in parsed, "the model file was parsed before its hash was checked"
    assert hashlib.sha256(tampered.encode()).hexdigest() not in " ".join(parsed)
