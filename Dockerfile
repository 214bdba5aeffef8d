# syntax=docker/dockerfile:1
# predictive-scaler: one image for the controller (`predictive-scaler controller`)
# and the weekly retraining job (`predictive-scaler retrain`).
#
# The base image is pinned by its full version tag. Pin it by digest too when you
# build (`docker buildx imagetools inspect python:3.11.7-slim-bookworm`), e.g.
#   --build-arg PYTHON_IMAGE=python:3.11.7-slim-bookworm@sha256:<digest>
# (this repository is built on machines without registry access, so the digest
# could not be looked up here).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

# --- build: install the package and its pinned dependencies into a venv ---------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/predictive-scaler
WORKDIR /src
# Dependencies first (cached while only the code changes), then the package.
COPY deploy/image/constraints.txt /src/constraints.txt
COPY pyproject.toml README.md LICENSE /src/
COPY predictive_scaler /src/predictive_scaler
# No extras: the controller and the retraining job read Prometheus (no Parquet, no pyarrow) and draw
# no plots (no matplotlib). Prophet declares matplotlib but only plots with it (prophet/plot.py
# guards the import, and logs once that plotting is off), so it and the packages only it needs are
# removed again: tests/test_packaging_extras.py fits and predicts with Prophet while matplotlib
# cannot be imported. `pip check` reports that removal, hence no `pip check` here.
RUN /opt/predictive-scaler/bin/pip install --constraint /src/constraints.txt /src \
 && /opt/predictive-scaler/bin/pip uninstall --yes \
      matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing \
 && /opt/predictive-scaler/bin/python -c "import prophet, importlib.util as u; assert not u.find_spec('matplotlib') and not u.find_spec('pyarrow')" \
 && /opt/predictive-scaler/bin/python -m compileall -q /opt/predictive-scaler \
 && /opt/predictive-scaler/bin/predictive-scaler --help >/dev/null

# --- runtime: the venv only, no compilers, no pip cache, non-root ---------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="predictive-scaler" \
      org.opencontainers.image.description="Predictive GPU autoscaler for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/predictive-scaler /opt/predictive-scaler
# The root filesystem is read-only in the cluster: everything that writes goes
# to /tmp (an emptyDir), the model store is a mounted volume.
ENV PATH=/opt/predictive-scaler/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
# 65532: the conventional "nonroot" uid/gid; matches runAsUser in deploy/base.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8081
ENTRYPOINT ["predictive-scaler"]
CMD ["--help"]
