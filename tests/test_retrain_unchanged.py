"""A scaler whose pulled history did not change since its serving model was trained on it is not
retrained (the fingerprint is in the version's metrics); a changed history (next week) is."""

from __future__ import annotations

from datetime import timedelta

from predictive_scaler.retrain.stores import MemoryStore
from predictive_scaler.retrain.training import train_and_promote
from predictive_scaler.series import Series
from tests.test_retrain import FAST, START, FakeHistory, synthetic, target


def test_an_unchanged_history_is_not_retrained_and_a_changed_one_is() -> None:
    t = target("chat")
    history = FakeHistory({t.key: synthetic(35)})
    store = MemoryStore()
    now = START + timedelta(days=28)
    first = train_and_promote(t, history, store, FAST, now, "w1")
    assert first.result == "promoted"
    again = train_and_promote(t, history, store, FAST, now, "w1-again")  # same pull: same fingerprint
    assert again.result == "kept" and "history unchanged" in again.reason
    assert again.serving_version == first.version
    later = train_and_promote(t, history, store, FAST, now + timedelta(days=7), "w2")
    assert "history unchanged" not in later.reason  # a week on, the history moved: trained and compared


def test_a_changed_history_value_is_retrained() -> None:
    t = target("chat")
    series = synthetic(35)
    store = MemoryStore()
    now = START + timedelta(days=28)
    train_and_promote(t, FakeHistory({t.key: series}), store, FAST, now, "w1")
    values = series.values.copy()
    values[5000] *= 1.5  # one late correction of a recorded value
    altered = Series(values=values, start=series.start, step_seconds=series.step_seconds, name=series.name)
    changed = train_and_promote(t, FakeHistory({t.key: altered}), store, FAST, now, "w1b")
    assert "history unchanged" not in changed.reason
