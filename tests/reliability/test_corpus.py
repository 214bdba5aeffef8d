"""The bad-input corpus (tests/reliability/corpus/): each file gets a clear error — what is wrong
and what to do (fragments in corpus/expectations.yaml) — and nothing already stored is lost.

- specs/: invalid PredictiveScaler manifests → ConfigError naming the field;
- prometheus/: malformed answers served by the fault proxy to the controller's metrics port →
  SourceError (missing data), never a number;
- traces/: malformed CSV traces → DataError naming the row;
- models/: hostile model files whose manifest hash matches them (an attacker wrote both) →
  refused by load, by promote and by the controller's model port; the serving model still loads,
  the pointer is unchanged, and a pickle payload never runs.
Plus generated cases: wrong series, path traversal in names, an oversize file, a bad hash.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from predictive_scaler.controller.ports import PrometheusMetricsPort, StoreModelPort
from predictive_scaler.errors import ConfigError, DataError, ModelError, ScalerError, SourceError
from predictive_scaler.forecasting.store import (
    MANIFEST_FILE,
    MAX_MODEL_BYTES,
    MODEL_FILE,
    ModelStore,
    load_artifact,
)
from predictive_scaler.series import load_trace
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.reliability.conftest import MODEL
from tests.support.proxy import FaultProxy, Fixed

CORPUS = Path(__file__).parent / "corpus"
EXPECT: dict[str, dict[str, list[str]]] = yaml.safe_load((CORPUS / "expectations.yaml").read_text())
PICKLE_MARKER = Path("/tmp/predictive-scaler-pickle-was-loaded")


def cases(kind: str) -> list[tuple[Path, list[str]]]:
    return [(CORPUS / kind / name, fragments) for name, fragments in sorted(EXPECT[kind].items())]


def ids(kind: str) -> list[str]:
    return sorted(EXPECT[kind])


def assert_says(exc: BaseException, fragments: list[str]) -> None:
    message = str(exc)
    missing = [f for f in fragments if f not in message]
    assert not missing, f"message lacks {missing}: {message}"


@pytest.mark.parametrize("kind", ["specs", "prometheus", "traces", "models"])
def test_every_corpus_file_has_expectations(kind: str) -> None:
    files = {p.name for p in (CORPUS / kind).iterdir()}
    assert files == set(EXPECT[kind]), files ^ set(EXPECT[kind])


def test_the_corpus_is_large_enough() -> None:
    assert sum(len(v) for v in EXPECT.values()) >= 30


# -- specs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, fragments", cases("specs"), ids=ids("specs"))
def test_invalid_spec(path: Path, fragments: list[str]) -> None:
    manifest = yaml.safe_load(path.read_text())
    assert manifest["kind"] == "PredictiveScaler"
    with pytest.raises(ConfigError) as info:
        ScalerSpec.from_dict(manifest["spec"])
    assert_says(info.value, fragments)
    assert info.value.field is not None and info.value.field.startswith("spec")


# -- Prometheus answers ----------------------------------------------------------------------------

@pytest.mark.parametrize("path, fragments", cases("prometheus"), ids=ids("prometheus"))
def test_malformed_prometheus_answer(proxy: FaultProxy, path: Path, fragments: list[str]) -> None:
    status = 400 if "bad-query" in path.name else 200
    proxy.inject(Fixed(status, path.read_bytes()))
    spec = ScalerSpec.from_dict({"target": {"name": "llm"}, "capacity": {"requestsPerReplica": 100},
                                 "demand": {"kind": "requests", "query": "sum(rate(requests_total[2m]))"}})
    port = PrometheusMetricsPort.for_spec(PrometheusSource(proxy.url, retries=0, timeout=5), spec, "ml")
    with pytest.raises(SourceError) as info:
        port.demand_now(datetime(2018, 6, 20, 8, 1, tzinfo=UTC))
    assert_says(info.value, fragments)


# -- traces ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, fragments", cases("traces"), ids=ids("traces"))
def test_malformed_trace(path: Path, fragments: list[str]) -> None:
    with pytest.raises(DataError) as info:
        load_trace(path, min_history=None)
    assert_says(info.value, fragments)


# -- models ------------------------------------------------------------------------------------------

def plant(store: ModelStore, body: bytes, version: str = "29990101T000000Z-0badf00d",
          manifest_changes: dict[str, Any] | None = None) -> Path:
    """A new version holding ``body``, its manifest hash made to match (hostile, not corrupt)."""
    pointer = store.pointer(MODEL)
    assert pointer is not None
    d = store.version_dir(MODEL, version)
    shutil.copytree(store.version_dir(MODEL, pointer.version), d)
    (d / MODEL_FILE).write_bytes(body)
    manifest = json.loads((d / MANIFEST_FILE).read_text())
    manifest["sha256"] = hashlib.sha256(body).hexdigest()
    manifest.update(manifest_changes or {})
    (d / MANIFEST_FILE).write_text(json.dumps(manifest))
    return d


def assert_nothing_lost(store: ModelStore, before: Any) -> None:
    assert store.pointer(MODEL) == before
    assert store.serving(MODEL, expected_series=MODEL).manifest.sha256 == before.sha256


def port_keeps_serving(store: ModelStore, version: str) -> None:
    """The controller's model port, holding the verified model, refuses the new version and keeps it."""
    port = StoreModelPort(store, MODEL, horizon_seconds=1800, quantile=0.95, expected_series=MODEL)
    port.refresh()
    kept = port.version
    assert kept is not None
    good = store.pointer(MODEL)
    assert good is not None
    store._write_pointer(MODEL, type(good)(version, good.sha256, (*good.history, good.version)))
    try:
        port.refresh()
        assert port.version == kept and port.problem is not None and "refused" in port.problem
    finally:
        store._write_pointer(MODEL, good)


