"""Differential privacy of a summed round: the clip each client applies, the server's noise, and
the Rényi-DP accountant (docs/algorithms.md "Differential privacy").

Client-level DP as in DP-FedAvg (McMahan et al. 2018): each client clips its contribution to
``||x_i||_2 <= S`` (client/secure_aggregation.py) and the released sum is

    central:  sum_i x_i + N(0, (z S)^2 I)     (added by the server to the, possibly secure, sum)
    local:    sum_i (x_i + N(0, (z S)^2 I))   (each client noises its own; no server noise)

with ``z`` = ``dp-noise-multiplier`` and, under DP, every weight a_i <= 1 (the data-size weights
of FedAvg become 1: a weight scales the sensitivity). Adaptive clipping (Andrew et al. 2021)
moves S towards the ``dp-target-quantile`` gamma of the update norms: the clients also sum the
bit c_i = 1{||x_i|| <= S}, the server releases b = (sum_i c_i + N(0, sigma_b^2)) / m and sets
S <- S exp(-eta_C (b - gamma)); the update noise is then z_u = (z^-2 - (2 sigma_b)^-2)^(-1/2), so
that both releases together cost what one Gaussian release of multiplier z does.

The accountant is Flower's :class:`~flwr.serverapp.RdpAccountant` (Google's dp-accounting): one
Gaussian release per summed round, m of the n clients, for the neighbouring relation of the run's
``dp-sampling`` (the summary's ``privacy`` states it, with the adversary it holds against):

- ``public`` (the seeded sample, which config.json reproduces and rounds.csv lists): no amplification
  by sampling; add-or-remove-one neighbours (one client's update present or absent), sensitivity S,
  multiplier z. Local DP likewise: each client's own release is the Gaussian mechanism at z.
- ``secret`` (central DP only; the sample is drawn from OS entropy and written nowhere): sampling
  without replacement (Wang, Balle, Kasiviswanathan 2019), which dp-accounting accounts only for
  replace-one neighbours, whose sensitivity is 2S: multiplier z/2. The amplification holds only
  against those who cannot see the sample: not the server, not the sampled silos (secure
  aggregation tells them their peers); against them, the same replace-one releases without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
from flwr.serverapp import RdpAccountant
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)

from hetfed import versions
from hetfed.config import ConfigError


@dataclass(frozen=True)
class DPSettings:
    """The run config's DP keys (validated by hetfed.config)."""

    mode: str  # "off", "central" or "local"
    noise_multiplier: float
    clipping_norm: float
    adaptive: bool
    target_quantile: float
    clip_learning_rate: float
    clipped_count_stddev: float  # 0: m / 20 (Andrew et al.'s recommendation)
    delta: float
    epsilon_budget: float  # 0: none
    secret_sample: bool  # dp-sampling = secret: amplification by sampling (module docs)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> DPSettings:
        return cls(
            mode=str(cfg["dp"]),
            noise_multiplier=float(cfg["dp-noise-multiplier"]),
            clipping_norm=float(cfg["dp-clipping-norm"]),
            adaptive=cfg["dp-clipping"] == "adaptive",
            target_quantile=float(cfg["dp-target-quantile"]),
            clip_learning_rate=float(cfg["dp-clip-learning-rate"]),
            clipped_count_stddev=float(cfg["dp-clipped-count-stddev"]),
            delta=float(cfg["dp-delta"]),
            epsilon_budget=float(cfg["dp-epsilon"]),
            secret_sample=cfg["dp-sampling"] == "secret",
        )

    @property
    def on(self) -> bool:
        return self.mode != "off"


ADVERSARY = {
    "central": "anyone who sees the released model/sum, trusting the server to add the noise",
    "local": "the server and anyone after it",
}
UNSEEN_SAMPLE = (
    "only against those who cannot see the sample: not the server, not the sampled silos (secure "
    "aggregation tells them their peers, and each knows it was sampled)"
)


def relation(secret_sample: bool) -> NeighboringRelation:
    """The neighbouring relation epsilon holds for (module docs)."""
    return NeighboringRelation.REPLACE_ONE if secret_sample else NeighboringRelation.ADD_OR_REMOVE_ONE


