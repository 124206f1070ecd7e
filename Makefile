# mcpmesh: every target installs what it needs (see `make setup`); nothing depends on hand-installed tools.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Triton's perf_analyzer, from the tritonclient 2.40.0 wheel (newer wheels' binary needs glibc 2.38) in a
# venv of its own: its pins conflict with the project's, and only the binary is used (tools/perf_analyzer).
TOOLS := .tools
PERF_ANALYZER := $(TOOLS)/perf/.installed

.PHONY: help setup constraints proto proto-check native lint test up down status bench models certs chaos gpu-check compose-config compose-test k8s-validate multihost secure-test clean

help:
	@echo "make setup | proto | proto-check | native | lint | test | up [SECURE=1] | down | bench | models | certs | chaos | gpu-check | compose-config | compose-test | k8s-validate | multihost | secure-test"

# etcd (and etcdctl, faketime for the tests) from Debian's packages when missing, then the venv with the project (editable) and its dev tools.
setup: $(STAMP) $(PERF_ANALYZER)
	@command -v etcd >/dev/null && command -v etcdctl >/dev/null || tools/install-system-deps.sh
	@command -v faketime >/dev/null || tools/install-system-deps.sh faketime
	@command -v promtool >/dev/null || tools/install-system-deps.sh promtool
	@command -v docker-compose >/dev/null || tools/install-system-deps.sh docker-compose

# Output: one line per step; pip's own output goes to $(SETUP_LOG) (a failure prints its tail).
SETUP_LOG := $(VENV)/setup.log
$(STAMP): pyproject.toml constraints.txt
	@command -v etcd >/dev/null || tools/install-system-deps.sh
	@test -x $(PY) || { echo "setup: creating $(VENV)"; python3 -m venv $(VENV); }
	@echo "setup: installing mcpmesh and its dev tools into $(VENV) (pinned by constraints.txt; log: $(SETUP_LOG))"
	@{ $(PY) -m pip install --upgrade pip && $(PY) -m pip install -c constraints.txt -e '.[dev]'; } \
	  >$(SETUP_LOG) 2>&1 || { tail -20 $(SETUP_LOG); echo "setup failed; see $(SETUP_LOG)"; exit 1; }
	@touch $(STAMP)
	@echo "setup: done"

# Refresh constraints.txt from the venv after a dependency change in pyproject.toml.
constraints: $(STAMP)
	@{ sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^mcpmesh'; \
	  grep -E '^(pycuda|onnxruntime-gpu)==' constraints.txt; } >constraints.txt.new && mv constraints.txt.new constraints.txt
	@echo "constraints.txt: $$(grep -c '==' constraints.txt) pins"

$(PERF_ANALYZER): tools/perf-analyzer-requirements.txt
	@ldconfig -p | grep -q 'libb64\.so\.0d' || tools/install-system-deps.sh libb64
	@test -x $(TOOLS)/perf/bin/python || python3 -m venv $(TOOLS)/perf
	@echo "setup: installing Triton's perf_analyzer into $(TOOLS)/perf (log: $(TOOLS)/perf/setup.log)"
	@$(TOOLS)/perf/bin/python -m pip install --no-deps -r tools/perf-analyzer-requirements.txt \
	  >$(TOOLS)/perf/setup.log 2>&1 || { tail -20 $(TOOLS)/perf/setup.log; exit 1; }
	@touch $(PERF_ANALYZER)

# Regenerate Python code and .pyi stubs from protos/ into libs/contracts/ (committed; CI checks it is current).
proto: $(STAMP)
	$(PY) tools/gen_protos.py

proto-check: $(STAMP)
	$(PY) tools/gen_protos.py --check

lint: $(STAMP) proto-check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) tools/gen_docs.py --check
	@site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $$site; rc=$$?; rm -rf $$site; exit $$rc

# One pytest worker per core (pytest-xdist), each file on one worker (its module fixtures start once): most
# of the suite waits on real processes, so two workers on two cores take about half the time.
test: setup native
	$(VENV)/bin/pytest -q tests -m "not slow" -n auto --dist loadfile

# Performance figures (DESIGN.md sections 12-13): ratios against baselines measured in the same run.
bench: setup native
	$(PY) bench/run.py

# The demo model repository (deterministic; used by make up and the tests).
models: setup
	$(PY) tools/make_models.py --out models --force

# The development cluster (tools/devcluster): etcd, two workers, scheduler, router, health; demo models
# loaded; a demo client; status.
# SECURE=1: every door locked (etcd TLS and users, mutual TLS, CURVE), each service under its own identity.
up: setup native
	$(PY) -m mcp_devcluster up $(if $(filter 1 yes true,$(SECURE)),--secure)

down:
	@test -x $(PY) && $(PY) -m mcp_devcluster down || echo "nothing to stop"

