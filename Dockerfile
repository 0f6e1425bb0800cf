# syntax=docker/dockerfile:1
# The specdec sidecar: `specdec serve` (scrape vLLM's /metrics + the route-tagging proxy).
#
#   docker build -t specdec:0.1.0 .
#   docker run --rm -p 10419:10419 -p 8001:8001 \
#     -v $PWD/deploy/compose/specdec.yaml:/etc/specdec/specdec.yaml:ro specdec:0.1.0
#
# Two stages: the builder turns the checkout into a wheel and installs it with its
# dependencies into /opt/venv (every dependency ships binary wheels for CPython 3.11 on
# amd64 and arm64, so no compiler is needed even there); the final image is python:3.11-slim
# plus that venv, run as an unprivileged numeric user (Kubernetes' runAsNonRoot can verify a
# numeric UID). Checked by tests/integration/test_deploy.py (structure + hadolint).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel needs (.dockerignore keeps the rest of the checkout out of the context).
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY dashboards ./dashboards
RUN python -m venv /opt/venv \
 && python -m pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install /wheels/specdec-*.whl \
 && /opt/venv/bin/specdec --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="specdec" \
      org.opencontainers.image.description="Live speculative-decoding payoff for vLLM: Prometheus sidecar and route-tagging proxy" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/venv /opt/venv
# No home directory, no shell login, no files of its own: the config is mounted read-only at
# /etc/specdec/specdec.yaml and the root filesystem can be read-only.
RUN groupadd --system --gid 10419 specdec \
 && useradd --system --uid 10419 --gid specdec --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin specdec \
 && mkdir -p /etc/specdec
USER 10419:10419
# 10419: the sidecar's /metrics and /-/healthy; 8001: the proxy clients talk to.
EXPOSE 10419 8001
# slim has no curl or wget: ask Python. Exits 0 only on a 200 from /-/healthy.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:10419/-/healthy', timeout=4).status != 200)"]
ENTRYPOINT ["specdec"]
CMD ["serve", "--config", "/etc/specdec/specdec.yaml"]
