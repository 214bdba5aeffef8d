"""What the benchmarks share: one BLAS thread per process, and writing the Markdown result."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: numpy's BLAS threads; one per process, as the Makefile sets them (the fits are single-threaded
#: work, and a thread per core made selection several times slower on 2 cores).
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def reexec_with_one_blas_thread(module: str, argv: Sequence[str] | None) -> None:
    """Re-run ``python -m module`` with one BLAS thread unless it already has one.

    BLAS reads these variables once, when numpy loads, so setting them here would be too late.
    """
    if all(os.environ.get(v) == "1" for v in THREAD_VARS):
        return
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
    given = sys.argv[1:] if argv is None else list(argv)
    os.execve(sys.executable, [sys.executable, "-m", module, *given], env)


def write_markdown(out: Path | str, lines: Sequence[str]) -> Path:
    """Write ``lines`` as one Markdown file (parents created) and say where on stderr."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return path
