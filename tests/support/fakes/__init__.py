"""The one place the tests' fakes are found.

- :mod:`tests.support.fakes.fixtures` — the ``fake_api`` (stateful fake Kubernetes API
  server) and ``clock`` (a :class:`~predictive_scaler.clock.FakeClock` at :data:`START`)
  fixtures, defined once for the kube and controller tests (their conftests import them);
- :class:`FakeApiServer` (``tests/kube/fake_apiserver.py``) and the fakes of the
  reconciler's ports (``tests/fakes.py``), re-exported here.

The modules still live where they were first written; moving them here is left for a
session in which nobody else is editing them (issue #13).
"""

from tests.fakes import FakeCluster, FakeMetrics, FakeModel
from tests.kube.fake_apiserver import FakeApiServer
from tests.support.fakes.fixtures import START

__all__ = ["START", "FakeApiServer", "FakeCluster", "FakeMetrics", "FakeModel"]
