"""`predictive-scaler evaluate` end to end on small synthetic traces (fast models only)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictive_scaler import cli
from predictive_scaler.forecasting import registry

DAY = 288


def _write_trace(path, days: float, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    n = int(days * DAY)
    t = np.arange(n) / DAY
    values = 50 * np.exp(0.5 * np.sin(2 * np.pi * t) + rng.normal(0, 0.1, n))
    values[100:110] = np.nan
    start = 1_700_000_100
    lines = [f"{start + 300 * i},{'NaN' if np.isnan(v) else f'{v:.3f}'}" for i, v in enumerate(values)]
    path.write_text("timestamp,value\n" + "\n".join(lines) + "\n")
    return str(path)


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return _write_trace(tmp_path_factory.mktemp("trace") / "t.csv", days=16)


def test_json_document_has_the_documented_shape(trace, capsys):
    code = cli.main(["evaluate", "--trace", trace, "--models", "persistence,seasonal-naive",
                     "--horizons", "10m,30m,7m", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    doc = _strict_json(out)
    assert set(doc) == {"quantile", "selected", "models"}
    assert doc["quantile"] == 0.95 and doc["selected"] in ("persistence", "seasonal-naive")
    for model in doc["models"].values():
        assert set(model) == {"horizons", "fit_seconds"}
        assert set(model["horizons"]) == {"10m", "30m", "7m"}
        assert all(v is None for v in model["horizons"]["7m"].values())  # not a multiple of 5 min
        assert all(isinstance(v, float) for v in model["horizons"]["30m"].values())


def test_table_lists_each_model_and_horizon(trace, capsys):
    assert cli.main(["evaluate", "--trace", trace, "--models", "persistence", "--quantile", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "pinball" in out and "coverage" in out
    assert sum(line.startswith("persistence") for line in out.splitlines()) == 3
    assert "quantile 0.9; selected: persistence" in out


def test_short_trace_is_refused_then_allowed_with_a_warning(tmp_path, capsys):
    short = _write_trace(tmp_path / "short.csv", days=11)
    assert cli.main(["evaluate", "--trace", short, "--models", "persistence"]) == 2
    assert "insufficient history: 11.0 days < 14 days required" in capsys.readouterr().err
    assert cli.main(["evaluate", "--trace", short, "--models", "persistence", "--min-history", "7d", "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "below the 14 days" in captured.err
    assert _strict_json(captured.out)["selected"] == "persistence"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "lstm"], "unknown model 'lstm'"),
        (["--horizons", "90m"], "outside 5m–60m"),
        (["--horizons", "soon"], "cannot read duration"),
        (["--quantile", "1.5"], "quantile 1.5"),
    ],
    ids=["unknown-model", "horizon-range", "horizon-syntax", "quantile"],
)
def test_bad_arguments_are_reported(trace, capsys, argv, message):
    assert cli.main(["evaluate", "--trace", trace, *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_unavailable_model_is_reported_clearly(trace, capsys, monkeypatch):
    real = registry.forecaster

    def fake(kind, **options):
        if kind == "prophet":
            raise ImportError("No module named 'prophet'")
        return real(kind, **options)

    monkeypatch.setattr(registry, "forecaster", fake)
    assert cli.main(["evaluate", "--trace", trace, "--models", "prophet,persistence", "--json"]) == 0
    doc = _strict_json(capsys.readouterr().out)
    assert doc["selected"] == "persistence"
    assert "prophet: model not available" in doc["models"]["prophet"]["error"]
    assert all(v is None for v in doc["models"]["prophet"]["horizons"]["30m"].values())
