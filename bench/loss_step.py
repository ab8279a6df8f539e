"""Cost of one training epoch per decision-focused loss, as ratios to SPO+.

Same MLP (p=8 -> 64 -> d=50, Glorot-uniform weights, zero biases), same synthetic fractional
knapsack data (docs/algorithms.md 1.7 without heterogeneity), batch 64, Adam with per-parameter
gradient clipping at 1.0, one torch thread. Epochs of the different losses are interleaved so
that machine noise hits them alike; the median epoch CPU time (process time, far less noisy than
wall time on a shared machine) is reported. "cached" means the
true-cost solution (w*(c) for SPO+/PFYL/DPO, w_lam(c) for RSPO+) is computed once before
training and passed in, as the trainer does across epochs; "uncached" recomputes it per batch.

Run: ``python bench/loss_step.py`` (writes its section of docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import markdown_table, write_section  # noqa: E402
from hetfed.client.losses import dpo_loss, mse_loss, pfyl_loss, rspo_plus_loss, spo_plus_loss  # noqa: E402
from hetfed.problems.polytope import KnapsackPolytope  # noqa: E402

P, D, N, BATCH = 8, 50, 2048, 64
EPOCHS = 15  # timed epochs per loss (median reported)

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def knapsack_data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, KnapsackPolytope]:
    """x [N, p], c [N, d] and the knapsack {0 <= w <= 1, a'w <= 0.6 d}, degree-4 costs."""
    b = torch.bernoulli(torch.full((D, P), 0.5), generator=gen) * (0.5 + torch.rand(D, 1, generator=gen))
    x = torch.randn(N, P, generator=gen)
    signal = -(1 + (1 + x @ b.T / P**0.5) ** 4)
    c = (signal / signal.abs().mean()).double()
    weights = 0.5 + torch.rand(D, generator=gen, dtype=torch.float64)
    return x, c, KnapsackPolytope(weights, 0.6 * D)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    first, last = torch.nn.Linear(P, 64), torch.nn.Linear(64, D)
    model = torch.nn.Sequential(first, torch.nn.ReLU(), last)
    for layer in (first, last):
        torch.nn.init.xavier_uniform_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
    return model


def losses(poly: KnapsackPolytope, c: torch.Tensor, lam: float) -> dict[str, LossFn]:
    """Each loss as f(c_hat, c_batch, batch_index) -> scalar."""
    w_star, w_lam = poly.solve_lp(c), poly.regularized_argmin(c, lam)
    gen = torch.Generator().manual_seed(1)
    return {
        "MSE": lambda ch, cb, i: mse_loss(ch, cb),
        "SPO+ (cached)": lambda ch, cb, i: spo_plus_loss(ch, cb, poly, w_star=w_star[i]),
        "SPO+ (uncached)": lambda ch, cb, i: spo_plus_loss(ch, cb, poly),
        "RSPO+ (cached)": lambda ch, cb, i: rspo_plus_loss(ch, cb, poly, lam, w_lam_c=w_lam[i]),
        "RSPO+ (uncached)": lambda ch, cb, i: rspo_plus_loss(ch, cb, poly, lam),
        "PFYL (cached, 10 samples)": lambda ch, cb, i: pfyl_loss(
            ch, cb, poly, generator=gen, w_star=w_star[i]
        ),
        "DPO (cached, 10 samples)": lambda ch, cb, i: dpo_loss(ch, cb, poly, generator=gen, w_star=w_star[i]),
    }


def epoch(model: torch.nn.Module, opt: torch.optim.Optimizer, loss_fn: LossFn, x, c, order) -> float:
    """CPU seconds for one pass over the data in the given order."""
    start = time.process_time()
    for idx in order.split(BATCH):
        opt.zero_grad()
        loss_fn(model(x[idx]), c[idx], idx).backward()
        for p in model.parameters():
            torch.nn.utils.clip_grad_norm_(p, 1.0)
        opt.step()
    return time.process_time() - start


def main() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, c, poly = knapsack_data(gen)
    lam = float(c.norm(dim=1).mean()) / poly.radius()  # lam0 of docs/algorithms.md 1.3
    fns = losses(poly, c, lam)
    runs = {name: make_model(0) for name in fns}
    opts = {name: torch.optim.Adam(model.parameters(), lr=1e-3) for name, model in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(EPOCHS + 1):
        order = torch.randperm(N, generator=gen)
        for name, fn in fns.items():
            seconds = epoch(runs[name], opts[name], fn, x, c, order)
            if rep > 0:  # the first epoch warms up allocators and solver caches
                times[name].append(seconds)
    median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    rows = []
    for name, ms in median.items():
        base = "SPO+ (uncached)" if "uncached" in name else "SPO+ (cached)"
        rows.append([name, f"{ms:.1f}", f"{ms / median[base]:.2f}x"])
        print(rows[-1], flush=True)
    ratio = median["RSPO+ (cached)"] / median["SPO+ (cached)"]
    body = (
        f"One epoch = {N} samples in batches of {BATCH} ({N // BATCH} Adam steps) on knapsack d={D}, "
        f"MLP {P} -> 64 -> {D}, one torch thread, median CPU time of {EPOCHS} interleaved epochs; "
        f"lam = lam0 = mean||c|| / R = {lam:.3g}. Ratios are to SPO+ with the same caching (the uncached "
        "rows compare to uncached SPO+).\n\n"
        + markdown_table(["loss", "ms / epoch", "vs SPO+"], rows)
        + "\n\nTarget: an RSPO+ epoch <= 1.3x an SPO+ epoch on knapsack d=50 (the paper reports 1.4-2.0x "
        f"with Gurobi projections): **{'met' if ratio <= 1.3 else 'MISSED'}** with the trainer's caching "
        f"({ratio:.2f}x)."
    )
    write_section("loss_step", "Training epoch per loss (knapsack d=50)", body)


if __name__ == "__main__":
    main()
