"""Interp-DFFL (``interp-dffl``, docs/algorithms.md 1.1): at the final evaluation a decision client also
scores a blend of a local model and the federated one. Called from the decision client's evaluation
(client/decision_client.py ``DecisionClient.evaluate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from hetfed.client.adam import Adam
from hetfed.client.batch_losses import make_loss
from hetfed.client.decision import BATCHES, NOISE, decision_metrics, train_epochs
from hetfed.client.losses import spo_plus_loss
from hetfed.problems.base import DecisionSplit

if TYPE_CHECKING:
    from hetfed.client.decision_client import DecisionClient


def interp_dffl(client: DecisionClient, fed: torch.nn.Module) -> dict[str, float]:
    """Interp-DFFL: ``c_hat = (1 - a) c_hat_local + a c_hat_fed`` with ``a`` in {0, 0.05, ..., 1}
    chosen on a calibration split (the last ``interp-split`` of the training data) by the
    lowest SPO+ loss; the local SPO+ model trains on the rest for ``interp-local-epochs`` epochs
    (to convergence: ~60 Adam steps, the warm start's budget, leave it far behind the federated
    model, and the blend would always pick the federated one)."""
    params, poly, train = client.params, client.data.polytope, client.data.train
    n_cal = max(1, round(params.interp_split * len(train)))
    fit_part = DecisionSplit(train.x[:-n_cal], train.c[:-n_cal])
    cal = DecisionSplit(train.x[-n_cal:], train.c[-n_cal:])
    local = client.new_model()
    loss = make_loss("spo+", fit_part, poly, params, 1.0, client.gen(NOISE, 2000))
    train_epochs(
        local,
        [(fit_part, loss)],
        Adam(local.parameters(), lr=params.lr),  # the run's lr, not a calibrated one
        epochs=params.interp_local_epochs,
        batch_size=params.batch_size,
        generator=client.gen(BATCHES, 2000),
        clip_norm=params.clip_norm,
    )
    with torch.no_grad():
        blends = torch.linspace(0, 1, 21, dtype=torch.float64)
        scores = [float(spo_plus_loss((1 - a) * local(cal.x) + a * fed(cal.x), cal.c, poly)) for a in blends]
        a = float(blends[int(np.argmin(scores))])

    class Blend(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (1 - a) * local(x) + a * fed(x)

    return {**decision_metrics(Blend(), client.data.test, poly), "blend": a}
