# The two commands a newcomer runs on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TRACES := backtests/traces

# One BLAS thread per process: numpy's default of one per core made model
# selection 5-10x slower on this 2-core machine (measured in the retrain bench).
export OPENBLAS_NUM_THREADS := 1
export OMP_NUM_THREADS := 1
export MKL_NUM_THREADS := 1

.PHONY: keda-stubs crd sharded-manifests demo test lint typecheck unit tools kube-apiserver bench-forecast bench-backtest bench-controller bench-retrain clean peers-venv bench-peers

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The statsforecast peers (`evaluate --peers`, `make bench-peers`) live in a venv of their own:
# statsforecast 2.x requires pandas<3, and .venv (like the image) stays on the newest pandas.
PEERS_VENV  := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed-stamp

$(PEERS_STAMP): pyproject.toml
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -e '.[peers]'
	touch $(PEERS_STAMP)

peers-venv: $(PEERS_STAMP)

## demo: run the main job (a backtest of the bundled NASA trace) and say where the report is
demo: $(STAMP)
	$(BIN)/predictive-scaler backtest --frontier --evaluation 42d --report backtests/results/demo

## report-screenshot: run the demo, then photograph its report's first screens into docs/ (needs Debian's chromium)
.PHONY: report-screenshot
report-screenshot: demo
	bash scripts/report-screenshot.sh backtests/results/demo/report.html docs/report-screenshot.png

## gpu-capacity-docs: draw docs/gpu-capacity-ladders.png and its figures from the bundled H200 telemetry
.PHONY: gpu-capacity-docs
gpu-capacity-docs: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_capacity --out docs

## tools: the programs the tests need besides Python packages (installed with apt when root)
tools:
	@bash scripts/ensure-tools.sh

# The markers of what a test needs besides Python packages (pyproject.toml; docs/development.md).
NEEDS_MARKERS := prometheus or promtool or kubectl or kubeapi or peers or objectstore

## unit: every test that needs no program or service, on every core, with fewer Hypothesis examples
unit: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist worksteal --hypothesis-profile=unit -m "not ($(NEEDS_MARKERS))"

## test: lint, type-check and run every test (real Prometheus and a real API server included; nothing skips)
# The unmarked tests run on every core; those that start servers run one at a time. Both runs
# always run (a failure in the first still shows the second's) and each ends with its time per marker.
test: $(STAMP) $(PEERS_STAMP) tools kube-apiserver lint typecheck
	status=0; \
	$(BIN)/python -m pytest -q -n auto --dist worksteal -m "not ($(NEEDS_MARKERS))" || status=1; \
	$(BIN)/python -m pytest -q -m "$(NEEDS_MARKERS)" || status=1; \
	exit $$status

## kube-apiserver: build (once; cached outside the clone) the Kubernetes 1.20 API server the e2e tests run
kube-apiserver:
	@bash scripts/build-kube-apiserver.sh >/dev/null

lint: $(STAMP)
	$(BIN)/ruff check predictive_scaler benchmarks tests backtests scripts
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy predictive_scaler

bench-forecast: $(STAMP)
	$(BIN)/python -m benchmarks.forecast --traces $(TRACES) --out backtests/results/forecast.md

## bench-peers: the project's forecasts against statsforecast on the bundled long traces (in .venv-peers)
bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m benchmarks.forecast_peers --traces $(TRACES) --out backtests/results/peers.md

## bench-heldout: the forecasting defaults chosen leave-one-trace-out, with held-out and validation figures (in .venv-peers)
.PHONY: bench-heldout
bench-heldout: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m benchmarks.forecast_heldout --traces $(TRACES) --cost --out backtests/results/heldout.md

bench-backtest: $(STAMP)
	$(BIN)/python -m benchmarks.backtest --traces $(TRACES) --frontier --out backtests/results/summary.md

## bench-bursty: the planner with and without service tracking on bursty overlays (tuning) and the ingress traces (validation)
.PHONY: bench-bursty
bench-bursty: $(STAMP)
	$(BIN)/python -m benchmarks.bursty --traces $(TRACES) --out backtests/results/bursty.md

SCALERS ?= 100,300,1000
PODS ?= 2000,20000
bench-controller: $(STAMP) tools
	$(BIN)/python -m benchmarks.controller --scalers $(SCALERS) --pods $(PODS) --out backtests/results/controller.md

bench-retrain: $(STAMP) tools
	$(BIN)/python -m benchmarks.retrain --scalers 40 --weeks 4 --shards 1,2 --out backtests/results/retrain-run.md

## bench-retrain-quality: what the retraining speed-ups (and the selection ledger alone) change in what the job serves
.PHONY: bench-retrain-quality
bench-retrain-quality: $(STAMP)
	$(BIN)/python -m benchmarks.retrain_quality --out backtests/results/retrain-quality.md

## crd: regenerate deploy/base/crd.yaml from the one source (predictive_scaler/spec.py)
crd: $(STAMP)
	$(BIN)/python -m predictive_scaler.crd > deploy/base/crd.yaml

## sharded-manifests: regenerate deploy/overlays/sharded/statefulset.yaml from deploy/base/deployment.yaml (REPLICAS shards)
REPLICAS ?= 2
sharded-manifests: $(STAMP)
	$(BIN)/python -m predictive_scaler.controller.shard_manifests --replicas $(REPLICAS) > deploy/overlays/sharded/statefulset.yaml

## keda-stubs: regenerate the committed gRPC stubs of KEDA's external scaler API (predictive_scaler/keda/)
keda-stubs: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. predictive_scaler/keda/externalscaler.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
