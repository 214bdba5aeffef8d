"""KEDA's external scaler API, served from the controller's own decisions (``spec.mode: keda``).

- :mod:`answer` — pure: a reconcile's decision → the whole replicas KEDA's HPA is to compute;
- :mod:`board` — the latest answer per scaler this process decided, written by the controller;
- :mod:`status` — the answers of every scaler, read from its spec and ``status.keda`` (any replica);
- :mod:`targets` — whether the ScaledObject asking scales the scaler's own workload;
- :mod:`tls` — optional TLS / mTLS on the port, from files re-read when they change;
- :mod:`server` — the gRPC server (grpcio) over all of these;
- :mod:`ownership` — which HPA and ScaledObject on the target are KEDA acting for this scaler.

Nothing here imports kopf or kubernetes. The stubs ``externalscaler_pb2*.py`` are generated
from ``externalscaler.proto`` (``make keda-stubs``) and committed. docs/keda.md is the contract:
the KEDA releases claimed, the answers, the errors.
"""
