"""A daemon thread that calls a function every ``period`` seconds until stopped (e2e recorders, stand-ins)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Ticker:
    """Calls ``tick`` every ``period`` seconds on a daemon thread named ``name``, from :meth:`start`
    until :meth:`stop`; ``tick`` handles (and records) its own errors."""

    def __init__(self, name: str, tick: Callable[[], None], period: float = 1.0) -> None:
        self.name, self.tick, self.period = name, tick, period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.tick()
