"""What DP says it protects: the refusals of DP settings that would not hold, the accountant against
dp-accounting's own RDP computation for the relation the summary states, a secret sample that no file
of the run names, and local DP that releases nothing un-noised (no within-clip bit on the wire)."""

from __future__ import annotations

import csv
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import RdpAccountant
from flwr.app import Message

from hetfed import versions
from hetfed.config import ConfigError
from hetfed.dashboard import Dashboard
from hetfed.engines.inline import node_configs, run_inline
from hetfed.server.privacy import epsilon_after

FEDAVG = {"num-rounds": 2, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0}


def observed_run(tmp_path: Path, name: str, nodes: int = 4, **cfg: Any) -> tuple[dict, list[Message]]:
    """A real inline run; the train replies as they left the clients."""
    seen: list[Message] = []

    def watch(instruction: Message, reply: Message) -> None:
        if instruction.metadata.message_type == "train":
            seen.append(reply)

    run_config = {**FEDAVG, "results-dir": str(tmp_path), "run-name": name, **cfg}
    summary = run_inline(run_config, node_configs(nodes), observers=[watch])
    return summary, seen


def model_size(run_dir: Path) -> int:
    with np.load(run_dir / "models.npz") as z:
        return sum(z[k].size for k in z.files)


@pytest.mark.parametrize("secure", [False, True])
def test_local_dp_replies_carry_no_within_clip_bit_and_central_ones_do(tmp_path: Path, secure: bool) -> None:
    """Under local DP the server must not learn whether a silo's update was within the clip: neither a
    ``dp-within`` metric in clear nor a bit in the secure sum's vector. Central DP keeps both (the
    server is trusted there, and adaptive clipping sums the bits)."""
    dp = {"dp-clipping-norm": 0.05, "secure-aggregation": secure}
    _, local = observed_run(tmp_path, "local", dp="local", **dp)
    _, central = observed_run(tmp_path, "central", dp="central", **dp)
    assert len(local) == len(central) == 2 * 4
    in_metrics = [
        ["dp-within" in r.content.metric_records["metrics"] for r in replies] for replies in (local, central)
    ]
    size = model_size(tmp_path / "local")
    assert size == model_size(tmp_path / "central")
    if secure:  # nothing in clear; the masked vector is [a x, a] under local DP, [a x, a, bit] under central
        assert not any(in_metrics[0]) and not any(in_metrics[1])
        assert {r.content.array_records["masked"]["y"].numpy().size for r in local} == {size + 1}
        assert {r.content.array_records["masked"]["y"].numpy().size for r in central} == {size + 2}
    else:
        assert not any(in_metrics[0]) and all(in_metrics[1])
    rows = (tmp_path / "local" / "rounds.csv").read_text()
    assert "dp-within" not in rows


# --- the accountant: dp-accounting's RDP API directly, for the stated relation -------------------
def dp_accounting_epsilon(rounds: int, z: float, n: int, m: int, delta: float, secret: bool) -> float:
    """public: add-or-remove-one, the Gaussian at z per round, no amplification; secret: replace-one
    (sensitivity 2S: z/2), m of n sampled without replacement."""
    if secret:
        acc = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        event: dp_event.DpEvent = dp_event.SampledWithoutReplacementDpEvent(
            n, m, dp_event.GaussianDpEvent(z / 2)
        )
    else:
        acc = RdpAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
        event = dp_event.GaussianDpEvent(z)
    acc.compose(event, rounds)
    return float(acc.get_epsilon(delta))


def test_a_public_sample_is_accounted_without_amplification_and_a_secret_one_with_it() -> None:
    """The issue's example: n = 100, m = 10, z = 1, 100 rounds, delta 1e-5. The public (seeded, listed)
    sample gets no amplification: the Gaussian mechanism at z each round, add-or-remove-one. The secret
    one keeps the amplified figure (replace-one, 83.9), which holds only where the sample is unseen."""
    public = epsilon_after(100, 1.0, 100, 10, 1e-5)
    assert public == pytest.approx(dp_accounting_epsilon(100, 1.0, 100, 10, 1e-5, secret=False), abs=1e-6)
    assert public == pytest.approx(epsilon_after(100, 1.0, 100, 100, 1e-5), abs=1e-6)  # m does not matter
    secret = epsilon_after(100, 1.0, 100, 10, 1e-5, secret_sample=True)
    assert secret == pytest.approx(dp_accounting_epsilon(100, 1.0, 100, 10, 1e-5, secret=True), abs=1e-6)
    assert round(secret, 1) == 83.9 and public > secret
    # the same replace-one releases without amplification (against those who see the sample)
    unamplified = dp_accounting_epsilon(100, 0.5, 100, 100, 1e-5, secret=False)
    assert round(unamplified, 1) == 294.9


