"""The statsforecast peers, for real, in the environment `make bench-peers` uses.

statsforecast 2.x requires pandas<3, so it lives in ``.venv-peers`` (``make peers-venv``;
``make test`` creates it), not in the test venv. These tests run ``evaluate --peers`` there
as a subprocess. A missing ``.venv-peers`` fails them — it never skips them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting import statsforecast_peers

ROOT = Path(__file__).resolve().parents[2]
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
DAY = 288


def _write_trace(path: Path, days: float, seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    n = int(days * DAY)
    t = np.arange(n) / DAY
    values = 80 * np.exp(0.6 * np.sin(2 * np.pi * t) + rng.normal(0, 0.15, n))
    values[500:520] = np.nan  # a gap inside the history: both sides must cope
    start = 1_700_000_100
    lines = [f"{start + 300 * i},{'NaN' if np.isnan(v) else f'{v:.3f}'}" for i, v in enumerate(values)]
    path.write_text("timestamp,value\n" + "\n".join(lines) + "\n")
    return path


def _peers_python() -> Path:
    assert PEERS_PYTHON.exists(), (
        f"{PEERS_PYTHON} is missing: the peers tests run in the statsforecast venv; create it with "
        "`make peers-venv` (`make test` does)"
    )
    return PEERS_PYTHON


def _evaluate(trace: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(_peers_python().with_name("predictive-scaler")), "evaluate", "--trace", str(trace), "--peers",
         "--models", "persistence,holt-winters", *extra],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )


@pytest.fixture(scope="module")
def peers_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    trace = _write_trace(tmp_path_factory.mktemp("peers") / "t.csv", days=10)
    done = _evaluate(trace, "--json", "--peer-models", "Naive,SeasonalNaive,AutoARIMA", "--peer-fit-limit", "10")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


@pytest.mark.peers
@pytest.mark.slow
def test_peers_are_scored_in_the_same_protocol(peers_json: dict[str, Any]) -> None:
    doc = peers_json
    assert doc["protocol"]["origin_every"] == "30m" and doc["protocol"]["min_history"] == "7d"
    assert set(doc["peers"]) == {"Naive", "Naive+conformal", "SeasonalNaive", "SeasonalNaive+conformal",
                                 "AutoARIMA", "AutoARIMA+conformal"}
    for name in ("Naive", "Naive+conformal", "SeasonalNaive+conformal"):
        h30 = doc["peers"][name]["horizons"]["30m"]
        assert set(h30) >= {"pinball", "normalised_pinball", "coverage", "mape"}
        assert 0.0 < h30["normalised_pinball"] < 1.0 and 0.5 < h30["coverage"] <= 1.0
    # Same actuals on both sides: normalised pinball ÷ pinball is 1 / mean actual for every entry.
    level = [h["pinball"] / h["normalised_pinball"] for h in
             (*(m["horizons"]["30m"] for m in doc["models"].values()),
              doc["peers"]["Naive"]["horizons"]["30m"])]
    assert max(level) == pytest.approx(min(level), rel=1e-9)


@pytest.mark.peers
@pytest.mark.slow
def test_every_project_model_and_the_served_one_get_normalised_pinball(peers_json: dict[str, Any]) -> None:
    doc = peers_json
    for entry in (*doc["models"].values(), doc["served"]):
        assert isinstance(entry["horizons"]["30m"]["normalised_pinball"], float)
    # Each refit serves one candidate or a weighted combination ("arima×0.6+persistence×0.4").
    chosen = {part.split("×")[0] for c in doc["served"]["choices"] for part in c.split("+")}
    assert doc["served"]["choices"] and chosen <= set(doc["models"])
    served = doc["served"]["horizons"]["30m"]["normalised_pinball"]
    best = min(m["horizons"]["30m"]["normalised_pinball"] for m in doc["models"].values())
    assert doc["regret"] == pytest.approx(served / best)


@pytest.mark.peers
@pytest.mark.slow
def test_autoarima_is_capped_to_fit_and_says_so(peers_json: dict[str, Any]) -> None:
    # Seasonal AutoARIMA with a 288-step season never fitted within 120 s and grew past 7 GB; it is
    # fitted without a season instead, scored, and the report says so.
    entry = peers_json["peers"]["AutoARIMA"]
    assert "skipped" not in entry and entry["fit_seconds"] < 10.0
    assert isinstance(entry["horizons"]["30m"]["normalised_pinball"], float)
    assert any(n.startswith("AutoARIMA capped: fitted without a season") for n in peers_json["notes"])


def test_the_cap_is_said_only_where_a_peer_was_cut_down() -> None:
    assert "without a season" in statsforecast_peers.cap_of("AutoARIMA", 288)
    assert "without a season" in statsforecast_peers.cap_of("AutoARIMA", 48)
    assert statsforecast_peers.cap_of("AutoARIMA", 24) == ""  # hourly data: seasonal, as asked
    assert statsforecast_peers.cap_of("AutoETS", 288) == ""


class _SlowModel:
    def fit(self, y: Any) -> None:
        time.sleep(30)


def test_a_peer_over_the_fit_limit_is_stopped_and_reported_skipped_with_its_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No statsforecast in this venv: the peer's module is faked, its fit sleeps (in the forked child).
    fake = types.ModuleType("statsforecast")
    fake.__version__ = "test"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "statsforecast", fake)
    monkeypatch.setitem(sys.modules, "statsforecast.models", types.ModuleType("statsforecast.models"))
    monkeypatch.setattr(statsforecast_peers, "_factory", lambda *a: _SlowModel())
    values = np.arange(600, dtype=float)
    t0 = time.perf_counter()
    got = statsforecast_peers.run_peer("AutoETS", values, (0, 500), np.arange(400, 490), np.arange(500, 590), 6, 288,
                                       fit_limit=0.5)
    assert isinstance(got, statsforecast_peers.PeerSkipped)
    assert "longer than 0.5 s" in got.reason and got.seconds >= 0.5
    assert time.perf_counter() - t0 < 20  # stopped, not waited for


def test_missing_statsforecast_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "statsforecast", None)
    with pytest.raises(ModelError, match=r"pip install -e '\.\[peers\]'.*pandas<3"):
        statsforecast_peers.require_statsforecast()


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([np.nan, 2.0, np.nan, 4.0], [2.0, 2.0, 2.0, 4.0], id="leading-and-inner-gap"),
        pytest.param([1.0, 3.0], [1.0, 3.0], id="no-gap"),
        pytest.param([np.nan, np.nan], [0.0, 0.0], id="all-missing"),
    ],
)
def test_gaps_are_filled_causally(values: list[float], expected: list[float]) -> None:
    np.testing.assert_array_equal(statsforecast_peers.fill_gaps(np.array(values)), np.array(expected))
