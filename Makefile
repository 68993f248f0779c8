# Everything a fresh machine needs is installed by these targets (Python venv, and for the
# e2e tests a Kubernetes control plane built from Go modules, cached under ~/.cache/swapwise).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: run test lint unit quick compat e2e e2e-1.37 e2e-smoke-1.37 control-plane control-plane-1.34 \
	control-plane-1.37 unit-tools prometheus vpa karpenter kube-state-metrics helm4 image node \
	node-parts node-e2e node-bench demo bench clean admission-policy-golden release

# The dev venv runs the newest uvicorn, Starlette and FastAPI pyproject.toml allows, pinned by
# constraints/newest.txt (as the image does), so the whole suite is the "newest" compat run.
$(BIN)/.installed: pyproject.toml constraints/newest.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints/newest.txt -e '.[test]'
	touch $@

## The Python virtualenv .venv with swapwise and its test tools installed (every target that
## runs Python makes it first).
venv: $(BIN)/.installed

## Run the webhook on 127.0.0.1:8443: built-in policy, development certificates under certs/.
## More `swapwise serve` options: make run ARGS='--policy examples/policy.yaml --port 9443'
run: venv
	$(BIN)/swapwise serve $(ARGS)

## The whole suite, in timed stages (hack/stage: a line per stage, a table at the end): lint;
## unit and integration tests; the whole e2e suite against a real control plane on Kubernetes
## 1.34 with Helm 3 (the real node's line; the admission policies on v1beta1 included); the
## chart with Helm 4 (its tests and its e2e installs); the server tests on the oldest uvicorn;
## the real-node scenarios (a kubelet with swap in a QEMU guest). The 1.37 line is not built
## here (what it costs: docs/development.md "CI budget"): make e2e-smoke-1.37 or e2e-1.37,
## when README "Supported versions" says. Downloads, the real node's parts and the test
## stages that leave a core idle run in the background: the unit tests need only helm and
## promtool (built first), so they run beside the Go builds of the control plane; compat and
## helm4 beside e2e, which mostly waits on its control plane; nothing runs beside the real
## node, whose emulated guest takes both cores (docs/development.md "What make test runs").
test: venv
	@hack/stage --begin
	@hack/stage lint $(MAKE) --no-print-directory lint
	@hack/stage --background node-parts $(MAKE) --no-print-directory node-parts
	@hack/stage build-unit $(MAKE) --no-print-directory unit-tools
	@hack/stage --background unit $(MAKE) --no-print-directory unit
	@hack/stage build-1.34 $(MAKE) --no-print-directory control-plane-1.34
	@hack/stage build-tools $(MAKE) --no-print-directory prometheus vpa karpenter kube-state-metrics
	@hack/stage --wait node-parts
	@hack/stage --background node $(MAKE) --no-print-directory node
	@hack/stage --wait unit
	@hack/stage --background compat $(MAKE) --no-print-directory compat
	@hack/stage --background helm4 $(MAKE) --no-print-directory helm4
	@hack/stage e2e-1.34 env SWAPWISE_K8S_VERSION=1.34 SWAPWISE_HELM=3 $(MAKE) --no-print-directory e2e
	@hack/stage --wait compat
	@hack/stage --wait helm4
	@hack/stage --wait node
	@hack/stage node-e2e $(MAKE) --no-print-directory node-e2e
	@hack/stage --summary

## Lint: ruff over webhook, tests and benchmarks, and mypy (strict) over webhook.
lint: venv
	$(BIN)/ruff check webhook tests benchmarks testkit conftest.py
	$(BIN)/mypy

## Everything but the e2e and real-node tests: no control plane, a few minutes.
unit: venv
	SWAPWISE_SKIP_E2E=1 $(BIN)/pytest -m "not e2e and not node" --ignore=tests/node

## The engine, the policy file, the admission decision and the golden recording of the rendered
## admission policies, without the tests marked slow: under 30 seconds, while you work.
QUICK := tests/engine tests/policy tests/admission tests/render/test_admission_policy_golden.py
quick: venv
	$(BIN)/pytest -q -p no:cacheprovider -m "not slow" $(QUICK)

## What the unit tests run of the Go-built tools: helm (the chart tests) and promtool (the
## alert rule tests). The tests build a missing one themselves; make test builds them first so
## that the unit stage can run beside the rest of the Go builds.
unit-tools:
	tests/e2e/build-control-plane.sh helm
	tests/e2e/build-prometheus.sh promtool

## What the oldest uvicorn, Starlette and FastAPI that pyproject.toml allows
## (constraints/oldest.txt) could break, in a venv of its own under build/compat/: the server
## over real HTTPS (test_server.py, reliability/), the routes in process (test_routes.py). Left
## out: the in-process fuzzing and field-type suites (test_fuzz.py, test_pod_field_types.py):
## volume on the engine, which no web framework touches; test_fuzz_https.py runs the same
## checks through the oldest server. The newest versions (constraints/newest.txt) are what
## the dev venv runs every test on.
COMPAT := build/compat
COMPAT_TESTS := tests/server/test_server.py tests/server/test_routes.py $(filter-out \
  tests/reliability/test_fuzz.py tests/reliability/test_pod_field_types.py, \
  $(wildcard tests/reliability/test_*.py))
