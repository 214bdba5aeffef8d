"""Parsing shared by several commands' flags."""

from __future__ import annotations

import argparse
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictive_scaler.errors import ConfigError
from predictive_scaler.forecasting.registry import DEFAULT_CANDIDATES
from predictive_scaler.yaml_input import excerpt

if TYPE_CHECKING:
    import pandas as pd

#: The candidate models of `train` and `evaluate`: the one default list (the retraining job's
#: and the backtest's too), as a flag value.
DEFAULT_MODELS = ",".join(DEFAULT_CANDIDATES)

#: Mirrors series.DEFAULT_MAX_MISSING (not imported: registering flags must not import pandas).
DEFAULT_MAX_MISSING = 0.5


def add_command(subparsers: Any, doc: str | None) -> argparse.ArgumentParser:
    """Add a command's parser from its module docstring, so its words live in one place.

    The docstring's first line is ```predictive-scaler NAME`: HELP``; the paragraph after the
    blank line is the description ``NAME --help`` prints.
    """
    if not doc:
        raise ValueError("a command module needs a docstring (`predictive-scaler NAME`: help)")
    first, _, rest = doc.strip().partition("\n")
    head, _, help_text = first.partition(": ")
    name = head.strip("`").removeprefix("predictive-scaler ")
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help_text, description=" ".join(rest.split()) or help_text)
    return parser


def parse_time_flag(flag: str, text: str, timezone: str | None = None) -> pd.Timestamp:
    """The value of a time flag (``--at``, ``--end``, ``--now``) as UTC; naive times are in ``timezone``
    (``--timezone``, as the trace's), else UTC."""
    import pandas as pd

    from predictive_scaler.series import to_utc

    try:
        stamp = pd.Timestamp(text)
    except (ValueError, OverflowError):
        stamp = pd.NaT
    if pd.isna(stamp):
        raise ConfigError(f"{flag} {excerpt(text)} is not a time; write ISO-8601, e.g. 2026-03-01T00:00:00Z",
                          field=flag.lstrip("-").replace("-", "_"))
    if stamp.tzinfo is None and timezone is not None:
        from predictive_scaler.series import parse_timezone

        try:
            stamp = stamp.tz_localize(parse_timezone(timezone), ambiguous="raise", nonexistent="raise")
        except ValueError as exc:
            raise ConfigError(f"{flag} {excerpt(text)} does not exist or happens twice in {timezone} (a clock change); "
                              "write it with its UTC offset", field=flag.lstrip("-").replace("-", "_")) from exc
    return to_utc(stamp)


def add_trace_flags(p: argparse.ArgumentParser, *, history: bool = True) -> None:
    """``--timezone`` (and, for commands that check history, ``--max-missing``)."""
    p.add_argument("--timezone", default=None, metavar="ZONE",
                   help="time zone of trace timestamps written without a UTC offset (IANA name: UTC, "
                        "Europe/Berlin …); without it such timestamps are refused")
    if history:
        p.add_argument("--max-missing", type=float, default=DEFAULT_MAX_MISSING, metavar="SHARE",
                       help=f"largest share of missing steps accepted in the trace (default {DEFAULT_MAX_MISSING})")


def max_missing(args: argparse.Namespace) -> float:
    """``--max-missing`` checked: a share in [0, 1]."""
    value = float(args.max_missing)
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"--max-missing {value:g} is not a share; give one between 0 and 1 (default "
                          f"{DEFAULT_MAX_MISSING})", field="max_missing")
    return value


def at_most(flag: str, value: float, high: float, what: str) -> float:
    """A number flag no larger than ``high`` (so neither infinite nor NaN); ConfigError naming the flag.

    Only the absurd end: a command checks the low end (positive, …) where it uses the value.
    """
    if not value <= high:
        why = "is not a number" if value != value else f"is more than the {high:g} a run can use"  # NaN ≠ NaN
        raise ConfigError(f"{flag} {value:g} {why}; give the {what}", field=flag.lstrip("-").replace("-", "_"))
    return value


def positive_duration(flag: str, text: str) -> timedelta:
    """A duration flag (``--min-history``, ``--horizon`` …) that must be a positive span."""
    from predictive_scaler.errors import DataError
    from predictive_scaler.series import parse_duration

    try:
        value = parse_duration(text)
    except DataError as exc:
        raise ConfigError(f"{flag}: {exc}", field=flag.lstrip("-").replace("-", "_")) from exc
    if value <= timedelta(0):
        raise ConfigError(f"{flag} {excerpt(text)} is not a positive duration; give one such as 14d",
                          field=flag.lstrip("-").replace("-", "_"))
    return value


