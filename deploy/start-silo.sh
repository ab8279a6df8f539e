#!/usr/bin/env bash
# Start one silo's SuperNode of a federation across machines, in the foreground (systemd runs this).
# usage: deploy/start-silo.sh ENV_FILE [--print]
#   ENV_FILE: see deploy/silo.env.example. --print shows the SuperNode command without running it.
set -euo pipefail
ENV_FILE=${1:?usage: start-silo.sh ENV_FILE [--print]}
shift
set -a
# shellcheck source=silo.env.example
source "$ENV_FILE"
set +a
args=(federation silo --superlink "${HETFED_SUPERLINK:?HETFED_SUPERLINK is not set in $ENV_FILE}"
      --partition-id "${HETFED_PARTITION_ID:?}" --num-partitions "${HETFED_NUM_PARTITIONS:?}"
      --state-dir "${HETFED_STATE_DIR:?}" --port "${HETFED_PORT:-9094}"
      --runtime "${HETFED_RUNTIME:-warm}")
if [[ -n "${HETFED_CA:-}" ]]; then
  args+=(--ca "$HETFED_CA")
else
  args+=(--insecure)  # hetfed accepts this only for a loopback SuperLink
fi
[[ -z "${HETFED_KEY:-}" ]] || args+=(--key "$HETFED_KEY")
[[ -z "${HETFED_DATA_PATH:-}" ]] || args+=(--data-path "$HETFED_DATA_PATH")
[[ -z "${HETFED_POLICY:-}" ]] || args+=(--policy "$HETFED_POLICY")
[[ -z "${HETFED_SECAGG_IDENTITY:-}" ]] || args+=(--identity "$HETFED_SECAGG_IDENTITY")
[[ -z "${HETFED_SECAGG_ROSTER:-}" ]] || args+=(--roster "$HETFED_SECAGG_ROSTER")
# App pinning: the SuperNode runs only the app builds approved with `hetfed federation approve`.
if [[ "${HETFED_ANY_APP:-0}" == 1 ]]; then
  args+=(--any-app)
elif [[ -n "${HETFED_APPROVED_APPS:-}" ]]; then
  args+=(--approved-apps "$HETFED_APPROVED_APPS")
fi  # else: HETFED_STATE_DIR/approved-apps
exec "${HETFED_BIN:-hetfed}" "${args[@]}" "$@"