def accountant(population: int, delta: float, secret_sample: bool = False) -> RdpAccountant:
    """Flower's RDP accountant for ``population`` clients: without amplification for a public sample,
    sampling without replacement for a secret one (module docs)."""
    config = PrivacyConfig(
        target_delta=delta,
        population_size=population,
        neighboring_relation=relation(secret_sample),
        sampling_method=SamplingMethod.WITHOUT_REPLACEMENT
        if secret_sample
        else SamplingMethod.NO_AMPLIFICATION,
    )
    return RdpAccountant(config)


def accounted_multiplier(noise_multiplier: float, secret_sample: bool) -> float:
    """The multiplier per sensitivity: z for add-or-remove-one (S), z/2 for replace-one (2S)."""
    return noise_multiplier / 2 if secret_sample else noise_multiplier


def release(
    noise_multiplier: float, population: int, sample_size: int, secret_sample: bool = False
) -> GaussianPrivacyEvent:
    """One round's release as the accountant sees it (module docs)."""
    z = accounted_multiplier(noise_multiplier, secret_sample)
    return GaussianPrivacyEvent(noise_multiplier=z, sample_size=sample_size, population_size=population)


def epsilon_after(
    rounds: int,
    noise_multiplier: float,
    population: int,
    sample_size: int,
    delta: float,
    secret_sample: bool = False,
) -> float:
    """epsilon at ``delta`` after ``rounds`` summed rounds of ``sample_size`` of ``population`` clients."""
    acc = accountant(population, delta, secret_sample)
    acc.compose(release(noise_multiplier, population, sample_size, secret_sample), rounds)
    return acc.get_epsilon(delta)


