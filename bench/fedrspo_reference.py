"""FedRSPO+ as a plain single-process loop (docs/algorithms.md 1.3-1.6), without Flower.

An independent transcription of the protocol for two uses: tests check that the Flower
strategy + ClientApp compute the same numbers, and bench/knapsack_run.py measures the
framework's overhead against it. It shares the numerical library (losses, projections, the
data generator) with hetfed, not the protocol code: sampling, FedAvg of deltas, schedules,
freezing and evaluation are written out here again.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch

from hetfed.client.batch_losses import make_loss
from hetfed.client.calibration import calibrate
from hetfed.client.decision import BATCHES, MONITOR, NOISE, batch_generator, decision_metrics, train_epochs
from hetfed.config import validate
from hetfed.methods.decision import CalibratedParams
from hetfed.problems.metrics import qp_lp_gap
from hetfed.problems.models import make_mlp
from hetfed.problems.registry import get_problem


def fedrspo_plain(overrides: dict[str, Any], clients: int) -> dict[str, dict[str, float]]:
    """Per-client test relative regret of the federated and personalized models."""
    cfg: dict[str, Any] = validate({"strategy": "fedrspo", **overrides})
    params = CalibratedParams.from_config(cfg)
    seed, loss = cfg["seed"], cfg["loss"]
    data = [get_problem(cfg["problem"]).load_client(cfg, j, clients, None) for j in range(clients)]
    cal = [calibrate(d, cfg["rspo-alpha"]) for d in data]
    calibrated = loss == "rspo+"
    model = make_mlp(data[0].num_features, cfg["hidden"], data[0].num_costs, seed=seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
    k = max(1, min(clients, math.ceil(round(cfg["fraction"] * clients, 9))))
    warm_loss = "mse" if loss == "mse->spo+" else loss
    for rnd in range(1, cfg["num-rounds"] + 1):
        sampled = sorted(int(p) for p in rng.choice(list(range(clients)), size=k, replace=False))
        start = {name: p.detach().numpy().copy() for name, p in model.state_dict().items()}
        trained = {}
        for j in sampled:
            local = copy.deepcopy(model)
            lr = cal[j]["lr0"] if calibrated else cfg["lr"]
            batch_loss = make_loss(
                warm_loss,
                data[j].train,
                data[j].polytope,
                params,
                cal[j]["lam0"],
                batch_generator(seed, NOISE, j, rnd),
            )
            train_epochs(
                local,
                [(data[j].train, batch_loss)],
                torch.optim.Adam(local.parameters(), lr=lr),  # type: ignore[arg-type]  # torch's: see train_epochs below
                epochs=cfg["local-epochs"],
                batch_size=cfg["batch-size"],
                generator=batch_generator(seed, BATCHES, j, rnd),
                clip_norm=cfg["clip-norm"],
            )
            trained[j] = {name: p.detach().numpy().copy() for name, p in local.state_dict().items()}
        n = {j: float(len(data[j].train)) for j in sampled}
        total = sum(n.values())
        new = {
            name: w + sum(n[j] * (trained[j][name] - w) for j in sampled) / total for name, w in start.items()
        }
        model.load_state_dict({name: torch.from_numpy(v) for name, v in new.items()})

    out = {}
    per_loss = "spo+" if loss == "mse->spo+" else loss
    for j in range(clients):
        fed = decision_metrics(model, data[j].test, data[j].polytope)["relative-regret"]
        out[data[j].name] = {"fed-relative-regret": fed}
        if cfg["personal-rounds"] == 0:
            continue
        personal = copy.deepcopy(model)
        lam0 = cal[j]["lam0"]
        lr0 = cal[j]["lr0"] * cfg["rspo-alpha-personal"] / cfg["rspo-alpha"] if calibrated else cfg["lr"]
        opt = torch.optim.Adam(personal.parameters(), lr=lr0)
        monitor = np.random.default_rng(np.random.SeedSequence([seed, MONITOR, j]))
        lam, lr, frozen = lam0, lr0, 0
        val = data[j].val
        for t in range(1, cfg["personal-rounds"] + 1):
            index = torch.from_numpy(
                np.sort(monitor.choice(len(val), size=min(cfg["monitor-size"], len(val)), replace=False))
            )
            if frozen and t > frozen + cfg["freeze-extra-rounds"]:
                break
            annealed = per_loss == "rspo+" and cfg["anneal"]
            if annealed and not frozen:
                lam = lam0 / (1 + cfg["kappa-lam"] * (t - 1))
                lr = lr0 / (1 + cfg["kappa-lr"] * (t - 1))
            for group in opt.param_groups:
                group["lr"] = lr
            batch_loss = make_loss(
                per_loss,
                data[j].train,
                data[j].polytope,
                params,
                lam,
                batch_generator(seed, NOISE, j, 1000 + t),
            )
            train_epochs(
                personal,
                [(data[j].train, batch_loss)],
                # torch's Adam, not hetfed's transcription of it (client/adam.py): the reference shares
                # no training code it checks; train_epochs only calls zero_grad and step
                opt,  # type: ignore[arg-type]
                epochs=cfg["personal-epochs"],
                batch_size=cfg["batch-size"],
                generator=batch_generator(seed, BATCHES, j, 1000 + t),
                clip_norm=cfg["clip-norm"],
            )
            if (
                annealed
                and not frozen
                and qp_lp_gap(val.c[index], data[j].polytope, lam) <= cfg["freeze-tau"]
            ):
                frozen = t
        out[data[j].name]["per-relative-regret"] = decision_metrics(personal, data[j].test, data[j].polytope)[
            "relative-regret"
        ]
    return out
