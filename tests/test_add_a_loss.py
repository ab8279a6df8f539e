"""docs/algorithms.md "How to add a loss", done once: a loss defined in this file only (its builder
and its registration) trains a real federation, and the run equals the plain loop with that loss."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.client.batch_losses import LossInputs, make_loss
from hetfed.client.decision import BatchLoss
from hetfed.engines.inline import node_configs, run_inline
from hetfed.methods.decision import LOSSES, DecisionParams, Loss, register_loss
from hetfed.problems.knapsack import KnapsackParams, load_client


def l1_batch(inputs: LossInputs) -> BatchLoss:
    """The new loss: mean absolute cost error, ``mean_i ||c_hat_i - c_i||_1 / d``."""
    return lambda c_hat, c, idx: (c_hat - c).abs().mean()


@pytest.fixture
def l1() -> Iterator[str]:
    """The loss registered for this test only (a module adding a loss registers it once)."""
    register_loss("l1-test", Loss("tests.test_add_a_loss:l1_batch"))
    yield "l1-test"
    del LOSSES["l1-test"]


def test_the_registered_loss_is_a_choice_and_builds_its_batch_loss(l1: str) -> None:
    assert DecisionParams.from_config({"loss": l1}).loss == l1  # the schema's choices follow the registry
    with pytest.raises(ValueError, match="registered already"):
        register_loss(l1, Loss())
    data = load_client(KnapsackParams(num_items=6, n_train=12, n_test=4), seed=1, partition_id=0)
    batch = make_loss(l1, data.train, data.polytope, DecisionParams(), 1.0, torch.Generator())
    c_hat = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    value = float(batch(c_hat, data.train.c, torch.arange(12)))
    assert value == pytest.approx(np.abs(c_hat.numpy() - data.train.c.numpy()).mean(), rel=1e-14)


def test_a_federation_trains_with_it_as_the_plain_loop_does(tmp_path: Path, l1: str) -> None:
    from bench.fedrspo_reference import fedrspo_plain

    cfg = {"loss": l1, "num-items": 10, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-rounds": 3}
    cfg |= {"personal-rounds": 2, "lr": 0.01}
    plain = fedrspo_plain(cfg, clients=4)
    flower = run_inline(
        {"strategy": "fedrspo", **cfg, "results-dir": str(tmp_path), "run-name": "r"}, node_configs(4)
    )
    assert flower["status"] == "completed"
    for name, metrics in plain.items():
        for key, value in metrics.items():
            assert flower["clients"][name][key] == pytest.approx(value, rel=1e-12, abs=1e-15), (name, key)
    mse = run_inline(
        {"strategy": "fedrspo", **cfg, "loss": "mse", "results-dir": str(tmp_path), "run-name": "m"},
        node_configs(4),
    )
    assert mse["clients"] != flower["clients"]  # the new loss really trained (not a fallback to mse)