class Privacy:
    """A run's DP state: the current clip, the releases so far, and the noise (module docs)."""

    def __init__(self, settings: DPSettings, population: int, sample_size: int) -> None:
        self.settings = settings
        self.population, self.sample_size = population, sample_size
        self.clip = settings.clipping_norm
        self.releases = 0
        self.redone = 0  # local DP: releases of rounds the server received and then redid (a resume)
        self.rng = np.random.default_rng()  # the noise must not be reproducible: fresh entropy

    def check_budget(self, planned_rounds: int) -> None:
        """ConfigError (one line) when the planned summed rounds, with the releases of rounds redone
        so far, would spend more than dp-epsilon."""
        s = self.settings
        if not s.on or s.epsilon_budget <= 0:
            return
        releases = planned_rounds + self.redone
        eps = self.epsilon_of(releases)
        if eps > s.epsilon_budget:
            redone, advice = "", "raise the noise or lower num-rounds"
            if self.redone:  # a resume: the releases are made, the config is the run's
                redone = f" (and {self.redone} more releases of rounds redone after a stop)"
                advice = "this run cannot go on within it"
            raise ConfigError(
                f"run config 'dp-epsilon': {planned_rounds} rounds{redone} of {self.sample_size} of "
                f"{self.population} clients at dp-noise-multiplier {s.noise_multiplier:g} spend epsilon "
                f"{eps:.4g} at delta {s.delta:g}, over the budget {s.epsilon_budget:g}; {advice}"
            )

    def client_values(self) -> dict[str, float]:
        """What a summed round's train message carries: the clip, the local noise multiplier, and the
        run's epsilon budget (0: none; checked by :meth:`check_budget` before round 1), which a silo's
        policy bounds (client/silo_policy.py ``max-epsilon``)."""
        s = self.settings
        if not s.on:
            return {"dp-clip": 0.0, "dp-local-noise": 0.0}
        return {
            "dp-clip": float(self.clip),
            "dp-local-noise": s.noise_multiplier if s.mode == "local" else 0.0,
            "dp-epsilon": s.epsilon_budget,
        }

    def update_noise_multiplier(self) -> float:
        """z_u: z, or with adaptive clipping (z^-2 - (2 sigma_b)^-2)^(-1/2)."""
        z = self.settings.noise_multiplier
        if not self.settings.adaptive:
            return z
        sigma_b = self.count_stddev()
        rest = z**-2 - (2 * sigma_b) ** -2
        if rest <= 0:
            raise ConfigError(
                f"run config 'dp-clipped-count-stddev': {sigma_b:g} leaves no noise for the update at "
                f"dp-noise-multiplier {z:g} (needs 2 sigma_b > z); raise it or the noise multiplier"
            )
        return float(rest**-0.5)

    def count_stddev(self) -> float:
        return self.settings.clipped_count_stddev or self.sample_size / 20

    def noised(
        self, total: np.ndarray, within: float | None, contributors: int
    ) -> tuple[np.ndarray, dict[str, float]]:
        """The released sum: central noise added to ``total``; the adaptive clip moved by ``within``
        (sum_i c_i; None under local DP, whose clients send no such bit and which has no adaptive
        clip). Returns the sum and the round's DP columns (clip used, epsilon so far)."""
        s = self.settings
        used = self.clip
        if s.mode == "central":
            total = total + self.rng.normal(0.0, self.update_noise_multiplier() * used, size=total.shape)
        if s.adaptive and within is not None:
            noisy = (within + self.rng.normal(0.0, self.count_stddev())) / max(contributors, 1)
            self.clip = float(used * math.exp(-s.clip_learning_rate * (noisy - s.target_quantile)))
        if s.mode == "central":
            self.releases += 1  # local DP counted its release when the server received it (received)
        return total, {"dp-clip": used, "dp-epsilon": self.epsilon()}

    def received(self) -> None:
        """Local DP: the server now holds the round's noised updates, one release. Counted at once,
        before the round's checkpoint: a stop before it makes the resume redo the round, a second
        release of the same data."""
        self.releases += 1

    def epsilon(self) -> float:
        """epsilon after the releases so far (0 before the first)."""
        return self.epsilon_of(self.releases) if self.releases else 0.0

    def epsilon_of(self, releases: int, amplified: bool = True) -> float:
        """epsilon after ``releases`` summed rounds; ``amplified`` False: a secret sample's releases
        against those who see the sample (replace-one, no amplification)."""
        s = self.settings
        if s.secret_sample and not amplified:  # the same Gaussian per 2S, without sampling
            z = accounted_multiplier(s.noise_multiplier, True)
            return epsilon_after(releases, z, self.population, self.sample_size, s.delta)
        return epsilon_after(
            releases, s.noise_multiplier, self.population, self.sample_size, s.delta, s.secret_sample
        )

    def report(self) -> dict[str, Any]:
        """What the summary's ``privacy`` states of the DP releases (module docs): the relation and
        the adversary epsilon holds against, n, m, z, S, delta, epsilon, the sampling, the accountant."""
        s = self.settings
        secret = s.secret_sample
        sampling: dict[str, Any] = {
            "dp-sampling": "secret" if secret else "public",
            "amplification": "sampling without replacement, m of n" if secret else "none",
        }
        if secret:
            sampling["holds-against"] = UNSEEN_SAMPLE
            sampling["epsilon-without-amplification"] = self.epsilon_of(self.releases, amplified=False)
        return {
            "neighbouring-relation": relation(secret).value,
            "sensitivity": "2 S" if secret else "S",
            "adversary": ADVERSARY[s.mode],
            "clients": self.population,
            "clients-per-round": self.sample_size,
            "noise-multiplier": s.noise_multiplier,
            "clipping-norm": s.clipping_norm,
            "clipping": "adaptive" if s.adaptive else "fixed",
            "final-clip": self.clip,
            "delta": s.delta,
            "epsilon": self.epsilon(),
            "releases": self.releases,
            **({"redone-releases": self.redone} if self.redone else {}),
            "sampling": sampling,
            "accountant": {
                "method": "Renyi DP (flwr RdpAccountant over dp-accounting)",
                "accounted-noise-multiplier": accounted_multiplier(s.noise_multiplier, secret),
                "dp-accounting": metadata.version("dp-accounting"),
                "flwr": versions.flower(),
            },
        }

    def state_dict(self) -> dict[str, Any]:
        return {"clip": self.clip, "releases": self.releases, "redone": self.redone}

    def load_state_dict(self, state: Mapping[str, Any], received: int = 0) -> None:
        """The checkpoint's state. ``received``: the releases the server had received when it
        stopped (local DP); more than the checkpoint's when a round after it had released, and the
        resume redoes that round: the accountant counts both."""
        self.clip = float(state["clip"])
        checkpointed = int(state["releases"])
        self.redone = int(state.get("redone", 0)) + max(0, received - checkpointed)
        self.releases = max(checkpointed, received)
