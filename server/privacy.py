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
sampled Gaussian release per summed round, m of the n clients. With every client in every round
there is no amplification (add/remove-one, multiplier z); with m < n, sampling without replacement
(Wang, Balle, Kasiviswanathan 2019), which dp-accounting accounts only for replace-one neighbours,
whose sensitivity is 2S: multiplier z/2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.serverapp import RdpAccountant
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)

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
        )

    @property
    def on(self) -> bool:
        return self.mode != "off"


def accountant(population: int, sample_size: int, delta: float) -> RdpAccountant:
    """Flower's RDP accountant for rounds of ``sample_size`` of ``population`` clients."""
    everyone = sample_size >= population
    config = PrivacyConfig(
        target_delta=delta,
        population_size=population,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE
        if everyone
        else NeighboringRelation.REPLACE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION if everyone else SamplingMethod.WITHOUT_REPLACEMENT,
    )
    return RdpAccountant(config)


def release(noise_multiplier: float, population: int, sample_size: int) -> GaussianPrivacyEvent:
    """One round's release as the accountant sees it (z, or z/2 for replace-one; module docs)."""
    z = noise_multiplier if sample_size >= population else noise_multiplier / 2
    return GaussianPrivacyEvent(noise_multiplier=z, sample_size=sample_size, population_size=population)


def epsilon_after(
    rounds: int, noise_multiplier: float, population: int, sample_size: int, delta: float
) -> float:
    """epsilon at ``delta`` after ``rounds`` summed rounds."""
    acc = accountant(population, sample_size, delta)
    acc.compose(release(noise_multiplier, population, sample_size), rounds)
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
        eps = epsilon_after(releases, s.noise_multiplier, self.population, self.sample_size, s.delta)
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
        policy bounds (client/policy.py ``max-epsilon``)."""
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
        s = self.settings
        if self.releases == 0:
            return 0.0
        return epsilon_after(self.releases, s.noise_multiplier, self.population, self.sample_size, s.delta)

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
