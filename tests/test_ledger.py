"""A silo's own ledger (client/ledger.py): every reply that left the silo, recorded on the silo.

On real SuperNodes the silos' ledgers and the server's traffic audit (``audit-traffic``) must
describe the same replies; on the inline engine each ledger entry's SHA-256 must be that of the
arrays the server received, a failing ClientApp's error must be recorded, and a reply that cannot
be recorded must not leave.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
from flwr.app import Message

from hetfed.client.ledger import LEDGER_FILE, read
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from hetfed.records import to_numpy
from tests.conftest import REPO, hetfed_cli

FAST = {"num-rounds": 2, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "seed": 3}


def with_state_dirs(root: Path, nodes: int) -> list[dict]:
    return [{**c, "state-dir": str(root / f"node-{c['partition-id']}")} for c in node_configs(nodes)]


def as_traffic(entry: dict) -> tuple:
    """A ledger entry in the traffic audit's terms: round, exchange, partition, arrays with shapes
    and dtypes, metric and config names."""
    arrays = tuple(sorted((k, tuple(a["shape"]), a["dtype"]) for k, a in entry["arrays"].items()))
    return (entry["round"], entry["message-type"], entry["partition-id"], arrays,
            tuple(sorted(entry["metrics"])), tuple(sorted(entry["configs"])))  # fmt: skip


def traffic_key(t: dict) -> tuple:
    arrays = tuple(sorted((k, tuple(shape), t["dtypes"][k]) for k, shape in t["arrays"].items()))
    return (t["round"], t["exchange"], t["partition-id"], arrays, tuple(sorted(t["metrics"])),
            tuple(sorted(t["configs"])))  # fmt: skip


def test_the_ledger_hashes_what_the_server_received_and_records_failures(tmp_path: Path) -> None:
    received: list[tuple[int, str, dict[str, str]]] = []

    def observe(instruction: Message, reply: Message) -> None:
        if not reply.has_error():
            hashes = {
                f"{r}/{k}": hashlib.sha256(v.tobytes()).hexdigest()
                for r, record in reply.content.array_records.items()
                for k, v in to_numpy(record).items()
            }
            received.append((int(instruction.metadata.group_id), instruction.metadata.message_type, hashes))

    configs = with_state_dirs(tmp_path / "state", 3)
    configs[1].update({"fail-round": 2, "drill-exchange": "train"})  # round 2's train; its evaluate goes
    cfg = {**FAST, "fraction": 1.0, "results-dir": str(tmp_path), "run-name": "r", "audit-traffic": True}
    assert run_inline(cfg, configs, observers=[observe])["status"] == "completed"
    entries = [e for c in configs for e in read(c["state-dir"])]
    ok = [(e["round"], e["message-type"], {k: a["sha256"] for k, a in e["arrays"].items()})
          for e in entries if "error" not in e]  # fmt: skip
    assert sorted(map(str, ok)) == sorted(map(str, received)) and any(h for _, _, h in ok)
    (failed,) = [e for e in entries if "error" in e]
    assert (failed["round"], failed["message-type"], failed["partition-id"]) == (2, "train", 1)
    assert failed["error"] == "FaultDrill: fault drill: partition 1 fails round 2 (node config fail-round)"
    assert failed["arrays"] == {} and failed["metrics"] == []
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:
        (row,) = [r for r in csv.DictReader(f) if r["status"] == "failed"]
    assert "fault drill: partition 1 fails round 2" in row["error"]  # the same reply, as the server saw it
    assert {e["run-name"] for e in entries} == {"r"} and len({e["run-id"] for e in entries}) == 1


def test_a_reply_that_cannot_be_recorded_does_not_leave(tmp_path: Path) -> None:
    configs = with_state_dirs(tmp_path / "state", 3)
    (Path(configs[2]["state-dir"]) / LEDGER_FILE).mkdir(parents=True)  # the ledger cannot be written
    cfg = {**FAST, "num-clients": 2, "results-dir": str(tmp_path), "run-name": "r", "audit-traffic": True}
    summary = run_inline(cfg, configs)
    assert summary["status"] == "completed" and "client-02" not in summary["clients"]
    (reason,) = summary["failed"].values()  # left out at discovery, before it could name its partition
    ledger = Path(configs[2]["state-dir"]) / LEDGER_FILE
    assert (
        f"LedgerError'>:<'this silo's ledger {ledger} cannot be written ([Errno 21] Is a directory" in reason
    )
    assert reason.endswith("the reply was not sent'>"), reason
    traffic = [json.loads(line) for line in (tmp_path / "r" / "traffic.jsonl").read_text().splitlines()]
    assert traffic and all(t["partition-id"] != 2 for t in traffic)


def test_without_a_state_dir_no_ledger_is_kept(tmp_path: Path) -> None:
    run_inline({**FAST, "results-dir": str(tmp_path / "results"), "run-name": "r"}, node_configs(2))
    assert not list(tmp_path.rglob(LEDGER_FILE))


def test_a_state_dir_without_a_ledger_is_one_line(tmp_path: Path) -> None:
    out = hetfed_cli("federation", "ledger", "--state-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"hetfed: error: {tmp_path / LEDGER_FILE} does not exist: this state dir's node recorded no reply"
    ]


@pytest.mark.deployment
def test_the_silos_ledgers_and_the_servers_traffic_audit_describe_the_same_replies(
    deployment, tmp_path: Path
) -> None:
    cfg = prepare({**FAST, "audit-traffic": True, "run-name": "ledgered"}, "deployment", tmp_path)
    run_id = deployment.submit(REPO, cfg)
    assert deployment.wait_run(run_id, timeout=900) == "finished:completed", deployment.run_log(run_id)[
        -3000:
    ]
    state_dirs = sorted((deployment.root / "state").glob("node-*"))
    assert len(state_dirs) == 3
    entries = [e for d in state_dirs for e in read(d) if e["run-name"] == "ledgered"]
    assert {e["flower-run-id"] for e in entries} == {run_id}
    # Discovery (query.info, round 0) is not in the traffic audit: the pool audits the exchanges.
    ledger = Counter(as_traffic(e) for e in entries if e["message-type"] != "query.info")
    traffic = (tmp_path / "ledgered" / "traffic.jsonl").read_text().splitlines()
    assert ledger == Counter(traffic_key(json.loads(line)) for line in traffic)
    assert len(traffic) == 2 * 2 + 3 and not any("error" in e for e in entries)
    assert Counter(e["message-type"] for e in entries)["query.info"] == 3

    out = hetfed_cli("federation", "ledger", *(a for d in state_dirs for a in ("--state-dir", str(d))))
    assert out.returncode == 0, out.stderr
    for d in state_dirs:
        mine = [e for e in read(d) if e["run-name"] == "ledgered"]
        assert f"{d / LEDGER_FILE}: " in out.stdout
        assert f"run ledgered (Flower run {run_id}): {len(mine)} replies, rounds 0-2" in out.stdout
