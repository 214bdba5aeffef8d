"""predictive-scaler: a predictive GPU autoscaler for Kubernetes."""

__version__ = "0.1.0"
