# worker-bridge: the two commands that matter are `make demo` and `make test`.
# Both set up everything they need: a virtualenv, a local Debian base image (debootstrap, no
# registry needed) and the worker-bridge images.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BASE_IMAGE ?= worker-bridge/rootfs:bookworm
export TESTCONTAINERS_RYUK_DISABLED := true
# The web view's browser tests drive Debian's chromium; Playwright never downloads one.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
# npm and pip inside image builds trust what this machine trusts (a TLS-intercepting proxy's CA
# among them): the host's CA bundle goes into the images as their extra CA file.
export WORKER_BRIDGE_EXTRA_CA_FILE ?= $(firstword $(wildcard $(SSL_CERT_FILE) /etc/ssl/certs/ca-certificates.crt))
LINT_PATHS := bridge tests scripts $(wildcard bench/*.py bench/*/)

.PHONY: install base-image images images-all test-deps demo test test-fast lint format bench bench-quick clean-containers cluster-up cluster-down cluster-status

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,cluster]' --config-settings editable_mode=compat
	touch $@

install: $(VENV)/.installed

base-image:
	scripts/bootstrap-base-image $(BASE_IMAGE)

# What the demo uses: base, verify and mock (apt only: nothing from the npm registry).
images: install base-image
	$(BIN)/worker-bridge images build --base-image $(BASE_IMAGE) > .images-build.log 2>&1 \
	  || (tail -30 .images-build.log; exit 1)
	@tail -1 .images-build.log

# Every image, the worker CLIs' too (their CLIs come from the npm registry): what the tests use.
images-all: install base-image
	$(BIN)/worker-bridge images build --all --base-image $(BASE_IMAGE) > .images-build.log 2>&1 \
	  || (tail -30 .images-build.log; exit 1)
	@tail -1 .images-build.log

# What the tests need besides the images: docker-compose (the compose tests), chromium (the web
# view's browser tests), the TypeScript MCP client's packages (the interop test) and Debian's
# docker-registry and socat (the cluster tests' registry), so a fresh `make test` skips nothing.
test-deps: install tests/interop/node_modules/.package-lock.json
	@command -v docker-compose >/dev/null 2>&1 || scripts/install-test-deps docker-compose
	@command -v chromium >/dev/null 2>&1 || scripts/install-test-deps chromium
	@command -v mkfs.erofs >/dev/null 2>&1 || scripts/install-test-deps erofs-utils
	@command -v docker-registry >/dev/null 2>&1 || scripts/install-test-deps docker-registry
	@command -v socat >/dev/null 2>&1 || scripts/install-test-deps socat

tests/interop/node_modules/.package-lock.json: tests/interop/package-lock.json
	npm ci --prefix tests/interop --no-audit --no-fund --loglevel=error

demo: images
	$(BIN)/python scripts/demo.py

test: images-all test-deps
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=25

# Everything not marked `docker`, with the engine out of reach: DOCKER_HOST names a socket that
# does not exist, so a test that needs the engine without its mark fails here instead of passing
# on the engine of the machine it runs on (tests/conftest.py says how a test gets the mark).
test-fast: install
	DOCKER_HOST=unix:///nonexistent/docker.sock $(BIN)/pytest -q -m "not docker"

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy bridge

format: install
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

# Sealed environment views (mkfs.erofs) are what a warm environment is measured with.
bench: images-all
	@command -v mkfs.erofs >/dev/null 2>&1 || scripts/install-test-deps erofs-utils
	WORKER_BRIDGE_TEST_BASE_IMAGE=$(BASE_IMAGE) $(BIN)/python -m bench $(BENCH_ARGS)

bench-quick: images-all
	@command -v mkfs.erofs >/dev/null 2>&1 || scripts/install-test-deps erofs-utils
	WORKER_BRIDGE_TEST_BASE_IMAGE=$(BASE_IMAGE) $(BIN)/python -m bench --quick --out .bench-quick.json

clean-containers:
	docker ps -aq --filter label=io.worker-bridge.task | xargs -r docker rm -f

# A cluster of simulated nodes on this machine (scripts/local-cluster; root): `make cluster-up
# NODES=3` prints the address to use; `make cluster-down` leaves nothing of it behind.
NODES ?= 2
cluster-up: install
	@command -v docker-registry >/dev/null 2>&1 || scripts/install-test-deps docker-registry
	@command -v socat >/dev/null 2>&1 || scripts/install-test-deps socat
	scripts/local-cluster up $(NODES)

cluster-down:
	scripts/local-cluster down

cluster-status:
	scripts/local-cluster status
