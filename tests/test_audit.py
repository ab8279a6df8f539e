"""The audit trail on the SuperLink host: start, stop and resume of a run on a real federation.

A local federation over TLS with node authentication (``hetfed federation up --node-auth``); a
deployment run is started with ``hetfed run``, stopped by SIGINT (``flwr stop``), resumed with
``hetfed run --resume``. ``audit.jsonl`` must list the three, each with the FAB hash (checked
against the hash hetfed computes of the app folder and against ``flwr ls``) and the admitted
nodes' public keys (checked against the keys ``up`` made). A run submitted with a bare ``flwr``
command bypasses hetfed: ``hetfed federation audit`` names it as such.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from hetfed import audit
from hetfed.engines.federation_info import FederationInfo
from hetfed.engines.flower import CONNECTION
from hetfed.engines.runner import prepare
from hetfed.runtime.pinning import fab_hash
from tests.conftest import REPO, hetfed_cli
from tests.test_cli_faults import sets, start_cli, wait_for_round

DOWNED_ROUNDS = 200
RUN = {"num-rounds": 6, "n-train": 40, "n-test": 30, "num-items": 10, "local-epochs": 1, "seed": 5}


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``hetfed federation up --nodes 2`` over TLS with node authentication; its folder."""
    base = tmp_path_factory.mktemp("audit")
    tls, root = base / "tls", base / "fed"
    assert hetfed_cli("federation", "certs", "--out", str(tls)).returncode == 0
    up = hetfed_cli(
        "federation", "up", "--nodes", "2", "--dir", str(root), "--tls-dir", str(tls), "--node-auth"
    )
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield root
    finally:
        if (root / "federation.json").exists():  # the test takes it down itself when it gets that far
            down = hetfed_cli("federation", "down", "--dir", str(root), timeout=120)
            assert down.returncode == 0, down.stderr


def public_key(pem: str) -> tuple[int, int]:
    """An EC public key's point, from its PEM."""
    key = serialization.load_pem_public_key(pem.encode())
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key.public_numbers().x, key.public_numbers().y


def test_a_folder_without_a_federation_is_one_line(tmp_path: Path) -> None:
    out = hetfed_cli("federation", "audit", "--dir", str(tmp_path), timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"hetfed: error: {tmp_path} holds no federation (no federation.json, no audit.jsonl)"
    ]


@pytest.mark.deployment
def test_start_stop_and_resume_are_audited_with_the_fab_hash_and_the_admitted_keys(
    federation: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    base = [
        "run",
        "--engine",
        "deployment",
        "--federation-dir",
        str(federation),
        "--results-dir",
        str(results),
    ]
    proc = start_cli(*base, *sets({**RUN, "run-name": "audited"}))
    wait_for_round(results / "audited", 1, proc, timeout=300)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    resumed = hetfed_cli("run", "--resume", "audited", "--results-dir", str(results), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    flower = FederationInfo.load(federation).flower()
    bare = flower.submit(REPO, prepare({**RUN, "run-name": "bare"}, "deployment", tmp_path))  # not via hetfed
    flower.stop_run(bare)

    entries = audit.read(federation)
    assert [e["event"] for e in entries] == ["start", "stop", "resume"]
    first = stdout.split("submitted run ")[1].split()[0]
    assert entries[0]["run-id"] == entries[1]["run-id"] == first != entries[2]["run-id"]
    assert {e["run-name"] for e in entries} == {"audited"}
    assert "--engine deployment" in entries[0]["command"] and "run-name=audited" in entries[0]["command"]
    assert "--resume audited" in entries[2]["command"]
    assert entries[1]["detail"] == "stopped by SIGINT; flwr stop accepted"
    assert entries[0]["run-config"]["num-rounds"] == 6 and entries[2]["run-config"]["resume"] is True
    # The FAB hash: the build hetfed makes of this folder, and what `flwr ls` reports of each run.
    expected = fab_hash(REPO)
    assert all(e["fab-hash"] == expected for e in entries)
    for e in entries:
        listed = flower.flwr_json("ls", CONNECTION, "--run-id", e["run-id"])["runs"][0]
        assert listed["fab-hash"] == e["fab-hash"]
    # The admitted nodes: exactly the two keys `up` made and registered (OpenSSH files in keys/).
    made = {
        public_key(
            serialization.load_ssh_public_key(p.read_bytes())
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )
        for p in sorted((federation / "keys").glob("*.pub"))
    }
    assert len(made) == 2
    for e in entries:
        assert {public_key(n["public-key"]) for n in e["nodes"]} == made
        assert all(n["status"] == "online" for n in e["nodes"])

    out = hetfed_cli("federation", "audit", "--dir", str(federation), timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for entry, line in zip(entries, lines[:3], strict=True):
        assert line == audit.describe(entry)
        assert f"  {entry['event']}" in line and f"FAB {expected[:12]}" in line and "2 nodes admitted" in line
    assert lines[3] == f"3 audit entries in {federation / 'audit.jsonl'}"
    assert lines[5].startswith(f"  run {bare} (") and lines[5].count("run ") == 1
    assert json.loads((federation / "audit.jsonl").read_text().splitlines()[1])["event"] == "stop"

    # `federation down` ends the runs still going: one stop each, with the config they were submitted with.
    # Long enough to be going when `down` looks (a 6-round run once finished first in CI).
    proc = start_cli(*base, *sets({**RUN, "run-name": "downed", "num-rounds": DOWNED_ROUNDS}))
    wait_for_round(results / "downed", 1, proc, timeout=300)
    down = hetfed_cli("federation", "down", "--dir", str(federation), timeout=120)
    assert down.returncode == 0, down.stderr
    proc.communicate(timeout=120)
    *_, started, ended = audit.read(federation)
    assert (started["event"], ended["event"]) == ("start", "stop") and started["run-id"] == ended["run-id"]
    assert ended["detail"] == "ended by hetfed federation down" and "federation down" in ended["command"]
    assert ended["run-config"]["run-name"] == "downed" and ended["run-config"]["num-rounds"] == DOWNED_ROUNDS
    assert ended["fab-hash"] == expected and len(ended["nodes"]) == 2
