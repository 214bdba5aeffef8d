"""API errors are mapped once (kube/api_errors.py) and caught by type everywhere else.

The table pins what each answer means: its error type, whether a retry can help, and the hint the
message carries. The callers' tests feed typed errors straight into a ``KubeCluster`` (its
``_request`` replaced): nothing above the mapping looks at a status number.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import (
    ClusterError,
    ConfigError,
    ConflictError,
    ForbiddenError,
    GoneError,
    MissingApiError,
    NotFoundError,
    ServerError,
    ThrottledError,
    UnauthorizedError,
)
from predictive_scaler.kube import api_errors
from predictive_scaler.kube.api_errors import api_error
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from tests.kube.shared import DEPLOYMENT, NOW, REPO

WHAT = "read the scale of Deployment ml/llm"
RBAC = "the controller's ServiceAccount lacks this permission; compare the RBAC rules with docs/kube-api-calls.md"


#: HTTP status → (error type, retryable, the hint the message ends with).
MAPPING: dict[int, tuple[type[ClusterError], bool, str | None]] = {
    409: (ConflictError, True, "the object changed since it was read; re-read and retry"),
    429: (ThrottledError, True, "throttled by the API server; backing off"),
    500: (ServerError, True, "API server error; retried with backoff"),
    503: (ServerError, True, "API server error; retried with backoff"),
    504: (ServerError, True, "API server error; retried with backoff"),
    401: (UnauthorizedError, False, RBAC),
    403: (ForbiddenError, False, RBAC),
    404: (NotFoundError, False, None),
    410: (GoneError, False, None),
    400: (ClusterError, False, None),
    422: (ClusterError, False, None),
    302: (ClusterError, False, None),
}


@pytest.mark.parametrize(
    ("status", "kind", "retryable", "hint"),
    [pytest.param(status, *row, id=f"{status}-{row[0].__name__}") for status, row in MAPPING.items()],
)
def test_each_status_maps_to_one_type(status: int, kind: type[ClusterError], retryable: bool,
                                      hint: str | None) -> None:
    error = api_error(status, WHAT, body=lambda: b'{"kind": "Status", "message": "the reason"}')
    assert type(error) is kind
    assert error.status == status and error.retryable is retryable
    message = str(error)
    assert message.startswith(f"{WHAT}: HTTP {status}: the reason")
    if hint is None:
        assert "(" not in message
    else:
        assert message.endswith(f"({hint})")


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_a_success_is_no_error_and_its_body_is_not_read(status: int) -> None:
    def body() -> bytes:
        raise AssertionError("a success's body is the caller's")

    assert api_error(status, WHAT, body=body) is None


@pytest.mark.parametrize("status", [None, 0], ids=["none", "zero"])
def test_nothing_back_is_a_retryable_server_error_without_a_status(status: int | None) -> None:
    error = api_error(status, WHAT, reason="cannot reach the API server (timeout)")
    assert type(error) is ServerError and error.status is None and error.retryable
    assert str(error) == f"{WHAT}: cannot reach the API server (timeout)"


def test_nothing_back_without_a_reason_says_so() -> None:
    assert str(api_error(None, WHAT)) == f"{WHAT}: no answer from the API server"


@pytest.mark.parametrize(("status", "kind"), [(410, GoneError), (404, NotFoundError), (500, ServerError),
                                              (409, ConflictError), (403, ForbiddenError)])
def test_a_callers_reason_replaces_the_answer_and_its_hint(status: int, kind: type[ClusterError]) -> None:
    error = api_error(status, "watch pods", reason="the watch ended with an error (too old)")
    assert type(error) is kind and error.status == status
    assert str(error) == "watch pods: the watch ended with an error (too old)"


@pytest.mark.parametrize(
    ("headers", "retry_after"),
    [({"Retry-After": "2"}, 2.0), ({"Retry-After": "-3"}, 0.0),
     ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None), ({}, None), (None, None)],
    ids=["seconds", "negative", "http-date", "absent", "no-headers"],
)
def test_a_throttle_carries_retry_after(headers: dict[str, str] | None, retry_after: float | None) -> None:
    error = api_error(429, WHAT, headers=headers)
    assert isinstance(error, ThrottledError) and error.retry_after == retry_after


@pytest.mark.parametrize(
    ("body", "detail"),
    [(b"", f"{WHAT}: HTTP 404"), (b"not json at all", f"{WHAT}: HTTP 404: not json at all"),
     (b'["a list"]', f"{WHAT}: HTTP 404"), (b"x" * 300, f"{WHAT}: HTTP 404: " + "x" * 200)],
    ids=["empty", "text", "not-an-object", "long-text"],
)
def test_the_answers_own_message(body: bytes, detail: str) -> None:
    assert str(api_error(404, WHAT, body=lambda: body)) == detail


def test_missing_api_is_a_not_found_without_a_status() -> None:
    error = MissingApiError("no HPA API", api="autoscaling/v2")
    assert isinstance(error, NotFoundError) and error.status is None and not error.retryable


# -- the callers catch by type ------------------------------------------------------------------------

def _kube(answers: Callable[[str, str], Any]) -> KubeCluster:
    """A KubeCluster whose every request is answered (or refused) by ``answers(method, path)``."""
    clock = FakeClock(NOW)
    kube = KubeCluster(object(), retry=RetryPolicy(max_attempts=2), clock=clock,  # type: ignore[arg-type]
                       sleep=clock.advance, rng=random.Random(0))

    def request(method: str, path: str, **_: Any) -> Any:
        return answers(method, path)

    kube._request = request  # type: ignore[method-assign]
    return kube


def _refuse(error: ClusterError, where: str = "") -> Callable[[str, str], Any]:
    def answers(method: str, path: str) -> Any:
        if where in path:
            raise error
        return {"items": [], "metadata": {}, "versions": [{"version": "v2"}]}
    return answers


def test_a_missing_target_is_target_not_found() -> None:
    with pytest.raises(NotFoundError, match="target not found: Deployment ml/llm") as info:
        _kube(_refuse(NotFoundError("no such scale", status=404))).get_scale(DEPLOYMENT)
    assert info.value.status == 404 and not info.value.retryable


def test_a_missing_placeholder_is_none_and_deleting_it_is_false() -> None:
    kube = _kube(_refuse(NotFoundError("no such Deployment")))
    assert kube.get_placeholder("llm", "ml") is None
    assert kube.delete_placeholder("llm", "ml") is False


@pytest.mark.parametrize(
    ("error", "outcome"),
    [(NotFoundError("none"), None), (ForbiddenError("no grant"), ConfigError),
     (UnauthorizedError("bad token"), UnauthorizedError), (ServerError("down", status=500), ServerError)],
    ids=["missing", "forbidden", "unauthorised", "server-error"],
)
def test_priority_class_read_by_error_type(error: ClusterError, outcome: type[Exception] | None) -> None:
    kube = _kube(_refuse(error))
    if outcome is None:
        assert kube.priority_class_value("placeholder") is None
        return
    with pytest.raises(outcome) as info:
        kube.priority_class_value("placeholder")
    if outcome is ConfigError:
        assert "(403 Forbidden)" in str(info.value) and "get on priorityclasses" in str(info.value)


def test_keda_absent_is_a_not_found_on_the_scaled_object_list() -> None:
    kube = _kube(_refuse(NotFoundError("no keda.sh"), "/scaledobjects"))
    assert kube.list_conflicting_autoscalers(DEPLOYMENT) == ()
    with pytest.raises(ForbiddenError):
        _kube(_refuse(ForbiddenError("no grant"), "/scaledobjects")).list_conflicting_autoscalers(DEPLOYMENT)


def test_no_autoscaling_group_is_a_missing_api() -> None:
    with pytest.raises(MissingApiError, match="serves neither autoscaling/v2 nor autoscaling/v2beta2"):
        _kube(_refuse(NotFoundError("no group"), "/apis/autoscaling")).hpa_version()


def test_an_unserved_target_version_is_a_config_error() -> None:
    kube = _kube(_refuse(NotFoundError("no group"), "/apis/serving.example.com/v1"))
    with pytest.raises(ConfigError, match="does not serve serving.example.com/v1"):
        kube.scalable_plural("serving.example.com/v1", "InferenceService")


def test_a_continue_token_gone_restarts_the_list_once() -> None:
    pages = iter([
        {"items": [1], "metadata": {"continue": "t1"}},
        GoneError("expired"),
        {"items": [2], "metadata": {"continue": "t2"}},
        {"items": [3], "metadata": {"resourceVersion": "9"}},
    ])

    def answers(method: str, path: str) -> Any:
        page = next(pages)
        if isinstance(page, Exception):
            raise page
        return page

    assert _kube(answers).list_paginated("/api/v1/pods", what="list pods") == ([2, 3], "9")


@pytest.mark.parametrize(
    ("error", "reachable"),
    [(NotFoundError("no /version", status=404), True), (ThrottledError("slow", status=429), True),
     (ClusterError("teapot", status=418), True), (ForbiddenError("no", status=403), False),
     (UnauthorizedError("who", status=401), False), (ServerError("down", status=503), False),
     (ServerError("no answer"), False)],
    ids=["not-found", "throttled", "other", "forbidden", "unauthorised", "server-error", "unreachable"],
)
def test_ping_by_error_type(error: ClusterError, reachable: bool) -> None:
    assert (_kube(_refuse(error)).ping(timeout=1.0) is None) is reachable


# -- status numbers are read in one place -------------------------------------------------------------

#: The functions allowed to compare a status with an HTTP status number: the Kubernetes mapping and
#: Prometheus's own (a different API, mapped in sources/).
MAPPINGS = {("predictive_scaler/kube/api_errors.py", "api_error"),
            ("predictive_scaler/sources/prometheus.py", "_status_verdict")}


def _status_comparisons(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of each comparison of something named ``…status…`` with a number 100–599."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Compare):
                sides = [child.left, *child.comparators]
                numbers = [s for s in sides for n in ast.walk(s)
                           if isinstance(n, ast.Constant) and type(n.value) is int and 100 <= n.value <= 599]
                named = any("status" in ast.unparse(s) for s in sides)
                if numbers and named:
                    found.append((name, child.lineno))
            visit(child, name)

    visit(tree, "")
    return found


def test_http_status_numbers_are_compared_in_one_mapping_only() -> None:
    package = REPO / "predictive_scaler"
    stray = [f"{path.relative_to(REPO)}:{line} (in {function or 'module'})"
             for path in sorted(package.rglob("*.py"))
             for function, line in _status_comparisons(path)
             if (str(path.relative_to(REPO)), function) not in MAPPINGS]
    assert not stray, f"catch a typed error (predictive_scaler.errors) instead: {stray}"
    assert _status_comparisons(Path(api_errors.__file__))


# -- end to end: the fake API server's answers arrive typed ------------------------------------------

@pytest.mark.parametrize(("status", "kind"), [
    (401, UnauthorizedError), (403, ForbiddenError), (404, NotFoundError), (409, ConflictError),
    (410, GoneError), (429, ThrottledError), (500, ServerError), (400, ClusterError),
])
def test_the_transport_raises_the_mapped_type(fake_api, cluster, status: int, kind: type[ClusterError]) -> None:
    fake_api.fail_next("^/version$", status)
    with pytest.raises(ClusterError) as info:
        cluster._request("GET", "/version", what="check the API server")
    assert type(info.value) is kind and info.value.status == status
    assert str(info.value).startswith(f"check the API server: HTTP {status}")


class _Stop:
    """The reflector's stop event: records how long each wait after an error would be, then stops it."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.stopped = False

    def is_set(self) -> bool:
        return self.stopped

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.stopped = True
        return True