compat: venv $(COMPAT)/oldest/.installed
	@for v in $(VENV) $(COMPAT)/oldest; do \
	  echo "compat: $$v: $$($$v/bin/python -c 'import fastapi, starlette, uvicorn; \
	    print("uvicorn", uvicorn.__version__, "starlette", starlette.__version__, "fastapi", fastapi.__version__)')"; \
	done
	SWAPWISE_SKIP_E2E=1 $(COMPAT)/oldest/bin/pytest -q -p no:cacheprovider $(COMPAT_TESTS)

$(COMPAT)/%/.installed: pyproject.toml constraints/%.txt
	$(PYTHON) -m venv $(COMPAT)/$*
	$(COMPAT)/$*/bin/pip install --quiet --upgrade pip
	$(COMPAT)/$*/bin/pip install --quiet -c constraints/$*.txt -e '.[test]'
	touch $@

## The whole e2e suite on the line SWAPWISE_K8S_VERSION selects (1.34 by default, or 1.37)
## with the Helm SWAPWISE_HELM selects (3 by default, or 4); e2e-1.37 is the whole suite on
## the 1.37 line with Helm 4 (make test runs neither it nor its smoke; README "Supported
## versions" says when to run them).
E2E_LINE = $(or $(SWAPWISE_K8S_VERSION),1.34)
e2e: venv control-plane-$(E2E_LINE) prometheus vpa karpenter
	$(BIN)/pytest --durations=15 -m e2e tests/e2e

## The whole e2e suite on the Kubernetes 1.37 line with Helm 4 (its control plane built
## first: docs/development.md "CI budget"; README "Supported versions" says when to run it).
e2e-1.37: venv control-plane-1.37 prometheus vpa karpenter
	SWAPWISE_K8S_VERSION=1.37 SWAPWISE_HELM=4 $(BIN)/pytest -m e2e tests/e2e

## The chart with Helm 4: the chart tests, and the e2e tests that install it (webhook and
## admission-policy modes) or dry-run through it, on the 1.34 control plane.
HELM4_E2E := tests/e2e/test_helm.py tests/e2e/test_helm_admission_policy.py \
  tests/e2e/test_chart_dry_run.py
helm4: venv control-plane-1.34
	SWAPWISE_HELM=4 $(BIN)/pytest -q -p no:cacheprovider tests/chart
	SWAPWISE_HELM=4 $(BIN)/pytest -q -p no:cacheprovider -m e2e $(HELM4_E2E)

## The e2e tests marked smoke (what can differ between lines: admission, the chart with
## Helm 4, the admission policies, the lines' own differences) on 1.37 with Helm 4.
e2e-smoke-1.37: venv control-plane-1.37
	SWAPWISE_K8S_VERSION=1.37 SWAPWISE_HELM=4 $(BIN)/pytest -m "e2e and smoke" tests/e2e

## Record what a real 1.37 API server stores under the rendered admission policies
## (tests/data/admission-policy-golden.json), which the unit tier checks the engine and the
## renderer against: run it when the renderer or the engine changes, and commit the file.
admission-policy-golden: venv control-plane-1.34 control-plane-1.37
	SWAPWISE_AP_LINE=1.37 $(BIN)/python -m tests.e2e.record_cel_golden

## Both control planes, 1.34 and 1.37 (etcd and helm4 built once and shared between them),
## each with helm 3 and helm 4; the 1.34 line also has the real node's kubelet.
control-plane: control-plane-1.34 control-plane-1.37

control-plane-1.34:
	tests/e2e/build-control-plane.sh etcd kube-apiserver kube-scheduler kube-controller-manager \
	  kubectl helm helm4 kubelet

control-plane-1.37:
	SWAPWISE_K8S_VERSION=1.37 tests/e2e/build-control-plane.sh

## promtool and prometheus from Go modules (alert rule tests, dashboard queries, a real
## Prometheus scraping swapwise), cached under ~/.cache/swapwise/prometheus like the above.
prometheus:
	tests/e2e/build-prometheus.sh

## The Vertical Pod Autoscaler's admission controller and updater from Go modules (VPA 1.5.1,
## the release for Kubernetes 1.34; tests/e2e/test_vpa.py), cached under ~/.cache/swapwise/vpa.
vpa:
	tests/e2e/build-vpa.sh

## Karpenter v1.15.0 (its kwok provider) and kwok v0.8.0 from Go modules, with Karpenter's CRDs
## and kwok's stages (tests/e2e/test_autoscaling.py: scale from zero, consolidation), cached
## under ~/.cache/swapwise/karpenter.
karpenter:
	tests/e2e/build-karpenter.sh

