# One image for every container of docker-compose.yml: the SuperLink, the SuperNodes and the
# SuperExec executors that run the ServerApp and the ClientApps (each service picks its
# entrypoint). Everything the app imports is installed here, so Flower's runtime dependency
# installation stays off and containers never download anything.
#
# Built offline: every package comes from ./wheelhouse (`hetfed docker wheelhouse`, run on a
# host that reaches a package index), installed with --no-index, so the build itself needs no
# network (`docker build --network none`), as on an air-gapped silo. BASE_IMAGE is Flower's
# image, or the local stand-in of `hetfed docker base-image` where no registry is reachable.
ARG FLWR_VERSION=1.42.0
ARG BASE_IMAGE=flwr/superexec:${FLWR_VERSION}
FROM ${BASE_IMAGE}

ENV FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

WORKDIR /app

# The dependencies first (this layer is reused while the wheelhouse is unchanged): the CPU torch
# wheel (the default torch wheel pulls gigabytes of CUDA), Flower (the base image's own) and
# hetfed's runtime requirements, as listed in the wheelhouse's requirements.txt. qpth declares
# numpy<2, so it comes without its dependencies (as in the Makefile).
COPY wheelhouse/ /tmp/wheelhouse/
RUN python -m pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse -r /tmp/wheelhouse/requirements.txt \
 && python -m pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse --no-deps "qpth==0.0.18"

# hetfed itself; its build backend comes from the wheelhouse too. Flower's [simulation] extra
# (Ray) is not used in a deployment.
COPY --chown=app:app pyproject.toml README.md constraints-dev.txt ./
COPY --chown=app:app hetfed ./hetfed
COPY --chown=app:app server ./server
COPY --chown=app:app client ./client
COPY --chown=app:app strategies ./strategies
COPY --chown=app:app problems ./problems
RUN sed -i 's/"flwr\[simulation\]/"flwr/' pyproject.toml \
 && python -m pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse -c constraints-dev.txt .

# Mount points of the named volumes, owned by the image's user so fresh volumes are writable:
# /state (SuperLink database), /app/results (ServerApp results), /silo/{data,state} (one silo).
# Last, with /app final: the FAB hash of this very app (as `flwr run /app` builds it) becomes the
# silos' allow-list (app pinning in docker-compose.tls.yml), root-owned so no ClientApp can extend
# it. The TLS compose SuperLink also needs nginx (its reverse proxy): the stand-in base image
# (`hetfed docker base-image`) has Debian's nginx-light; on another base image install it there.
USER root
RUN rm -rf /tmp/wheelhouse \
 && mkdir -p /state /app/results /silo/data /silo/state \
 && chown -R app:app /state /app/results /silo \
 && hetfed federation approve /app --file /etc/hetfed/approved-apps \
 && (command -v nginx >/dev/null || echo "warning: no nginx in the image: docker-compose.tls.yml's SuperLink needs it")
USER app

ENTRYPOINT ["flower-superexec"]
