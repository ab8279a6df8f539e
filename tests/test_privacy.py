"""Differential privacy: the clip and noise on the clients, the server's noise and adaptive clip,
the Rényi-DP accountant against published formulas computed independently, the budget refusal."""

from __future__ import annotations

import csv
import functools
import json
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch

from hetfed.client.secure_aggregation import privatized
from hetfed.config import ConfigError, validate
from hetfed.engines.inline import node_configs, run_inline
from hetfed.server.privacy import DPSettings, Privacy, accountant, epsilon_after
from tests.conftest import hetfed_cli, kill_at_a_checkpoint, start_inline_run

FEDAVG = {"num-rounds": 3, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0}


# --- the accountant against the published formulas ------------------------------------------
def library_orders() -> list[float]:
    return [float(a) for a in accountant(10, 1e-5).state_dict()["orders"]]  # type: ignore[union-attr]


def epsilon_from_rdp(rdp: list[float], orders: list[float], delta: float) -> float:
    """Balle et al. 2020, Prop. 12: eps = min_a rdp(a) + log((a-1)/a) - (log delta + log a)/(a-1)
    (0 where delta^2 + exp(-rdp) > 1: the KL bound already gives delta)."""
    best = math.inf
    for a, r in zip(orders, rdp, strict=True):
        if delta**2 + math.expm1(-r) > 0:
            eps = 0.0
        elif a > 1.01:
            eps = r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
        else:
            eps = math.inf
        best = min(best, eps)
    return max(0.0, best)


def gaussian_rdp(alpha: float, sigma: float) -> float:
    """The Gaussian mechanism of sensitivity 1: alpha / (2 sigma^2) (Mironov 2017)."""
    return alpha / (2 * sigma**2)


def wor_subsampled_gaussian_rdp(alpha: float, sigma: float, q: float) -> float:
    """Wang, Balle, Kasiviswanathan 2019, Theorem 27 (with its forward-difference term), for the
    Gaussian mechanism sampled without replacement at rate q, in 400-digit arithmetic:

        A_a = 1 + q^2 C(a,2) min(4 (e^{eps(2)} - 1), 2 e^{eps(2)})
                + sum_{j>=3} q^j C(a,j) min(4 sqrt(|D^{2 floor(j/2)}| |D^{2 ceil(j/2)}|), 2 e^{(j-1) eps(j)})

    with eps(j) = j / (2 sigma^2) and D^l the l-th forward difference at 0 of j -> e^{(j-1) eps(j)};
    above order 256 the second term of each min (the library's choice, which is still a bound);
    non-integer orders interpolate log A_a linearly between the neighbouring integers (Cor. 10)."""
    if alpha != int(alpha):
        lo, hi = math.floor(alpha), math.ceil(alpha)
        t = alpha - lo
        return ((1 - t) * _log_a(lo, sigma, q) + t * _log_a(hi, sigma, q)) / (alpha - 1)
    return _log_a(int(alpha), sigma, q) / (alpha - 1)


