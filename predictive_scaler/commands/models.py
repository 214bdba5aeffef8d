"""`predictive-scaler models list|show|promote|rollback|verify`: operate the model store."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "models",
        help="list, inspect, promote or roll back model versions in a store",
        description="Operate a model store: a directory (a PersistentVolume in the cluster) or an object store "
                    "bucket, s3://bucket/prefix (credentials from the AWS SDK's environment; "
                    "--s3-endpoint-url or AWS_ENDPOINT_URL_S3 for an S3-compatible store).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    ls = actions.add_parser("list", help="versions of one model, or every model's serving version")
    ls.add_argument("--store", required=True, help=STORE_HELP)
    ls.add_argument("--name", help="model name (default: list every model in the store)")
    ls.add_argument("--json", action="store_true", help="print JSON")
    add_endpoint_flag(ls)
    ls.set_defaults(func=run_list)

    show = actions.add_parser("show", help="a version's manifest, verified (default: the serving version)")
    show.add_argument("--store", required=True, help=STORE_HELP)
    show.add_argument("--name", required=True, help="model name")
    show.add_argument("--version", help="version id (default: the serving one)")
    add_endpoint_flag(show)
    show.set_defaults(func=run_show)

    promote = actions.add_parser("promote", help="serve a listed version (verified first)")
    promote.add_argument("--store", required=True, help=STORE_HELP)
    promote.add_argument("--name", required=True, help="model name")
    promote.add_argument("--version", required=True, help="version id from `models list`")
    add_endpoint_flag(promote)
    promote.set_defaults(func=run_promote)

    rollback = actions.add_parser("rollback", help="serve the version that served before the current one")
    rollback.add_argument("--store", required=True, help=STORE_HELP)
    rollback.add_argument("--name", required=True, help="model name")
    add_endpoint_flag(rollback)
    rollback.set_defaults(func=run_rollback)

    verify = actions.add_parser("verify", help="check every pointer and version of the store (exit 1 on a problem)")
    verify.add_argument("--store", required=True, help=STORE_HELP)
    verify.add_argument("--name", help="model name (default: every model in the store)")
    verify.add_argument("--repair", action="store_true",
                        help="re-point a damaged or failing serving pointer to the newest version that verifies")
    verify.add_argument("--json", action="store_true", help="print JSON")
    add_endpoint_flag(verify)
    verify.set_defaults(func=run_verify)


STORE_HELP = "model store: a directory or s3://bucket/prefix"


def add_endpoint_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--s3-endpoint-url", help="endpoint of an S3-compatible object store for an s3:// store "
                                             "(default: $AWS_ENDPOINT_URL_S3, else AWS S3)")


def open_store_flag(location: str, flag: str, *, keep: int = 5, endpoint: str | None = None,
                    must_exist: bool = True) -> Any:
    """The store a flag names: ``s3://bucket/prefix`` or a directory (which must exist if ``must_exist``)."""
    import os
    from pathlib import Path

    from predictive_scaler.errors import ConfigError
    from predictive_scaler.forecasting.store import ModelStore, is_object_store_url, open_store
    from predictive_scaler.yaml_input import describe

    if is_object_store_url(location):
        if endpoint:
            # The SDK's own variable: worker processes inherit it, and no credential travels in a flag.
            os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
        return open_store(location, keep=keep)
    if must_exist and not Path(location).is_dir():
        what = describe(location)
        problem = "no such directory" if what is None else f"is {what}, not a directory"
        raise ConfigError(f"{flag} {location}: {problem}; give the directory (or s3:// URL) `train --out` wrote to",
                          field=flag.lstrip("-").replace("-", "_"))
    return ModelStore(location, keep=keep)


def _store(args: argparse.Namespace) -> Any:
    return open_store_flag(args.store, "--store", endpoint=getattr(args, "s3_endpoint_url", None))


