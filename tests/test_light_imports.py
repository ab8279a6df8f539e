"""A ClientApp imports only what its run needs: the LSA clients (NumPy) never import torch.

Each check runs in a fresh Python process (this one has torch loaded already) that imports
``hetfed.client.app`` as ``flwr-clientapp`` does and sends it real messages.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetfed.client.app import CLIENTS, MESSAGE_TYPES, client_class
from hetfed.config import validate
from hetfed.methods import SECAGG_EXCHANGES
from hetfed.strategies.registry import METHODS, build_strategy, strategy_class

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "scipy", "matplotlib", "sklearn", "gymnasium")

# Sends query.info (which builds the client's data), two train rounds and the final evaluate to one
# node, then the evaluate again to a restarted node (empty context.state, same state-dir); prints
# what got imported. Arguments: strategy, problem, state dir, settings (JSON), more run config (JSON).
SEND = """
import json, sys
import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from hetfed.client.app import app
from hetfed.config import validate
from hetfed.records import to_record

strategy, problem, state_dir, settings, extra = sys.argv[1:4] + [json.loads(a) for a in sys.argv[4:6]]
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
run_config = {"strategy": strategy, "problem": problem, "seed": 5, "num-rounds": 2, **extra}
nodes = {"partition-id": 1, "num-partitions": 3, "state-dir": state_dir}

def context():
    return Context(run_id=1, node_id=7, node_config=nodes, state=RecordDict(), run_config=run_config)

def send(ctx, kind, server_round=0):
    config = {**settings, "run-name": "r", "server-round": server_round, "report": True, "eta": 0.5,
              "beta": 0.5, "local-steps": 2}
    content = RecordDict({"config": ConfigRecord(config)})
    if server_round:
        zeros = np.zeros(validate(run_config)["garnet-dim"])
        content["arrays"] = to_record({"g-bar": zeros, "theta": zeros})
    reply = app(Message(content, dst_node_id=7, message_type=kind), ctx)
    assert not reply.has_error(), reply.error
    return dict(reply.content["metrics"])

ctx = context()
metrics = [send(ctx, "query.info")]
if sys.argv[6:] == ["rounds"]:
    metrics += [send(ctx, "train", 1), send(ctx, "train", 2), send(ctx, "evaluate", 2)]
    metrics.append(send(context(), "evaluate", 2))  # restored from state-dir
torch = sys.modules.get("torch")
print(json.dumps({
    "metrics": metrics,
    "loaded": [m for m in HEAVY if m in sys.modules],
    "threads": torch.get_num_threads() if torch else None,
}))
"""


def fresh_python(script: str, *args: str) -> dict:
    """Run ``script`` in a new interpreter in the repository; its last line of output, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def client_settings(strategy: str, problem: str, **extra: object) -> str:
    """What the strategy's messages carry for its client (JSON), from the strategy it builds."""
    cfg = validate({"strategy": strategy, "problem": problem, "seed": 5, "num-rounds": 2, **extra})
    return json.dumps(build_strategy(cfg).client_settings())


def test_the_client_table_covers_every_strategy_and_message_type() -> None:
    # Every strategy names a client class the ClientApp has, and every client class serves one.
    assert {strategy_class(name).client_handler for name in METHODS} == set(CLIENTS)
    for name, handler in CLIENTS.items():  # each message type the table lists has its handler method
        cls = client_class(name)
        assert all(callable(getattr(cls, kind.replace(".", "_"), None)) for kind in handler.handles), name
    handled = {kind for handler in CLIENTS.values() for kind in handler.handles}
    # Secure aggregation's exchanges are served for every client class (client/secure_aggregation.py).
    assert sorted(MESSAGE_TYPES) == sorted(handled | set(SECAGG_EXCHANGES))
    assert not handled & set(SECAGG_EXCHANGES)


def test_loading_the_client_app_imports_no_torch() -> None:
    loaded = (
        "import json, sys\nimport hetfed.client.app\n"
        "print(json.dumps([m for m in HEAVY if m in sys.modules]))"
    )
    assert fresh_python(loaded) == []


LSA = sorted(name for name in METHODS if strategy_class(name).family == "lsa")


