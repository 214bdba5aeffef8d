"""The report answers first: its opening paragraph says, in plain words and with the scenario's currency,
what predictive scaling cost and served against the reactive default and at equal service — in figures
that are the ones `backtest --json` prints — and the report names no local path and no internal wording.

One real backtest (a bundled trace, the frontier, the CLI in-process) feeds every test here.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from predictive_scaler.backtest.headline import headline
from predictive_scaler.cli import main
from predictive_scaler.series import parse_duration

ROOT = Path(__file__).resolve().parents[2]
#: A bundled trace: 14 days at one minute, so 7 days train and one evaluated day is quick.
TRACE = ROOT / "backtests" / "traces" / "ms_mongodb_machine01_rps.csv"
#: Not the default currency: every amount must carry the scenario's own.
CURRENCY = "EUR"
SCENARIO = f"""\
name: small
forecasters: [persistence, seasonal-naive]
evaluation: 1d
spec:
  prewarm:
    budget:
      maxGpus: 8
      currency: {CURRENCY}
"""


@dataclass(frozen=True)
class Backtest:
    doc: dict[str, Any]
    md: str
    page: str
    workdir: Path


@pytest.fixture(scope="module")
def backtest(tmp_path_factory: pytest.TempPathFactory) -> Backtest:
    workdir = tmp_path_factory.mktemp("report")
    scenario = workdir / "small.yaml"
    scenario.write_text(SCENARIO)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["backtest", "--trace", str(TRACE), "--scenario", str(scenario), "--frontier", "--json",
                     "--report", str(workdir / "rep"), "--no-progress"])
    assert code == 0
    return Backtest(json.loads(out.getvalue()), (workdir / "rep" / "report.md").read_text(),
                    (workdir / "rep" / "report.html").read_text(), workdir)


def _text(page: str) -> str:
    """The page's visible text, the inlined images left out."""
    page = re.sub(r'src="data:image/png;base64,[^"]*"', 'src=""', page)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def _opening(page: str) -> str:
    """The first paragraph after the title: what a reader sees first."""
    m = re.search(r"</h1>\s*<p>(.*?)</p>", page, re.S)
    assert m, "the title is not followed by a paragraph"
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(1)))


