"""Which autoscalers on the target are KEDA acting for this scaler (so not a conflict in mode keda). Pure.

A ScaledObject is ours when one of its triggers is ``external`` or ``external-push``
with ``scalerName`` naming this PredictiveScaler; the HPA KEDA creates for it is the
one whose ownerReference is that ScaledObject. Any other HPA or ScaledObject on the
same workload still conflicts: it would fight KEDA's HPA.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class Autoscaler(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def external_scalers(self) -> tuple[str, ...]: ...

    @property
    def owner_scaled_object(self) -> str | None: ...


A = TypeVar("A", bound=Autoscaler)


def foreign(found: Iterable[A], scaler_name: str) -> tuple[A, ...]:
    """``found`` without the ScaledObjects that use ``scaler_name`` and the HPAs they own."""
    found = tuple(found)
    ours = {a.name for a in found if a.kind == "ScaledObject" and scaler_name in a.external_scalers}
    return tuple(a for a in found
                 if not (a.kind == "ScaledObject" and a.name in ours)
                 and not (a.kind == "HorizontalPodAutoscaler" and a.owner_scaled_object in ours))
