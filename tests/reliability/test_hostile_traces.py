"""Hostile traces (encoding, headers, time zones, duplicates, order, spans and sizes, directories,
binaries, Parquet schemas, gaps) through `train`, `evaluate`, `forecast` and `backtest`.

Every refusal names the file, the row where there is one, and what to do; the store `train --out`
writes into is unchanged. Accepted inputs are checked for the right answer (the forecast is issued
at the right UTC time), not just exit 0.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.reliability.hostile import START, STEP, Case, Ran, check, csv, ids, rows

TRAIN = "train --trace {d}/t.csv --out {store} --name web --models persistence"
TRAIN_PQ = "train --trace {d}/t.parquet --out {store} --name web --models persistence"
FORECAST = "forecast --model {store}/web --trace {d}/t.csv --json"
FORECAST_PQ = "forecast --model {store}/web --trace {d}/t.parquet --json"
DAY = 288  # steps of 5 minutes

GOOD = csv(rows())
SHORT = rows(DAY)  # one day


def issued_at(expected: str) -> Callable[[Ran, Path], None]:
    """The forecast of an accepted trace is issued at the right UTC time (a wrong zone shows here)."""
    def then(ran: Ran, work: Path) -> None:
        doc = json.loads(ran.out)
        assert pd.Timestamp(doc["issued_at"]) == pd.Timestamp(expected), doc["issued_at"]
    return then


def parquet(frame: Callable[[], pd.DataFrame]) -> Callable[[Path], None]:
    return lambda path: frame().to_parquet(path)


def frame(n: int = DAY, **cols: object) -> pd.DataFrame:
    t = START + pd.to_timedelta(np.arange(n) * STEP, unit="s")
    df = pd.DataFrame({"timestamp": t, "value": 100.0 + np.arange(n) % 7})
    for k, v in cols.items():
        df[k] = v(df) if callable(v) else v
    return df


def naive(pairs: list[tuple[str, float]]) -> list[tuple[str, float]]:
    return [(t.rstrip("Z"), v) for t, v in pairs]


def with_gaps(share: float) -> str:
    pairs = rows()
    rng = np.random.default_rng(5)
    keep = rng.random(len(pairs)) >= share
    keep[0] = keep[-1] = True
    return csv([(t, v if k else "") for (t, v), k in zip(pairs, keep, strict=True)])


LAST_SHORT = SHORT[-1][0]
AUTUMN = pd.date_range("2024-10-26T23:30:00Z", "2024-10-27T02:30:00Z", freq="5min")

CASES: list[Case] = [
    # -- encoding and binaries ----------------------------------------------------------------
    Case("utf16", TRAIN, 2, ("t.csv", "UTF-16", "save it as UTF-8"), {"t.csv": GOOD.encode("utf-16")}),
    Case("latin1", TRAIN, 2, ("t.csv", "not UTF-8", "0xe9", "save it as UTF-8"),
         {"t.csv": ("timestamp,value\n2024-01-01T00:00:00Z,1\n# café\n" + GOOD[16:]).encode("latin-1")}),
    Case("gzip", TRAIN, 2, ("t.csv", "gzip-compressed", "gunzip"), {"t.csv": gzip.compress(GOOD.encode())}),
    Case("zip", TRAIN, 2, ("t.csv", "ZIP archive", "extract"), {"t.csv": b"PK\x03\x04" + b"\x14" * 200}),
    Case("png", TRAIN, 2, ("t.csv", "binary", "NUL", "timestamp,value CSV"),
         {"t.csv": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4}),
    Case("nul-bytes-inside", TRAIN, 2, ("t.csv", "binary", "NUL"),
         {"t.csv": GOOD[:300].encode() + b"\x00\x00" + GOOD[300:900].encode()}),
    Case("parquet-named-csv", TRAIN, 2, ("t.csv", "Parquet file", "name it .parquet"),
         {"t.csv": lambda p: frame().to_parquet(p)}),
    Case("utf8-bom-accepted", FORECAST, 0, ('"issued_at"',), {"t.csv": "\ufeff" + csv(SHORT)},
         then=issued_at(LAST_SHORT)),
    Case("crlf-accepted", FORECAST, 0, ('"issued_at"',), {"t.csv": csv(SHORT).replace("\n", "\r\n")},
         then=issued_at(LAST_SHORT)),
    # -- headers and columns ----------------------------------------------------------------------
    Case("empty-file", TRAIN, 2, ("t.csv", "empty", "'timestamp,value' header"), {"t.csv": ""}),
    Case("header-only", TRAIN, 2, ("t.csv", "no rows", "add timestamp,value rows"), {"t.csv": "timestamp,value\n"}),
    Case("no-header", TRAIN, 2, ("t.csv", "wrong columns", "looks like data", "add a 'timestamp,value' header"),
         {"t.csv": GOOD.split("\n", 1)[1]}),
    Case("three-columns", TRAIN, 2, ("t.csv", "wrong columns", "'host'", "exactly two columns"),
         {"t.csv": csv([(t, f"{v},a") for t, v in SHORT], "timestamp,value,host")}),
    Case("renamed-columns", TRAIN, 2, ("t.csv", "wrong columns", "'time', 'rps'", "named 'timestamp' and 'value'"),
         {"t.csv": csv(SHORT, "time,rps")}),
    Case("semicolons", TRAIN, 2, ("t.csv", "separated by something other than a comma", "use commas"),
         {"t.csv": GOOD.replace(",", ";")}),
    Case("tabs", TRAIN, 2, ("t.csv", "other than a comma"), {"t.csv": GOOD.replace(",", "\t")}),
    Case("header-repeated-inside", TRAIN, 2, ("t.csv", "row 4", "cannot read timestamp 'timestamp'", "ISO-8601"),
         {"t.csv": csv(SHORT[:2]) + "timestamp,value\n" + csv(SHORT[2:]).split("\n", 1)[1]}),
    Case("ragged-row", TRAIN, 2, ("t.csv", "not a readable CSV", "line 3", "one 'timestamp,value' pair per line"),
         {"t.csv": "timestamp,value\n2024-01-01T00:00:00Z,1\n2024-01-01T00:05:00Z,2,3,4\n"}),
    Case("uppercase-header-accepted", FORECAST, 0, ('"issued_at"',), {"t.csv": csv(SHORT, "Timestamp, Value")},
         then=issued_at(LAST_SHORT)),
    # -- values ---------------------------------------------------------------------------------
    Case("value-not-a-number", TRAIN, 2, ("t.csv", "row 3", "'lots' is not a number", "or NaN"),
         {"t.csv": csv([SHORT[0], (SHORT[1][0], "lots"), *SHORT[2:]])}),
    Case("value-infinite", TRAIN, 2, ("t.csv", "row 2", "infinite", "finite number or NaN"),
         {"t.csv": csv([(SHORT[0][0], "1e999"), *SHORT[1:]])}),
    Case("value-negative", TRAIN, 2, ("t.csv", "row 3", "negative rate -5", "convert it to a rate"),
         {"t.csv": csv([SHORT[0], (SHORT[1][0], -5), *SHORT[2:]])}),
    Case("value-boolean", TRAIN, 2, ("t.csv", "row 2", "'true' is not a number"),
         {"t.csv": csv([(SHORT[0][0], "true"), *SHORT[1:]])}),
    # -- time zones --------------------------------------------------------------------------------
    Case("mixed-z-and-naive", TRAIN, 2, ("t.csv", "row 3", "has no UTC offset, but row 2", "read hours apart",
                                         "with its offset (Z for UTC)"),
         {"t.csv": csv([(t if i % 2 == 0 else t.rstrip("Z"), v) for i, (t, v) in enumerate(rows())])}),
    Case("mixed-z-and-naive-even-with-timezone", TRAIN + " --timezone UTC", 2, ("t.csv", "has no UTC offset"),
         {"t.csv": csv([(t if i % 2 == 0 else t.rstrip("Z"), v) for i, (t, v) in enumerate(rows())])}),
    Case("naive-without-timezone", TRAIN, 2, ("t.csv", "no UTC offset", "time zone they were written in is unknown",
                                              "--timezone"), {"t.csv": csv(naive(rows()))}),
    Case("naive-forecast-without-timezone", FORECAST, 2, ("t.csv", "--timezone"), {"t.csv": csv(naive(SHORT))}),
    Case("naive-with-timezone-utc", FORECAST + " --timezone UTC", 0, ('"issued_at"',),
         {"t.csv": csv(naive(SHORT))}, then=issued_at(LAST_SHORT)),
    Case("naive-with-timezone-berlin", FORECAST + " --timezone Europe/Berlin", 0, ('"issued_at"',),
         {"t.csv": csv(naive(SHORT))},  # Berlin is UTC+1 in January: an hour earlier in UTC
         then=issued_at(str(pd.Timestamp(LAST_SHORT) - pd.Timedelta(hours=1)))),
    Case("timezone-misspelt", FORECAST + " --timezone Europe/Berln", 2,
         ("--timezone 'Europe/Berln' is not a time zone", "did you mean 'Europe/Berlin'", "IANA name"),
         {"t.csv": csv(naive(SHORT))}),
    Case("timezone-nonsense", FORECAST + " --timezone +02:00", 2, ("is not a time zone", "IANA name"),
         {"t.csv": csv(naive(SHORT))}),
    Case("offsets-accepted", FORECAST, 0, ('"issued_at"',),  # +02:00 everywhere: two hours earlier in UTC
         {"t.csv": csv([(t.replace("Z", "+02:00"), v) for t, v in SHORT])},
         then=issued_at(str(pd.Timestamp(LAST_SHORT) - pd.Timedelta(hours=2)))),
    Case("dst-spring-gap", FORECAST + " --timezone Europe/Berlin", 2,
         ("t.csv", "row 3", "2024-03-31 02:00:00 does not exist", "clocks jumped forward", "UTC offsets"),
         {"t.csv": csv(naive(rows(12, start=pd.Timestamp("2024-03-31T01:45:00Z"), step=300 * 3)))}),
    Case("dst-autumn-ambiguous", FORECAST + " --timezone Europe/Berlin", 2,
         ("t.csv", "happens twice", "clocks went back", "UTC offsets"),
         {"t.csv": "timestamp,value\n2024-10-27T02:00:00,1\n2024-10-27T02:30:00,1\n"}),
    Case("dst-autumn-ordered-accepted", FORECAST + " --timezone Europe/Berlin", 0, ('"issued_at"',),
         {"t.csv": csv([(t.tz_convert("Europe/Berlin").strftime("%Y-%m-%dT%H:%M:%S"), 1) for t in AUTUMN])},
         then=issued_at(str(AUTUMN[-1]))),  # 02:00–02:55 happen twice; the order tells which
    Case("date-only-naive", FORECAST, 2, ("t.csv", "no UTC offset", "--timezone"),
         {"t.csv": "timestamp,value\n2024-01-01,1\n2024-01-02,2\n2024-01-03,3\n"}),
    # -- duplicates and order ---------------------------------------------------------------------
    Case("duplicate-row", TRAIN, 2, ("t.csv", "row 3", "duplicate", "sort the file and remove duplicates"),
         {"t.csv": csv([SHORT[0], SHORT[0], *SHORT[1:]])}),
    Case("unsorted", TRAIN, 2, ("t.csv", "row 3", "earlier than the one before", "sort the file"),
         {"t.csv": csv([SHORT[1], SHORT[0], *SHORT[2:]])}),
    Case("same-instant-two-offsets", TRAIN, 2, ("t.csv", "row 3", "duplicate"),
         {"t.csv": "timestamp,value\n2024-01-01T00:00:00Z,1\n2024-01-01T02:00:00+02:00,1\n"}),
    Case("empty-timestamp", TRAIN, 2, ("t.csv", "row 3", "empty timestamp", "every row needs one"),
         {"t.csv": csv([SHORT[0], ("", 1), *SHORT[2:]])}),
    Case("epoch-and-iso-mixed", TRAIN, 2, ("t.csv", "mixes with epoch-second rows", "one format"),
         {"t.csv": "timestamp,value\n1704067200,1\n2024-01-01T00:05:00Z,1\n1704067800,1\n"}),
    # -- spans and sizes --------------------------------------------------------------------------
    Case("one-row", TRAIN, 2, ("t.csv", "only one row", "regularly spaced"), {"t.csv": csv(SHORT[:1])}),
    Case("year-9999", TRAIN, 2, ("t.csv", "row 3", "'9999-12-31", "outside the years 1678–2261", "check that row's year"),
         {"t.csv": "timestamp,value\n2024-01-01T00:00:00Z,1\n9999-12-31T23:59:00Z,2\n"}),
    Case("year-0", TRAIN, 2, ("t.csv", "row 2", "outside the years"),
         {"t.csv": "timestamp,value\n0000-01-01T00:00:00Z,1\n0000-01-01T00:05:00Z,1\n"}),
    Case("two-hundred-years-later", TRAIN, 2,
         ("t.csv", "row 4", "days after the first row", "more than the 10,000,000 a trace may hold",
          "check that row's year"),
         {"t.csv": "timestamp,value\n2024-01-01T00:00:00Z,1\n2024-01-01T00:00:01Z,1\n2224-01-01T00:00:00Z,2\n"}),
    Case("epoch-milliseconds", TRAIN, 2, ("t.csv", "row 2", "epoch milliseconds", "divide by 1000"),
         {"t.csv": "timestamp,value\n1704067200000,1\n1704067500000,1\n"}),
    Case("epoch-far-future", TRAIN, 2, ("t.csv", "row 3", "outside the years"),
         {"t.csv": "timestamp,value\n1704067200,1\n99999999999,1\n"}),
    Case("sub-second-step", TRAIN, 2, ("t.csv", "0.5s is not a whole number of seconds", "resample"),
         {"t.csv": "timestamp,value\n2024-01-01T00:00:00Z,1\n2024-01-01T00:00:00.5Z,1\n2024-01-01T00:00:01Z,1\n"}),
    Case("off-grid-row", TRAIN, 2, ("t.csv", "row 5", "off the 300s grid", "resample the trace"),
         {"t.csv": csv(SHORT[:3] + [("2024-01-01T00:12:00Z", 1)] + SHORT[4:])}),
    Case("thirteen-days", TRAIN, 2, ("t.csv", "insufficient history: 13.0 days < 14 days", "--min-history"),
         {"t.csv": csv(rows(13 * DAY))}),
    Case("one-step-short-of-14-days", TRAIN, 2,
         ("t.csv", "13.997 days < 14 days", "1 step(s) of 5m short", "--min-history"),
         {"t.csv": csv(rows(14 * DAY - 1))}),
    Case("exactly-14-days-evaluate", "evaluate --trace {d}/t.csv --models persistence", 2,
         ("t.csv", "14.0 days leaves nothing to evaluate after the first 14 days", "longer trace", "--min-history"),
         {"t.csv": csv(rows(14 * DAY))}),
    Case("exactly-14-days-accepted-by-forecast", FORECAST, 0, ('"issued_at"',), {"t.csv": csv(rows(14 * DAY))},
         then=issued_at(rows(14 * DAY)[-1][0])),
    # -- directories and paths --------------------------------------------------------------------
    Case("trace-is-a-directory", "train --trace {d}/traces --out {store} --name web --models persistence", 2,
         ("traces", "is a directory, not a trace file", "it holds a.csv", "one timestamp,value CSV"),
         {"traces/a.csv": GOOD}),
    Case("trace-missing", "train --trace {d}/nope.csv --out {store} --name web", 2,
         ("nope.csv", "no such file", "timestamp,value CSV or Parquet")),
    Case("trace-directory-forecast", "forecast --model {store}/web --trace {d}", 2, ("is a directory",)),
    Case("trace-directory-backtest", "backtest --trace {d} --no-progress", 2, ("is a directory",)),
    Case("trace-is-dev-null", "train --trace /dev/null --out {store} --name web", 2, ("/dev/null",)),
    # -- Parquet schemas ------------------------------------------------------------------------------
    Case("parquet-wrong-columns", TRAIN_PQ, 2, ("t.parquet", "wrong columns", "'rps'"),
         {"t.parquet": parquet(lambda: frame().rename(columns={"value": "rps"}))}),
    Case("parquet-extra-column", TRAIN_PQ, 2, ("t.parquet", "wrong columns", "'host'"),
         {"t.parquet": parquet(lambda: frame(host="a"))}),
    Case("parquet-text-values", TRAIN_PQ, 2, ("t.parquet", "row 1", "'x' is not a number"),
         {"t.parquet": parquet(lambda: frame(value="x"))}),
    Case("parquet-list-values", TRAIN_PQ, 2, ("t.parquet", "row 1", "is not a number"),
         {"t.parquet": parquet(lambda: frame(3, value=lambda df: [[1, 2]] * len(df)))}),
    Case("parquet-naive-timestamps", TRAIN_PQ, 2, ("t.parquet", "has no time zone", "--timezone"),
         {"t.parquet": parquet(lambda: frame(timestamp=lambda df: df["timestamp"].dt.tz_localize(None)))}),
    Case("parquet-naive-with-timezone", FORECAST_PQ + " --timezone America/New_York", 0, ('"issued_at"',),
         {"t.parquet": parquet(lambda: frame(timestamp=lambda df: df["timestamp"].dt.tz_localize(None)))},
         then=issued_at(str(START + pd.Timedelta(seconds=STEP * (DAY - 1)) + pd.Timedelta(hours=5)))),
    Case("parquet-truncated", TRAIN_PQ, 2, ("t.parquet", "not a readable Parquet file", "export it again"),
         {"t.parquet": lambda p: (frame().to_parquet(p), p.write_bytes(p.read_bytes()[:300]))}),
    Case("parquet-no-rows", TRAIN_PQ, 2, ("t.parquet", "no rows"), {"t.parquet": parquet(lambda: frame(0))}),
    Case("parquet-null-timestamp", TRAIN_PQ, 2, ("t.parquet", "row 2", "empty timestamp"),
         {"t.parquet": parquet(lambda: frame(timestamp=lambda df: df["timestamp"].where(df.index != 1)))}),
    Case("parquet-text-timestamps-accepted", FORECAST_PQ, 0, ('"issued_at"',),
         {"t.parquet": parquet(lambda: frame(timestamp=lambda df: df["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")))},
         then=issued_at(LAST_SHORT)),
    # -- gaps --------------------------------------------------------------------------------------
    Case("ninety-five-percent-missing", TRAIN, 2,
         ("t.csv", "95% of the 6,048 steps are missing", "more than the 50% allowed", "days observed",
          "fill the gaps", "--max-missing"), {"t.csv": with_gaps(0.95)}),
    Case("ninety-five-percent-missing-evaluate", "evaluate --trace {d}/t.csv --models persistence", 2,
         ("95% of the", "--max-missing"), {"t.csv": with_gaps(0.95)}),
    Case("ninety-five-percent-missing-backtest", "backtest --trace {d}/t.csv --no-progress", 2,
         ("95% of the", "more than the 50% allowed", "--max-missing"), {"t.csv": with_gaps(0.95)}),
    Case("all-missing", TRAIN, 2, ("100% of the", "missing"),
         {"t.csv": csv([(t, "NaN") for t, _ in rows()])}),
    Case("max-missing-not-a-share", TRAIN + " --max-missing 1.5", 2,
         ("--max-missing 1.5 is not a share", "between 0 and 1"), {"t.csv": GOOD}),
    Case("long-outage-in-the-middle", TRAIN, 2, ("t.csv", "missing", "--max-missing"),
         {"t.csv": csv(rows()[:2 * DAY] + rows()[-2 * DAY:])}),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hostile_trace(case: Case, work: Path) -> None:
    check(case, work)
