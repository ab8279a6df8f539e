# A local stand-in for flwr/superexec (`hetfed docker base-image`), for machines that cannot pull
# Flower's image: Flower's base-image layout (venv /python/venv on PATH, user app uid/gid 49999,
# WORKDIR and HOME /app, entrypoint flower-superexec) on a debootstrap'ed Debian imported as
# DEBIAN_IMAGE. Flower comes from the wheelhouse in the build context: the build needs no network.
ARG DEBIAN_IMAGE=local/debian:bookworm
FROM ${DEBIAN_IMAGE}
ARG FLWR_VERSION=1.42.0
LABEL org.hetfed.stand-in="flwr/superexec:${FLWR_VERSION}"
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /python/venv \
 && /python/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels "flwr==${FLWR_VERSION}" \
 && rm -rf /tmp/wheels \
 && groupadd -g 49999 app && useradd -M -d /app -u 49999 -g app -s /bin/sh app \
 && mkdir -p /app && chown -R app:app /app /python/venv
ENV PATH=/python/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 LANG=C.UTF-8 LC_ALL=C.UTF-8 HOME=/app
WORKDIR /app
USER app
ENTRYPOINT ["flower-superexec"]