def check_output(flag: str, path: str | Path, *, directory: bool) -> Path:
    """Refuse an output path that cannot be written — before any work starts.

    ``directory``: the path is (or will be created as) a directory; else it is a file.
    """
    p = Path(path)
    if p.exists():
        if directory and not p.is_dir():
            raise ConfigError(f"{flag} {p}: is a file, not a directory; give a directory (it is created if "
                              "missing)", field=flag.lstrip("-").replace("-", "_"))
        if not directory and p.is_dir():
            raise ConfigError(f"{flag} {p}: is a directory; give the path of a file to write",
                              field=flag.lstrip("-").replace("-", "_"))
        existing = p if p.is_dir() else p.parent
    else:
        existing = p.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ConfigError(f"{flag} {p}: {existing} is a file, not a directory, so nothing can be written "
                              f"under it; choose another {flag}", field=flag.lstrip("-").replace("-", "_"))
    try:  # os.access says yes to root everywhere: write a probe file, as the real write will
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {p}: cannot write in {existing} ({exc.strerror or exc}); choose another {flag} "
                          "or fix its permissions", field=flag.lstrip("-").replace("-", "_")) from exc
    return p


def add_prometheus_auth_flags(p: argparse.ArgumentParser) -> None:
    """The ``--prometheus-*`` credential, TLS and header flags every command that reads Prometheus takes
    (each defaults to its ``PREDICTIVE_SCALER_PROMETHEUS_*`` variable; secrets only ever from files)."""
    g = p.add_argument_group("Prometheus authentication (docs/install.md, Prometheus behind authentication)")
    g.add_argument("--prometheus-bearer-token-file", metavar="FILE",
                   help="send 'Authorization: Bearer <file content>', re-read when the file changes (a projected "
                        "ServiceAccount token) ($PREDICTIVE_SCALER_PROMETHEUS_BEARER_TOKEN_FILE)")
    g.add_argument("--prometheus-basic-auth-user", metavar="USER",
                   help="basic auth user ($PREDICTIVE_SCALER_PROMETHEUS_BASIC_AUTH_USER)")
    g.add_argument("--prometheus-basic-auth-password-file", metavar="FILE",
                   help="basic auth password, read from this file ($PREDICTIVE_SCALER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE)")
    g.add_argument("--prometheus-ca-file", metavar="FILE",
                   help="PEM CA bundle that signed Prometheus's certificate ($PREDICTIVE_SCALER_PROMETHEUS_CA_FILE)")
    g.add_argument("--prometheus-cert-file", metavar="FILE",
                   help="PEM client certificate for mTLS ($PREDICTIVE_SCALER_PROMETHEUS_CERT_FILE)")
    g.add_argument("--prometheus-key-file", metavar="FILE",
                   help="its PEM private key ($PREDICTIVE_SCALER_PROMETHEUS_KEY_FILE)")
    g.add_argument("--prometheus-insecure-skip-verify", action="store_true", default=None,
                   help="do NOT verify Prometheus's certificate (unsafe: prefer --prometheus-ca-file) "
                        "($PREDICTIVE_SCALER_PROMETHEUS_INSECURE_SKIP_VERIFY=true)")
    g.add_argument("--prometheus-header", action="append", default=[], metavar="NAME=VALUE",
                   help="send this header with every query, e.g. X-Scope-OrgID=team-a (repeatable; "
                        "$PREDICTIVE_SCALER_PROMETHEUS_HEADERS, comma-separated); never a secret: use "
                        "--prometheus-header-file")
    g.add_argument("--prometheus-header-file", action="append", default=[], metavar="NAME=PATH",
                   help="send this header with the file's content as its value, re-read when it changes "
                        "(repeatable; $PREDICTIVE_SCALER_PROMETHEUS_HEADER_FILES)")
    g.add_argument("--prometheus-sigv4-region", metavar="REGION",
                   help="sign requests with AWS SigV4 for Amazon Managed Prometheus in REGION, with the default AWS "
                        "credentials (IRSA …); needs predictive-scaler[aws] ($PREDICTIVE_SCALER_PROMETHEUS_SIGV4_REGION)")
    g.add_argument("--prometheus-google-auth", action="store_true", default=None,
                   help="authenticate to Google Managed Prometheus with Application Default Credentials (workload "
                        "identity); needs predictive-scaler[gcp] ($PREDICTIVE_SCALER_PROMETHEUS_GOOGLE_AUTH=true)")


def prometheus_auth(args: argparse.Namespace, environ: Any) -> Any:
    """The :class:`~predictive_scaler.sources.prometheus_auth.PrometheusAuth` of ``args`` over ``environ``."""
    from predictive_scaler.sources.prometheus_auth import PrometheusAuth, parse_pairs

    return PrometheusAuth.from_env(
        environ, bearer_token_file=args.prometheus_bearer_token_file,
        basic_auth_user=args.prometheus_basic_auth_user,
        basic_auth_password_file=args.prometheus_basic_auth_password_file, ca_file=args.prometheus_ca_file,
        cert_file=args.prometheus_cert_file, key_file=args.prometheus_key_file,
        insecure_skip_verify=args.prometheus_insecure_skip_verify,
        headers=parse_pairs(args.prometheus_header, "--prometheus-header"),
        header_files=parse_pairs(args.prometheus_header_file, "--prometheus-header-file"),
        sigv4_region=args.prometheus_sigv4_region, google_auth=args.prometheus_google_auth)
