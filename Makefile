# Everything a fresh machine needs is installed by these targets (Python venv, and for the
# e2e tests a Kubernetes control plane built from Go modules, cached under ~/.cache/swapwise).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: run test lint unit compat e2e e2e-1.37 control-plane prometheus vpa image node node-e2e demo bench clean

# The dev venv runs the newest uvicorn, Starlette and FastAPI pyproject.toml allows, pinned by
# constraints/newest.txt (as the image does), so the whole suite is the "newest" compat run.
$(BIN)/.installed: pyproject.toml constraints/newest.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints/newest.txt -e '.[test]'
	touch $@

venv: $(BIN)/.installed

## Run the webhook on 127.0.0.1:8443: built-in policy, development certificates under certs/.
## More `swapwise serve` options: make run ARGS='--policy examples/policy.yaml --port 9443'
run: venv
	$(BIN)/swapwise serve $(ARGS)

## The whole suite: lint, type check, unit/integration tests, e2e against a real control plane
## on Kubernetes 1.34 with Helm 3, the whole e2e suite again on 1.37 with Helm 4, the chart
## tests with Helm 4, then the real-node scenarios (a kubelet with swap in a QEMU guest).
## E2E_LINES: the lines the e2e suite runs on (E2E_LINES=1.37 leaves out the 1.34 run).
E2E_LINES ?= 1.34 1.37
test: venv lint control-plane prometheus vpa
	SWAPWISE_K8S_VERSION=1.34 SWAPWISE_HELM=3 $(BIN)/pytest --ignore=tests/node $(if $(filter 1.34,$(E2E_LINES)),,-m "not e2e")
	$(if $(filter 1.37,$(E2E_LINES)),$(MAKE) e2e-1.37)
	SWAPWISE_HELM=4 $(BIN)/pytest -q tests/chart
	$(MAKE) compat
	$(MAKE) node-e2e

lint: venv
	$(BIN)/ruff check webhook tests benchmarks
	$(BIN)/mypy

unit: venv
	SWAPWISE_SKIP_E2E=1 $(BIN)/pytest -m "not e2e and not node"

## The server tests (test_server.py, test_routes.py, reliability/) against the oldest uvicorn,
## Starlette and FastAPI that pyproject.toml allows (constraints/oldest.txt), in a venv of its
## own under build/compat/. The newest (constraints/newest.txt) are what the dev venv runs
## every test on.
COMPAT := build/compat
compat: venv $(COMPAT)/oldest/.installed
	@for v in $(VENV) $(COMPAT)/oldest; do \
	  echo "compat: $$v: $$($$v/bin/python -c 'import fastapi, starlette, uvicorn; \
	    print("uvicorn", uvicorn.__version__, "starlette", starlette.__version__, "fastapi", fastapi.__version__)')"; \
	done
	SWAPWISE_SKIP_E2E=1 $(COMPAT)/oldest/bin/pytest -q -p no:cacheprovider \
	  tests/test_server.py tests/test_routes.py tests/reliability

$(COMPAT)/%/.installed: pyproject.toml constraints/%.txt
	$(PYTHON) -m venv $(COMPAT)/$*
	$(COMPAT)/$*/bin/pip install --quiet --upgrade pip
	$(COMPAT)/$*/bin/pip install --quiet -c constraints/$*.txt -e '.[test]'
	touch $@

## The e2e suite on the line SWAPWISE_K8S_VERSION selects (1.34 by default, or 1.37) with the
## Helm SWAPWISE_HELM selects (3 by default, or 4); e2e-1.37 is the 1.37 line with Helm 4.
e2e: venv control-plane prometheus vpa
	$(BIN)/pytest -m e2e tests/e2e

e2e-1.37: venv control-plane prometheus vpa
	SWAPWISE_K8S_VERSION=1.37 SWAPWISE_HELM=4 $(BIN)/pytest -m e2e tests/e2e

## Both control planes, 1.34 and 1.37 (etcd and helm4 built once and shared between them),
## each with helm 3 and helm 4.
control-plane:
	tests/e2e/build-control-plane.sh
	SWAPWISE_K8S_VERSION=1.37 tests/e2e/build-control-plane.sh

## promtool and prometheus from Go modules (alert rule tests, dashboard queries, a real
## Prometheus scraping swapwise), cached under ~/.cache/swapwise/prometheus like the above.
prometheus:
	tests/e2e/build-prometheus.sh

## The Vertical Pod Autoscaler's admission controller and updater from Go modules (VPA 1.5.1,
## the release for Kubernetes 1.34; tests/e2e/test_vpa.py), cached under ~/.cache/swapwise/vpa.
vpa:
	tests/e2e/build-vpa.sh

## The container image from the Dockerfile, without a Docker daemon (buildah), as an OCI
## archive: build/swapwise-image.tar. LOCAL_BASE=1 builds FROM a Debian-made equivalent of
## the pinned python base image, for machines that cannot pull from Docker Hub.
image:
	hack/build-image.sh $(if $(LOCAL_BASE),--local-base)

## The real swap node (kubelet, kernel, Debian root, images), built once and cached; and the
## swapwise image it runs in-cluster (built here: the tests run without a network).
## SWAPWISE_NODE_GVISOR=1 adds gVisor (runsc and its containerd shim) and its scenario.
node: control-plane
	tests/node/build-node.sh
	if [ "$$SWAPWISE_NODE_GVISOR" = 1 ]; then tests/node/build-gvisor.sh; fi
	hack/build-image.sh --local-base

## Real-node scenarios, inside a network namespace of their own; figures in build/node-e2e/.
## Prometheus is built first: the density scenario scrapes the kubelet with it, offline.
node-e2e: venv node prometheus
	SWAPWISE_NODE_E2E=1 unshare --net -- $(BIN)/pytest tests/node

## A local control plane + swapwise installed by Helm + a dry-run preview of an example pod.
demo: venv control-plane
	$(BIN)/python -m tests.e2e.demo

## Benchmarks (figures printed; see BENCHMARKS.md). Needs wrk and h2load
## (apt-get install wrk nghttp2-client); the API-server run needs the control plane.
bench: venv control-plane
	@command -v wrk >/dev/null && command -v h2load >/dev/null || \
	  { echo "bench needs wrk and h2load: apt-get install wrk nghttp2-client"; exit 1; }
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
