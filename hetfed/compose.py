"""``hetfed federation compose``: a docker-compose file for a cross-silo federation on one Docker host.

Flower 1.42 topology with process isolation, one image (``Dockerfile``: Flower +
hetfed + CPU torch, runtime dependency installation off) for every container:

- ``superlink``: Fleet, Control and Runtime APIs on port 8000 (published on the
  host's loopback only, for the operator's ``flwr``), state in volume ``superlink-state``;
- ``superexec-serverapp``: runs the ServerApp; results in volume ``results``;
- per silo ``i``: ``supernode-i`` (``hetfed-supernode --runtime warm --worker external``:
  Flower's SuperNode with the warm runtime's waits, on the shared network ``link`` and the
  silo's own network ``silo-i``) and ``superexec-clientapp-i``, the silo's long-lived
  ClientApp worker (``hetfed-worker``, which falls back to Flower's ``flower-superexec``
  if its self-test fails), the only container that mounts the silo's volume ``silo-i``
  (``/silo/data``, ``/silo/state``). ``silo-i`` is an internal network: the container
  holding the silo's data reaches its own SuperNode and nothing else.

Secure aggregation runs with signed keys (hetfed/silo_identity.py): each silo's identity
(``identities/silo-i.key``, mode 0600, owned by the containers' user 49999) and the federation's
roster (``identities/roster.toml``) are compose secrets (read-only bind mounts) of the silo's
ClientApp executor only, at ``/run/secrets/identity.key`` and ``/run/secrets/roster.toml``, and
each SuperNode's node config names them (``secagg-identity``, ``secagg-roster``).
:func:`identity_commands` makes them before ``docker compose up`` (``federation identity``).

With ``tls`` the certificates (``hetfed federation certs --out certs --host superlink``)
and node keys (``hetfed federation keygen keys/silo-i``) are compose secrets, the
SuperLink authenticates SuperNodes, and the Control API is closed to the silos as on a
SuperLink host (``hetfed federation superlink``): the ``superlink`` container runs the
SuperLink on its own 127.0.0.1:8001 behind nginx, which serves port 8000 with TLS and
forwards only the Fleet API and ``/health`` (403 for the rest). The operator's services
share the SuperLink's network namespace (``network_mode: service:superlink``) and reach
127.0.0.1:8001 there: ``superexec-serverapp`` (Runtime API) and a one-shot ``register``
that registers the silos' public keys before their SuperNodes start. The operator runs
``flwr`` inside the ``superlink`` container (``docker compose exec superlink flwr ...``,
connection ``hetfed`` in ``$FLWR_HOME=/state/flwr-home``) and submits the image's own app
``/app``. Every silo is pinned to that build: the image carries its FAB hash in
``/etc/hetfed/approved-apps`` (computed when the image is built, by ``hetfed federation
approve``), and each SuperNode and ClientApp worker refuses any other app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hetfed import versions
from hetfed.config import to_toml, validate
from hetfed.engines.flower import superexec_args, superlink_args, supernode_args
from hetfed.silo_identity import ROSTER_FILE, identity_file

LINK_PORT = 8000  # Flower's default SuperLink port (Fleet, Control and Runtime APIs; TLS: the proxy)
LOCAL_PORT = 8001  # TLS: the SuperLink itself, on the superlink container's 127.0.0.1
NODE_PORT = 9094  # each SuperNode's Runtime API (its ClientApp executor connects here)
IMAGE = "hetfed-app:local"
SECRETS = "/run/secrets"
SILO_DATA, SILO_STATE = "/silo/data", "/silo/state"
APPROVED_APPS = "/etc/hetfed/approved-apps"  # the image's own build (Dockerfile), root-owned
OPERATOR_HOME = "/state/flwr-home"  # TLS: flwr's connection inside the superlink container
IDENTITIES = Path("identities")  # beside the compose file: silo-<i>.key and roster.toml
IDENTITY_TARGET, ROSTER_TARGET = "identity.key", "roster.toml"  # in each ClientApp executor's /run/secrets
APP_USER = "49999:49999"  # Flower's images' user `app` (docker/base.Dockerfile), who reads the secrets


def compose_spec(silos: int, problem: str, tls: bool) -> dict[str, Any]:
    """The compose file as a mapping (see the module docstring for the topology)."""
    if silos < 1:
        raise ValueError(f"--silos must be >= 1, got {silos}")
    validate({"problem": problem})  # a clear error for an unknown problem
    version = versions.flower()
    link = f"superlink:{LINK_PORT}"
    ca_file = f"{SECRETS}/ca.crt"
    ca = ca_file if tls else None
    env = {
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",  # hetfed.runtime.telemetry_off
    }

    def service(entrypoint: str, command: list[str], **extra: Any) -> dict[str, Any]:
        return {
            "image": IMAGE,
            "build": {"context": ".", "dockerfile": "Dockerfile", "args": {"FLWR_VERSION": version}},
            "entrypoint": [entrypoint],
            "command": command,
            "environment": dict(env),
            **extra,
        }

    # The Control and Runtime APIs: the SuperLink's port (plain) or its own loopback (TLS, behind nginx).
    control = f"127.0.0.1:{LOCAL_PORT}" if tls else link
    beside_superlink = {"network_mode": "service:superlink"} if tls else {"networks": ["link"]}
    if tls:
        superlink = service(
            "hetfed",
            ["federation", "superlink", "--dir", "/state", "--tls-dir", SECRETS, "--host", "0.0.0.0"]
            + ["--port", str(LINK_PORT), "--local-port", str(LOCAL_PORT), "--isolation", "process"]
            + ["--silos", str(silos)],
            **_secrets(["ca.crt", "server.pem", "server.key"]),
        )
        superlink["environment"]["FLWR_HOME"] = OPERATOR_HOME  # `docker compose exec superlink flwr ...`
    else:
        superlink = service(
            "hetfed-superlink",
            superlink_args(
                host="0.0.0.0", port=LINK_PORT, database="/state/state.db", tls=None, isolation="process"
            ),
        )
    superlink |= {
        "ports": [f"127.0.0.1:{LINK_PORT}:{LINK_PORT}"],  # the operator's host only (TLS: the proxy)
        "volumes": ["superlink-state:/state"],
        "networks": ["link"],
        "restart": "on-failure",
    }
    services: dict[str, Any] = {
        "superlink": superlink,
        "superexec-serverapp": service(
            "flower-superexec",
            superexec_args(runtime_api=control, ca=ca),
            volumes=["results:/app/results"],  # the ServerApp's results-dir "results", cwd /app
            **beside_superlink,
            depends_on=["superlink"],
            restart="on-failure",
            **_secrets(["ca.crt"] if tls else []),
        ),
    }
    if tls:
        services["register"] = service(
            "hetfed",
            ["federation", "register", "--superlink", control, "--ca", ca_file, "--wait", "120"]
            + [f"{SECRETS}/silo-{i}.pub" for i in range(silos)],
            **beside_superlink,
            depends_on=["superlink"],
            restart="no",
            **_secrets(["ca.crt", *(f"silo-{i}.pub" for i in range(silos))]),
        )
    for i in range(silos):
        node_config = {
            "partition-id": i,
            "num-partitions": silos,
            "data-path": SILO_DATA,
            "state-dir": SILO_STATE,
            # Signed keys: the paths are the executor's, where the ClientApp reads the node config.
            "secagg-identity": f"{SECRETS}/{IDENTITY_TARGET}",
            "secagg-roster": f"{SECRETS}/{ROSTER_TARGET}",
        }
        pinning = ["--approved-apps", APPROVED_APPS] if tls else []
        if tls:
            node_config["approved-apps"] = APPROVED_APPS  # the ClientApp reports what its silo approved
        services[f"supernode-{i}"] = service(
            "hetfed-supernode",
            ["--runtime", "warm", "--worker", "external", *pinning]
            + supernode_args(
                superlink=link,
                node_config=node_config,
                ca=ca,
                key=f"{SECRETS}/silo-{i}" if tls else None,
                host="0.0.0.0",
                port=NODE_PORT,
                isolation="process",
            ),
            networks=["link", f"silo-{i}"],
            depends_on=(
                {"register": {"condition": "service_completed_successfully"}} if tls else ["superlink"]
            ),
            restart="on-failure",
            **_secrets(["ca.crt", f"silo-{i}"] if tls else []),
        )
        # The silo's Runtime API traffic stays on its internal network, so it is not encrypted.
        services[f"superexec-clientapp-{i}"] = service(
            "hetfed-worker",
            ["--runtime-api-address", f"supernode-{i}:{NODE_PORT}", *pinning],
            volumes=[f"silo-{i}:/silo"],
            networks=[f"silo-{i}"],
            depends_on=[f"supernode-{i}"],
            restart="on-failure",
            stop_signal="SIGINT",
            **_secrets(
                [IDENTITY_TARGET, ROSTER_TARGET],
                {IDENTITY_TARGET: f"silo-{i}-identity", ROSTER_TARGET: "roster"},
            ),
        )
    spec: dict[str, Any] = {
        "name": "hetfed",
        "x-hetfed": {"silos": silos, "problem": problem, "tls": tls, "flwr": version},
        "services": services,
        "networks": {"link": {}, **{f"silo-{i}": {"internal": True} for i in range(silos)}},
        "volumes": {"superlink-state": {}, "results": {}, **{f"silo-{i}": {} for i in range(silos)}},
    }
    files = {f"silo-{i}-identity": identity_file(IDENTITIES, i) for i in range(silos)}
    files["roster"] = IDENTITIES / ROSTER_FILE
    if tls:
        credentials = {
            "ca.crt": "certs/ca.crt",
            "server.pem": "certs/server.pem",
            "server.key": "certs/server.key",
        }
        for i in range(silos):
            credentials |= {f"silo-{i}": f"keys/silo-{i}", f"silo-{i}.pub": f"keys/silo-{i}.pub"}
        files |= {_secret_name(target): Path(path) for target, path in credentials.items()}
    spec["secrets"] = {name: {"file": f"./{path.as_posix()}"} for name, path in files.items()}
    return spec


def identity_commands(silos: int) -> list[list[str]]:
    """What makes the silos' identities and their roster, run in the compose file's folder before
    ``docker compose up``: ``federation identity`` per silo keeps an existing identity and sets its
    line in the roster (so it is safe to run again); then ``chown`` hands the keys to the containers'
    user (their mode stays 0600)."""
    roster = (IDENTITIES / ROSTER_FILE).as_posix()
    make = [
        ["hetfed", "federation", "identity", "--key", identity_file(IDENTITIES, i).as_posix()]
        + ["--partition-id", str(i), "--roster", roster]
        for i in range(silos)
    ]
    return [*make, ["chown", APP_USER, *(identity_file(IDENTITIES, i).as_posix() for i in range(silos))]]


def run_config(silos: int, problem: str) -> dict[str, Any]:
    """The run config the operator submits to the compose federation (``flwr run --run-config``)."""
    return {"problem": problem, "num-clients": silos}


def render(spec: dict[str, Any], command: str) -> str:
    """YAML text with a header naming the command that generated it."""

    class NoAliases(yaml.SafeDumper):  # repeated lists stay literal: readable, and no anchors to chase
        def ignore_aliases(self, data: Any) -> bool:
            return True

    body = yaml.dump(spec, Dumper=NoAliases, sort_keys=False, default_flow_style=False, width=1000)
    return f"# Generated by `{command}`; regenerate instead of editing.\n{body}"


def write_compose(
    out: Path, run_config_path: Path, silos: int, problem: str, tls: bool, command: str
) -> None:
    """Write the compose file and the matching run config."""
    Path(out).write_text(render(compose_spec(silos, problem, tls), command))
    Path(run_config_path).parent.mkdir(parents=True, exist_ok=True)
    Path(run_config_path).write_text(
        f"# Submit with: flwr run . hetfed-compose --run-config {run_config_path}\n"
        + to_toml(run_config(silos, problem))
    )


def _secret_name(target: str) -> str:
    return target.replace(".", "-")


def _secrets(targets: list[str], sources: dict[str, str] | None = None) -> dict[str, Any]:
    """A service's ``secrets`` entry: each mounted read-only at /run/secrets/<target>, from secret
    ``sources[target]`` (default: the target's own name)."""
    named = sources or {}
    entries = [{"source": named.get(t, _secret_name(t)), "target": t} for t in targets]
    return {"secrets": entries} if targets else {}
