# One image for every container of docker-compose.yml: the SuperLink, the SuperNodes and the
# SuperExec executors that run the ServerApp and the ClientApps (each service picks its
# entrypoint). Everything the app imports is installed here, so Flower's runtime dependency
# installation stays off and containers never download anything.
ARG FLWR_VERSION=1.42.0
FROM flwr/superexec:${FLWR_VERSION}

ENV FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

WORKDIR /app

# CPU-only torch from PyTorch's CPU wheel index: the default torch wheel pulls gigabytes of CUDA.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python -m pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# hetfed and its dependencies. flwr is the image's own; its [simulation] extra (Ray) is not used
# in a deployment. qpth declares numpy<2, so it comes without its dependencies (as in the Makefile).
COPY --chown=app:app pyproject.toml README.md constraints-dev.txt ./
COPY --chown=app:app hetfed ./hetfed
COPY --chown=app:app server ./server
COPY --chown=app:app client ./client
COPY --chown=app:app strategies ./strategies
COPY --chown=app:app problems ./problems
RUN sed -i 's/"flwr\[simulation\]/"flwr/' pyproject.toml \
 && python -m pip install --no-cache-dir -c constraints-dev.txt . \
 && python -m pip install --no-cache-dir --no-deps "qpth==0.0.18"

# Mount points of the named volumes, owned by the image's user so fresh volumes are writable:
# /state (SuperLink database), /app/results (ServerApp results), /silo/{data,state} (one silo).
USER root
RUN mkdir -p /state /app/results /silo/data /silo/state \
 && chown -R app:app /state /app/results /silo
USER app

ENTRYPOINT ["flower-superexec"]
