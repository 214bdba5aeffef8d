"""Service tracking: headroom widened while the ready replicas leave demand unserved.

A forecast of each model step's mean cannot see short bursts that come at random (a 3× burst of
ten minutes every two hours): a plan on its P85 leaves part of every burst unserved, and no drift
rule helps, because the forecast is not biased — merely noisy. So the planner tracks the share of
demand its ready replicas did not serve and widens what it plans on while that share runs above
what the service target allows (``1 - target``), as the coverage tracker widens a conformal band:
each decision moves the log of the headroom multiplier up by the gain times the shortfall seen
since the last decision (as a share of the smoothed demand level) and down by the gain times the
allowed share. The long-run shortfall then settles near the allowed share; where the plan already
serves, the multiplier stays at 1 (it never goes below).

It is off unless ``spec.service.enabled``: on bursty traces it buys service near the oracle's, but
on traces whose spikes are rarer and taller (a news-driven series) it buys little service for much
money, and the default must not trade one for the other (``make bench-bursty``, ``docs/results.md``).
"""

from __future__ import annotations

import math

from predictive_scaler.spec import ServiceTracking

#: The demand level shortfall is measured against: demand smoothed over this many seconds.
LEVEL_SECONDS = 3600.0
#: A gap longer than this between decisions counts as this long (a restart is no evidence).
MAX_DT_SECONDS = 600.0
#: One decision's shortfall counts at most this many demand levels (one wild sample cannot
#: buy the whole multiplier at once).
MAX_SHORTFALL_SHARE = 4.0


def update(settings: ServiceTracking, headroom_log: float, level: float | None, demand: float,
           served_capacity: float | None, dt: float) -> tuple[float, float]:
    """(log multiplier, demand level) after a decision ``dt`` seconds after the previous one.

    ``served_capacity`` is what the ready replicas serve (None: no evidence — more headroom could not
    have served the shortfall; the planner says when, ``planner._service``). Disabled, the multiplier
    is 1 and only the demand level is kept.
    """
    dt = min(max(dt, 0.0), MAX_DT_SECONDS)
    level = demand if level is None else level + (1 - math.exp(-dt / LEVEL_SECONDS)) * (demand - level)
    if not settings.enabled or settings.gain_per_hour == 0:
        return 0.0, level
    if level <= 0 or dt == 0:
        return headroom_log, level
    short = 0.0 if served_capacity is None else max(0.0, demand - served_capacity) / level
    step = settings.gain_per_hour * dt / 3600.0 * (min(short, MAX_SHORTFALL_SHARE) - (1 - settings.target))
    return min(max(0.0, headroom_log + step), math.log(settings.max_multiplier)), level
