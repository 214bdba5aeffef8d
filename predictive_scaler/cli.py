"""The `predictive-scaler` command: a thin dispatcher over predictive_scaler.commands.

Each command lives in its own module under ``predictive_scaler/commands/`` and
exposes ``register(subparsers)`` (which adds its parser and sets ``func``).
Command modules import heavy libraries inside their ``run`` so that
``predictive-scaler --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings
from collections.abc import Sequence

from predictive_scaler import __version__
from predictive_scaler.errors import ScalerError

#: Command modules, in the order `--help` lists them.
COMMANDS = ("train", "forecast", "evaluate", "backtest", "controller", "retrain", "models", "status", "shadow_report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="predictive-scaler",
        description="Predictive GPU autoscaler for Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"predictive_scaler.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"predictive_scaler.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2

    def _warn(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        print(f"warning: {message}", file=sys.stderr)

    warnings.showwarning = _warn
    try:
        return int(args.func(args) or 0)
    except ScalerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