@pytest.mark.parametrize("strategy", LSA)
def test_an_lsa_client_runs_its_rounds_without_torch(tmp_path: Path, strategy: str) -> None:
    settings = client_settings(strategy, "garnet")
    out = fresh_python(SEND, strategy, "garnet", str(tmp_path), settings, "{}", "rounds")
    assert out["loaded"] == [], out["loaded"]
    assert out["metrics"][0]["num-examples"] == 1
    restored, final = out["metrics"][-1], out["metrics"][-2]
    assert final["sq-error"] > 0 and restored == final  # the restarted node read the .npz/.json state
    saved = {p.suffix for p in (tmp_path / "r-p1").glob("*")}  # FedLSA clients keep no state
    assert saved <= {".json", ".npz"} and (strategy == "fedlsa" or ".json" in saved), saved


@pytest.mark.parametrize(
    ("strategy", "problem"), [("fedavg", "knapsack"), ("softmax-switching", "quadratic")]
)
def test_decision_and_constrained_clients_still_import_torch_on_one_thread(
    tmp_path: Path, strategy: str, problem: str
) -> None:
    out = fresh_python(SEND, strategy, problem, str(tmp_path), client_settings(strategy, problem), "{}")
    assert "torch" in out["loaded"]
    assert out["threads"] == 1


@pytest.mark.parametrize(("eta_o", "scipy"), [(0.0, False), (0.5, True)])
def test_a_knapsack_client_maps_scipy_only_for_objective_heterogeneity(
    tmp_path: Path, eta_o: float, scipy: bool
) -> None:
    # Its polytope has exact torch oracles (no HiGHS, no SciPy); only the rotations expm(eta_o G_j)
    # of a heterogeneous objective need SciPy's linear algebra, ~17 MB of a worker's RSS.
    extra = {"eta-o": eta_o}
    settings = client_settings("fedavg", "knapsack", **extra)
    out = fresh_python(SEND, "fedavg", "knapsack", str(tmp_path), settings, json.dumps(extra))
    assert out["metrics"][0]["num-examples"] > 0  # query.info built the client's data
    assert ("scipy" in out["loaded"]) is scipy, out["loaded"]


INLINE = """
import json, sys, tempfile, types
from hetfed.engines.inline import node_configs, run_inline

def holds(module, package="torch"):
    for value in list(vars(module).values()):
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str) and name.split(".")[0] == package:
            return True
    return False

with tempfile.TemporaryDirectory() as tmp:
    cfg = {"strategy": "pflsa", "problem": "garnet", "num-rounds": 3, "results-dir": tmp, "run-name": "r"}
    summary = run_inline(cfg, node_configs(3))
packages = ("client", "problems", "strategies", "server", "hetfed")
ours = {n: m for n, m in list(sys.modules.items()) if n.split(".")[0] in packages}
print(json.dumps({
    "iteration": summary["aggregate"]["iteration"],
    "holders": sorted(n for n, m in ours.items() if m is not None and holds(m)),
    "matplotlib-holders": sorted(n for n, m in ours.items() if m is not None and holds(m, "matplotlib")),
    "modules": sorted(ours),
    "loaded": [m for m in HEAVY if m in sys.modules],
}))
"""


def test_an_inline_pflsa_run_loads_torch_only_for_the_server_store() -> None:
    """The client side and the strategies of a PF-LSA run hold no torch; server/store.py still imports
    it at module level (its checkpoints go through torch.save), so torch is loaded but only there.
    matplotlib is loaded when the run ends, inside server/plots.py ``draw`` (rounds.png), held by no
    module."""
    out = fresh_python(INLINE)
    assert out["iteration"] == 3
    assert {"hetfed.client.lsa", "hetfed.problems.garnet", "hetfed.strategies.pflsa"} <= set(out["modules"])
    assert set(out["holders"]) <= {"hetfed.server.store"}, out["holders"]
    light = (
        "hetfed.problems.models",
        "hetfed.client.decision_client",
        "hetfed.client.constrained",
        "hetfed.problems.constrained",
    )
    assert not set(light) & set(out["modules"])
    assert not {"scipy", "sklearn", "gymnasium"} & set(out["loaded"])
    assert "matplotlib" in out["loaded"] and out["matplotlib-holders"] == []
