"""`models list|show|promote|rollback` for operators, on a store of real (baseline) models."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.cli import main
from predictive_scaler.clock import FakeClock
from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.series import Series


def history(level: float) -> Series:
    rng = np.random.default_rng(int(level))
    values = level * np.exp(rng.normal(0, 0.1, 3 * 288))
    return Series(values=values, start=pd.Timestamp("2024-01-01T00:00:00Z"), step_seconds=300, name="web")


@pytest.fixture
def store(tmp_path: Path) -> tuple[ModelStore, list[str]]:
    """Three versions of "web" (the last serving) and one of "batch"."""
    clock = FakeClock(datetime(2024, 2, 1, tzinfo=UTC))
    s = ModelStore(tmp_path / "store", clock=clock)
    versions = []
    for level in (10.0, 20.0, 30.0):
        clock.advance(timedelta(days=7))
        h = history(level)
        metrics = {"selected": "persistence",
                   "models": {"persistence": {"horizons": {"30m": {"pinball": level / 10, "coverage": 0.95}}}}}
        versions.append(s.publish("web", PersistenceForecaster().fit(h), series="web",
                                  window=TrainingWindow.of(h), metrics=metrics))
    s.publish("batch", PersistenceForecaster().fit(history(5.0)), series="batch", window=TrainingWindow.of(history(5.0)))
    return s, versions


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_every_model(store: tuple[ModelStore, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    s, versions = store
    rc, out, _ = run(capsys, "models", "list", "--store", str(s.root))
    assert rc == 0
    assert re.search(rf"^web\s+{versions[-1]}\s+3$", out, re.M)
    assert re.search(r"^batch\s+\S+\s+1$", out, re.M)


def test_list_versions_marks_the_serving_one(store: tuple[ModelStore, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    s, versions = store
    rc, out, _ = run(capsys, "models", "list", "--store", str(s.root), "--name", "web", "--json")
    rows = json.loads(out)
    assert rc == 0
    assert [r["version"] for r in rows] == versions
    assert [r["serving"] for r in rows] == [False, False, True]
    assert [r["pinball"] for r in rows] == [1.0, 2.0, 3.0]
    rc, out, _ = run(capsys, "models", "list", "--store", str(s.root), "--name", "web")
    assert re.search(rf"^{versions[-1]}\s+\*\s+persistence", out, re.M)


def test_show_prints_the_verified_manifest(store: tuple[ModelStore, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    s, versions = store
    rc, out, _ = run(capsys, "models", "show", "--store", str(s.root), "--name", "web")
    doc = json.loads(out)
    assert rc == 0 and doc["version"] == versions[-1] and doc["verified"] is True
    assert doc["kind"] == "persistence" and doc["series"] == "web" and len(doc["sha256"]) == 64
    rc, out, _ = run(capsys, "models", "show", "--store", str(s.root), "--name", "web", "--version", versions[0])
    assert json.loads(out)["version"] == versions[0]


def test_promote_then_rollback(store: tuple[ModelStore, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    s, versions = store
    rc, out, _ = run(capsys, "models", "promote", "--store", str(s.root), "--name", "web", "--version", versions[0])
    assert rc == 0 and f"now serving {versions[0]}" in out
    assert s.pointer("web").version == versions[0]  # type: ignore[union-attr]
    rc, out, _ = run(capsys, "models", "rollback", "--store", str(s.root), "--name", "web")
    assert rc == 0 and f"rolled back from {versions[0]} to {versions[2]}" in out
    rc, out, _ = run(capsys, "models", "rollback", "--store", str(s.root), "--name", "web")
    assert rc == 0 and f"to {versions[1]}" in out
    assert s.serving("web").path.name == versions[1]


def test_damaged_version_is_listed_as_damaged_and_cannot_be_promoted(
    store: tuple[ModelStore, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    s, versions = store
    (s.version_dir("web", versions[0]) / "manifest.json").write_text("{not json")
    _, out, _ = run(capsys, "models", "list", "--store", str(s.root), "--name", "web")
    assert re.search(rf"^{versions[0]}\s+damaged", out, re.M)
    rc, _, err = run(capsys, "models", "promote", "--store", str(s.root), "--name", "web", "--version", versions[0])
    assert rc == 2 and "not JSON" in err
    assert s.pointer("web").version == versions[-1]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["list", "--name", "../web"], "invalid model name '../web'"),
        (["show", "--name", "web", "--version", "../../etc"], "invalid version '../../etc'"),
        (["show", "--name", "nobody"], "'nobody' has no serving version"),
        (["promote", "--name", "web", "--version", "20990101T000000Z-deadbeef"], "no model artifact here"),
    ],
    ids=["traversal-name", "traversal-version", "unknown-name", "unknown-version"],
)
def test_refusals(store: tuple[ModelStore, list[str]], capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    s, _ = store
    rc, _, err = run(capsys, "models", argv[0], "--store", str(s.root), *argv[1:])
    assert rc == 2
    assert message in err


def test_missing_store_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "models", "list", "--store", str(tmp_path / "none"))
    assert rc == 2 and "no such directory" in err
