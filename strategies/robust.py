"""Robust aggregation: what replaces a summed round's weighted mean in plain mode, so that one bad
silo cannot move the model anywhere (docs/algorithms.md "4.1 Robust aggregation").

A strategy whose summed round is a model average (``FederatedStrategy.robust_refusal`` empty:
FedAvg and its compositions, FedRSPO+'s warm start, softmax switching and its baselines) takes,
in clear, instead of ``sum_j a_j x_j / sum_j a_j`` over the round's updates x_j:

- ``median``: the coordinate-wise weighted median (:func:`weighted_median`);
- ``trimmed-mean``: the coordinate-wise weighted mean without the clients whose weight lies in
  the lowest or the highest ``trim`` of the weight (:func:`weighted_trimmed_mean`);
- ``krum``: the update of Krum's choice (Blanchard et al. 2017; Flower's ``aggregate_krum``).

With equal weights the first two are Flower's ``aggregate_median`` and ``aggregate_trimmed_avg``
(tests/test_robust_aggregation.py). The weights are the strategy's own numbers only (switching's
plan); a weight a client reports itself (FedAvg's ``num-examples``) would let a bad silo claim
the whole weight, so those rounds weight their clients equally, as Flower's FedMedian,
FedTrimmedAvg and Krum do. ``aggregation-max-norm`` > 0 rejects an update with
``||x_j||_2`` above it (the round loop records the reason in rounds.csv).

Plain mode only: central DP's noise is calibrated to the sum, secure aggregation gives the server
only the sum, and the LSA methods' fixed points need the mean; those are refused before round 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.server.strategy.aggregate import aggregate_krum

from hetfed.params import ConfigError


def weighted_median(values: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """The weighted median of each column of ``values`` (clients x entries): the midpoint of the
    minimisers of ``sum_j a_j |m - v_j|``. Sorted ``v_(1) <= ... <= v_(n)`` with cumulative weight
    ``C_i`` and ``k`` the first i with ``C_i >= W/2``: ``(v_(k) + v_(k+1)) / 2`` when ``C_k = W/2``
    (to 1e-9 of W), else ``v_(k)``. Equal weights: ``np.median``."""
    order, cumulative = _sorted_weights(values, weights)
    ranked = np.take_along_axis(values, order, axis=0)
    columns = np.arange(values.shape[1])
    k = np.argmax(np.round(cumulative, 9) >= 0.5, axis=0)
    low = ranked[k, columns]
    high = ranked[np.minimum(k + 1, len(values) - 1), columns]
    tie = np.round(cumulative[k, columns], 9) == 0.5
    return np.where(tie, (low + high) / 2, low)


def weighted_trimmed_mean(values: np.ndarray, weights: Sequence[float], trim: float) -> np.ndarray:
    """The weighted mean of each column of ``values`` (clients x entries) over the clients kept:
    sorted ``v_(1) <= ... <= v_(n)`` with cumulative weight fractions ``c_i``, client ``(i)`` is
    dropped when ``c_i <= trim`` or ``c_{i-1} >= 1 - trim`` (its weight lies wholly in a trimmed
    tail; to 1e-9), and the result is ``sum_kept a v / sum_kept a``. Equal weights: Flower's
    ``aggregate_trimmed_avg`` (``int(trim n)`` cut at each end). ``0 <= trim < 0.5``."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"weighted_trimmed_mean: trim must be in [0, 0.5), got {trim!r}")
    order, cumulative = _sorted_weights(values, weights)
    ranked = np.take_along_axis(values, order, axis=0)
    a = np.asarray(weights, dtype=np.float64)[order]
    before = cumulative - a / float(np.sum(weights))
    kept = (np.round(cumulative, 9) > round(trim, 9)) & (np.round(before, 9) < round(1.0 - trim, 9))
    kept_weight = np.where(kept, a, 0.0)
    result: np.ndarray = np.sum(kept_weight * ranked, axis=0) / np.sum(kept_weight, axis=0)
    return result


def krum(updates: Sequence[Sequence[np.ndarray]], f: int) -> list[np.ndarray]:
    """Krum's choice among ``updates`` (each a list of arrays): the x_i with the smallest
    ``sum_{j in N_i} ||x_i - x_j||^2`` over its ``n - f - 2`` nearest others (Flower's
    ``aggregate_krum``, to_keep 0). It is robust to f bad updates when ``n >= 2f + 3``."""
    return list(aggregate_krum([(list(x), 1) for x in updates], num_malicious=f, to_keep=0))


