"""`train` publishes a verified model; `forecast` prints quantiles from observations up to --at only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.cli import main
from predictive_scaler.forecasting.store import ModelStore

STEP = 300


def write_trace(path: Path, days: int = 17, *, seed: int = 3, scale_after: pd.Timestamp | None = None) -> Path:
    """Daily cycle + noise at 5 minutes; optionally everything after ``scale_after`` ×10."""
    rng = np.random.default_rng(seed)
    n = days * 86400 // STEP
    times = pd.date_range("2024-01-01T00:00:00Z", periods=n, freq=f"{STEP}s")
    hours = np.asarray(times.hour + times.minute / 60, dtype=float)
    values = 100 * (1.5 + np.sin(2 * np.pi * (hours - 8) / 24)) * np.exp(rng.normal(0, 0.1, n))
    if scale_after is not None:
        values = np.where(times > scale_after, values * 10, values)
    pd.DataFrame({"timestamp": times.strftime("%Y-%m-%dT%H:%M:%SZ"), "value": values.round(3)}).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One fast training run (baselines only) shared by the forecast tests."""
    d = tmp_path_factory.mktemp("train")
    trace = write_trace(d / "web.csv")
    rc = main(["train", "--trace", str(trace), "--out", str(d / "store"), "--models", "persistence,seasonal-naive"])
    assert rc == 0
    return trace, d / "store"


def test_train_publishes_a_serving_verified_version(trained: tuple[Path, Path]) -> None:
    _, store_dir = trained
    store = ModelStore(store_dir)
    assert store.names() == ["web"]
    loaded = store.serving("web", expected_series="web")
    m = loaded.manifest
    # One calibrated candidate, or a weighted combination of calibrated candidates.
    assert m.kind in ("calibrated", "combination")
    assert m.base_kind and set(m.base_kind.split("+")) <= {"persistence", "seasonal-naive"}
    assert m.metrics["selected"] == (m.base_kind if m.kind == "calibrated" else "combination")
    assert set(m.metrics["models"]) - {"combination"} == {"persistence", "seasonal-naive"}
    assert m.window.step_seconds == STEP and m.window.end - m.window.start == pd.Timedelta(days=17)


def test_train_prints_choice_and_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "api.csv", days=15)
    rc = main(["train", "--trace", str(trace), "--out", str(tmp_path / "s"), "--name", "api-gw",
               "--models", "persistence", "--horizon", "20m"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "selected: persistence" in out
    assert re.search(r"20m: mae [\d.]+, .*coverage 0\.\d+", out)
    assert "30m" not in out  # only horizons up to --horizon are evaluated
    assert ModelStore(tmp_path / "s").pointer("api-gw") is not None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--name", "../escape"], "invalid model name '../escape'"),
        (["--models", "oracle"], "unknown model 'oracle'"),
        (["--horizon", "soon"], "cannot read duration 'soon'"),
    ],
    ids=["traversal-name", "unknown-model", "bad-horizon"],
)
def test_train_refuses_bad_arguments_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    trace = write_trace(tmp_path / "web.csv", days=15)
    rc = main(["train", "--trace", str(trace), "--out", str(tmp_path / "s"), *extra])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "escape").exists()


def test_train_refuses_short_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "web.csv", days=10)
    assert main(["train", "--trace", str(trace), "--out", str(tmp_path / "s"), "--models", "persistence"]) == 2
    assert "insufficient history: 10.0 days < 14 days required" in capsys.readouterr().err


def _table(out: str) -> list[tuple[str, float, float]]:
    rows = []
    for line in out.splitlines():
        m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\s+([\d.]+)\s+([\d.]+)$", line)
        if m:
            rows.append((m[1], float(m[2]), float(m[3])))
    return rows


