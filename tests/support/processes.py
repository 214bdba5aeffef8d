"""Stopping the processes the tests start (Prometheus, the API server, etcd, the controller)."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def stop_process(popen: subprocess.Popen[Any], *, grace: float, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to ``popen`` if it still runs and wait up to ``grace`` seconds; kill it when it
    has not exited by then. True when it exited by itself (or had already)."""
    if popen.poll() is not None:
        return True
    popen.send_signal(sig)
    try:
        popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(timeout=5)
        return False
    return True
