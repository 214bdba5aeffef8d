"""The clone stands on its own: every trace the project uses is bundled with its source and licence,
and nothing in the project reaches outside the repository for data."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from predictive_scaler.series import load_trace

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "backtests" / "traces"
#: The long traces the forecasting and backtest issues are judged on, and the short LLM ones.
REQUIRED = [
    "nasa_http_1995", "ms_mongodb_machine01_rps", "nab_nyc_taxi", "nab_twitter_aapl",
    "nab_rds_cpu_e47b3b", "servegen_m_small", "servegen_m_large",
    "azure_llm2023_conv_reqs", "azure_llm2023_code_reqs",
]
#: A path that leaves the clone for the team workspace's shared folder.
OUTSIDE = re.compile(r"\.\./shared|shared/traces|[\"']shared[\"']\s*[/)]")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True).stdout
    return [REPO / line for line in out.splitlines() if line]


@pytest.mark.parametrize("name", REQUIRED, ids=REQUIRED)
def test_trace_is_bundled_with_source_and_licence(name: str) -> None:
    path = TRACES / f"{name}.csv"
    assert path.is_file(), f"{path} is not bundled"
    readme = (TRACES / "README.md").read_text()
    row = next((line for line in readme.splitlines() if f"{name}.csv" in line), None)
    assert row is not None, f"{name}.csv has no row in backtests/traces/README.md"
    assert re.search(r"MIT|Apache-2\.0|CC-BY-4\.0|redistributable", row), f"{name}.csv: no licence in its row"
    assert " : " in row, f"{name}.csv: no source (repository : path) in its row"


@pytest.mark.parametrize("name", REQUIRED, ids=REQUIRED)
def test_bundled_trace_loads(name: str) -> None:
    trace = load_trace(TRACES / f"{name}.csv", min_history=None)
    assert trace.values.size > 50


def test_every_bundled_csv_is_documented() -> None:
    readme = (TRACES / "README.md").read_text()
    undocumented = [p.name for p in TRACES.glob("*.csv") if p.name not in readme]
    assert not undocumented, f"bundled without source and licence: {undocumented}"


def test_no_alibaba_file_is_bundled() -> None:
    """They carry no licence file; tests use a generated stand-in instead."""
    assert not [p for p in tracked_files() if p.name.startswith("alibaba_") and p.suffix == ".csv"]


def test_nothing_in_the_project_reads_the_team_shared_folder() -> None:
    offenders = []
    for path in tracked_files():
        if path.suffix in {".md", ".csv", ".png", ".html", ".json"} or path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        offenders += [f"{path.relative_to(REPO)}:{n}" for n, line in enumerate(text.splitlines(), 1)
                      if OUTSIDE.search(line)]
    assert not offenders, f"these lines reach outside the clone for data: {offenders}"
