# syntax=docker/dockerfile:1
# llm-sidecar image: docker build -t llm-sidecar . (`make image REGISTRY=...` gives it the name
# and version tag the chart expects, `make image-push` pushes it too)
# Runs as an unprivileged user (uid 10001) on a read-only root filesystem: nothing is written
# at run time (bytecode is compiled at build time, PYTHONDONTWRITEBYTECODE stops the rest).
# Ports: 8080 the proxy, 9464 the admin port (/metrics, /healthz alive, /readyz upstream ready);
# Kubernetes probes use the admin port (helm/llm-sidecar), Docker uses the HEALTHCHECK below.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- build: install the package and its dependencies into a self-contained virtualenv ------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/llm-sidecar
# A C compiler for the optional per-token C (sidecar/base/_speedups.c, relay/data/_token_lane.c), in this
# stage only. Best effort: where it or Python's headers are missing, pip builds the package
# without them and the relay uses the Python originals (same bytes, same figures).
# (The official python image has Python's headers; a base with Debian's python3 needs its
# -dev package.)
RUN headers=$(python -c "import os, sysconfig; print(os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))"); \
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev \
       $([ "$headers" = True ] || echo python3-dev) && rm -rf /var/lib/apt/lists/*) \
    || echo "no C compiler: the Python byte checks are used"
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY sidecar ./sidecar
RUN /opt/llm-sidecar/bin/pip install --no-compile . \
 && (/opt/llm-sidecar/bin/python -c "from sidecar.base.speedups import IN_C; from sidecar.relay.data.token_lane import IN_C_LANE; print('C byte checks:', IN_C, 'token lane in C:', IN_C_LANE)") \
 && /opt/llm-sidecar/bin/pip uninstall --yes pip setuptools \
 && /opt/llm-sidecar/bin/python -m compileall -q -j 0 /opt/llm-sidecar

# -- runtime: the virtualenv on a clean slim base, no build tools, no root ------------------
FROM ${PYTHON_IMAGE} AS runtime
# SOURCE_URL: the repository the image is built from, for its OCI source label (registries such
# as ghcr.io link the image to it); empty unless given (`make image SOURCE_URL=https://...`),
# since the project has no public repository address yet.
ARG SOURCE_URL=""
LABEL org.opencontainers.image.title="llm-sidecar" \
      org.opencontainers.image.description="Latency observability sidecar for LLM inference servers" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 llm-sidecar \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin llm-sidecar
COPY --from=build /opt/llm-sidecar /opt/llm-sidecar
ENV PATH=/opt/llm-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LLM_SIDECAR_LISTEN=0.0.0.0:8080 \
    LLM_SIDECAR_METRICS_LISTEN=0.0.0.0:9464
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080 9464
# /healthz on the admin port (wherever LLM_SIDECAR_METRICS_LISTEN puts it).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('LLM_SIDECAR_METRICS_LISTEN', ':9464').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2)"]
# The program is the entrypoint, the subcommand the command: `docker run IMAGE` serves (give
# the upstream with LLM_SIDECAR_UPSTREAM or `serve --upstream URL`), `docker run IMAGE
# simulate` runs the simulated server, and Kubernetes' `args: [serve, ...]` replaces CMD
# exactly as `docker run IMAGE serve ...` would (an entrypoint that named the subcommand too
# made the chart's `args: [serve]` run `llm-sidecar serve serve`).
ENTRYPOINT ["llm-sidecar"]
CMD ["serve"]