def _sorted_weights(values: np.ndarray, weights: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Each column's sort order, and the cumulative weight fraction along it."""
    a = np.asarray(weights, dtype=np.float64)
    if a.shape != (len(values),) or np.any(a < 0) or not np.sum(a) > 0:
        raise ValueError(f"robust aggregation: {len(values)} updates need as many weights >= 0, not all 0")
    order = np.argsort(values, axis=0, kind="stable")
    return order, np.cumsum(a[order], axis=0) / float(np.sum(a))


@dataclass(frozen=True)
class RobustAggregation:
    """The run's rule for a summed round in clear (run-config keys ``aggregation``,
    ``aggregation-trim``, ``aggregation-krum-f``, ``aggregation-max-norm``; see the module docs)."""

    rule: str = "mean"
    trim: float = 0.1
    krum_f: int = 1
    max_norm: float = 0.0  # 0: no bound

    @classmethod
    def for_run(cls, cfg: Mapping[str, Any], refusal: str) -> RobustAggregation:
        """The run's settings; a one-line ConfigError naming the key when the run cannot keep them:
        the strategy's ``refusal`` (why its round has no robust form; empty: it has), DP, or secure
        aggregation."""
        out = cls(
            str(cfg["aggregation"]),
            float(cfg["aggregation-trim"]),
            int(cfg["aggregation-krum-f"]),
            float(cfg["aggregation-max-norm"]),
        )
        if not out.in_use:
            return out
        key = "aggregation" if out.robust else "aggregation-max-norm"
        setting = f"{key} = {out.rule if out.robust else out.max_norm}"
        if refusal:
            raise ConfigError(
                f"run config '{key}': {setting} needs a model average; "
                f"strategy {cfg['strategy']!r}: {refusal}"
            )
        if cfg["dp"] == "central":
            raise ConfigError(
                f"run config '{key}': {setting} with dp = central: its noise is calibrated to the sum"
            )
        if cfg["dp"] != "off":
            raise ConfigError(
                f"run config '{key}': {setting} with dp = {cfg['dp']}: robust aggregation runs in plain mode "
                "only (DP rounds are sums, server/aggregation.py)"
            )
        if cfg["secure-aggregation"]:
            raise ConfigError(
                f"run config '{key}': {setting} with secure-aggregation = true: the server sees only the sum"
            )
        return out

    @property
    def robust(self) -> bool:
        """Whether a round's estimate replaces its weighted mean."""
        return self.rule != "mean"

    @property
    def in_use(self) -> bool:
        """Whether anything differs from today's mean of every usable update."""
        return self.robust or self.max_norm > 0

    def check_round_clients(self, clients: int) -> None:
        """Before round 1: the rule against the planned ``clients`` per round (one-line ConfigError):
        Krum needs ``n >= 2f + 3``, a trimmed mean must trim at least one client."""
        if self.rule == "krum" and clients < 2 * self.krum_f + 3:
            raise ConfigError(
                f"run config 'aggregation-krum-f': krum with f = {self.krum_f} needs at least "
                f"{2 * self.krum_f + 3} clients per round (n >= 2f + 3), the plan has {clients}; "
                "lower aggregation-krum-f, raise 'fraction' (or 'switching-m') or add clients"
            )
        if self.rule == "trimmed-mean" and math.floor(round(self.trim * clients, 9)) < 1:
            raise ConfigError(
                f"run config 'aggregation-trim': {self.trim:g} of the plan's {clients} clients per round "
                "trims none (the mean); raise it or the clients per round"
            )

    def norm_violation(self, update: Mapping[str, np.ndarray]) -> str | None:
        """Why ``update`` (x_j) is refused by ``aggregation-max-norm`` (None: it is not)."""
        if not self.max_norm:
            return None
        norm = math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in update.values()))
        if norm <= self.max_norm:
            return None
        return f"update norm {norm:.4g} exceeds aggregation-max-norm {self.max_norm:g}"

    def estimate(
        self, updates: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
    ) -> tuple[dict[str, np.ndarray] | None, str]:
        """The rule's estimate from the round's ``updates`` (same arrays each) and ``weights``; (None,
        why) when there are too few updates for it (Krum: fewer than 2f + 3)."""
        keys = sorted(updates[0])
        if self.rule == "krum":
            if len(updates) < 2 * self.krum_f + 3:
                return (
                    None,
                    f"krum with f = {self.krum_f} needs {2 * self.krum_f + 3} updates, got {len(updates)}",
                )
            chosen = krum([[np.asarray(x[k], dtype=np.float64) for k in keys] for x in updates], self.krum_f)
            return dict(zip(keys, chosen, strict=True)), ""
        flat = np.stack([np.concatenate([np.ravel(x[k]) for k in keys]).astype(np.float64) for x in updates])
        if self.rule == "median":
            values = weighted_median(flat, weights)
        elif self.rule == "trimmed-mean":
            values = weighted_trimmed_mean(flat, weights, self.trim)
        else:
            raise ValueError(f"RobustAggregation.estimate: rule {self.rule!r} is the mean (plain_sum)")
        out, at = {}, 0
        for k in keys:
            shape = np.shape(updates[0][k])
            out[k] = values[at : at + math.prod(shape)].reshape(shape)
            at += math.prod(shape)
        return out, ""