def _summary(manifest: Any) -> dict[str, Any]:
    """The few manifest facts an operator scans for: what, for what, trained when, how good."""
    metrics = manifest.metrics or {}
    kind = manifest.base_kind or metrics.get("selected") or manifest.kind
    horizons = metrics.get("models", {}).get(metrics.get("selected"), {}).get("horizons", {})
    longest = list(horizons)[-1] if horizons else None
    row = horizons.get(longest, {}) if longest else {}
    return {
        "kind": kind,
        "series": manifest.series,
        "created_at": manifest.created_at.isoformat(),
        "window": f"{manifest.window.start:%Y-%m-%d} – {manifest.window.end:%Y-%m-%d}",
        "horizon": longest,
        "pinball": row.get("pinball"),
        "coverage": row.get("coverage"),
    }


def run_list(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.name is None:
        rows = []
        for name in store.names():
            pointer, problem = store.pointer_or_problem(name)  # a damaged pointer is reported, not fatal
            serving = f"damaged pointer: {problem}" if problem else (pointer.version if pointer else None)
            rows.append({"name": name, "serving": serving, "versions": len(store.list(name))})
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            _table([["name", "serving", "versions"], *([r["name"], r["serving"] or "–", str(r["versions"])] for r in rows)])
        return 0
    infos = store.list(args.name)
    if args.json:
        print(json.dumps([
            {"version": i.version, "serving": i.serving,
             **(_summary(i.manifest) if i.manifest else {"problem": i.problem})}
            for i in infos
        ], indent=2, allow_nan=False))
        return 0
    table = [["version", "serving", "kind", "trained on", "horizon", "pinball", "coverage"]]
    for i in infos:
        if i.manifest is None:
            table.append([i.version, "*" if i.serving else "", "damaged", i.problem or "", "", "", ""])
            continue
        s = _summary(i.manifest)
        table.append([i.version, "*" if i.serving else "", s["kind"], s["window"], s["horizon"] or "–",
                     _num(s["pinball"]), _num(s["coverage"])])
    if len(table) == 1:
        print(f"no versions of {args.name!r} in {args.store}")
        return 1
    _table(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    store = _store(args)
    loaded = store.load(args.name, args.version) if args.version else store.serving(args.name)
    doc = loaded.manifest.to_dict()
    doc["version"] = loaded.path.name
    doc["verified"] = True  # load_artifact checked hash, format, parameters
    print(json.dumps(doc, indent=2, allow_nan=False))
    return 0


def run_promote(args: argparse.Namespace) -> int:
    store = _store(args)
    _, problem = store.pointer_or_problem(args.name)
    loaded = store.promote(args.name, args.version)
    repaired = " — the damaged serving pointer was replaced" if problem else ""
    print(f"{args.name}: now serving {loaded.path.name} ({_summary(loaded.manifest)['kind']}){repaired}")
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    store = _store(args)
    before, problem = store.pointer_or_problem(args.name)
    loaded = store.rollback(args.name)
    if problem:
        print(f"{args.name}: the serving pointer was damaged; repaired: now serving {loaded.path.name}, the newest "
              "version that verifies")
        return 0
    print(f"{args.name}: rolled back from {before.version if before else '–'} to {loaded.path.name}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from predictive_scaler.errors import ConfigError

    store = _store(args)
    if args.name is not None and args.name not in store.names():
        raise ConfigError(f"--name {args.name!r}: no such model in {args.store} (it holds "
                          f"{', '.join(store.names()) or 'none'}); check the name", field="name")
    reports = store.verify(args.name, repair=args.repair)
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        for r in reports:
            state = "ok" if r.ok else f"{len(r.problems)} problem(s)"
            print(f"{r.name}: serving {r.serving or '–'}, {r.versions} version(s): {state}")
            if r.repaired:
                print(f"  {r.repaired}")
            for problem in r.problems:
                print(f"  problem: {problem}")
        if not reports:
            print(f"no models in {args.store}")
    return 0 if all(r.ok for r in reports) else 1


def _num(v: Any) -> str:
    return "–" if v is None else f"{float(v):.4g}"


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
