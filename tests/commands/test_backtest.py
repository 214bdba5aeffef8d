"""`predictive-scaler backtest` end to end on a small trace file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.cli import main


@pytest.fixture()
def trace_file(tmp_path: Path) -> Path:
    n = 9 * 288
    t = np.arange(n) * 300
    values = 100 + 60 * np.sin(2 * np.pi * t / 86400) + np.random.default_rng(3).normal(0, 4, n)
    stamps = pd.date_range("2024-01-01", periods=n, freq="300s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")
    path = tmp_path / "t.csv"
    pd.DataFrame({"timestamp": stamps, "value": np.round(values, 2)}).to_csv(path, index=False)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: small\nforecasters: [persistence]\nevaluation: 12h\n"
                        "spec:\n  prewarm:\n    budget:\n      maxGpus: 4\n")
    return path


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        (["--json"], "json"),
        (["--peak-replicas", "5"], "table"),
        (["--capacity-per-replica", "20", "--policies", "reactive,oracle", "--json"], "capacity"),
    ],
    ids=["json", "table", "capacity"],
)
def test_backtest_command(trace_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str], check: str) -> None:
    code = main(["backtest", "--trace", str(trace_file), "--scenario", str(trace_file.with_name("s.yaml")),
                 "--no-progress", *extra])
    out = capsys.readouterr().out
    assert code == 0
    if check == "json":
        doc = json.loads(out)
        assert doc["scenario"]["name"] == "small"
        assert 0 <= doc["policies"]["predictive"]["slo_attainment"] <= 1
    elif check == "table":
        assert "scenario: small" in out and "physical bound" in out and "predictive" in out
        assert '"peak_replicas":5' in out
    else:
        doc = json.loads(out)
        assert set(doc["policies"]) == {"reactive", "oracle"}
        assert doc["scenario"]["capacity_per_replica"] == 20


def test_report_is_written_and_self_contained(trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "rep"
    code = main(["backtest", "--trace", str(trace_file), "--scenario", str(trace_file.with_name("s.yaml")),
                 "--no-progress", "--report", str(out_dir)])
    assert code == 0
    page = (out_dir / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "src=\"capacity.png\"" not in page
    md = (out_dir / "report.md").read_text()
    assert "## Scenario" in md and "physical bound" in md
    assert str(out_dir / "report.html") in capsys.readouterr().out


def test_bad_scenario_is_a_clean_error(tmp_path: Path, trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: gke\n")
    assert main(["backtest", "--trace", str(trace_file), "--scenario", str(bad), "--no-progress"]) == 2
    assert "preset" in capsys.readouterr().err
