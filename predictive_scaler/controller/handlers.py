"""kopf registrations — thin: they call :class:`ControllerService` and map API faults to kopf retries.

:func:`build_registry` returns a fresh ``kopf.OperatorRegistry`` and the plain
handler functions registered on it (:class:`Handlers`), so tests call exactly
what kopf calls, without an event loop or an API server watch.

Operational notes:
- kopf peering is not leader election: run ONE replica per shard — unsharded, one
  with the Recreate strategy (deploy/base/deployment.yaml does); sharded, one per
  ordinal fenced by a Lease (controller/shards.py) — and the operator runs
  standalone (no peering objects, so no RBAC for them).
- No finalizers: the placeholder is garbage-collected through its ownerReference
  when the PredictiveScaler is deleted, so deletion needs no handler of ours to
  succeed, and deleting a scaler (or the CRD, on uninstall) completes while the
  controller is stopped. kopf puts its finalizer on every object a timer runs
  for, so that it can stop the timer before the object goes; the reconcile timer
  is registered without that need (:func:`_release_finalizer`) and is stopped by
  its filter instead, once the watch reports the object DELETED. A finalizer an
  older version left is removed by kopf at the next event of the object. The
  deletion handlers only drop in-memory bookings.
- kopf's own handler log lines are not posted as Events (a timer every minute
  would flood ``kubectl describe``); ours are, deduplicated.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from predictive_scaler.controller.service import ControllerService
from predictive_scaler.errors import ClusterError, ShuttingDown, ThrottledError
from predictive_scaler.kube import manifests

log = logging.getLogger("predictive_scaler.controller")

#: Retry delay for a failed API call when the server did not say (seconds).
DEFAULT_RETRY_DELAY = 10.0


def retry_delay(exc: ClusterError, interval: float) -> float:
    """How long kopf waits before retrying after an API fault: Retry-After, else a short fixed delay."""
    if isinstance(exc, ThrottledError) and exc.retry_after is not None:
        return max(1.0, min(float(exc.retry_after), interval))
    return min(DEFAULT_RETRY_DELAY, interval)


@dataclass(frozen=True)
class Handlers:
    reconcile: Callable[..., None]
    startup: Callable[..., None]
    deleted: Callable[..., None]
    watched: Callable[..., None]


def build_registry(service: ControllerService) -> tuple[kopf.OperatorRegistry, Handlers]:
    registry = kopf.OperatorRegistry()
    interval = float(service.settings.interval_seconds)

    def reconcile(*, name: str, namespace: str | None, uid: str, spec: Mapping[str, Any],
                  status: Mapping[str, Any], meta: Mapping[str, Any], **_: Any) -> None:
        try:
            service.reconcile(name=name, namespace=namespace or "default", uid=uid, spec=dict(spec or {}),
                              status=dict(status or {}), annotations=dict(meta.get("annotations") or {}),
                              generation=meta.get("generation"))
        except ShuttingDown as exc:
            log.info("period abandoned", extra={"scaler": f"{namespace}/{name}", "detail": str(exc)})
        except ClusterError as exc:
            # API faults are retried by kopf; they never reach the planner, so the strategy stays.
            raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=retry_delay(exc, interval)) from exc

    def startup(*, settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, service)
        try:
            count = service.seed_budget()
        except ShuttingDown:
            return  # SIGTERM during start-up: nothing to book, the process is stopping
        except ClusterError as exc:
            # Without the bookings a scaler could take budget others hold: do not start half-blind.
            raise kopf.TemporaryError(f"cannot read the PredictiveScalers' budgets: {exc}", delay=5) from exc
        log.info("started", extra={"scalers": count, "namespace": service.settings.namespace or "*"})

    def deleted(*, name: str, namespace: str | None, uid: str, **_: Any) -> None:
        service.forget(uid, namespace or "default", name)

    # UIDs of scalers the watch reported DELETED: their timers must stop (one short string per deleted
    # scaler for the life of the process; a UID never comes back).
    gone: set[str] = set()

    def watched(*, type: str | None, name: str, namespace: str | None, uid: str, **kw: Any) -> None:
        # Watching handlers run before kopf re-matches the object's timers on the same event, so the
        # timer's filter below already sees the UID as gone and kopf stops the timer.
        if type == "DELETED" and uid not in gone:
            gone.add(uid)
            deleted(name=name, namespace=namespace, uid=uid, **kw)

    def alive(*, uid: str, **_: Any) -> bool:
        return uid not in gone

    def removal(*, type: str | None, **_: Any) -> bool:
        return type == "DELETED"  # kopf logs every call of a handler: only the one event that matters

    kopf.timer(manifests.GROUP, manifests.VERSION, manifests.PLURAL, interval=interval, initial_delay=1.0,
               id="reconcile", when=alive, registry=registry)(reconcile)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.login(registry=registry)(login)
    kopf.on.event(manifests.GROUP, manifests.VERSION, manifests.PLURAL, id="gone", when=removal,
                  registry=registry)(watched)
    # A deletion that other finalizers hold (foreground cascading): forget the booking at once.
    kopf.on.delete(manifests.GROUP, manifests.VERSION, manifests.PLURAL, optional=True, id="forget",
                   registry=registry)(deleted)
    _release_finalizer(registry)
    return registry, Handlers(reconcile=reconcile, startup=startup, deleted=deleted, watched=watched)


def _release_finalizer(registry: kopf.OperatorRegistry) -> None:
    """Register the timers as not needing kopf's finalizer.

    kopf marks every timer as needing one and offers no option against it; its handlers are frozen
    dataclasses, so they are replaced by copies. tests/controller/test_finalizers.py fails if a kopf
    release moves this, rather than letting uninstall hang again.
    """
    spawning = registry._spawning  # noqa: SLF001 - see the docstring
    spawning._handlers = [dataclasses.replace(h, requires_finalizer=False)  # noqa: SLF001
                          for h in spawning._handlers]  # noqa: SLF001


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod the ServiceAccount, else the kubeconfig (``$KUBECONFIG``, set from ``--kubeconfig``)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def configure(settings: kopf.OperatorSettings, service: ControllerService) -> None:
    """kopf settings the design relies on."""
    settings.posting.level = logging.WARNING  # kopf's "Timer succeeded" every minute is not an Event
    settings.execution.max_workers = 8  # sync handlers run in threads; the budget ledger is locked
    settings.peering.standalone = True
    # No watch of CustomResourceDefinitions (kopf's resource scanning): the one resource we serve
    # is known, and the RBAC grants nothing on CRDs — kopf would get a 403 and warn at every start.
    settings.scanning.disabled = True
    # Keep kopf's handler progress in status.kopf (the CRD preserves it) rather than annotations.
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.watching.server_timeout = 300