@functools.cache
def _log_a(alpha: int, sigma: float, q: float) -> float:
    with mpmath.workdps(400):
        h, d = _differences(sigma, max(alpha + 1, 65))
        e2 = mpmath.exp(1 / mpmath.mpf(sigma) ** 2)
        total = 1 + q**2 * mpmath.binomial(alpha, 2) * min(4 * (e2 - 1), 2 * e2)
        for j in range(3, alpha + 1):
            cap = 2 * h[j]  # 2 e^{(j-1) eps(j)}
            if alpha <= 256:
                cap = min(4 * mpmath.sqrt(abs(d[2 * (j // 2)]) * abs(d[2 * ((j + 1) // 2)])), cap)
            total += mpmath.mpf(q) ** j * mpmath.binomial(alpha, j) * cap
        return float(mpmath.log(total))


@functools.cache
def _differences(sigma: float, top: int) -> tuple[list[mpmath.mpf], list[mpmath.mpf]]:
    """h(j) = e^{(j-1) j / (2 sigma^2)} for j = 0..top, and its forward differences D^l at 0."""
    with mpmath.workdps(400):
        s2 = mpmath.mpf(sigma) ** 2
        h = [mpmath.exp(mpmath.mpf((j - 1) * j) / (2 * s2)) for j in range(top + 1)]
        d = [
            mpmath.fsum((-1) ** (order - k) * mpmath.binomial(order, k) * h[k] for k in range(order + 1))
            for order in range(top + 1)
        ]
        return h, d


@pytest.mark.parametrize("z", [0.8, 1.5, 4.0])
@pytest.mark.parametrize("rounds", [1, 10, 200])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_epsilon_with_every_client_equals_the_gaussian_closed_form(
    z: float, rounds: int, delta: float
) -> None:
    orders = library_orders()
    expected = epsilon_from_rdp([rounds * gaussian_rdp(a, z) for a in orders], orders, delta)
    assert epsilon_after(rounds, z, 10, 10, delta) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("z", [1.0, 2.0, 6.0])
@pytest.mark.parametrize("rounds", [1, 30])
@pytest.mark.parametrize(("m", "n"), [(2, 10), (10, 100)])
def test_epsilon_of_sampled_rounds_equals_theorem_27(z: float, rounds: int, m: int, n: int) -> None:
    """A secret sample of m of n clients without replacement: replace-one neighbours, sensitivity 2 S,
    sigma = z / 2."""
    orders = [a for a in library_orders() if a <= 64]  # the higher orders never win at these settings
    rdp = [rounds * wor_subsampled_gaussian_rdp(a, z / 2, m / n) for a in orders]
    expected = epsilon_from_rdp(rdp, orders, 1e-5)
    assert epsilon_after(rounds, z, n, m, 1e-5, secret_sample=True) == pytest.approx(expected, abs=1e-6)


# --- the clip, the noise, the adaptive clip --------------------------------------------------
def test_privatized_clips_the_joint_norm_and_adds_noise_of_z_times_the_clip() -> None:
    rng = np.random.default_rng(1)
    x = {"a": np.full(3, 2.0), "b": np.full(1, 2.0)}  # ||x|| = 4
    clipped, within = privatized(x, 1.0, 0.0, rng)
    assert not within
    assert math.sqrt(sum(float((v**2).sum()) for v in clipped.values())) == pytest.approx(1.0)
    np.testing.assert_allclose(clipped["a"], 0.5)
    same, within = privatized(x, 10.0, 0.0, rng)
    assert within and np.array_equal(same["a"], x["a"])
    noisy, _ = privatized({"a": np.zeros(200_000)}, 0.5, 2.0, rng)
    assert float(np.std(noisy["a"])) == pytest.approx(1.0, rel=0.01)  # z S = 2 x 0.5


def settings(**overrides: object) -> DPSettings:
    return DPSettings.from_config(validate({"dp": "central", **overrides}))


def test_central_noise_and_the_adaptive_clip_follow_andrew_et_al() -> None:
    privacy = Privacy(settings(**{"dp-noise-multiplier": 1.0, "dp-clipping-norm": 2.0}), 10, 10)
    noise = np.stack([privacy.noised(np.zeros(1000), 10, 10)[0] for _ in range(50)])
    assert float(noise.std()) == pytest.approx(2.0, rel=0.02)  # z S
    adaptive = settings(
        **{
            "dp-clipping": "adaptive",
            "dp-clipping-norm": 1.0,
            "dp-clipped-count-stddev": 0.1,
            "dp-noise-multiplier": 1.0,
            "dp-target-quantile": 0.5,
            "dp-clip-learning-rate": 0.2,
        }
    )
    privacy = Privacy(adaptive, 10, 10)
    with pytest.raises(ConfigError, match="dp-clipped-count-stddev"):
        privacy.noised(np.zeros(3), 8, 10)  # 2 sigma_b must exceed z
    adaptive = settings(
        **{
            "dp-clipping": "adaptive",
            "dp-clipping-norm": 1.0,
            "dp-clipped-count-stddev": 5.0,
            "dp-noise-multiplier": 1.0,
            "dp-target-quantile": 0.5,
            "dp-clip-learning-rate": 0.2,
        }
    )
    privacy = Privacy(adaptive, 10, 10)
    z_u = privacy.update_noise_multiplier()
    assert z_u == pytest.approx((1.0**-2 - (2 * 5.0) ** -2) ** -0.5)
    draws = []
    for _ in range(400):
        privacy.clip = 1.0
        privacy.noised(np.zeros(1), 8, 10)  # 8 of 10 within: b = 0.8 + N(0, 0.5^2)
        draws.append(math.log(privacy.clip))
    # log S' = -eta_C (b - gamma): mean -0.2 x 0.3, std 0.2 x 5 / 10
    assert float(np.mean(draws)) == pytest.approx(-0.06, abs=0.015)
    assert float(np.std(draws)) == pytest.approx(0.1, rel=0.15)


# --- runs ------------------------------------------------------------------------------------
def test_dp_run_records_epsilon_per_round_and_clips_every_update(tmp_path: Path) -> None:
    cfg = {
        **FEDAVG,
        "results-dir": str(tmp_path),
        "run-name": "dp",
        "dp": "central",
        "dp-clipping-norm": 0.05,
        "dp-noise-multiplier": 1e-9,
        "secure-aggregation": True,
    }
    summary = run_inline(cfg, node_configs(4))
    with open(tmp_path / "dp" / "rounds.csv", newline="") as f:
        server = [r for r in csv.DictReader(f) if r["client"] == "server" and r["round"] != "0"]
    eps = [float(r["dp-epsilon"]) for r in server]
    assert eps == pytest.approx([epsilon_after(t, 1e-9, 4, 4, 1e-5) for t in (1, 2, 3)])
    assert summary["privacy"]["epsilon"] == pytest.approx(eps[-1]) and summary["privacy"]["releases"] == 3
    report = (tmp_path / "dp" / "report.md").read_text()
    assert (
        f"Privacy: secure aggregation; central DP, epsilon {eps[-1]:.4g} at delta 1e-05 after 3 rounds"
        in report
    )
    with np.load(tmp_path / "dp" / "models.npz") as z:
        final = {k: z[k] for k in z.files}
    run_inline({**cfg, "run-name": "r0", "num-rounds": 1, "dp-clipping-norm": 1e-12}, node_configs(4))
    with np.load(tmp_path / "r0" / "models.npz") as z:
        start = {k: z[k] for k in z.files}  # one round with a clip of 1e-12: the initial model
    moved = math.sqrt(sum(float(((final[k] - start[k]).astype(np.float64) ** 2).sum()) for k in final))
    assert moved <= 3 * 0.05 + 1e-5  # three rounds, each a mean of updates clipped to 0.05


def test_a_budget_the_plan_would_exceed_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    seen: list[str] = []
    cfg = {
        **FEDAVG,
        "results-dir": str(tmp_path),
        "run-name": "b",
        "strategy": "fedrspo",
        "loss": "rspo+",
        "dp": "central",
        "dp-noise-multiplier": 0.5,
        "dp-epsilon": 1.0,
    }
    with pytest.raises(
        ConfigError, match=r"^run config 'dp-epsilon': 3 rounds of 4 of 4 clients .* over the budget 1;"
    ):
        run_inline(cfg, node_configs(4), observers=[lambda ins, _: seen.append(ins.metadata.message_type)])
    assert set(seen) == {"query.info"}  # discovery only: no calibration, no round
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["status"] == "failed" and "dp-epsilon" in summary["error"]


def test_local_dp_is_accounted_without_amplification_and_noised_on_the_clients(tmp_path: Path) -> None:
    cfg = {**FEDAVG, "results-dir": str(tmp_path), "fraction": 0.5, "dp": "local", "dp-clipping-norm": 0.01}
    run_inline({**cfg, "run-name": "q", "dp-noise-multiplier": 1e-9}, node_configs(4))
    loud = run_inline({**cfg, "run-name": "l", "dp-noise-multiplier": 50.0}, node_configs(4))
    # The server knows whom it sampled: no amplification by sampling; the population is all 4 clients.
    orders = library_orders()
    gaussian = epsilon_from_rdp([3 * gaussian_rdp(a, 50.0) for a in orders], orders, 1e-5)
    assert loud["privacy"]["epsilon"] == pytest.approx(gaussian, abs=1e-6)
    assert loud["privacy"]["clients"] == 4 and loud["privacy"]["clients-per-round"] == 2
    steps = {}
    for name in ("q", "l"):
        with np.load(tmp_path / name / "models.npz") as z:
            steps[name] = {k: z[k] for k in z.files}
    gap = math.sqrt(
        sum(float(((steps["l"][k] - steps["q"][k]).astype(np.float64) ** 2).sum()) for k in steps["q"])
    )
    size = sum(v.size for v in steps["q"].values())
    # Each round's mean carries the clients' noise: N(0, (z S)^2 / m) per entry, 3 rounds.
    expected = 50.0 * 0.01 * math.sqrt(3 * size / 2)
    assert gap == pytest.approx(expected, rel=0.1)


@pytest.mark.parametrize("secure", [True, False])
def test_a_local_dp_round_redone_after_a_kill_is_accounted_twice(tmp_path: Path, secure: bool) -> None:
    """Local DP: the server holds the clients' noised updates (their sum, with secure aggregation)
    once a round's replies are in. Killed before that round's checkpoint, the run redoes the round on
    resume, with fresh noise: the server then holds two releases of it and the accountant counts
    both (summary, report, rounds.csv). With a budget that the extra release exceeds, the resume is
    refused in one line and the run folder keeps what it had."""
    z, rounds = 2.0, 4
    orders = library_orders()

    def gaussian_epsilon(releases: int) -> float:  # every client in every round: no amplification
        return epsilon_from_rdp([releases * gaussian_rdp(a, z) for a in orders], orders, 1e-5)

    run_dir = tmp_path / "local"
    sets = {**FEDAVG, "num-rounds": rounds, "seed": 5, "run-name": "local", "dp": "local"}
    sets |= {"dp-noise-multiplier": z, "dp-clipping-norm": 0.05, "secure-aggregation": str(secure).lower()}
    if not secure:  # a budget the planned rounds meet and one more release does not
        sets["dp-epsilon"] = round((gaussian_epsilon(rounds) + gaussian_epsilon(rounds + 1)) / 2, 3)
    kill_at_a_checkpoint(start_inline_run(tmp_path, sets), run_dir)
    received = json.loads((run_dir / "privacy.json").read_text())["releases"]
    checkpointed = int(torch.load(run_dir / "checkpoint.pt", weights_only=False)["privacy"]["releases"])
    assert received == checkpointed + 1  # the round after the checkpoint had released

    out = hetfed_cli("run", "--resume", "local", "--results-dir", str(tmp_path))
    if not secure:
        line = (
            f"run config 'dp-epsilon': {rounds} rounds (and 1 more releases of rounds redone after a stop) "
            f"of 3 of 3 clients at dp-noise-multiplier 2 spend epsilon {gaussian_epsilon(rounds + 1):.4g}"
        )
        assert out.returncode == 2 and line in out.stderr and "Traceback" not in out.stderr, out.stderr[
            -3000:
        ]
        assert json.loads((run_dir / "privacy.json").read_text())["releases"] == received  # nothing sent
        return
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    privacy = summary["privacy"]
    assert privacy["releases"] == rounds + 1 and privacy["redone-releases"] == 1
    assert privacy["epsilon"] == pytest.approx(gaussian_epsilon(rounds + 1), abs=1e-6)
    with open(run_dir / "rounds.csv", newline="") as f:
        last = [r for r in csv.DictReader(f) if r["client"] == "server"][-1]
    assert float(last["dp-epsilon"]) == pytest.approx(gaussian_epsilon(rounds + 1), abs=1e-6)
    assert (
        f"after {rounds + 1} releases (1 of rounds redone after a stop)"
        in (run_dir / "report.md").read_text()
    )
