# The openwop-memory sidecar image. Deliberately minimal, and NOT built or tested by CI:
# check it yourself before relying on it. Build from the repository root:
#   docker build -t openwop-memory:0.1.0 .
# The Kubernetes manifests in kubernetes/ expect this image (uid/gid 10001, paths below).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY client /tmp/src/client
COPY sidecar /tmp/src/sidecar
RUN pip install /tmp/src/client /tmp/src/sidecar \
 && rm -rf /tmp/src \
 && groupadd --system --gid 10001 openwop-memory \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/openwop-memory --shell /usr/sbin/nologin openwop-memory \
 && mkdir -p /run/openwop-memory /var/lib/openwop-memory \
 && chown 10001:10001 /run/openwop-memory /var/lib/openwop-memory

# Overridable like every setting (OPENWOP_MEMORY_*, flags, or a TOML file via --config).
ENV OPENWOP_MEMORY_SOCKET=/run/openwop-memory/memory.sock \
    OPENWOP_MEMORY_DATABASE=sqlite:////var/lib/openwop-memory/memory.db

USER 10001:10001
WORKDIR /var/lib/openwop-memory
# SIGTERM drains for up to drain_timeout (10s): give `docker stop` more, e.g. -t 30.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=10s --start-period=10s \
    CMD ["openwop-memory", "health", "--timeout", "3"]
ENTRYPOINT ["openwop-memory"]
CMD ["serve"]