@pytest.mark.parametrize("path, fragments", cases("models"), ids=ids("models"))
def test_hostile_model_file(store: ModelStore, path: Path, fragments: list[str]) -> None:
    before = store.pointer(MODEL)
    PICKLE_MARKER.unlink(missing_ok=True)
    d = plant(store, path.read_bytes())
    with pytest.raises(ModelError) as info:
        load_artifact(d)
    assert_says(info.value, fragments)
    with pytest.raises(ModelError):
        store.promote(MODEL, d.name)
    assert_nothing_lost(store, before)
    port_keeps_serving(store, d.name)
    assert not PICKLE_MARKER.exists(), "a pickle payload ran"


def test_bad_hash_is_refused_and_keeps_the_previous(store: ModelStore) -> None:
    before = store.pointer(MODEL)
    d = plant(store, b'{"kind": "persistence", "params": {}}')
    (d / MODEL_FILE).write_bytes(b'{"kind": "persistence", "params": {"x": 1}}')
    with pytest.raises(ModelError, match="sha256 does not match the manifest"):
        store.promote(MODEL, d.name)
    assert_nothing_lost(store, before)


def test_model_for_another_series(store: ModelStore) -> None:
    before = store.pointer(MODEL)
    assert before is not None
    body = (store.version_dir(MODEL, before.version) / MODEL_FILE).read_bytes()
    d = plant(store, body, manifest_changes={"series": "someone-else"})
    with pytest.raises(ModelError) as info:
        load_artifact(d, expected_series=MODEL)
    assert_says(info.value, ["'someone-else'", f"not {MODEL!r}", "retrain"])
    port_keeps_serving(store, d.name)
    assert_nothing_lost(store, before)


def test_oversize_model_file_is_not_read(store: ModelStore) -> None:
    before = store.pointer(MODEL)
    d = plant(store, b"{}")
    with open(d / MODEL_FILE, "r+b") as fh:
        fh.truncate(MAX_MODEL_BYTES + 1)  # sparse: no 50 MB written
    with pytest.raises(ModelError) as info:
        load_artifact(d)
    assert_says(info.value, ["over the", "byte limit", "roll back with"])
    assert_nothing_lost(store, before)


TRAVERSALS = ["../evil", "..", "a/../../b", "/etc/passwd", "models\\..\\x", ".hidden", "", "x" * 300]


@pytest.mark.parametrize("name", TRAVERSALS, ids=[f"name{i}" for i in range(len(TRAVERSALS))])
def test_path_traversal_in_names(store: ModelStore, name: str, tmp_path: Path) -> None:
    before = store.pointer(MODEL)
    outside = sorted(p.name for p in store.root.parent.iterdir())
    good = store.serving(MODEL, expected_series=MODEL)
    for attempt in (lambda: store.publish(name, good.model, series=name, window=good.manifest.window),
                    lambda: store.load(MODEL, name), lambda: store.promote(MODEL, name),
                    lambda: store.version_dir(name, "v1")):
        with pytest.raises(ScalerError) as info:
            attempt()
        assert "name" in str(info.value) or "version" in str(info.value), str(info.value)
    assert sorted(p.name for p in store.root.parent.iterdir()) == outside
    assert_nothing_lost(store, before)


def test_pinned_traversal_version_is_a_model_problem_not_a_crash(store: ModelStore) -> None:
    port = StoreModelPort(store, MODEL, horizon_seconds=1800, quantile=0.95, pinned_version="../../etc",
                          expected_series=MODEL)
    try:
        port.refresh()
    except (ModelError, ConfigError) as exc:  # either is reported; a crash of another kind is not
        assert "version" in str(exc)
    else:
        assert port.version is None and port.problem is not None


def test_prometheus_answer_never_becomes_zero_demand(proxy: FaultProxy) -> None:
    """An empty vector is missing data with a reason, not 0 req/s (the classic scale-to-zero)."""
    proxy.inject(Fixed(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}'))
    spec = ScalerSpec.from_dict({"target": {"name": "llm"}, "capacity": {"requestsPerReplica": 100},
                                 "demand": {"kind": "requests", "query": "sum(rate(requests_total[2m]))"}})
    port = PrometheusMetricsPort.for_spec(PrometheusSource(proxy.url, retries=0, timeout=5), spec, "ml")
    with pytest.raises(SourceError, match="no series"):
        port.demand_now(datetime(2018, 6, 20, 8, 1, tzinfo=UTC) - timedelta(minutes=1))