@pytest.mark.parametrize("target", ["entry", "root", "version-dir"], ids=["store-entry", "store-root", "artifact-dir"])
def test_forecast_prints_p50_p95_per_step(trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str], target: str) -> None:
    trace, store_dir = trained
    model = {"entry": store_dir / "web", "root": store_dir,
             "version-dir": next((store_dir / "web" / "versions").iterdir())}[target]
    rc = main(["forecast", "--model", str(model), "--trace", str(trace), "--at", "2024-01-16T12:00:00Z"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = _table(out)
    assert [r[0] for r in rows] == [f"2024-01-16T12:{m:02d}:00Z" for m in range(5, 31, 5)]
    assert all(0 < p50 <= p95 for _, p50, p95 in rows)
    assert "issued at 2024-01-16T12:00:00" in out


def test_forecast_reads_observations_up_to_at_only(trained: tuple[Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    trace, store_dir = trained
    at = pd.Timestamp("2024-01-15T06:00:00Z")
    changed = write_trace(tmp_path / "web.csv", scale_after=at)  # the future is wildly different
    outs = []
    for t in (trace, changed):
        assert main(["forecast", "--model", str(store_dir / "web"), "--trace", str(t), "--at", at.isoformat()]) == 0
        outs.append(_table(capsys.readouterr().out))
    assert outs[0] == outs[1] and outs[0]


def test_forecast_drops_a_partial_last_bucket(trained: tuple[Path, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A 1-minute trace cut at 12:03 must not feed a 3-minute 12:00 bucket to a 5-minute model."""
    _, store_dir = trained
    times = pd.date_range("2024-01-15T00:00:00Z", "2024-01-16T12:03:00Z", freq="60s")
    values = np.full(len(times), 200.0)
    values[-3:] = 0.0  # a partial bucket of zeros would pull the forecast down
    fine = tmp_path / "fine.csv"
    pd.DataFrame({"timestamp": times.strftime("%Y-%m-%dT%H:%M:%SZ"), "value": values}).to_csv(fine, index=False)
    assert main(["forecast", "--model", str(store_dir / "web"), "--trace", str(fine), "--horizon", "10m"]) == 0
    out = capsys.readouterr().out
    assert "issued at 2024-01-16T11:55:00" in out
    assert all(p50 > 100 for _, p50, _ in _table(out))


def test_forecast_json_has_no_nan(trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    trace, store_dir = trained
    assert main(["forecast", "--model", str(store_dir), "--trace", str(trace), "--horizon", "60m",
                 "--quantiles", "0.5,0.9,0.95", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert set(doc["quantiles"]) == {"0.5", "0.9", "0.95"}
    assert all(len(v) == 12 for v in doc["quantiles"].values())
    assert doc["series"] == "web"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--horizon", "7m"], "horizon 7m is not a multiple of the model's 5m step"),
        (["--horizon", "2h"], "horizon 2h is outside 5m–60m"),
        (["--at", "2023-01-01T00:00:00Z"], "is outside the trace"),
        (["--at", "noon"], "--at 'noon' is not a time"),
        (["--series", "checkout"], "trained for series 'web', not 'checkout'"),
        (["--quantiles", "0.95,0.5"], "must be distinct and increasing"),
    ],
    ids=["horizon-not-multiple", "horizon-too-long", "at-outside", "at-unreadable", "other-series", "quantile-order"],
)
def test_forecast_refusals(trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    trace, store_dir = trained
    rc = main(["forecast", "--model", str(store_dir / "web"), "--trace", str(trace), *extra])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_forecast_refuses_a_tampered_model(trained: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    trace, store_dir = trained
    copy = tmp_path / "artifact"
    version = next((store_dir / "web" / "versions").iterdir())
    copy.mkdir()
    for f in ("model.json", "manifest.json"):
        (copy / f).write_bytes((version / f).read_bytes())
    body = (copy / "model.json").read_text()
    (copy / "model.json").write_text(body.replace('"log_offset":', '"log_offset": 0.0, "x":', 1))
    assert main(["forecast", "--model", str(copy), "--trace", str(trace)]) == 2
    assert "sha256 does not match" in capsys.readouterr().err


def test_forecast_on_a_directory_without_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "web.csv", days=2)
    assert main(["forecast", "--model", str(tmp_path), "--trace", str(trace)]) == 2
    assert "neither a model artifact" in capsys.readouterr().err


@pytest.mark.slow
def test_train_and_forecast_with_prophet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "web.csv", days=15)
    assert main(["train", "--trace", str(trace), "--out", str(tmp_path / "s"), "--models", "prophet"]) == 0
    assert "selected: prophet" in capsys.readouterr().out
    loaded = ModelStore(tmp_path / "s").serving("web")
    assert loaded.manifest.base_kind == "prophet"
    assert main(["forecast", "--model", str(tmp_path / "s"), "--trace", str(trace)]) == 0
    rows = _table(capsys.readouterr().out)
    assert len(rows) == 6 and all(0 < p50 <= p95 for _, p50, p95 in rows)
