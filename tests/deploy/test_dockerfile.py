"""The Dockerfile, checked statically (no container daemon here): pinned, non-root, no secrets, real entry point."""

from __future__ import annotations

import importlib
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from .support import DEPLOY, OVERLAYS, REPO, pod_specs, render

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CONSTRAINTS = DEPLOY / "image" / "constraints.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


DOCKER = instructions(DOCKERFILE.read_text())


def _arg_defaults() -> dict[str, str]:
    out = {}
    for word, rest in DOCKER:
        if word == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            out[name.strip()] = value.strip()
    return out


def _stages() -> list[tuple[str, str | None]]:
    """(resolved image, stage name) of every FROM."""
    args = _arg_defaults()
    stages = []
    for word, rest in DOCKER:
        if word == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append((image, name))
    return stages


def image_is_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return re.search(r"@sha256:[0-9a-f]{64}$", image) is not None
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and re.match(r"^v?\d+\.\d+\.\d+", tag) is not None


@pytest.mark.parametrize("image, pinned", [
    ("python:3.11.7-slim-bookworm", True),
    ("python:3.11.7-slim@sha256:" + "a" * 64, True),
    ("python:latest", False),
    ("python:3.11-slim", False),
    ("python", False),
    ("registry:5000/python", False),
], ids=["version-tag", "digest", "latest", "minor-only", "untagged", "registry-port-no-tag"])
def test_pin_rule(image, pinned):
    assert image_is_pinned(image) is pinned


def test_multi_stage_from_pinned_images():
    stages = _stages()
    assert len(stages) >= 2, "build and runtime stages"
    names = {name for _, name in stages if name}
    for image, _ in stages:
        assert image in names or image_is_pinned(image), f"unpinned base image {image}"
    requires = SpecifierSet(PYPROJECT["project"]["requires-python"])
    for image, _ in stages:
        if image.startswith("python:"):
            assert re.match(r"python:(\d+\.\d+\.\d+)", image).group(1) in requires


def _final_stage() -> list[tuple[str, str]]:
    last_from = max(i for i, (word, _) in enumerate(DOCKER) if word == "FROM")
    return DOCKER[last_from:]


@pytest.mark.kubectl
def test_runs_as_the_numeric_non_root_user_the_manifests_expect():
    users = [rest for word, rest in _final_stage() if word == "USER"]
    assert users, "the runtime stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    for name, spec in pod_specs(render(OVERLAYS["default"])):
        assert spec["securityContext"]["runAsUser"] == int(uid), name


def test_no_secrets_baked_in():
    secretish = re.compile(r"(TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|PRIVATE|AWS_|KUBECONFIG)", re.I)
    for word, rest in DOCKER:
        if word in ("ENV", "ARG", "LABEL"):
            assert not secretish.search(rest), f"{word} {rest}"
        if word in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|id_rsa|\.kube|\.pem|\.key\b|secret", rest, re.I), rest
        assert word != "ADD" or not re.search(r"https?://", rest), "ADD from a URL is unverified"
        if word == "RUN":
            assert not re.search(r"curl[^|]*\|\s*(ba)?sh", rest), "curl | sh"


def test_entry_point_is_the_packaged_console_script():
    entry = [rest for word, rest in _final_stage() if word == "ENTRYPOINT"]
    assert entry, "no ENTRYPOINT"
    (program,) = re.findall(r'^\["([^"]+)"', entry[-1])
    target = PYPROJECT["project"]["scripts"][program]
    module, _, function = target.partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_copied_sources_exist_and_pass_dockerignore():
    ignore = DockerIgnore(DOCKERIGNORE.read_text())
    for word, rest in DOCKER:
        if word == "COPY" and "--from=" not in rest:
            *sources, _dest = [p for p in rest.split() if not p.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), source
                assert not ignore.excluded(source), f"{source} is excluded by .dockerignore"


class DockerIgnore:
    """Docker's .dockerignore rules: patterns in order, the last match wins, `!` re-includes,
    a pattern matching a parent directory matches everything under it."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line.lstrip("!").strip("/")
            regex = "".join(".*" if tok == "**" else "[^/]*" if tok == "*" else "[^/]" if tok == "?"
                            else re.escape(tok) for tok in re.split(r"(\*\*|\*|\?)", pattern))
            self.rules.append((negate, re.compile(regex.replace(".*/", "(.*/)?"))))

    def excluded(self, path: str) -> bool:
        parts = path.strip("/").split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        result = False
        for negate, regex in self.rules:
            if any(regex.fullmatch(p) for p in prefixes):
                result = not negate
        return result


@pytest.mark.parametrize("path, excluded", [
    (".venv/bin/python", True), (".git/config", True), ("tests/deploy/test_rbac.py", True),
    ("backtests/results/x.md", True), ("models/x/model.json", True), ("predictive_scaler/cli.py", False),
    ("predictive_scaler/__pycache__/cli.cpython-311.pyc", True), ("pyproject.toml", False),
    ("deploy/image/constraints.txt", False), ("deploy/base/crd.yaml", True),
], ids=lambda v: str(v))
def test_build_context_is_minimal(path, excluded):
    assert DockerIgnore(DOCKERIGNORE.read_text()).excluded(path) is excluded


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"not pinned with ==: {line}"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_every_runtime_dependency_is_pinned_within_pyproject():
    pins = _pins()
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in {CONSTRAINTS.relative_to(REPO)}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} violates {dep}"
    test_only = {canonicalize_name(Requirement(d).name) for d in PYPROJECT["project"]["optional-dependencies"]["test"]}
    assert not test_only & set(pins), f"test tools in the image: {sorted(test_only & set(pins))}"