@pytest.mark.parametrize(
    ("error", "optional", "wait", "absent"),
    [(GoneError("too old"), False, 0, False), (ServerError("down", status=503), False, 1.0, False),
     (NotFoundError("no keda.sh"), True, 300, True), (NotFoundError("no pods?"), False, 1.0, False)],
    ids=["gone-relists-at-once", "server-error-backs-off", "optional-not-found-is-absent", "not-found-backs-off"],
)
def test_the_reflector_reacts_to_the_error_type(error: ClusterError, optional: bool, wait: float,
                                                absent: bool) -> None:
    from predictive_scaler.kube.cache import Reflector

    class Failing:
        def list_paginated(self, *args: Any, **kwargs: Any) -> Any:
            raise error

    replaced: list[list[dict[str, Any]]] = []
    reflector = Reflector(Failing(), "scaledobjects", lambda: "/apis/keda.sh/v1alpha1/scaledobjects",  # type: ignore[arg-type]
                          on_replace=replaced.append, on_event=lambda kind, obj: None, optional=optional,
                          watch_timeout_seconds=300)
    reflector._stop = _Stop()  # type: ignore[assignment]
    reflector._run()
    assert reflector._stop.waits == [wait]  # type: ignore[attr-defined]
    assert reflector.absent is absent and (replaced == [[]]) is absent
    assert reflector.relists_after_error == (0 if absent else 1)
