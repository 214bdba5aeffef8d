"""A writer process for the object store tests: publish ``count`` versions of ``name`` to an s3:// store.

    python -m tests.support.objectstore_writer URL NAME COUNT [PAUSE]

``PAUSE`` > 0: sleep that long after each ``model.json`` is written and before its manifest, and
print ``model-written`` first — the test kills the process there (SIGKILL mid-publish).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.object_store import ObjectModelStore
from predictive_scaler.forecasting.store import MODEL_FILE, TrainingWindow
from predictive_scaler.series import Series

START = pd.Timestamp("2026-01-05", tz="UTC")


def model(seed: int):  # noqa: ANN201 - a fitted persistence model
    rng = np.random.default_rng(seed)
    values = 100 + 30 * np.sin(np.arange(2016) * 2 * np.pi / 288) + rng.normal(0, 5, 2016)
    return PersistenceForecaster().fit(Series(values=values, start=START, step_seconds=300, name="x"))


def window() -> TrainingWindow:
    return TrainingWindow(START, START + pd.Timedelta(days=7), 300)


def main(argv: list[str]) -> int:
    url, name, count = argv[0], argv[1], int(argv[2])
    pause = float(argv[3]) if len(argv) > 3 else 0.0
    store = ObjectModelStore(url, keep=1000)
    if pause > 0:
        put = store._put

        def slow_put(key: str, body: bytes, **kw: object) -> None:
            put(key, body, **kw)  # type: ignore[arg-type]
            if key.endswith(MODEL_FILE):
                print("model-written", flush=True)
                time.sleep(pause)

        store._put = slow_put  # type: ignore[method-assign]
    for i in range(count):
        version = store.publish(name, model(hash((name, i)) % 2**32), series=name, window=window())
        print(version, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
