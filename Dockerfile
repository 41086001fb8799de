# The openwop-memory sidecar image. Build from the repository root: `make image`
# (or `docker build -t openwop-memory:0.1.0 .`). The Kubernetes manifests in kubernetes/
# expect it: uid and gid 10001, the paths below. tests/deploy/test_deployment.py checks this file's
# properties (pinned and hashed dependencies, no build tools in the final stage, a numeric
# non-root user, STOPSIGNAL, HEALTHCHECK) on every test run; the test machines have no
# container engine, so tests/deploy/test_image_build.py runs the build stage's COPY and RUN in a
# scratch directory instead and serves from the result as ENTRYPOINT, CMD, ENV and
# HEALTHCHECK below say. The image itself is built only where `make image` can run.
#
# For a reproducible base, pin both FROM lines to a digest your registry serves
# (python:3.11-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- build: a virtualenv with the pinned dependencies and the two local packages ----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Every dependency comes from the lock, by hash (make lock); pip refuses anything else.
# The venv gets no pip of its own: the build stage's pip installs into it.
COPY sidecar/requirements.lock /tmp/requirements.lock
RUN python -m venv --without-pip /opt/openwop-memory \
 && pip --python /opt/openwop-memory/bin/python install --require-hashes \
        -r /tmp/requirements.lock
COPY client /tmp/src/client
COPY sidecar /tmp/src/sidecar
# --no-deps: the dependencies are the locked ones above; setuptools (locked too) builds the
# two packages and is removed afterwards, with the bytecode compiled at install.
RUN pip --python /opt/openwop-memory/bin/python install --no-deps --no-build-isolation \
        /tmp/src/client /tmp/src/sidecar \
 && pip --python /opt/openwop-memory/bin/python uninstall --yes setuptools

# -- runtime: the interpreter and the virtualenv, nothing to build or install with --------
FROM ${PYTHON_IMAGE}
# pip and setuptools of the base image are not needed to run the sidecar.
RUN python -m pip uninstall --yes pip setuptools wheel \
 && groupadd --system --gid 10001 openwop-memory \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/openwop-memory --shell /usr/sbin/nologin openwop-memory \
 && mkdir -p /run/openwop-memory /var/lib/openwop-memory \
 && chown 10001:10001 /run/openwop-memory /var/lib/openwop-memory
COPY --from=build /opt/openwop-memory /opt/openwop-memory

ENV PATH=/opt/openwop-memory/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OPENWOP_MEMORY_SOCKET=/run/openwop-memory/memory.sock \
    OPENWOP_MEMORY_DATABASE=sqlite:////var/lib/openwop-memory/memory.db

# Numeric, so that runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/openwop-memory
# SIGTERM drains for up to drain_timeout (10s): give `docker stop` more, e.g. -t 30.
STOPSIGNAL SIGTERM
# The probe imports only the standard library: one call costs about 0.05 s of wall time
# and 0.05 s of CPU (measured by tests/deploy/test_deployment.py).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["openwop-memory", "health", "--timeout", "3"]
ENTRYPOINT ["openwop-memory"]
CMD ["serve"]