status: setup
	$(PY) -m mcp_devcluster status

# The C memory pool, the router's grpc++ front door (for the venv's Python; Debian's libgrpc++-dev is
# installed when missing) and, where nvcc exists, the CUDA kernels, with the system compiler.
native: $(STAMP)
	@pkg-config --exists grpc++ 2>/dev/null && command -v c++ >/dev/null || tools/install-system-deps.sh grpc
	PYTHON=$(PY) libs/native/build.sh lib
	libs/native/cuda/build.sh

# The GPU checks and benchmark (DESIGN.md section 9): needs a CUDA GPU; without one it says so and fails.
# No setup dependency: the GPU machine has no network (pycuda comes as an sdist in .whl/, see
# tools/prepare_gpu_wheels.sh).
gpu-check:
	$(if $(wildcard $(PY)),$(PY),python3) tools/gpu_check.py

# Validate the compose deployment: both worker profiles, and with the test and etcd-port files. The gpu
# profile can only be validated on these machines (no GPU); `make compose-test` runs the cpu profile.
COMPOSE := docker-compose -f deploy/compose/docker-compose.yml
compose-config:
	@command -v docker-compose >/dev/null || tools/install-system-deps.sh docker-compose
	$(COMPOSE) --profile cpu config -q
	$(COMPOSE) --profile gpu config -q
	$(COMPOSE) -f deploy/compose/docker-compose.test.yml --profile cpu config -q
	$(COMPOSE) -f deploy/compose/docker-compose.etcd-port.yml config -q
	@echo "deploy/compose: valid (cpu and gpu profiles, docker-compose.test.yml, docker-compose.etcd-port.yml)"

# The compose deployment's cpu profile built and run for real (tools/compose_test.py, deploy/compose/README.md):
# Debian's docker.io when missing, dockerd started (and stopped) when none runs, a debootstrap base image when
# debian:bookworm-slim cannot be pulled, the wheelhouse, the images; host networking on 127.0.0.1; inference,
# a canary flip, scrapes, WorkerDown in Alertmanager; then down -v. ~8 min from nothing here, 1.5-2.5 min cached.
compose-test: setup
	$(PY) tools/compose_test.py

# Render deploy/k8s's overlays (tools/k8s_render.py: `kubectl kustomize` from the venv's pinned kubectl) and
# validate every object offline against the Kubernetes schemas (kubernetes-validate, strict);
# tests/unit/test_k8s_manifests.py runs the same in make test, with checks of what the objects say.
k8s-validate: $(STAMP)
	$(PY) tools/k8s_render.py --check

# The mesh across hosts (tests/multihost): network namespaces on a private bridge as hosts, a 3-member etcd,
# services spread over them, SDK load from a client host; kill -9 the etcd leader, cut a worker host off
# (iptables), add a fifth host. Needs root (skips otherwise; MCP_REQUIRE_NETNS=1 fails instead). ~1.5 min.
multihost: setup native
	@command -v iptables >/dev/null || tools/install-system-deps.sh iptables
	$(VENV)/bin/pytest -q -s tests/multihost -m slow -p no:cacheprovider

# `make up SECURE=1` for real on its fixed ports, probed door by door as an attacker would
# (tests/integration/test_secure_up.py; about 20 s). Not in `make test`: those ports may hold your cluster.
secure-test: setup native
	$(VENV)/bin/pytest -q tests/integration/test_secure_up.py -m slow -p no:cacheprovider

# A test CA, every service's, operator's, application's and worker's certificate, CURVE keys (README
# "Securing a cluster"); CERTS_WORKERS names the workers' ids (default: the ids `make up` runs).
CERTS_WORKERS ?= worker-1,worker-2
certs: $(STAMP)
	$(PY) -m mcp_devcluster.certs --out certs --workers $(CERTS_WORKERS)

# Chaos under load (tests/chaos): every fault scenario of tests/integration/scenarios.py against a cluster of
# two routers, schedulers and health services, SDK client processes checking every answer; one row per
# scenario in bench/chaos.json. MCP_CHAOS_SECONDS (default 40) scales each scenario; `make test` keeps a short
# run of each (tests/integration/test_delivery.py). About 11 minutes at the defaults on 2 cores, then the
# fuzzers of tests/fuzz with MCP_FUZZ_EXAMPLES random examples each (make test: a few, fixed), ~4 minutes.
MCP_FUZZ_EXAMPLES ?= 200
chaos: setup native
	$(VENV)/bin/pytest -q -s tests/chaos -m slow -p no:cacheprovider --override-ini="addopts=-ra --strict-markers"
	MCP_FUZZ_EXAMPLES=$(MCP_FUZZ_EXAMPLES) $(VENV)/bin/pytest -q tests/fuzz -p no:cacheprovider --timeout=900

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