def _money(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def _expected_figures(doc: dict[str, Any]) -> tuple[list[str], int]:
    """Every figure the headline should give, in order, computed here from the `--json` document alone, and
    how many of them are amounts of money."""
    p, r = doc["policies"]["predictive"], doc["policies"]["reactive"]
    # The span in its largest whole unit ("42 days", "12 hours"); one of it is written without the 1.
    span = parse_duration(doc["scenario"]["evaluation"]).total_seconds()
    number = next((span // unit for unit in (86400, 3600, 60) if span >= unit and span % unit == 0), 1)
    figures = [] if number == 1 else [f"{number:.0f}"]
    figures += [_money(p["cost"]), f"{100 * abs(p['cost'] / r['cost'] - 1):.1f}",
               f"{100 * doc['scenario']['target_utilization']:.0f}", _money(r["cost"]),
               f"{p['unmet_minutes']:,.0f}", f"{r['unmet_minutes']:,.0f}",
               f"{100 * abs(p['unmet_minutes'] / r['unmet_minutes'] - 1):.1f}",
               f"{100 * p['slo_attainment']:.2f}", f"{100 * r['slo_attainment']:.2f}"]
    ratio, gap = doc["headline"]["cost_ratio_vs_reactive"], doc["headline"]["gap_closed_vs_reactive"]
    reference = p["cost"] / ratio  # reactive's cost at the share predictive serves
    figures += [_money(reference), f"{100 * abs(ratio - 1):.1f}", _money(abs(reference - p["cost"]))]
    amounts = 4
    if gap is not None and gap > 0:
        figures.append(f"{100 * gap:.0f}")
    figures += [_money(p["wasted_prewarm_cost"]), f"{100 * p['wasted_prewarm_cost'] / p['cost']:.1f}",
                str(doc["scenario"]["spec"]["prewarm"]["budget"]["maxGpus"]), f"{p['minutes_over_budget']:,.0f}"]
    return figures, amounts + 1


def test_the_first_paragraph_is_the_headline_and_its_figures_are_the_jsons(backtest: Backtest) -> None:
    doc = backtest.doc
    p, r = doc["policies"]["predictive"], doc["policies"]["reactive"]
    # The run exercises every part of the headline: both leave some demand unmet, the frontier gives a
    # reactive cost at equal service, some prewarm was wasted and the budget was audited.
    assert p["unmet_minutes"] > 0 and r["unmet_minutes"] > 0 and p["unmet_minutes"] != r["unmet_minutes"]
    assert doc["headline"]["cost_ratio_vs_reactive"] is not None
    assert p["wasted_prewarm_cost"] > 0 and p["minutes_over_budget"] is not None
    text = _opening(backtest.page)
    figures, amounts = _expected_figures(doc)
    assert re.findall(r"\d[\d,]*(?:\.\d+)?", text) == figures, text
    assert len(re.findall(rf"\d \b{CURRENCY}\b", text)) == amounts, text
    more = "more" if p["cost"] > r["cost"] else "less"
    assert f"{100 * abs(p['cost'] / r['cost'] - 1):.1f} % {more} than reactive scaling" in text, text
    assert "fewer" in text if p["unmet_minutes"] < r["unmet_minutes"] else "more" in text
    assert "held" in text if p["minutes_over_budget"] == 0 else "exceeded" in text
    # The Markdown opens with the same paragraph.
    assert backtest.md.splitlines()[2] == text


def test_the_report_answers_first_and_the_tables_follow(backtest: Backtest) -> None:
    page = backtest.page
    order = [_opening(page)[:40], "<h2>Cost–service frontiers</h2>", 'alt="frontier"', "<details>",
             "<td>reactive (default)</td>", "</details>", "<h2>Day by day</h2>", "<h2>The hardest days</h2>",
             "<h2>Policies side by side</h2>", "<h2>Against the aims</h2>", "<h2>Scenario</h2>"]
    at = [page.find(x) for x in order]
    assert all(i >= 0 for i in at), [x for x, i in zip(order, at, strict=True) if i < 0]
    assert at == sorted(at), order


def test_no_local_path_and_no_internal_wording(backtest: Backtest) -> None:
    for name, text in (("report.md", backtest.md), ("report.html", _text(backtest.page))):
        assert str(backtest.workdir) not in text and str(TRACE.parent) not in text, name
        # An absolute path: a slash at the start of a word, followed by directories.
        assert not re.search(r"(?:^|[\s(`'\"])/(?:[\w.~-]+/)+", text), re.search(r"\S*/\S*/\S*", text)
        assert "issue" not in text.lower(), name
        assert "```json" not in text and '"trace":' not in text, name  # no raw scenario dump
    assert TRACE.name in backtest.md  # the trace is named by its file name


def _money_columns(md: str) -> list[list[str]]:
    """The cells of every Markdown table column whose header names an amount of money."""
    columns: list[list[str]] = []
    rows: list[list[str]] = []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if rows:
            head, *body = rows
            columns += [[r[i] for r in body] for i, h in enumerate(head) if h in ("cost", "wasted prewarm")]
            rows = []
    return columns


def test_every_amount_in_the_tables_carries_the_currency(backtest: Backtest) -> None:
    columns = _money_columns(backtest.md)
    assert len(columns) == 3  # the policies' cost and wasted prewarm, every operating point's cost
    for cells in columns:
        assert cells and all(c == "–" or c.endswith(f" {CURRENCY}") for c in cells), cells
    assert "USD" not in backtest.md and "USD" not in _text(backtest.page)  # nothing assumes the default


# -- the headline's words where a figure is missing or the run went the other way (no backtest needed) --

def _doc(**headline_figures: float | None) -> dict[str, Any]:
    predictive = {"cost": 1000.0, "unmet_minutes": 0.0, "slo_attainment": 1.0, "wasted_prewarm_cost": 0.0,
                  "minutes_over_budget": 12.0}
    reactive = {"cost": 1000.0, "unmet_minutes": 0.0, "slo_attainment": 1.0, "wasted_prewarm_cost": 0.0,
                "minutes_over_budget": None}
    doc: dict[str, Any] = {"scenario": {"evaluation": "12h", "target_utilization": 0.9},
                           "policies": {"predictive": predictive, "reactive": reactive}}
    if headline_figures:
        doc["headline"] = headline_figures
    return doc


def test_the_headline_says_what_it_cannot_compare() -> None:
    without_frontier = headline(_doc(), currency="JPY", allowed_gpus=4)
    assert "Over the 12 hours evaluated" in without_frontier and "--frontier" in without_frontier
    assert "against 1,000 JPY for reactive scaling" in without_frontier  # the same cost: no "0.0 % more"
    assert "neither left any demand unmet" in without_frontier
    assert "None of its cost went on capacity added ahead of demand" in without_frontier
    assert "the prewarm budget of 4 GPUs was exceeded in 12 minutes" in without_frontier
    beyond = headline(_doc(cost_ratio_vs_reactive=None, gap_closed_vs_reactive=None), currency="JPY")
    assert "No reactive target tried serves as much as the 100.00 % predictive serves" in beyond
    no_budget = _doc()
    no_budget["policies"]["predictive"]["minutes_over_budget"] = 0.0
    assert "its prewarm budget allows no GPUs ahead of demand" in headline(no_budget, currency="JPY", allowed_gpus=0)
    no_reactive = _doc()
    del no_reactive["policies"]["reactive"]
    assert "did not run the reactive policy" in headline(no_reactive, currency="JPY")