## kube-state-metrics from Go modules (tests/e2e/gomod/kube-state-metrics), cached under
## ~/.cache/swapwise/kube-state-metrics: the real-node suite's `swapwise tune` reads the pods'
## memory requests and profile annotations from it, as users' clusters export them.
kube-state-metrics:
	tests/e2e/build-kube-state-metrics.sh

## The container image from the Dockerfile, without a Docker daemon (buildah), as an OCI
## archive: build/swapwise-image.tar. LOCAL_BASE=1 builds FROM a Debian-made equivalent of
## the pinned python base image, for machines that cannot pull from Docker Hub.
image:
	hack/build-image.sh $(if $(LOCAL_BASE),--local-base)

## Release artifacts of the version in pyproject.toml, in dist/: the wheel and sdist (pipx
## install of the wheel gives the swapwise command), the chart packaged for helm push to an
## OCI registry, and the image as an OCI archive tagged with the version (hack/release.sh;
## LOCAL_BASE=1 as for make image). .github/workflows/release.yml runs it on a tag v<version>.
release: venv
	hack/release.sh $(if $(LOCAL_BASE),--local-base)

## What the real node needs that no Go build of the control plane does (host tools, kernel,
## Debian roots, the swapwise image): mostly downloads, so make test runs it in the background.
node-parts:
	tests/node/build-node.sh --prefetch
	hack/build-image.sh --local-base

## The real swap node (kubelet, kernel, Debian root, images), built once and cached; and the
## swapwise image it runs in-cluster (built here: the tests run without a network).
## SWAPWISE_NODE_GVISOR=1 adds gVisor (runsc and its containerd shim) and its scenario.
node: control-plane-1.34
	tests/node/build-node.sh
	if [ "$$SWAPWISE_NODE_GVISOR" = 1 ]; then tests/node/build-gvisor.sh; fi
	hack/build-image.sh --local-base

## Real-node scenarios, inside a network namespace of their own; figures in build/node-e2e/.
## Prometheus and kube-state-metrics are built first: the density scenario scrapes the kubelet
## and the API server with them, offline. Each test's time is printed (--durations=0): the
## budget per scenario is in docs/development.md.
node-e2e: venv node prometheus kube-state-metrics
	SWAPWISE_NODE_E2E=1 unshare --net -- $(BIN)/pytest --durations=0 tests/node \
	  --ignore=tests/node/bench

## The real-node benchmarks, outside CI (statistical, minutes long; docs/development.md says
## how long): tune on hot pods, the unbacked control, the wake-up matrix and gVisor, on their
## own guest boot; figures in build/node-bench/ (results.json with the keys the CI suite
## wrote for them before, and wakeup.json).
node-bench: venv control-plane-1.34 prometheus kube-state-metrics
	SWAPWISE_NODE_GVISOR=1 $(MAKE) --no-print-directory node
	SWAPWISE_NODE_E2E=1 SWAPWISE_NODE_GVISOR=1 SWAPWISE_NODE_RESULTS=build/node-bench/results.json \
	  unshare --net -- $(BIN)/pytest --durations=0 tests/node/bench

## A local control plane + swapwise installed by Helm + a dry-run preview of an example pod.
## It needs the line it runs on (SWAPWISE_K8S_VERSION, 1.34 by default), not both: e2e's
## test_docs runs it, and a cold make test built the whole 1.37 line there.
demo: venv control-plane-$(E2E_LINE)
	$(BIN)/python -m tests.e2e.demo

## Benchmarks (figures printed; see BENCHMARKS.md). Needs wrk and h2load
## (apt-get install wrk nghttp2-client); the API-server run needs the control plane of the
## selected line (1.34 by default).
bench: venv control-plane-$(E2E_LINE)
	@command -v wrk >/dev/null && command -v h2load >/dev/null || \
	  { echo "bench needs wrk and h2load: apt-get install wrk nghttp2-client"; exit 1; }
	$(BIN)/python -m benchmarks

## Remove the venv, build/, dist/ and the tools' caches in the checkout (not ~/.cache/swapwise).
clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

## List the documented targets: each with the first sentence of the ## comment above it.
help:
	@awk 'function show(name, text,   n, words, i, line) { \
	    if (match(text, /\. /)) text = substr(text, 1, RSTART); \
	    n = split(text, words, " "); line = sprintf("  %-16s", name); \
	    for (i = 1; i <= n; i++) { \
	      if (length(line) + 1 + length(words[i]) > 100) { print line; line = sprintf("%18s", "") } \
	      line = line " " words[i] } \
	    print line } \
	  /^## / { doc = doc (doc ? " " : "") substr($$0, 4); next } \
	  /^[A-Za-z0-9_-][A-Za-z0-9_.-]*:/ { if (doc) { name = $$0; sub(/:.*/, "", name); \
	    show(name, doc) } doc = ""; next } \
	  /^$$/ { doc = "" }' $(firstword $(MAKEFILE_LIST))
.PHONY: help
