"""A backtest with a scheduled event: the plan holds the event's floor from its lead time to its end,
and the report marks the window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from predictive_scaler.backtest import event_windows
from predictive_scaler.backtest.report import markdown
from predictive_scaler.backtest.runner import run_backtest
from predictive_scaler.backtest.scenario import load_scenario
from predictive_scaler.errors import ConfigError
from predictive_scaler.policy.events import lead_seconds
from tests.backtest.test_runner import daily_trace

EVAL_START = pd.Timestamp("2024-01-08T00:00:00Z")  # 9-day trace: 7 days of training
FLOOR = 18


def scenario_file(tmp_path: Path, **extra: object) -> Path:
    doc = {"forecasters": ["persistence"], "evaluation": "12h", "policies": ["predictive", "reactive"],
           "events": [{"name": "launch", "start": "2024-01-08T07:00:00+01:00",  # 06:00 UTC
                       "end": "2024-01-08T08:00:00Z", "minReplicas": FLOOR}], **extra}
    path = tmp_path / "event.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return run_backtest(daily_trace(), load_scenario(scenario_file(tmp_path_factory.mktemp("ev"))))


def test_every_minute_of_the_window_and_its_lead_time_plans_the_floor(result) -> None:  # noqa: ANN001
    setup = result.setup
    assert setup.eval_start == EVAL_START
    start = pd.Timestamp("2024-01-08T06:00:00Z").timestamp()
    end = pd.Timestamp("2024-01-08T08:00:00Z").timestamp()
    lead = lead_seconds(setup.spec)
    assert lead >= setup.spec.lead_times.node_start_seconds > 0
    times = setup.eval_start.timestamp() + np.arange(setup.n_ticks) * setup.tick_s
    window = (times >= start - lead) & (times < end)
    desired = result.runs["predictive"].desired
    assert window.sum() >= (end - start + lead) // setup.tick_s
    assert desired[window].min() >= FLOOR
    # Outside the window the plan follows demand again: the floor is not there all day.
    assert desired[times >= end + 3600].max() < FLOOR
    assert result.runs["reactive"].desired[window].min() < FLOOR  # the peer has no events: it is the plan


def test_the_report_marks_the_window(result) -> None:  # noqa: ANN001
    [w] = event_windows.windows(result)
    assert w.held is True and w.min_planned is not None and w.min_planned >= FLOOR
    text = markdown(result)
    assert "## Scheduled events" in text
    row = next(line for line in text.splitlines() if line.startswith("| launch |"))
    assert "2024-01-08T06:00Z → 2024-01-08T08:00Z" in row and row.endswith("| yes |")


def test_events_given_twice_are_refused(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, spec={"events": []})
    with pytest.raises(ConfigError, match="keep one") as info:
        load_scenario(path)
    assert info.value.field == "events"


def test_a_bad_event_in_a_scenario_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"events": [{"name": "x", "start": "tomorrow", "end": "2024-01-08T08:00:00Z",
                                                "minReplicas": 3}]}))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == "spec.events[0].start"


def test_the_backtests_training_gets_past_occurrences_as_holidays(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from predictive_scaler.retrain import (
        training,  # the job's training function, which the backtest runs
    )

    seen: list[object] = []
    real = training.train_model

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("options"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(training, "train_model", recording)
    weekly = [{"name": "launch", "start": "2024-01-01T06:00:00Z", "end": "2024-01-01T08:00:00Z",
               "minReplicas": FLOOR, "recurrence": "weekly"}]
    path = scenario_file(tmp_path, events=weekly, policies=["predictive"], evaluation="3h")
    result = run_backtest(daily_trace(), load_scenario(path))
    first = seen[0]
    assert isinstance(first, dict)
    assert first["prophet"]["holidays"] == (("launch", pd.Timestamp("2024-01-01T06:00:00Z").timestamp(),
                                             pd.Timestamp("2024-01-01T08:00:00Z").timestamp()),)
    # The next occurrence (Jan 8, 06:00) is after the 3 evaluated hours and their lead time: none to mark.
    assert event_windows.windows(result) == []
    assert "No event window falls inside the evaluation." in markdown(result)


def test_the_bundled_event_scenario_loads() -> None:
    scenario = load_scenario("backtests/launch-event.yaml")
    assert [e["name"] for e in scenario.spec["events"]] == ["launch", "webcast"]
