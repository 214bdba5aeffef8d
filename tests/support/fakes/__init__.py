"""The one place the tests' fakes live.

- :mod:`tests.support.fakes.ports` — fakes of the reconciler's ports (metrics, model, cluster);
- :mod:`tests.support.fakes.apiserver` — the stateful fake Kubernetes API server (fault injection,
  KEDA ScaledObjects, the stand-in the reliability suite replays);
- :mod:`tests.support.fakes.fixtures` — the ``fake_api`` and ``clock`` fixtures, defined once for
  the kube and controller tests (their conftests import them).
"""

from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.fixtures import START
from tests.support.fakes.ports import FakeCluster, FakeMetrics, FakeModel

__all__ = ["START", "FakeApiServer", "FakeCluster", "FakeMetrics", "FakeModel"]
