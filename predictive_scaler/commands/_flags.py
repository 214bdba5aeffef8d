"""Parsing shared by several commands' flags."""

from __future__ import annotations

import pandas as pd

from predictive_scaler.errors import ConfigError
from predictive_scaler.series import to_utc


def parse_time_flag(flag: str, text: str) -> pd.Timestamp:
    """The value of a time flag (``--at``, ``--end``, ``--now``) as UTC; naive times are UTC."""
    try:
        stamp = pd.Timestamp(text)
    except ValueError:
        stamp = pd.NaT
    if pd.isna(stamp):
        raise ConfigError(f"{flag} {text!r} is not a time; write ISO-8601, e.g. 2026-03-01T00:00:00Z",
                          field=flag.lstrip("-").replace("-", "_"))
    return to_utc(stamp)
