#!/usr/bin/env bash
# Start the SuperLink of a federation across machines, in the foreground (systemd runs this).
# usage: deploy/start-superlink.sh ENV_FILE [--print]
#   ENV_FILE: see deploy/superlink.env.example. --print shows the Flower command without running it.
set -euo pipefail
ENV_FILE=${1:?usage: start-superlink.sh ENV_FILE [--print]}
shift
set -a
# shellcheck source=superlink.env.example
source "$ENV_FILE"
set +a
args=(federation superlink --dir "${HETFED_DIR:?HETFED_DIR is not set in $ENV_FILE}"
      --host "${HETFED_HOST:-0.0.0.0}" --port "${HETFED_PORT:-8000}" --silos "${HETFED_SILOS:-0}")
if [[ -n "${HETFED_TLS_DIR:-}" ]]; then
  args+=(--tls-dir "$HETFED_TLS_DIR")
else
  args+=(--insecure)  # hetfed accepts this only with a loopback HETFED_HOST
fi
[[ "${HETFED_NODE_AUTH:-1}" == 1 ]] || args+=(--no-node-auth)
# SuperLink state: file (default, state.db in HETFED_DIR: registered keys survive a restart) or memory.
[[ -z "${HETFED_SUPERLINK_STATE:-}" ]] || args+=(--superlink-state "$HETFED_SUPERLINK_STATE")
# The reverse proxy (nginx): silos reach the Fleet API on HETFED_HOST:HETFED_PORT, the SuperLink and its
# Control API listen on 127.0.0.1:HETFED_LOCAL_PORT (default HETFED_PORT + 1) only.
if [[ "${HETFED_PROXY:-1}" == 1 ]]; then
  [[ -z "${HETFED_LOCAL_PORT:-}" ]] || args+=(--local-port "$HETFED_LOCAL_PORT")
else
  args+=(--no-proxy)
fi
exec "${HETFED_BIN:-hetfed}" "${args[@]}" "$@"
