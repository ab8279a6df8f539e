"""A silo's own policy (client/silo_policy.py): one test per rule, each refusal one line naming the rule,
recorded on both sides (the server's rounds.csv, the silo's ledger), the run going on with the other
silos; a silo whose run keeps within its policy serves as before; a malformed policy file is one
line; and on real SuperNodes a silo with a policy refuses a strategy it does not allow."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from hetfed.client.ledger import read
from hetfed.client.silo_policy import RULES, PolicyError, load
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from hetfed.server.rounds import NoUsableClient
from tests.conftest import REPO, hetfed_cli

FAST = {"num-rounds": 2, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "seed": 3}


def policed_run(tmp_path: Path, policy: str, **overrides) -> tuple[dict, list[dict], list[dict]]:
    """Three silos, every one in every round; silo 1 has ``policy``, every silo a state dir (ledger).
    Returns the summary, the rounds.csv rows, and silo 1's ledger."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "policy.toml"
    path.write_text(policy)
    configs = [{**c, "state-dir": str(tmp_path / f"node-{c['partition-id']}")} for c in node_configs(3)]
    configs[1]["policy"] = str(path)
    cfg = {**FAST, "fraction": 1.0, "results-dir": str(tmp_path), "run-name": "r", **overrides}
    summary = run_inline(cfg, configs)
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return summary, rows, read(configs[1]["state-dir"])


def assert_refused(tmp_path: Path, policy: str, refusal: str, rounds: set[int], **overrides) -> None:
    """Silo 1 refuses its exchanges of ``rounds`` with the one line ``refusal`` (and serves the
    others); the server records each as a failed exchange, the silo's ledger has the same line, the
    other silos are untouched and the run completes."""
    line = f"refused by this silo's policy, {refusal} (policy file {tmp_path / 'policy.toml'})"
    summary, rows, ledger = policed_run(tmp_path, policy, **overrides)
    assert summary["status"] == "completed"
    exchanges = [r for r in rows if r["round"] != "0"]
    failed = [r for r in exchanges if r["status"] == "failed"]
    assert failed and {r["client"] for r in failed} == {"client-01"}
    assert {int(r["round"]) for r in failed} == rounds
    assert all(r["error"] == line for r in failed), failed[0]["error"]  # the refusal's own line, no wrapper
    assert all(r["status"] == "ok" for r in exchanges if r["client"] != "client-01")
    refused = [e for e in ledger if "error" in e]
    assert [e["error"] for e in refused] == [f"PolicyRefusal: {line}"] * len(failed)
    assert all(e["arrays"] == {} and e["metrics"] == [] for e in refused)  # nothing of them left
    assert sorted((e["round"], e["message-type"]) for e in refused) == sorted(
        (int(r["round"]), r["exchange"]) for r in failed
    )
    assert {"client-00", "client-02"} <= set(summary["clients"])


def test_a_strategy_the_silo_does_not_allow_is_refused(tmp_path: Path) -> None:
    refusal = "rule 'strategies': strategy 'fedavg' is not allowed (allowed: fedrspo, local-only)"
    assert_refused(tmp_path, 'strategies = ["fedrspo", "local-only"]\n', refusal, {1, 2})


def test_a_loss_the_silo_does_not_allow_is_refused(tmp_path: Path) -> None:
    refusal = "rule 'losses': loss 'mse' is not allowed (allowed: spo+, rspo+)"
    assert_refused(tmp_path, 'losses = ["spo+", "rspo+"]\n', refusal, {1, 2})


def test_an_empty_allow_list_allows_nothing_and_says_so(tmp_path: Path) -> None:
    refusal = "rule 'strategies': strategy 'fedavg' is not allowed (allowed: none)"
    assert_refused(tmp_path, "strategies = []\n", refusal, {1, 2})


def test_a_name_hetfed_does_not_have_in_an_allow_list_is_refused_at_load(tmp_path: Path) -> None:
    """A typo would make the silo refuse every run; it is one line when the policy is read (silo start)."""
    from hetfed.methods import METHODS
    from hetfed.methods.decision import LOSSES

    for key, value, known in (("strategies", "fedavgg", METHODS), ("losses", "rspo", LOSSES)):
        path = tmp_path / f"{key}.toml"
        path.write_text(f'{key} = ["{next(iter(known))}", "{value}"]\n')
        with pytest.raises(PolicyError) as err:
            load(str(path))
        assert str(err.value) == (
            f"policy file {path}: {key!r} names {value!r}, which hetfed does not have (known: "
            f"{', '.join(known)})"
        )
    every = tmp_path / "every.toml"
    every.write_text(f"strategies = {list(METHODS)}\nlosses = {list(LOSSES)}\n".replace("'", '"'))
    assert load(str(every)).strategies == tuple(METHODS)


