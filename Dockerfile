# syntax=docker/dockerfile:1
#
# gpu-admission container image.
#   docker build -t gpu-admission:0.1.0 .
#   buildah bud --isolation chroot --build-arg BASE_IMAGE=<any Python >= 3.11 image> -t gpu-admission .
#
# Two stages on the same base image (the venv's interpreter symlinks point into it, so both stages must use
# the identical tag): the builder installs the pinned dependencies (requirements.lock) and the project
# wheel into /opt/venv; the final image gets that venv and nothing else - no compiler, no pip, no caches.
# The tag pins Python 3.11 and the Debian release (trixie); for byte-for-byte reproducible production
# builds add the digest as well: python:3.11-slim-trixie@sha256:<digest>.
#
# BASE_IMAGE: any image with `python` (>= 3.11, with the venv module) on PATH. The tests build on a Debian
# bookworm root filesystem made by mmdebstrap (scripts/image/build.sh), where pip is not installed at all.
#
# No HEALTHCHECK: Kubernetes ignores it (the kubelet runs the Deployment's startup/liveness/readiness
# probes on /healthz and /readyz), and the server speaks TLS only, so a Docker-level check would need an
# HTTPS client that skips certificate verification inside the image.

ARG BASE_IMAGE=python:3.11-slim-trixie

FROM ${BASE_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src

# Dependencies first, in their own layer (rebuilt only when the lock changes): exact pins, binary wheels
# only, so nothing is compiled and no toolchain is needed.
COPY requirements.lock ./
RUN pip install --no-cache-dir --only-binary=:all: --require-virtualenv -r requirements.lock

# The project, as a wheel, without re-resolving dependencies. pip byte-compiles it on install: the final
# image runs with a read-only root filesystem, so the .pyc files cannot be written at run time.
COPY pyproject.toml ./
COPY webhook ./webhook
COPY policies ./policies
COPY certs ./certs
COPY cluster ./cluster
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels . \
 && pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
 && pip uninstall --yes pip setuptools \
 && rm -rf /tmp/wheels

FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="gpu-admission" \
      org.opencontainers.image.description="Kubernetes admission webhook and policy enforcer for GPU/AI workloads" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH

# The base image's own installers are not needed at run time (a base without pip has none to remove).
RUN if python -c 'import pip' 2>/dev/null; then python -m pip uninstall --yes pip setuptools wheel; fi

COPY --from=builder /opt/venv /opt/venv

# 65532: the conventional "nonroot" uid/gid; the Deployment sets the same (runAsNonRoot needs a numeric uid).
USER 65532:65532

EXPOSE 8443

ENTRYPOINT ["gpu-admission"]
CMD ["serve", "--port", "8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key", "--policy-configmap", "gpu-admission/gpu-admission-policy", "--exception-group", "gpu-admission:exception-approvers", "--audit-stdout"]
