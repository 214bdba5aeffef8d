"""The bursty bench's overlay: seeded, 3× for 5–20 minutes every 90–150 minutes, one-minute traces only."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bursty import BURST_FACTOR, bursty


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def test_bursts_are_seeded_and_shaped_as_documented() -> None:
    base = np.full(7 * 1440, 10.0)
    out = bursty(base, 60, seed=3)
    np.testing.assert_array_equal(out, bursty(base, 60, seed=3))
    assert not np.array_equal(out, bursty(base, 60, seed=4))
    assert set(np.unique(out)) == {10.0, 10.0 * BURST_FACTOR}
    runs = _runs(out > 10.0)
    assert len(runs) > 50
    assert all(5 <= n <= 20 for _, n in runs[:-1])  # the last may be cut by the trace's end
    gaps = [b[0] - (a[0] + a[1]) for a, b in zip(runs, runs[1:], strict=False)]
    assert all(90 <= g <= 150 for g in gaps)
    assert 60 <= runs[0][0] < 150


def test_finer_steps_scale_and_coarser_ones_are_refused() -> None:
    base = np.full(2 * 1440 * 2, 1.0)
    runs = _runs(bursty(base, 30, seed=1) > 1.0)
    assert all(10 <= n <= 40 for _, n in runs[:-1])
    with pytest.raises(ValueError, match="one-minute"):
        bursty(np.ones(100), 300, seed=1)


def test_recurring_bursts_start_on_the_clock_and_move_by_at_most_the_jitter() -> None:
    from benchmarks.bursty import RECURRING_LENGTH, RECURRING_PERIOD, recurring

    start = 1_600_000_000 - 1_600_000_000 % 86400 + 37 * 60  # 00:37 UTC
    base = np.full(3 * 1440, 10.0)
    exact = recurring(base, start, 60, jitter_min=0, seed=1)
    runs = _runs(exact > 10.0)
    minutes = [(start // 60 + a) for a, _ in runs]
    assert all(m % RECURRING_PERIOD == 0 for m in minutes[1:])  # the first may be cut by the trace's start
    assert all(n == RECURRING_LENGTH for _, n in runs[1:-1])
    assert len(runs) == 3 * 1440 // RECURRING_PERIOD
    moved = recurring(base, start, 60, jitter_min=15, seed=1)
    np.testing.assert_array_equal(moved, recurring(base, start, 60, jitter_min=15, seed=1))
    offsets = [(start // 60 + a + RECURRING_PERIOD // 2) % RECURRING_PERIOD - RECURRING_PERIOD // 2
               for a, _ in _runs(moved > 10.0)[1:-1]]
    assert all(-15 <= o <= 15 for o in offsets) and len(set(offsets)) > 5
    with pytest.raises(ValueError, match="one-minute"):
        recurring(np.ones(100), start, 300, jitter_min=0, seed=1)