# --- refusals ---------------------------------------------------------------------------------
SWITCHING = {"problem": "quadratic", "num-rounds": 2, "switching-m": 2, "switching-local-steps": 1}


@pytest.mark.parametrize(
    ("cfg", "why"),
    [
        (
            {**SWITCHING, "strategy": "softmax-switching"},
            "strategy 'softmax-switching' draws its clients outside the summed round (an exchange the "
            "server reads names them)",
        ),
        (
            {"fraction": 1.0},
            "strategy 'fedavg' trains every client in every summed round (4 of 4): there is no sample "
            "to keep secret",
        ),
        (
            {"strategy": "local-only", "loss": "mse", "fraction": 0.5},
            "strategy 'local-only' sums no round (no release to sample for)",
        ),
    ],
)
def test_a_strategy_that_cannot_keep_its_sample_secret_is_refused_before_round_1(
    tmp_path: Path, cfg: dict, why: str
) -> None:
    seen: list[str] = []
    run_config = {**FEDAVG, "results-dir": str(tmp_path), "run-name": "r", "dp": "central"}
    run_config |= {"dp-sampling": "secret", **cfg}
    with pytest.raises(ConfigError) as err:
        run_inline(
            run_config, node_configs(4), observers=[lambda ins, _: seen.append(ins.metadata.message_type)]
        )
    assert str(err.value) == f"run config 'dp-sampling': {why}; use dp-sampling = public"
    assert set(seen) == {"query.info"}  # discovery only


# --- what the summary states ------------------------------------------------------------------
def test_the_summary_states_the_relation_adversary_and_accountant_of_its_epsilon(tmp_path: Path) -> None:
    z, clip = 2.0, 0.05
    dp = {"dp-noise-multiplier": z, "dp-clipping-norm": clip, "fraction": 0.5}
    central, _ = observed_run(tmp_path, "central", dp="central", **dp)
    local, _ = observed_run(tmp_path, "local", dp="local", **dp)
    installed = {"dp-accounting": metadata.version("dp-accounting"), "flwr": versions.flower()}
    expected = dp_accounting_epsilon(2, z, 4, 2, 1e-5, secret=False)
    for summary, adversary in (
        (central, "anyone who sees the released model/sum, trusting the server to add the noise"),
        (local, "the server and anyone after it"),
    ):
        privacy = summary["privacy"]
        assert privacy["neighbouring-relation"] == "add-or-remove-one" and privacy["sensitivity"] == "S"
        assert privacy["adversary"] == adversary
        assert (privacy["clients"], privacy["clients-per-round"]) == (4, 2)  # n, not m, also under local DP
        assert (privacy["noise-multiplier"], privacy["clipping-norm"], privacy["delta"]) == (z, clip, 1e-5)
        assert privacy["epsilon"] == pytest.approx(expected, abs=1e-6) and privacy["releases"] == 2
        assert privacy["sampling"] == {"dp-sampling": "public", "amplification": "none"}
        assert {k: privacy["accountant"][k] for k in installed} == installed
        assert privacy["accountant"]["accounted-noise-multiplier"] == z


