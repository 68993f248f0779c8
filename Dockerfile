# syntax=docker/dockerfile:1
# swapwise admission webhook image.
#   make image                  (buildah, no daemon: build/swapwise-image.tar; see README)
#   docker build -t swapwise:0.1.0 .   (where a Docker engine exists)
# PYTHON_IMAGE: the base; `make image LOCAL_BASE=1` passes an equivalent built from Debian.
# The builder turns the project and its dependencies into wheels; the final stage installs
# those wheels only: no source tree, no compiler, no pip cache.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints/newest.txt constraints/newest.txt
COPY webhook/ webhook/
# The project's own wheel, then a wheel for every runtime dependency; the web framework at
# the newest versions the whole test suite runs on (constraints/newest.txt).
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && pip wheel --no-cache-dir --wheel-dir /wheels --constraint constraints/newest.txt \
      /wheels/swapwise-*.whl

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="swapwise" \
      org.opencontainers.image.description="Kubernetes mutating admission webhook that makes pods swap-eligible under LimitedSwap" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A fixed, unprivileged identity; the chart runs the pod as the same UID/GID.
RUN groupadd --system --gid 65532 swapwise \
 && useradd --system --uid 65532 --gid 65532 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin swapwise
# The wheels are bind-mounted from the builder, so they never land in a layer. buildah's
# layer cache does not look into a bind mount: the digest of the sources (hack/build-image.sh
# passes it) keeps it from reusing an install of older wheels. Docker's BuildKit needs none.
ARG SOURCE_DIGEST=none
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels /wheels/swapwise-*.whl
USER 65532:65532
EXPOSE 8443
# Policy (ConfigMap) and certificate (kubernetes.io/tls Secret) come from mounted files,
# both watched for changes.
ENTRYPOINT ["swapwise", "serve"]
CMD ["--policy", "/etc/swapwise/policy/policy.yaml", "--cert-dir", "/etc/swapwise/tls", "--host", "0.0.0.0", "--port", "8443"]
