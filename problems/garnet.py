"""Heterogeneous Garnet MDPs: the federated TD(0) instance of PF-LSA (docs/algorithms.md section 3).

Agent ``c`` evaluates the uniform random policy on its own Garnet MDP with linear
features; TD(0) is the linear stochastic approximation ``A_c theta = b_c`` with

    A_c(Z) = phi(s) (phi(s) - gamma phi(s'))',   b_c(Z) = r_c(s) phi(s),
    s ~ mu_c (stationary),  s' ~ P_c(s, .),
    A_bar_c = Phi' D_mu_c (Phi - gamma P_c Phi),  b_bar_c = Phi' D_mu_c r_c,
    theta_c* = A_bar_c^{-1} b_bar_c.

Generative law (the one of the SCAFFLSA authors' Garnet generator, except that every
agent draws its perturbations from its own stream):

* Shared base MDP, from ``rng = default_rng(SeedSequence(seed))``, drawn in this order:
  1. support: for every (s, a), ``branching`` distinct next states, uniformly at random
     (the ``branching`` smallest of ``rng.random((S, A, S))[s, a]``); the base kernel
     puts ``1/branching`` on each;
  2. base rewards ``r(s) ~ U[0, 1]`` (``rng.random(S)``);
  3. features ``phi(s) ~ U[0, 1]^dim`` (``rng.random((S, dim))``), each row divided by its
     sum (so every phi(s) lies on the simplex).
* Agent ``c``, from ``rng_c = default_rng(SeedSequence(seed, spawn_key=(c,)))`` (the
  c-th child of ``SeedSequence(seed).spawn``), so agent ``c`` never depends on how many
  agents exist; both draws are made whatever the zetas, so zeta only scales the noise:
  1. ``u ~ U[0, 1]^(S x A x S)``; ``K_c(s, a, s') ∝ 1[s' in support(s, a)] (1 + zeta_ker u)``,
     rows renormalised (zeta_ker = 0 gives the base kernel);
  2. ``v ~ U[0, 1]^S``; ``r_c(s) = r(s) + zeta_rew v(s)``.
* Policy: uniform random, ``P_c(s, s') = (1/A) sum_a K_c(s, a, s')``.

A Flower client of partition ``c`` calls ``make_agent(c, seed, ...)`` and builds nothing
of the other agents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GarnetAgent", "GarnetBase", "garnet_base", "make_agent", "make_agents"]


@dataclass(frozen=True)
class GarnetBase:
    """The MDP shared by all agents before heterogeneity.

    ``kernel`` [S, A, S] puts 1/branching on each of ``branching`` states per (s, a);
    ``rewards`` [S] are U[0, 1]; ``features`` [S, dim] have rows on the simplex.
    """

    kernel: np.ndarray
    rewards: np.ndarray
    features: np.ndarray


class GarnetAgent:
    """One agent's policy-evaluation problem and its TD(0) sample oracle.

    Attributes (read-only arrays): ``features`` phi [S, dim], ``sa_kernel`` K_c [S, A, S],
    ``kernel`` P_c [S, S] (uniform policy), ``rewards`` r_c [S], ``mu`` [S] with
    ``mu P_c = mu``, ``A_bar`` [dim, dim], ``b_bar`` [dim], ``theta_star`` [dim].
    """

    def __init__(
        self,
        features: np.ndarray,
        sa_kernel: np.ndarray,
        rewards: np.ndarray,
        gamma: float,
        agent_index: int = 0,
    ) -> None:
        # Copies: the arrays are frozen below and must not freeze the caller's.
        features = np.array(features, dtype=float)
        sa_kernel = np.array(sa_kernel, dtype=float)
        rewards = np.array(rewards, dtype=float)
        n_states = features.shape[0] if features.ndim == 2 else 0
        if features.ndim != 2 or features.shape[1] > n_states:
            raise ValueError(f"features must be [n_states, dim] with dim <= n_states; got {features.shape}")
        if sa_kernel.ndim != 3 or sa_kernel.shape[0] != n_states or sa_kernel.shape[2] != n_states:
            raise ValueError(f"sa_kernel must be [{n_states}, n_actions, {n_states}]; got {sa_kernel.shape}")
        if np.any(sa_kernel < 0) or not np.allclose(sa_kernel.sum(axis=2), 1.0):
            raise ValueError("sa_kernel rows must be probability vectors (nonnegative, summing to 1)")
        if rewards.shape != (n_states,):
            raise ValueError(f"rewards must be [{n_states}]; got {rewards.shape}")
        if not 0.0 <= gamma < 1.0:
            raise ValueError(f"gamma must lie in [0, 1); got {gamma}")

        self.agent_index = agent_index
        self.gamma = float(gamma)
        self.features = features
        self.sa_kernel = sa_kernel
        self.rewards = rewards
        self.kernel = sa_kernel.mean(axis=1)  # uniform random policy
        self.mu = _stationary(self.kernel)
        phi_mu = features.T * self.mu  # Phi' D_mu
        self.A_bar = phi_mu @ (features - self.gamma * self.kernel @ features)
        self.b_bar = phi_mu @ rewards
        self.theta_star = np.linalg.solve(self.A_bar, self.b_bar)
        for array in (
            self.features,
            self.sa_kernel,
            self.rewards,
            self.kernel,
            self.mu,
            self.A_bar,
            self.b_bar,
            self.theta_star,
        ):
            array.flags.writeable = False
        # Inverse-CDF tables for sampling; the last entry is pinned to 1 so u in [0, 1) always lands.
        self._mu_cdf = _cdf(self.mu)
        self._kernel_cdf = _cdf(self.kernel)

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    def _draw(self, rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Features of ``batch`` transitions: phi(s) and phi(s') with s ~ mu, s' ~ P(s, .); and r(s)."""
        if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch < 1:
            raise ValueError(f"batch must be a positive integer; got {batch!r}")
        s = (rng.random(batch)[:, None] < self._mu_cdf).argmax(axis=1)
        s_next = (rng.random(batch)[:, None] < self._kernel_cdf[s]).argmax(axis=1)
        return self.features[s], self.features[s_next], self.rewards[s]

    def sample(self, rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` i.i.d. TD(0) pairs: A(Z) = phi(s)(phi(s) - gamma phi(s'))' and b(Z) = r(s) phi(s).

        Returns A [batch, dim, dim] and b [batch, dim].
        """
        phi_s, phi_next, r_s = self._draw(rng, batch)
        a = phi_s[:, :, None] * (phi_s - self.gamma * phi_next)[:, None, :]
        return a, r_s[:, None] * phi_s

    def g(self, theta: np.ndarray, rng: np.random.Generator, batch: int = 1) -> np.ndarray:
        """Mean over ``batch`` fresh samples of ``A(Z) theta - b(Z)``.

        Computed as ``phi(s) ((phi(s) - gamma phi(s'))'theta - r(s))`` without forming A(Z).

        Consumes ``rng`` exactly as :meth:`sample` with the same ``batch``.
        """
        theta = np.asarray(theta, dtype=float)
        if theta.shape != (self.dim,):
            raise ValueError(f"theta must have shape ({self.dim},); got {theta.shape}")
        phi_s, phi_next, r_s = self._draw(rng, batch)
        residual = (phi_s - self.gamma * phi_next) @ theta - r_s
        return (phi_s * residual[:, None]).mean(axis=0)

    def transitions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The law of one TD(0) sample, exactly: every pair (s, s') with its probability
        ``mu(s) P(s, s')`` [S*S], ``A(Z)`` [S*S, dim, dim] and ``b(Z)`` [S*S, dim] (pairs in
        row-major (s, s') order, impossible pairs included with probability 0)."""
        n = self.features.shape[0]
        s, s_next = np.divmod(np.arange(n * n), n)
        phi_s = self.features[s]
        a = phi_s[:, :, None] * (phi_s - self.gamma * self.features[s_next])[:, None, :]
        return (self.mu[:, None] * self.kernel).ravel(), a, self.rewards[s][:, None] * phi_s

    def error(self, theta: np.ndarray) -> float:
        """``||theta - theta_c*||^2``."""
        theta = np.asarray(theta, dtype=float)
        if theta.shape != (self.dim,):
            raise ValueError(f"theta must have shape ({self.dim},); got {theta.shape}")
        return float(np.sum((theta - self.theta_star) ** 2))


def garnet_base(
    seed: int, *, n_states: int = 10, n_actions: int = 10, branching: int = 3, dim: int = 5
) -> GarnetBase:
    """The shared base MDP of ``seed`` (law in the module docstring)."""
    _check_int("seed", seed, 0)
    _check_int("n_states", n_states, 2)
    _check_int("n_actions", n_actions, 1)
    _check_int("dim", dim, 1)
    _check_int("branching", branching, 1)
    if branching > n_states:
        raise ValueError(f"branching must be at most n_states={n_states}; got {branching}")
    if dim > n_states:
        raise ValueError(f"dim must be at most n_states={n_states} (A_bar would be singular); got {dim}")
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    # The `branching` smallest of i.i.d. uniforms form a uniformly random subset of the states.
    support = np.argsort(rng.random((n_states, n_actions, n_states)), axis=2)[..., :branching]
    kernel = np.zeros((n_states, n_actions, n_states))
    np.put_along_axis(kernel, support, 1.0 / branching, axis=2)
    rewards = rng.random(n_states)
    features = rng.random((n_states, dim))
    features /= features.sum(axis=1, keepdims=True)
    return GarnetBase(kernel=kernel, rewards=rewards, features=features)


def make_agent(
    agent_index: int,
    seed: int,
    zeta_ker: float = 0.0,
    zeta_rew: float = 0.0,
    *,
    n_states: int = 10,
    n_actions: int = 10,
    branching: int = 3,
    dim: int = 5,
    gamma: float = 0.95,
) -> GarnetAgent:
    """Agent ``agent_index`` of the federation of ``seed``, built from its own stream only."""
    base = garnet_base(seed, n_states=n_states, n_actions=n_actions, branching=branching, dim=dim)
    return _perturbed_agent(base, agent_index, seed, zeta_ker, zeta_rew, gamma)


def make_agents(
    n_agents: int,
    seed: int,
    zeta_ker: float = 0.0,
    zeta_rew: float = 0.0,
    *,
    n_states: int = 10,
    n_actions: int = 10,
    branching: int = 3,
    dim: int = 5,
    gamma: float = 0.95,
) -> list[GarnetAgent]:
    """Agents ``0 .. n_agents - 1``; agent c equals ``make_agent(c, seed, ...)``."""
    _check_int("n_agents", n_agents, 1)
    base = garnet_base(seed, n_states=n_states, n_actions=n_actions, branching=branching, dim=dim)
    return [_perturbed_agent(base, c, seed, zeta_ker, zeta_rew, gamma) for c in range(n_agents)]


def _perturbed_agent(
    base: GarnetBase, agent_index: int, seed: int, zeta_ker: float, zeta_rew: float, gamma: float
) -> GarnetAgent:
    """Apply agent ``agent_index``'s kernel and reward noise to ``base``."""
    _check_int("agent_index", agent_index, 0)
    for name, zeta in (("zeta_ker", zeta_ker), ("zeta_rew", zeta_rew)):
        if not (np.isfinite(zeta) and zeta >= 0):
            raise ValueError(f"{name} must be a finite number >= 0; got {zeta}")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(agent_index,)))
    kernel_noise = rng.random(base.kernel.shape)
    reward_noise = rng.random(base.rewards.shape)
    weights = (base.kernel > 0) * (1.0 + zeta_ker * kernel_noise)
    sa_kernel = weights / weights.sum(axis=2, keepdims=True)
    rewards = base.rewards + zeta_rew * reward_noise
    return GarnetAgent(base.features, sa_kernel, rewards, gamma, agent_index=agent_index)


def _stationary(kernel: np.ndarray) -> np.ndarray:
    """The unique mu >= 0 with mu P = mu and sum mu = 1 (ValueError if it is not unique)."""
    n = kernel.shape[0]
    system = np.vstack([kernel.T - np.eye(n), np.ones((1, n))])
    rhs = np.zeros(n + 1)
    rhs[-1] = 1.0
    mu, _, rank, _ = np.linalg.lstsq(system, rhs, rcond=None)
    if rank < n:
        raise ValueError("kernel has no unique stationary distribution (the chain is reducible)")
    mu = np.clip(mu, 0.0, None)  # round-off can leave -1e-17 on transient states
    return mu / mu.sum()


def _cdf(probabilities: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(probabilities, axis=-1)
    cdf[..., -1] = 1.0
    return cdf


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
