"""KEDA's external scaler API, served from the controller's own decisions (``spec.mode: keda``).

- :mod:`answer` — pure: a reconcile's decision → the metric KEDA's HPA scales on;
- :mod:`board` — the latest answer per scaler, written by the controller, read by the server;
- :mod:`server` — the gRPC server (grpcio) over the board;
- :mod:`ownership` — which HPA and ScaledObject on the target are KEDA acting for this scaler.

Nothing here imports kopf or kubernetes. The stubs ``externalscaler_pb2*.py`` are generated
from ``externalscaler.proto`` (``make keda-stubs``) and committed.
"""
