"""Every name has one home: it is imported from the module that defines it, never through another.

A module that imports a name and lists it in ``__all__``, or that another module imports the name
from, is a re-export: two import paths for one concept, which drift apart. Submodules imported
from their package (``from predictive_scaler.retrain import training``) are not re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "predictive_scaler"


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level(path: Path) -> tuple[set[str], set[str], list[str]]:
    """(names defined, names imported, ``__all__``) at a module's top level."""
    defined: set[str] = set()
    imported: set[str] = set()
    exported: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            defined |= names
            if "__all__" in names and isinstance(node.value, ast.List | ast.Tuple):
                exported = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        elif isinstance(node, ast.ImportFrom):
            imported |= {a.asname or a.name for a in node.names}
    return defined, imported - defined, exported


TOP = {name: _top_level(path) for name, path in MODULES.items()}


def test_every_all_lists_only_what_its_module_defines() -> None:
    bad = {name: [e for e in exported if e not in defined]
           for name, (defined, _, exported) in TOP.items() if any(e not in defined for e in exported)}
    assert not bad, bad


def test_no_name_is_imported_through_a_module_that_does_not_define_it() -> None:
    found = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in TOP:
                _, reexported, _ = TOP[node.module]
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {a.name} from {node.module}"
                          for a in node.names if a.name in reexported and f"{node.module}.{a.name}" not in MODULES]
    assert not found, "\n".join(found)


def test_the_check_sees_a_re_export(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from predictive_scaler.core.values import DemandSample\n__all__ = ['DemandSample']\n")
    defined, reexported, exported = _top_level(module)
    assert "DemandSample" in reexported and "DemandSample" not in defined and exported == ["DemandSample"]
