"""A stock Flower 1.42 FedAvg ServerApp and a light ClientApp (no hetfed code in either).

The ServerApp runs ``flwr.serverapp.strategy.FedAvg`` unchanged: every silo trains every round,
no federated evaluation; after every round it writes ``{"round": r}`` to the run config's
``progress`` file (the benchmark's round clock) and at the end the model to ``out`` (``.npz``).
The ClientApp's "training" is the received model plus seeded noise (partition and round), with
``num-examples = 40 + partition`` so FedAvg's weights differ: a reply of a real model's size
whose aggregate the benchmark's test can recompute.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

server = ServerApp()
client = ClientApp()


def mlp_arrays(sizes: list[int], seed: int = 0) -> list[np.ndarray]:
    """Weights and biases of an MLP with these layer sizes (float64), as hetfed's knapsack MLP has."""
    rng = np.random.default_rng(seed)
    out = []
    for fan_in, fan_out in zip(sizes, sizes[1:], strict=False):
        out += [
            rng.normal(0, fan_in**-0.5, (fan_out, fan_in)).astype(np.float64),
            np.zeros(fan_out, np.float64),
        ]
    return out


def write_progress(path: str, server_round: int) -> None:
    """``{"round": r}`` to ``path``, atomically (the benchmark polls it)."""
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps({"round": server_round}))
    os.replace(tmp, path)


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    silos = int(cfg["silos"])
    strategy = FedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=silos, min_available_nodes=silos
    )
    initial = ArrayRecord(mlp_arrays([int(s) for s in str(cfg["layer-sizes"]).split(",")]))

    def after_round(server_round: int, arrays: ArrayRecord) -> None:
        write_progress(str(cfg["progress"]), server_round)

    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(cfg["num-rounds"]), evaluate_fn=after_round
    )
    np.savez(str(cfg["out"]), *result.arrays.to_numpy_ndarrays())


@client.train()
def train(msg: Message, context: Context) -> Message:
    partition = int(str(context.node_config["partition-id"]))
    server_round = int(str(msg.content.config_records["config"]["server-round"]))
    rng = np.random.default_rng([partition, server_round])
    arrays = [
        a + rng.normal(0, 0.01, a.shape).astype(a.dtype)
        for a in msg.content.array_records["arrays"].to_numpy_ndarrays()
    ]
    metrics = MetricRecord({"num-examples": 40 + partition, "train_loss": float(rng.random())})
    return Message(RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics}), reply_to=msg)