def test_a_round_whose_every_reply_was_refused_is_not_ok(tmp_path: Path) -> None:
    """Every silo refuses fedavg's train messages: the server's row of each round says ``no-update``
    with why, not ``ok`` with clients-used 0."""
    (tmp_path / "policy.toml").write_text('strategies = ["fedrspo"]\n')
    configs = [{**c, "policy": str(tmp_path / "policy.toml")} for c in node_configs(3)]
    with pytest.raises(NoUsableClient):  # then the run fails: no client reported in the end
        run_inline({**FAST, "fraction": 1.0, "results-dir": str(tmp_path), "run-name": "r"}, configs)
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    server = [r for r in rows if r["client"] == "server"]
    assert [(r["round"], r["status"], r["clients-used"]) for r in server] == [
        ("1", "no-update", "0"),
        ("2", "no-update", "0"),
    ]
    assert all("no client's reply could be used" in r["error"] for r in server)
    assert {r["status"] for r in rows if r["client"] != "server" and r["round"] != "0"} == {"failed"}


def test_rounds_beyond_the_silos_maximum_are_refused(tmp_path: Path) -> None:
    assert_refused(tmp_path, "max-rounds = 1\n", "rule 'max-rounds': round 2 > 1", {2})


def test_more_local_epochs_than_the_silo_allows_are_refused(tmp_path: Path) -> None:
    refusal = "rule 'max-local-epochs': local-epochs 2 > 1"
    assert_refused(tmp_path, "max-local-epochs = 1\n", refusal, {1, 2}, **{"local-epochs": 2})


def test_a_reply_with_a_metric_that_may_not_leave_is_refused(tmp_path: Path) -> None:
    # Train replies carry val-relative-regret (round 1 and 2); the evaluate replies' fed-* may leave.
    policy = 'metrics = ["num-examples", "train-loss", "fed-*"]\n'
    refusal = "rule 'metrics': the reply carries metrics val-relative-regret, which may not leave"
    assert_refused(tmp_path, policy, refusal, {1, 2})


def test_an_update_outside_secure_aggregation_is_refused(tmp_path: Path) -> None:
    refusal = "rule 'require-secure-aggregation': the run did not declare secure aggregation for it"
    assert_refused(tmp_path, "require-secure-aggregation = true\n", refusal, {1, 2})


def test_an_update_without_differential_privacy_is_refused(tmp_path: Path) -> None:
    refusal = "rule 'require-dp': the run did not declare differential privacy for it (dp-clip)"
    assert_refused(tmp_path, "require-dp = true\n", refusal, {1, 2})


def test_a_dp_run_without_an_epsilon_budget_or_over_the_silos_bound_is_refused(tmp_path: Path) -> None:
    refusal = "rule 'max-epsilon': the run did not declare an epsilon budget (dp-epsilon)"
    assert_refused(tmp_path / "none", "max-epsilon = 50.0\n", refusal, {1, 2}, dp="central")
    refusal = "rule 'max-epsilon': the run's epsilon budget 1000 > 50"
    over = {"dp": "central", "dp-epsilon": 1000.0}
    assert_refused(tmp_path / "over", "max-epsilon = 50.0\n", refusal, {1, 2}, **over)


def test_the_example_policy_is_valid_and_documents_every_key() -> None:
    example = REPO / "deploy" / "policy.example.toml"
    policy = load(str(example))
    text = example.read_text()
    assert policy.strategies == ("fedavg", "fedrspo") and policy.max_epsilon is None
    assert all(f"\n{key} = " in text or f"\n# {key} = " in text for key in RULES)


def test_a_run_within_the_policy_is_served(tmp_path: Path) -> None:
    """Every rule but secure aggregation set and kept (DP with a budget under the bound, the run's
    strategy, loss, rounds, epochs and metrics): the silo serves every exchange."""
    policy = (
        'strategies = ["fedavg"]\nlosses = ["mse"]\nmax-rounds = 2\nmax-local-epochs = 1\n'
        'metrics = ["*"]\nrequire-dp = true\nmax-epsilon = 1000.0\n'
    )
    dp = {"dp": "central", "dp-epsilon": 1000.0, "dp-noise-multiplier": 5.0}
    summary, rows, ledger = policed_run(tmp_path / "policed", policy, **dp)
    assert summary["status"] == "completed" and all(r["status"] == "ok" for r in rows)
    assert ledger and not any("error" in e for e in ledger)
    assert set(summary["clients"]) == {"client-00", "client-01", "client-02"}
    # Secure aggregation required and declared: the masked updates leave, as do the protocol's own.
    secure = {"secure-aggregation": True}
    summary, rows, ledger = policed_run(tmp_path / "secure", "require-secure-aggregation = true\n", **secure)
    assert summary["status"] == "completed" and all(r["status"] == "ok" for r in rows)
    assert not any("error" in e for e in ledger)
    assert {"train", "query.secagg_keys", "query.secagg_unmask"} <= {e["message-type"] for e in ledger}


