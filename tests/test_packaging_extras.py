"""The runtime without its extras: pyarrow (`parquet`) and matplotlib (`report`) missing.

Each check runs in a fresh interpreter whose import system refuses the package (a
``sys.meta_path`` finder that raises ModuleNotFoundError), the way it would be absent
from the container image, while this venv keeps both for the rest of the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]

_BLOCKER = """
import sys

_BLOCKED = set({blocked!r})

class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

def _none_imported():
    assert not {{m.split(".")[0] for m in sys.modules}} & _BLOCKED, "a blocked package was imported"

sys.meta_path.insert(0, _Missing())
"""


def _run_without(blocked: set[str], body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "without.py"
    script.write_text(_BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)


def _cli(argv: list[str]) -> str:
    return f"""
from predictive_scaler.cli import main
code = main({argv!r})
_none_imported()
sys.exit(code)
"""


def _trace(path: Path, days: int = 3) -> Path:
    index = pd.date_range("2026-01-01", periods=days * 288, freq="5min", tz="UTC")
    values = 50 + 20 * np.sin(np.arange(len(index)) * 2 * np.pi / 288)
    pd.DataFrame({"timestamp": index.strftime("%Y-%m-%dT%H:%M:%SZ"), "value": values}).to_csv(path, index=False)
    return path


def test_the_blocker_blocks(tmp_path: Path) -> None:
    done = _run_without({"pyarrow"}, "import pyarrow\n", tmp_path)
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, done.stderr


def test_evaluate_a_parquet_trace_without_pyarrow_names_the_extra(tmp_path: Path) -> None:
    trace = tmp_path / "x.parquet"
    trace.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")  # never read: the reader is missing
    done = _run_without({"pyarrow"}, _cli(["evaluate", "--trace", str(trace), "--models", "persistence"]),
                        tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'predictive-scaler[parquet]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_evaluate_a_csv_trace_needs_no_pyarrow(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "x.csv")
    done = _run_without({"pyarrow"}, _cli(["evaluate", "--trace", str(trace), "--models", "persistence",
                                           "--min-history", "1d", "--json"]), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "persistence" in done.stdout


def test_backtest_report_without_matplotlib_names_the_extra_before_the_replay(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "x.csv")
    done = _run_without({"matplotlib"}, _cli(["backtest", "--trace", str(trace), "--report",
                                              str(tmp_path / "report")]), tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'predictive-scaler[report]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_prophet_fits_and_predicts_without_matplotlib(tmp_path: Path) -> None:
    """Prophet declares matplotlib but plots only with it: the image leaves it out (Dockerfile)."""
    body = """
    import logging
    import numpy as np
    import pandas as pd
    logging.getLogger("cmdstanpy").setLevel(logging.WARNING)
    from prophet import Prophet

    ds = pd.date_range("2026-01-01", periods=4 * 288, freq="5min")
    y = 50 + 20 * np.sin(np.arange(len(ds)) * 2 * np.pi / 288)
    model = Prophet(daily_seasonality=True, weekly_seasonality=False, yearly_seasonality=False)
    model.fit(pd.DataFrame({"ds": ds, "y": y}))
    future = model.make_future_dataframe(periods=12, freq="5min", include_history=False)
    forecast = model.predict(future)
    assert len(forecast) == 12 and np.isfinite(forecast["yhat"]).all(), forecast
    assert abs(float(forecast["yhat"].iloc[0]) - 50) < 25, forecast["yhat"].iloc[0]
    _none_imported()
    print("ok")
    """
    done = _run_without({"matplotlib"}, body, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok"), done.stdout
