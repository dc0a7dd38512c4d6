# syntax=docker/dockerfile:1
# embedding-monitor: small, non-root, read-only-root friendly; the CPU daemon carries no torch.
#   docker build -t embedding-monitor .
#   docker build --build-arg EXTRAS=gpu -t embedding-monitor:cuda .     # + torch, PyPI's CUDA build
#   docker build --build-arg EXTRAS=encoder --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu \
#     -t embedding-monitor:encoder .                                      # text queries, CPU torch
#   docker run --read-only --tmpfs /tmp -v embmon-state:/var/lib/embedding-monitor -p 9464:9464 \
#     embedding-monitor run --bootstrap-servers kafka:9092 --embeddings-topic embeddings
# What was and was not verified without a Docker engine: docs/deployment.md.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# EXTRAS: optional extras of pyproject.toml, comma-separated. Empty (the default): the CPU daemon,
# neither torch nor sentence-transformers. gpu: torch, for a device setting that says cuda;
# encoder: sentence-transformers (and torch), for golden sets with text queries.
ARG EXTRAS=""
# TORCH_INDEX: install torch==2.13.0 from this index before the rest (the CPU build:
# https://download.pytorch.org/whl/cpu); empty: torch, if an extra needs it, from PyPI (the CUDA build).
ARG TORCH_INDEX=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# 1. torch from its own index, only when asked for.
RUN if [ -n "$TORCH_INDEX" ]; then pip install --no-cache-dir torch==2.13.0 --index-url "$TORCH_INDEX"; fi

# 2. the dependencies (and those of EXTRAS) in their own layer: only a pyproject.toml change rebuilds it.
COPY pyproject.toml ./
RUN python -c "import os, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = [e.strip() for e in os.environ.get('EXTRAS', '').split(',') if e.strip()]; print('\n'.join(p['dependencies'] + [r for e in extras for r in p['optional-dependencies'][e]]))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt

# 3. the project itself, without touching the dependencies installed above.
COPY README.md LICENSE ./
COPY monitor ./monitor
RUN pip install --no-cache-dir --no-deps . \
    && embedding-monitor --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="embedding-monitor" \
      org.opencontainers.image.description="Watches production embedding quality and exports Prometheus metrics" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 embmon \
    && useradd --system --uid 10001 --gid embmon --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin embmon \
    && mkdir -p /var/lib/embedding-monitor \
    && chown embmon:embmon /var/lib/embedding-monitor
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    EMBMON_STATE_DIR=/var/lib/embedding-monitor \
    EMBMON_HTTP__PORT=9464
# the only writable paths: the state directory (references, checkpoints) and /tmp
VOLUME ["/var/lib/embedding-monitor"]
WORKDIR /var/lib/embedding-monitor
USER 10001:10001
EXPOSE 9464
# the port the daemon listens on (EMBMON_HTTP__PORT; --metrics-port or a config file's http.port need the same
# value in EMBMON_HTTP__PORT for this check)
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('EMBMON_HTTP__PORT', '9464'), timeout=4)"]
ENTRYPOINT ["embedding-monitor"]
CMD ["run"]