# --- a secret sample is written nowhere -------------------------------------------------------
def test_a_secret_sample_leaves_counts_only_in_the_run_folder_mlflow_and_metrics(tmp_path: Path) -> None:
    """A real run with a secret sample (2 of 5 clients, secure aggregation, traffic audit, MLflow): the
    test knows from the wire whom each round sampled; rounds.csv, traffic.jsonl, the checkpoint,
    summary.json, MLflow's store, the dashboard and /metrics name none of them in a round's train
    exchange, and give counts. The draw is not the seeded one."""
    mlruns = tmp_path / "mlruns"
    cfg = {
        "num-rounds": 3,
        "fraction": 0.4,
        "dp": "central",
        "dp-sampling": "secret",
        "dp-noise-multiplier": 2.0,
        "dp-clipping-norm": 0.05,
        "secure-aggregation": True,
        "audit-traffic": True,
        "mlflow-tracking-uri": str(mlruns),
    }
    names: dict[int, str] = {}  # node id -> client name, from the discovery replies
    sampled: dict[int, set[str]] = {}  # round -> the clients its train exchange went to

    def watch(instruction: Message, reply: Message) -> None:
        node = instruction.metadata.dst_node_id
        if instruction.metadata.message_type == "query.info":
            names[node] = str(reply.content.config_records["info"]["name"])
        if instruction.metadata.message_type == "train":
            rnd = int(instruction.content.config_records["config"]["server-round"])
            sampled.setdefault(rnd, set()).add(names[node])

    run_config = {**FEDAVG, "results-dir": str(tmp_path / "results"), "run-name": "s", **cfg}
    nodes = node_configs(5)
    summary = run_inline(run_config, nodes, observers=[watch])
    assert summary["status"] == "completed" and sorted(sampled) == [1, 2, 3]
    assert all(len(ids) == 2 for ids in sampled.values())
    run_dir = tmp_path / "results" / "s"
    public = run_inline(
        {**run_config, "dp-sampling": "public", "run-name": "p", "mlflow-tracking-uri": ""}, nodes
    )
    with open(tmp_path / "results" / "p" / "rounds.csv", newline="") as f:
        seeded = {(int(r["round"]), r["client"]) for r in csv.DictReader(f) if r["exchange"] == "train"}
    assert public["status"] == "completed" and len(seeded) == 6
    # the secret draw came from OS entropy, not from the seed (equal by chance with probability 1/1000)
    assert {(t, c) for t, clients in sampled.items() for c in clients} != seeded

    # rounds.csv: a client's rows are of the final evaluation only; the server's rows give counts.
    with open(run_dir / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["exchange"] for r in rows if r["client"] != "server"} == {"evaluate"}
    server = [r for r in rows if r["client"] == "server" and r["round"] != "0"]
    assert [(r["clients-sampled"], r["clients-failed"], r["clients-used"]) for r in server] == [
        ("2", "0", "2")
    ] * 3
    # traffic.jsonl: the train and secure-aggregation replies say their shapes, not who sent them.
    traffic = [json.loads(line) for line in (run_dir / "traffic.jsonl").read_text().splitlines()]
    summed = [t for t in traffic if t["exchange"] != "evaluate" and t["exchange"] != "query.info"]
    assert summed and {t["exchange"] for t in summed} >= {"train", "query.secagg_keys"}
    assert all("partition-id" not in t for t in summed)
    assert len([t for t in summed if t["exchange"] == "train"]) == 6
    # the checkpoint: the sampling stream is the seed's, untouched (it tells no draw); no sampled set.
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    fresh = np.random.default_rng(np.random.SeedSequence([42, 7]))  # FedAvg's stream of the default seed
    assert checkpoint["strategy"]["rng"] == fresh.bit_generator.state
    assert checkpoint["pool"]["holds-state"] in ([], [0, 1, 2, 3, 4])  # none, or all (the evaluation)
    # summary.json: counts, no per-round list of clients.
    text = (run_dir / "summary.json").read_text()
    assert "failed-rounds" not in text and summary["privacy"]["sampling"]["dp-sampling"] == "secret"
    assert summary["privacy"]["neighbouring-relation"] == "replace-one"
    expected = dp_accounting_epsilon(3, 2.0, 5, 2, 1e-5, secret=True)
    assert summary["privacy"]["epsilon"] == pytest.approx(expected, abs=1e-6)
    assert summary["privacy"]["sampling"]["epsilon-without-amplification"] == pytest.approx(
        dp_accounting_epsilon(3, 1.0, 5, 5, 1e-5, secret=False), abs=1e-6
    )
    # MLflow: metrics of a client are its evaluation's only; the artifacts are the files checked above.
    keys = {p.relative_to(m).as_posix() for m in mlruns.rglob("metrics") for p in m.rglob("*") if p.is_file()}
    client_keys = {k for k in keys if k.startswith("client-")}
    assert client_keys and all(k.split("/")[1] == "evaluate" for k in client_keys)
    assert {"clients-sampled", "clients-failed"} <= keys
    for artifact in mlruns.rglob("rounds.csv"):
        assert artifact.read_text() == (run_dir / "rounds.csv").read_text()
    # the dashboard and /metrics: only evaluate rows per client.
    dashboard = Dashboard(tmp_path / "results")
    metrics = dashboard.metrics().decode()
    client_lines = [
        ln for ln in metrics.splitlines() if ln.startswith("hetfed_client_replies{") and 'run="s"' in ln
    ]
    assert client_lines and all('exchange="evaluate"' in ln for ln in client_lines)
    # no line of any text file of the run folder or MLflow names a sampled client beside "train"
    for path in [*run_dir.rglob("*"), *mlruns.rglob("*")]:
        if path.is_file() and path.suffix in (".csv", ".json", ".jsonl", ".md", ""):
            for line in path.read_text(errors="replace").splitlines():
                if "train" in line and "evaluate" not in line:
                    assert not any(c in line for clients in sampled.values() for c in clients), (path, line)
