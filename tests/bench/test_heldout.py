"""The held-out bench (benchmarks/forecast_heldout.py): the leave-one-trace-out choice, the split
of long traces, and the figures recomputed from per-origin records."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.forecast_heldout import (
    FINAL_DAYS,
    LAUNCH_IDLE,
    LAUNCH_MARK,
    SLICE_DAYS,
    SLICE_MARK,
    SLICES_PER_TRACE,
    choose,
    figures,
    launch_names,
    leave_one_out,
    load_named,
    paired_ratio,
    part_of,
    parts,
    slice_names,
)
from predictive_scaler.forecasting.defaults import DEFAULT_VARIANT_NAME, VARIANT_NAMES

A, B = VARIANT_NAMES[0], VARIANT_NAMES[1]


def _table(**per_trace: tuple[float, float]) -> dict[str, dict[str, float | None]]:
    return {t: {v: None for v in VARIANT_NAMES} | {A: a, B: b} for t, (a, b) in per_trace.items()}


def test_each_trace_is_judged_by_the_choice_made_without_it():
    # B wins on x and y; A wins only on z, by a lot. Held out z: chosen on x and y -> B.
    table = _table(x=(1.0, 0.9), y=(1.0, 0.9), z=(0.5, 1.0))
    picks = leave_one_out(table)
    assert picks["z"] == B
    # Held out x: on y and z the geometric mean of A is sqrt(0.5) < sqrt(0.9) -> A.
    assert picks["x"] == A and picks["y"] == A
    assert choose(table, ["x", "y", "z"]) == A


def test_a_variant_without_a_figure_on_some_trace_is_not_chosen():
    table = _table(x=(1.0, 0.5), y=(1.0, 0.5))
    table["y"][B] = None
    assert choose(table, ["x", "y"]) == A


def test_a_tie_goes_to_the_code_s_default_and_a_better_variant_still_wins():
    others = [v for v in VARIANT_NAMES if v != DEFAULT_VARIANT_NAME]
    tied = {t: {v: 1.0 for v in VARIANT_NAMES} for t in ("x", "y")}
    assert choose(tied, ["x", "y"]) == DEFAULT_VARIANT_NAME
    tied["x"][others[-1]] = 0.99
    assert choose(tied, ["x", "y"]) == others[-1]


def _doc(days: int, step: int = 1800) -> dict[str, Any]:
    spd = 86400 // step
    ids = np.arange(7 * spd, days * spd - 1, dtype=float)
    loss = np.ones(ids.size)
    actual = np.full(ids.size, 10.0)
    hit = (ids % 20 != 0).astype(float)  # 95 % covered
    rec = [ids.tolist(), loss.tolist(), hit.tolist(), actual.tolist()]
    peer = [ids.tolist(), (2 * loss).tolist(), hit.tolist(), actual.tolist()]
    worse = [ids.tolist(), (3 * loss).tolist(), hit.tolist(), actual.tolist()]
    return {"grid_steps": days * spd, "report": {"step_seconds": step, "origins": {
        f"variant:{A}": rec, "peer:Naive": peer, "peer:AutoETS": worse}}}


def test_long_traces_keep_their_last_weeks_apart():
    assert set(parts(_doc(30))) == {"tuning"}
    split = parts(_doc(60))
    lo, hi = split["tuning"][1], split["final"][0]
    assert lo == hi == 60 * 48 - FINAL_DAYS * 48 - 1  # origins whose 30-minute target is in the last 21 days


def test_figures_pair_the_sides_and_pick_the_best_peer_per_part():
    doc = _doc(60)
    got = figures(doc, f"variant:{A}", parts(doc)["tuning"])
    assert got["best_peer"] == "Naive" and got["ratio"] == pytest.approx(0.5)
    assert got["interval"] == pytest.approx((0.5, 0.5))
    assert got["coverage"] == pytest.approx(0.95, abs=0.01)
    final = figures(doc, f"variant:{A}", parts(doc)["final"])
    assert final["days"] in (FINAL_DAYS, FINAL_DAYS + 1)  # the first origin targets the first final step


def test_ratio_counts_only_origins_both_sides_scored():
    side = {"ids": np.arange(10), "loss": np.ones(10), "hit": np.ones(10), "actual": np.ones(10)}
    peer = part_of({k: v.copy() for k, v in side.items()}, 0, 5)
    peer["loss"] = peer["loss"] * 4
    ratio, _, (a, b) = paired_ratio(side, peer, 5)
    assert ratio == pytest.approx(0.25) and a.sum() == 5


def _write_trace(path: Any, days: int, step: int = 3600) -> None:
    import pandas as pd

    times = pd.date_range("2024-01-01", periods=days * 86400 // step, freq=f"{step}s", tz="UTC")
    lines = ["timestamp,value", *(f"{t.isoformat()},{i % 24 + 1}" for i, t in enumerate(times))]
    path.write_text("\n".join(lines) + "\n")


def test_short_history_slices_lie_in_the_tuning_part_of_the_long_traces_only(tmp_path):
    _write_trace(tmp_path / "long.csv", 60)
    _write_trace(tmp_path / "short.csv", 14)
    names = slice_names(tmp_path, ["long", "short"])
    assert len(names) == SLICES_PER_TRACE and all(n.startswith(f"long{SLICE_MARK}") for n in names)
    starts = [int(n.partition(SLICE_MARK)[2]) for n in names]
    assert starts[0] == 0 and starts[-1] + SLICE_DAYS <= 60 - FINAL_DAYS  # never into the last weeks
    piece = load_named(tmp_path, names[-1])
    assert piece.name == names[-1]
    assert piece.span.days == SLICE_DAYS
    assert (piece.start - load_named(tmp_path, "long").start).days == starts[-1]


def test_launch_runs_are_the_short_runs_idle_for_their_first_days(tmp_path):
    _write_trace(tmp_path / "long.csv", 60)
    _write_trace(tmp_path / "short.csv", 14)
    slices = slice_names(tmp_path, ["long", "short"])
    names = launch_names(["long", "short"], slices)
    assert names == [f"short{LAUNCH_MARK}", *(f"{n}{LAUNCH_MARK}" for n in slices)]  # never a long trace
    for name in (names[0], names[-1]):
        run = load_named(tmp_path, name)
        plain = load_named(tmp_path, name.removesuffix(LAUNCH_MARK))
        idle = int(LAUNCH_IDLE.total_seconds() // run.step_seconds)
        assert run.name == name and run.start == plain.start and len(run) == len(plain)
        assert np.all(run.values[:idle] == 0)
        np.testing.assert_array_equal(run.values[idle:], plain.values[idle:])
        assert plain.values[:idle].min() > 0  # the written traces are never zero: the idle days are ours