def test_a_malformed_policy_file_is_one_line_and_leaves_the_silo_out(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('strategies = ["fedavg"]\nmax-rounds = = 3\n')
    with pytest.raises(PolicyError) as err:
        load(str(bad))
    assert str(err.value) == f"policy file {bad} is not TOML: Invalid value (at line 2, column 14)"
    typo = tmp_path / "typo.toml"
    typo.write_text("max-round = 3\n")
    with pytest.raises(PolicyError, match=r"^policy file .*typo.toml: unknown key 'max-round' \(keys: "):
        load(str(typo))
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('max-rounds = "3"\n')
    with pytest.raises(PolicyError) as err:
        load(str(wrong))
    assert str(err.value) == f"policy file {wrong}: 'max-rounds' must be an integer >= 0, got '3'"
    with pytest.raises(PolicyError, match=r"^policy file /nonexistent.toml \(node config 'policy'\) cannot"):
        load("/nonexistent.toml")

    # A silo started with it stops at start, in one line (hetfed federation silo --policy).
    out = hetfed_cli("federation", "silo", "--superlink", "127.0.0.1:9092", "--insecure", "--partition-id",
                     "0", "--num-partitions", "1", "--state-dir", str(tmp_path / "s"), "--any-app",
                     "--policy", str(bad), "--print", timeout=60)  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"hetfed: error: policy file {bad} is not TOML: Invalid value (at line 2, column 14)"
    ]

    # On a run: the silo fails discovery with that line, is left out, and the others run.
    configs = node_configs(3)
    configs[1]["policy"] = str(bad)
    cfg = {**FAST, "num-clients": 2, "results-dir": str(tmp_path), "run-name": "r"}
    summary = run_inline(cfg, configs)
    assert summary["status"] == "completed" and "client-01" not in summary["clients"]
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:
        (row,) = [r for r in csv.DictReader(f) if r["status"] == "failed"]
    assert (row["round"], row["exchange"], row["partition-id"]) == ("0", "query.info", "1")
    assert row["error"] == f"policy file {bad} is not TOML: Invalid value (at line 2, column 14)"


@pytest.fixture(scope="module")
def policed_deployment(tmp_path_factory: pytest.TempPathFactory):
    """A real SuperLink and 3 SuperNodes; SuperNode 1 allows only FedRSPO+."""
    from hetfed.engines.flower import LocalFlower
    from hetfed.federation import node_config

    root = tmp_path_factory.mktemp("policed")
    (root / "policy.toml").write_text('strategies = ["fedrspo"]\n')
    flower = LocalFlower(root)
    try:
        flower.start_superlink(cwd=REPO)
        for i in range(3):
            extra = {"policy": str(root / "policy.toml")} if i == 1 else {}
            flower.start_supernode(i, {**node_config(i, 3, root, None, None), **extra})
        flower.wait_for_nodes(3)
        yield flower
    finally:
        flower.stop()


@pytest.mark.deployment
def test_a_real_supernode_refuses_a_strategy_its_policy_does_not_allow(
    policed_deployment, tmp_path: Path
) -> None:
    deployment = policed_deployment
    cfg = prepare({**FAST, "fraction": 1.0, "run-name": "policed"}, "deployment", tmp_path)
    run_id = deployment.submit(REPO, cfg)
    assert deployment.wait_run(run_id, timeout=900) == "finished:completed", deployment.run_log(run_id)[
        -3000:
    ]
    policy = deployment.root / "policy.toml"
    line = (
        "refused by this silo's policy, rule 'strategies': strategy 'fedavg' is not allowed "
        f"(allowed: fedrspo) (policy file {policy})"
    )
    with open(tmp_path / "policed" / "rounds.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["round"] != "0"]
    failed = [r for r in rows if r["status"] == "failed"]
    assert {r["partition-id"] for r in failed} == {"1"} and {r["round"] for r in failed} == {"1", "2"}
    assert all(r["error"] == line for r in failed), failed[0]["error"]
    assert all(r["status"] == "ok" for r in rows if r["partition-id"] != "1")
    ledger = [e for e in read(deployment.root / "state" / "node-1") if e["run-name"] == "policed"]
    assert [e["error"] for e in ledger if "error" in e] == [f"PolicyRefusal: {line}"] * len(failed)
    silo_log = (deployment.root / "supernode-1.log").read_text()
    assert silo_log.count(line) == len(failed)  # the silo's own log: the line once per refusal,
    assert "Traceback" not in silo_log  # and no traceback (a refusal is not a fault of its ClientApp)
