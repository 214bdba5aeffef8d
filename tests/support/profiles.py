"""Hypothesis profiles: ``full`` (what `make test` and plain `pytest` run) and ``unit`` (`make unit`).

``full`` is Hypothesis' own defaults. ``unit`` draws a tenth as many examples, so that the
property tests still run on every quick check but no longer dominate it. A test that pins its
own count (the planner's 10,000 examples) asks :func:`examples` for it, which scales the count
by the same ratio: under ``full`` it is exactly the pinned number.

Select one with ``--hypothesis-profile=unit`` or ``HYPOTHESIS_PROFILE=unit``; the default is ``full``.
"""

from __future__ import annotations

import os

from hypothesis import settings

FULL = "full"
UNIT = "unit"
#: Hypothesis' default number of examples, which ``full`` keeps.
FULL_EXAMPLES = settings.default.max_examples
UNIT_EXAMPLES = 10
ENV = "HYPOTHESIS_PROFILE"


def register() -> None:
    """Register both profiles and load the one ``HYPOTHESIS_PROFILE`` names (``full`` when unset).

    Called from tests/conftest.py; ``--hypothesis-profile`` (Hypothesis' pytest plugin) is applied
    after it and wins.
    """
    settings.register_profile(FULL)
    settings.register_profile(UNIT, max_examples=UNIT_EXAMPLES)
    settings.load_profile(os.environ.get(ENV, FULL))


def examples(full: int, *, profile: settings | None = None) -> int:
    """How many examples a test that pins ``full`` of them draws under ``profile`` (the loaded one)."""
    return max(1, full * (profile or settings()).max_examples // FULL_EXAMPLES)
