# worker-bridge itself, as a service: `worker-bridge-mcp` (stdio by default; compose runs it with
# --http) or any CLI command (`docker run ... worker-bridge/bridge:0.1.0 worker-bridge doctor`).
#
# It drives the host's engine through the mounted /var/run/docker.sock (docker-py; no docker CLI
# inside) and runs as root, because it needs that socket; the task containers it starts still run
# as the unprivileged sandbox uid. Task containers bind-mount host paths the bridge names by its
# own paths, so the state root and every repository must be mounted at the same path inside as
# on the host: the bridge checks that at start-up and in `doctor` (WORKER_BRIDGE_IN_CONTAINER).
#
# Build from the repository root: docker build -t worker-bridge/bridge:0.1.0 .
# BASE_IMAGE is a build argument, like images/*/Dockerfile (no registry needed).
ARG BASE_IMAGE=worker-bridge/base:0.1.0
FROM ${BASE_IMAGE}

ARG WORKER_BRIDGE_VERSION=0.1.0
ARG WORKER_BRIDGE_SOURCE=https://github.com/worker-bridge/worker-bridge
LABEL org.opencontainers.image.title="worker-bridge" \
      org.opencontainers.image.description="Delegate coding tasks to CLI agents in disposable Docker containers, with host-side verification" \
      org.opencontainers.image.source="${WORKER_BRIDGE_SOURCE}" \
      org.opencontainers.image.version="${WORKER_BRIDGE_VERSION}" \
      org.opencontainers.image.licenses="MIT" \
      io.worker-bridge.image="bridge"

ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 LC_ALL=C.UTF-8
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv erofs-utils \
 && rm -rf /var/lib/apt/lists/*

# The dependencies first, from pyproject.toml alone, so a code change does not reinstall them
# (setuptools too, so the project itself installs without the network). pip trusts the base
# image's CA bundle (SSL_CERT_FILE/PIP_CERT are set there).
ENV VIRTUAL_ENV=/opt/worker-bridge PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv "$VIRTUAL_ENV"
ENV PATH=/opt/worker-bridge/bin:$PATH
COPY pyproject.toml /src/pyproject.toml
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && echo 'setuptools>=68' >> /tmp/requirements.txt \
 && pip install -q -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The project (with its image contexts, whichever of bridge/images or images/ holds them; the
# .dockerignore lets in only what the package needs).
COPY . /src
RUN pip install -q --no-deps --no-build-isolation /src && rm -rf /src

# WORKER_BRIDGE_IN_CONTAINER turns on the same-path check; the default state root is the one
# compose/compose.yaml mounts (at the same path on the host).
ENV WORKER_BRIDGE_IN_CONTAINER=1 \
    WORKER_BRIDGE_HOME=/var/lib/worker-bridge \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["worker-bridge-mcp"]
