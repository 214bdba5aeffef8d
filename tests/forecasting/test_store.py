"""Model artifacts and the model store: round trips, every refusal with its message, crash safety."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.core.values import Forecast
from predictive_scaler.errors import ConfigError, ModelError, StoreError
from predictive_scaler.forecasting import registry, store
from predictive_scaler.forecasting.base import FittedModel, check_quantiles
from predictive_scaler.forecasting.prophet import ERROR_PROBABILITIES, ProphetCurve, ProphetModel
from predictive_scaler.forecasting.store import (
    FORMAT_VERSION,
    ModelStore,
    TrainingWindow,
    load_artifact,
    save_artifact,
)
from predictive_scaler.series import Series

START = pd.Timestamp("2024-03-01T00:00:00Z")


@dataclass(frozen=True)
class TinyModel(FittedModel):
    """A test-local model kind: the last value times a factor per quantile."""

    kind: ClassVar[str] = "tiny"
    step_seconds: int
    factor: float

    def forecast(self, recent: Series, horizon_steps: int, quantiles: Sequence[float]) -> Forecast:
        qs = check_quantiles(quantiles)
        last = float(recent.values[-1])
        vals = np.array([[last * (1 + self.factor * q)] * horizon_steps for q in qs])
        return Forecast(recent.last_time, self.step_seconds, qs, vals, self.kind)

    def to_params(self) -> dict[str, Any]:
        return {"step_seconds": self.step_seconds, "factor": self.factor}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TinyModel:
        if not isinstance(params.get("factor"), float):
            raise ModelError("tiny: factor must be a float")
        return cls(step_seconds=int(params["step_seconds"]), factor=params["factor"])


@pytest.fixture(autouse=True)
def tiny_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._KINDS, "tiny", (TinyModel.__module__, "", "TinyModel"))


def recent() -> Series:
    return Series(values=np.linspace(10, 20, 12), start=START, step_seconds=300, name="web")


WINDOW = TrainingWindow(START - pd.Timedelta(days=14), START, 300)


def hand_built_prophet() -> ProphetModel:
    curve = ProphetCurve(
        start_epoch=(START - pd.Timedelta(days=14)).timestamp(), t_scale_seconds=14 * 86400.0,
        y_scale=5.0, k=0.01, m=0.6, changepoints_t=np.array([0.3, 0.6]), deltas=np.array([0.002, -0.001]),
        seasonalities=((7.0, 1, np.array([0.01, -0.02])), (1.0, 2, np.array([0.1, 0.05, -0.03, 0.02]))),
    )
    spread = np.linspace(-0.3, 0.3, len(ERROR_PROBABILITIES))
    table = np.array([[spread * (1 + h / 10) * (1.5 - b / 4) for h in range(6)] for b in range(2)])
    return ProphetModel(step_seconds=300, curve=curve, phi=0.4, theta=-0.8, level_edges=(3.0,),
                        error_quantiles=table,
                        max_gap_steps=12, warmup_steps=24)


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    d = tmp_path / "artifact"
    save_artifact(TinyModel(300, 0.5), series="web", window=WINDOW,
                  metrics={"30m": {"coverage": 0.95, "mape": float("nan")}}, directory=d,
                  clock=FakeClock(datetime(2024, 3, 2, tzinfo=UTC)))
    return d


# -- artifacts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [TinyModel(300, 0.5), hand_built_prophet()], ids=["tiny", "prophet"])
def test_round_trip_gives_identical_forecasts(tmp_path: Path, model: FittedModel) -> None:
    save_artifact(model, series="web", window=WINDOW, directory=tmp_path)
    loaded = load_artifact(tmp_path, expected_series="web")
    a = model.forecast(recent(), 6, (0.5, 0.95))
    b = loaded.model.forecast(recent(), 6, (0.5, 0.95))
    np.testing.assert_array_equal(a.values, b.values)
    assert loaded.manifest.kind == model.kind


def test_manifest_describes_the_artifact(artifact: Path) -> None:
    doc = json.loads((artifact / "manifest.json").read_text())
    assert doc["format_version"] == FORMAT_VERSION
    assert doc["sha256"] == hashlib.sha256((artifact / "model.json").read_bytes()).hexdigest()
    assert doc["series"] == "web"
    assert doc["window"] == {"start": "2024-02-16T00:00:00Z", "end": "2024-03-01T00:00:00Z", "step_seconds": 300}
    assert set(doc["libraries"]) >= {"predictive_scaler", "statsmodels", "prophet", "numpy", "pandas"}
    assert doc["metrics"]["30m"] == {"coverage": 0.95, "mape": None}  # undefined → null, never NaN
    assert doc["created_at"] == "2024-03-02T00:00:00Z"


def test_non_finite_parameters_are_not_saved(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="non-finite"):
        save_artifact(TinyModel(300, float("nan")), series="web", window=WINDOW, directory=tmp_path)
    assert not (tmp_path / "manifest.json").exists()


PICKLE_BYTES = b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."


def _rewrite_model(body: bytes, *, fix_hash: bool = True) -> Callable[[Path], None]:
    """Replace model.json; with fix_hash the manifest is made to match (a forged but consistent artifact)."""

    def apply(d: Path) -> None:
        (d / "model.json").write_bytes(body)
        if fix_hash:
            _edit_manifest(sha256=hashlib.sha256(body).hexdigest(), size_bytes=len(body))(d)

    return apply


def _edit_manifest(**changes: Any) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        doc = json.loads((d / "manifest.json").read_text())
        doc.update(changes)
        (d / "manifest.json").write_text(json.dumps(doc))

    return apply


def _flip_byte(d: Path) -> None:
    body = (d / "model.json").read_text().replace("0.5", "0.7")
    (d / "model.json").write_text(body)


REFUSALS: list[tuple[str, Callable[[Path], object], str]] = [
    ("hash-mismatch", _flip_byte, "sha256 does not match the manifest"),
    ("unknown-format", _edit_manifest(format_version=99), "unknown artifact format version 99"),
    ("nan-params", _rewrite_model(b'{"kind":"tiny","params":{"factor":NaN,"step_seconds":300}}'), "non-finite number NaN"),
    ("infinity-params", _rewrite_model(b'{"kind":"tiny","params":{"factor":Infinity,"step_seconds":300}}'), "non-finite number Infinity"),
    ("overflow-params", _rewrite_model(b'{"kind":"tiny","params":{"factor":1e999,"step_seconds":300}}'), "non-finite number 1e999"),
    ("not-json", _rewrite_model(b"factor = 0.5\n"), "not JSON"),
    ("pickle", _rewrite_model(PICKLE_BYTES), "not JSON — the bytes look like a Python pickle"),
    ("truncated", _rewrite_model(b'{"kind":"tiny","params":{"factor":0.'), "not JSON or truncated"),
    ("not-utf8", _rewrite_model(b"\xff\xfe{}"), "not UTF-8"),
    ("kind-mismatch", _rewrite_model(b'{"kind":"prophet","params":{}}'), "differs from the manifest"),
    ("bad-params", _rewrite_model(b'{"kind":"tiny","params":{"factor":"x","step_seconds":300}}'), "tiny: factor must be a float"),
    ("manifest-missing", lambda d: (d / "manifest.json").unlink(), "manifest file missing"),
    ("model-missing", lambda d: (d / "model.json").unlink(), "model file missing"),
    ("manifest-not-json", lambda d: (d / "manifest.json").write_bytes(PICKLE_BYTES), "pickle"),
    ("manifest-no-sha", _edit_manifest(sha256="abc"), "sha256 is not a hex digest"),
    ("manifest-bad-time", _edit_manifest(created_at="yesterday"), "created_at 'yesterday' is not an ISO-8601"),
]


@pytest.mark.parametrize(("damage", "message"), [(d, m) for _, d, m in REFUSALS], ids=[i for i, _, _ in REFUSALS])
def test_load_refuses_bad_artifacts(artifact: Path, damage: Callable[[Path], object], message: str) -> None:
    load_artifact(artifact)  # sound before the damage
    damage(artifact)
    with pytest.raises(ModelError, match=message) as info:
        load_artifact(artifact)
    # Every refusal tells the operator what to do next.
    assert "predictive-scaler" in str(info.value) or "upgrade" in str(info.value)


def test_refuses_artifact_for_another_series(artifact: Path) -> None:
    with pytest.raises(ModelError, match="trained for series 'web', not 'checkout'"):
        load_artifact(artifact, expected_series="checkout")


def test_refuses_oversize_model_before_reading(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "MAX_MODEL_BYTES", 16)
    with pytest.raises(ModelError, match="over the 16-byte limit"):
        load_artifact(artifact)


def test_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no model artifact here"):
        load_artifact(tmp_path / "nope")


# -- the store ---------------------------------------------------------------------------------

@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2024, 3, 2, tzinfo=UTC))


@pytest.fixture
def model_store(tmp_path: Path, clock: FakeClock) -> ModelStore:
    return ModelStore(tmp_path / "store", keep=3, clock=clock)


def publish(s: ModelStore, clock: FakeClock, factor: float, **kw: Any) -> str:
    clock.advance(timedelta(hours=1))
    return s.publish("web", TinyModel(300, factor), series="web", window=WINDOW, **kw)


def test_publish_serves_the_new_version_and_rollback_returns(model_store: ModelStore, clock: FakeClock) -> None:
    v1 = publish(model_store, clock, 0.1)
    v2 = publish(model_store, clock, 0.2)
    assert v1 < v2  # sortable ids: UTC timestamp first
    assert model_store.serving("web", expected_series="web").model == TinyModel(300, 0.2)
    assert [(i.version, i.serving) for i in model_store.list("web")] == [(v1, False), (v2, True)]
    assert model_store.rollback("web").manifest.sha256 == model_store.list("web")[0].manifest.sha256  # type: ignore[union-attr]
    assert model_store.serving("web").model == TinyModel(300, 0.1)
    with pytest.raises(ModelError, match="no earlier serving version"):
        model_store.rollback("web")
    assert model_store.names() == ["web"]


def test_unserved_publish_leaves_serving_alone(model_store: ModelStore, clock: FakeClock) -> None:
    publish(model_store, clock, 0.1)
    publish(model_store, clock, 0.2, serve=False)
    assert model_store.serving("web").model == TinyModel(300, 0.1)


def test_refused_new_version_leaves_serving_intact(model_store: ModelStore, clock: FakeClock) -> None:
    v1 = publish(model_store, clock, 0.1)
    v2 = publish(model_store, clock, 0.2, serve=False)
    (model_store.version_dir("web", v2) / "model.json").write_text('{"kind":"tiny","params":{}}')
    with pytest.raises(ModelError, match="sha256 does not match"):
        model_store.promote("web", v2)
    assert model_store.pointer("web").version == v1  # type: ignore[union-attr]
    assert model_store.serving("web").model == TinyModel(300, 0.1)


def test_corrupted_serving_version_is_refused_and_rollback_recovers(model_store: ModelStore, clock: FakeClock) -> None:
    publish(model_store, clock, 0.1)
    v2 = publish(model_store, clock, 0.2)
    (model_store.version_dir("web", v2) / "model.json").write_bytes(PICKLE_BYTES)
    with pytest.raises(ModelError, match="sha256 does not match"):
        model_store.serving("web")
    assert model_store.rollback("web").model == TinyModel(300, 0.1)


@pytest.mark.parametrize(
    "crash_on",
    ["version-rename", "pointer-switch"],
    ids=["crash-before-version-visible", "crash-before-pointer-switch"],
)
def test_crash_mid_publish_leaves_store_consistent(
    model_store: ModelStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, crash_on: str
) -> None:
    v1 = publish(model_store, clock, 0.1)
    real_replace = os.replace

    def crashing_replace(src: Any, dst: Any) -> None:
        is_version = Path(src).name.startswith(".tmp-")
        if (crash_on == "version-rename" and is_version) or (crash_on == "pointer-switch" and Path(dst).name == "serving"):
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(store.os, "replace", crashing_replace)
    # Mapped at the store's boundary: the path and what to do, the OSError kept as the cause.
    with pytest.raises(StoreError, match="simulated crash") as info:
        publish(model_store, clock, 0.2)
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.setattr(store.os, "replace", real_replace)

    assert model_store.serving("web").model == TinyModel(300, 0.1)
    assert model_store.pointer("web").version == v1  # type: ignore[union-attr]
    listed = model_store.list("web")
    assert all(i.manifest is not None for i in listed)  # no half-written version is visible
    assert len(listed) == (1 if crash_on == "version-rename" else 2)
    assert not list((model_store.root / "web").rglob(".*tmp*"))  # the failed write cleaned up after itself
    # A process killed outright leaves its temporary directory behind: never listed, swept next time.
    leftover = model_store.root / "web" / "versions" / ".tmp-killed"
    leftover.mkdir()
    (leftover / "model.json").write_text('{"kind":"tiny"')
    assert len(model_store.list("web")) == len(listed)
    v3 = publish(model_store, clock, 0.3)
    assert model_store.serving("web").model == TinyModel(300, 0.3)
    assert not list((model_store.root / "web" / "versions").glob(".tmp-*"))
    assert v3 > v1


def test_keeps_last_versions_but_never_the_serving_history(model_store: ModelStore, clock: FakeClock) -> None:
    versions = [publish(model_store, clock, f / 10) for f in range(1, 6)]
    kept = [i.version for i in model_store.list("web")]
    assert kept == versions[-3:]
    # Roll back all the way the history allows, each step to a version still present.
    assert model_store.rollback("web").model == TinyModel(300, 0.4)
    assert model_store.rollback("web").model == TinyModel(300, 0.3)


def test_promote_serves_an_older_listed_version(model_store: ModelStore, clock: FakeClock) -> None:
    v1 = publish(model_store, clock, 0.1)
    publish(model_store, clock, 0.2)
    model_store.promote("web", v1)
    assert model_store.serving("web").model == TinyModel(300, 0.1)
    assert model_store.rollback("web").model == TinyModel(300, 0.2)


@pytest.mark.parametrize(
    "name",
    ["../etc", "a/b", "/abs", "..", ".hidden", "", "a\\b", "web/../../x"],
    ids=["dotdot-prefix", "slash", "absolute", "dotdot", "hidden", "empty", "backslash", "embedded-dotdot"],
)
def test_names_cannot_escape_the_store(model_store: ModelStore, name: str) -> None:
    with pytest.raises(ConfigError, match="invalid model name"):
        model_store.publish(name, TinyModel(300, 0.1), series="web", window=WINDOW)
    with pytest.raises(ConfigError, match="invalid model name"):
        model_store.serving(name)
    assert not (model_store.root.parent / "etc").exists()


def test_tampered_pointer_cannot_escape(model_store: ModelStore, clock: FakeClock) -> None:
    publish(model_store, clock, 0.1)
    (model_store.root / "web" / "serving").write_text(json.dumps({"version": "../../x", "sha256": "0" * 64}))
    with pytest.raises(ModelError, match="invalid version.*models rollback"):  # store damage: repairable
        model_store.serving("web")


def test_no_serving_version_says_how_to_get_one(model_store: ModelStore) -> None:
    with pytest.raises(ModelError, match="no serving version.*predictive-scaler train"):
        model_store.serving("web")
    assert model_store.list("web") == [] and model_store.names() == []


def _truncate_model(d: Path) -> None:
    body = (d / "model.json").read_bytes()
    (d / "model.json").write_bytes(body[: len(body) // 2])


def _tamper_model(d: Path) -> None:
    doc = json.loads((d / "model.json").read_text())
    doc["params"]["factor"] = 0.9
    (d / "model.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "damage",
    [_truncate_model, _tamper_model, lambda d: (d / "manifest.json").unlink(), lambda d: (d / "model.json").unlink()],
    ids=["truncated-model", "tampered-model", "manifest-missing", "model-missing"],
)
def test_same_second_republish_over_a_damaged_version_writes_a_fresh_one(
    model_store: ModelStore, damage: Callable[[Path], None]
) -> None:
    # The clock never moves: both publishes fall in the same second with the same bytes.
    first = model_store.publish("web", TinyModel(300, 0.1), series="web", window=WINDOW)
    damage(model_store.version_dir("web", first))
    again = model_store.publish("web", TinyModel(300, 0.1), series="web", window=WINDOW)
    assert again != first and again > first  # a fresh id, still sorted after the damaged one
    assert model_store.pointer("web").version == again  # type: ignore[union-attr]
    assert model_store.serving("web", expected_series="web").model == TinyModel(300, 0.1)


def test_same_second_republish_of_an_intact_version_reuses_it(model_store: ModelStore) -> None:
    first = model_store.publish("web", TinyModel(300, 0.1), series="web", window=WINDOW)
    assert model_store.publish("web", TinyModel(300, 0.1), series="web", window=WINDOW) == first
    assert [i.version for i in model_store.list("web")] == [first]


def test_malformed_parameters_give_the_advice_once(tmp_path: Path) -> None:
    save_artifact(TinyModel(300, 0.1), series="web", window=WINDOW, directory=tmp_path / "a")
    model_file = tmp_path / "a" / "model.json"

    def failing(params: Mapping[str, Any]) -> TinyModel:
        raise ModelError("tiny parameters are incomplete or malformed (KeyError('x')); retrain")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TinyModel, "from_params", staticmethod(failing))
        with pytest.raises(ModelError) as info:
            load_artifact(tmp_path / "a")
    message = str(info.value)
    assert str(model_file) in message and "malformed" in message
    assert message.lower().count("retrain") == 1 and message.endswith("retrain with `predictive-scaler train`")
