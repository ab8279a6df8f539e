"""The centralized yardstick (the paper's Table 14): one model on the clients' pooled data, in one
process, which a federation never does; each sample is judged by its own client's loss and
polytope."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pooled(run_config: Mapping[str, Any], clients: int) -> dict[str, float]:
    """Test decision metrics (mean over clients) of ONE model trained on the pooled training data of
    the ``clients`` clients of ``run_config`` (any decision problem; each sample judged by its own
    client's loss and polytope, with the client's own lam: hetfed.client.decision_client.step_sizes),
    with the federated run's whole budget of epochs and, for a loss with a calibrated step, the
    mean of the clients' lr0_j (a shared calibration's lr)."""
    import torch

    from hetfed.client.batch_losses import make_loss
    from hetfed.client.decision import batch_generator, decision_metrics, train_epochs
    from hetfed.client.decision_client import step_sizes
    from hetfed.config import validate
    from hetfed.methods.decision import LOSSES, DecisionParams
    from hetfed.problems.models import make_mlp
    from hetfed.problems.registry import get_problem

    torch.set_num_threads(1)  # tiny matrices: more threads only spin (and fight the worker processes)
    cfg: dict[str, Any] = validate(dict(run_config))  # SCHEMA-typed values
    params = DecisionParams.from_config(cfg)
    seed, loss = cfg["seed"], cfg["loss"]
    spec = get_problem(cfg["problem"])
    assert spec.model_dims is not None  # a decision problem
    data = [spec.load_client(cfg, j, clients, None) for j in range(clients)]
    cal = [step_sizes(d, params, loss) for d in data]  # (lam0_j, lr0_j) as each client trains
    lr = sum(lr_j for _, lr_j in cal) / clients if LOSSES[loss].calibrated_lr else params.lr
    in_dim, out_dim = spec.model_dims(cfg)
    model = make_mlp(in_dim, cfg["hidden"], out_dim, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = batch_generator(seed, 99)
    splits = [
        (d.train, make_loss(loss, d.train, d.polytope, params, lam, gen))
        for d, (lam, _) in zip(data, cal, strict=True)
    ]
    epochs = cfg["num-rounds"] * cfg["local-epochs"] + cfg["personal-rounds"] * cfg["personal-epochs"]
    train_epochs(
        model,
        splits,
        opt,
        epochs=epochs,
        batch_size=params.batch_size,
        generator=gen,
        clip_norm=params.clip_norm,
    )
    metrics = [decision_metrics(model, d.test, d.polytope) for d in data]
    return {k: sum(m[k] for m in metrics) / clients for k in ("relative-regret", "absolute-regret")}


def centralized(run_config: Mapping[str, Any], clients: int) -> float:
    """Macro relative regret (%) of the pooled model (:func:`pooled`)."""
    return 100 * pooled(run_config, clients)["relative-regret"]
