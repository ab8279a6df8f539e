"""Federated safe RL on heterogeneous CartPole CMDPs (docs/algorithms.md 2; the spec's experiment c).

Each client runs gymnasium's CartPole-v1 dynamics (its vectorised implementation,
``CartPoleVectorEnv``) with its own physics and episodes capped at ``horizon``
steps. Per step t the reward is CartPole's 1 and the safety cost is

    c_t = 1[ |x_{t+1}| > x_safe  or  |theta_{t+1}| > theta_safe ]

on the state reached by the step (cart position x, pole angle theta in radians).
With ``fall_cost`` (run config ``rl-fall-cost``) an episode that ends by a fall at
step T < H also costs the H - T steps it did not live (a fallen pole is outside
the safe zone), so letting the pole fall sooner no longer lowers the cost.
For a softmax policy pi_w and H = horizon, both normalised by H so that they live
on the scale of the other tasks' losses (the softmax weights depend on that scale):

    f_i(w) = -E[sum_t r_t] / H            (minus the normalised return)
    g_i(w) =  E[sum_t c_t] / H - budget   (cost budget as a fraction of the horizon)

Estimates on a batch of N episodes are Monte-Carlo averages whose *gradient* is the
REINFORCE policy gradient ``(1/(N H)) sum_n sum_t grad log pi(a_t|s_t) A_t`` with
``A_t`` the reward-to-go ``sum_{t' >= t} x_{t'}`` of the per-step value x (``advantage =
"reward-to-go"``) or, with ``advantage = "gae"``, the generalised advantage estimate

    A_t = sum_l lambda^l delta_{t+l},   delta_t = x_t + V(s_{t+1}, t+1) - V(s_t, t)

(undiscounted, as f and g are; V = 0 after an episode ends) over a value baseline V fitted
by least squares to the batch's reward-to-go on features of the state and the time
(:func:`value_baseline`, one per quantity: return and cost). ``f`` and ``g`` return
``value + surrogate - surrogate.detach()`` (the value of the estimate, the gradient of the
score-function surrogate). Batches are on-policy: sample them with the model you
differentiate at. ``trust_region`` > 0 asks the client for TRPO-style local steps
(client/trust_region.py); :meth:`SafeRLTask.kl_from` gives it the policy's KL divergence.

With the defaults the constraint does not make the best return unreachable: a
centring linear feedback (push right iff x + 1.6 x_dot + 18 theta + 3 theta_dot > 0)
keeps every client's pole up for the whole horizon at zero cost. REINFORCE on f
alone instead finds policies that drift and spend ~4-12% of the steps outside
|x| <= 1, so the constraint decides which high-return policy is learnt.

Physics (deterministic per client from ``instance_seed``, default the run seed):
pole half-length, pole mass, cart mass and force magnitude are the CartPole
defaults times ``exp(heterogeneity * u)``, where for each of the four parameters
``u`` takes the evenly spaced levels ``-1 + (2k + 1)/n`` (k = 0..n-1) assigned to the
n clients by a seeded permutation, so clients always differ, evenly, in every parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

from hetfed.problems.constrained import check_batch_size, check_partition, parse_params, require, seeded_model

OBS_DIM = 4
NUM_ACTIONS = 2
PHYSICS_FIELDS = ("length", "masspole", "masscart", "force_mag")
_EVAL_STREAM = 1  # rng stream tag for evaluation episodes, apart from the physics stream 0
ADVANTAGES = ("reward-to-go", "gae")


@dataclass(frozen=True)
class SafeRLConfig:
    """Parameters of the safe-RL task (see the module docstring)."""

    horizon: int = 200
    x_safe: float = 1.0
    theta_safe: float = math.radians(8.0)
    budget: float = 0.05
    heterogeneity: float = 0.5
    hidden: int = 0  # 0: linear softmax policy; > 0: one tanh hidden layer of this width
    eval_episodes: int = 32
    # Defaults: the paper's TRPO-based setting, which hetfed reproduce safe-rl-trpo evaluates.
    fall_cost: bool = True  # a fall costs the steps left to the horizon
    advantage: str = "gae"  # or "reward-to-go" (plain REINFORCE weights)
    gae_lambda: float = 1.0  # 1: reward-to-go minus the fitted baseline, without bootstrapping bias
    trust_region: float = 0.01  # KL radius of a natural-gradient local step; 0: plain gradient steps
    instance_seed: int | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.horizon, int) and self.horizon >= 1,
            "horizon",
            f"must be a positive integer, got {self.horizon!r}",
        )
        require(self.x_safe > 0, "x_safe", f"must be positive, got {self.x_safe!r}")
        require(self.theta_safe > 0, "theta_safe", f"must be positive (radians), got {self.theta_safe!r}")
        require(
            0 <= self.budget <= 1, "budget", f"is a fraction of the horizon in [0, 1], got {self.budget!r}"
        )
        require(
            0 <= self.heterogeneity <= 1.5,
            "heterogeneity",
            f"must be in [0, 1.5] (factors exp(+-h)), got {self.heterogeneity!r}",
        )
        require(
            isinstance(self.hidden, int) and self.hidden >= 0,
            "hidden",
            f"must be a non-negative integer, got {self.hidden!r}",
        )
        require(
            isinstance(self.fall_cost, bool), "fall_cost", f"must be true or false, got {self.fall_cost!r}"
        )
        require(
            self.advantage in ADVANTAGES,
            "advantage",
            f"must be one of {list(ADVANTAGES)}, got {self.advantage!r}",
        )
        require(0 <= self.gae_lambda <= 1, "gae_lambda", f"must be in [0, 1], got {self.gae_lambda!r}")
        require(self.trust_region >= 0, "trust_region", f"must be >= 0, got {self.trust_region!r}")
        require(
            isinstance(self.eval_episodes, int) and self.eval_episodes >= 1,
            "eval_episodes",
            f"must be a positive integer, got {self.eval_episodes!r}",
        )


@dataclass(frozen=True)
class CartPolePhysics:
    """The CartPole parameters a client changes (gymnasium defaults: 0.5, 0.1, 1.0, 10.0)."""

    length: float = 0.5  # half the pole's length, m
    masspole: float = 0.1  # kg
    masscart: float = 1.0  # kg
    force_mag: float = 10.0  # N

    def apply(self, env: CartPoleVectorEnv) -> None:
        """Set the parameters on ``env``, including the two that gymnasium derives from them."""
        for name in PHYSICS_FIELDS:
            setattr(env, name, getattr(self, name))
        env.total_mass = self.masspole + self.masscart
        env.polemass_length = self.masspole * self.length


def client_physics(
    partition_id: int, num_partitions: int, heterogeneity: float, instance_seed: int
) -> CartPolePhysics:
    """Client ``partition_id``'s physics under the rule of the module docstring."""
    check_partition(partition_id, num_partitions)
    rng = np.random.default_rng([instance_seed, 0])
    levels = -1 + (2 * np.arange(num_partitions) + 1) / num_partitions
    # One independent permutation per parameter, so the parameters are not all large together.
    level = {name: levels[rng.permutation(num_partitions)[partition_id]] for name in PHYSICS_FIELDS}
    base = CartPolePhysics()
    return CartPolePhysics(
        **{name: getattr(base, name) * math.exp(heterogeneity * level[name]) for name in PHYSICS_FIELDS}
    )


@dataclass(frozen=True)
class Episodes:
    """N episodes padded to T steps; entries with ``mask`` false are after the episode ended.

    ``obs[t]`` is the observation the action ``actions[t]`` was taken in; ``next_obs[t]``
    the one it led to, on which ``costs[t]`` is computed.
    """

    obs: torch.Tensor  # [T, N, 4] float32
    actions: torch.Tensor  # [T, N] int64
    rewards: torch.Tensor  # [T, N] float32
    costs: torch.Tensor  # [T, N] float32
    next_obs: torch.Tensor  # [T, N, 4] float32
    mask: torch.Tensor  # [T, N] bool

    @property
    def num_episodes(self) -> int:
        return int(self.mask.shape[1])


def make_model(seed: int, **params: Any) -> torch.nn.Module:
    """Softmax policy logits: ``Linear(4, 2)`` or ``4 -> hidden (tanh) -> 2`` (PyTorch default init)."""
    config = parse_params(SafeRLConfig, params)
    if config.hidden == 0:
        return seeded_model(lambda: torch.nn.Linear(OBS_DIM, NUM_ACTIONS), seed)
    return seeded_model(
        lambda: torch.nn.Sequential(
            torch.nn.Linear(OBS_DIM, config.hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(config.hidden, NUM_ACTIONS),
        ),
        seed,
    )


def safety_cost(next_obs: np.ndarray, x_safe: float, theta_safe: float) -> np.ndarray:
    """1 where the reached state leaves the safe zone (|x| > x_safe or |theta| > theta_safe), else 0."""
    return ((np.abs(next_obs[..., 0]) > x_safe) | (np.abs(next_obs[..., 2]) > theta_safe)).astype(np.float32)


def rollout(
    policy: torch.nn.Module,
    physics: CartPolePhysics,
    config: SafeRLConfig,
    rng: np.random.Generator,
    num_episodes: int,
) -> Episodes:
    """``num_episodes`` parallel episodes of the stochastic policy; all randomness from ``rng``.

    With ``config.fall_cost`` the step on which an episode falls (terminates before the
    horizon) also carries the cost of the ``H - t - 1`` steps left.
    """
    env = CartPoleVectorEnv(num_envs=num_episodes, max_episode_steps=config.horizon)
    physics.apply(env)
    obs, _ = env.reset(seed=int(rng.integers(2**31)))
    alive = np.ones(num_episodes, dtype=bool)
    steps: list[tuple[np.ndarray, ...]] = []
    with torch.no_grad():
        while alive.any():
            prob_right = torch.softmax(policy(torch.from_numpy(obs)), dim=-1)[:, 1].numpy()
            action = (rng.random(num_episodes) < prob_right).astype(np.int64)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            cost = safety_cost(next_obs, config.x_safe, config.theta_safe)
            if config.fall_cost:
                left = config.horizon - len(steps) - 1  # steps after this one, to the horizon
                cost = cost + np.where(terminated & alive, left, 0).astype(np.float32)
            steps.append((obs, action, reward, cost, next_obs, alive.copy()))
            alive &= ~(terminated | truncated)  # the env auto-resets afterwards; those steps are masked out
            obs = next_obs
    env.close()
    obs_t, act_t, rew_t, cost_t, next_t, mask_t = (
        torch.from_numpy(np.stack(column)) for column in zip(*steps, strict=True)
    )
    return Episodes(obs_t, act_t, rew_t, cost_t, next_t, mask_t)


def value_features(episodes: Episodes, horizon: int) -> torch.Tensor:
    """Features of (s_t, t) for the value baseline: s, s^2, t/H, (t/H)^2, (t/H)^3, 1; [T, N, 12]."""
    steps, n = episodes.mask.shape
    t = (torch.arange(steps, dtype=torch.float64) / horizon)[:, None, None].expand(steps, n, 1)
    obs = episodes.obs.double()
    return torch.cat([obs, obs**2, t, t**2, t**3, torch.ones_like(t)], dim=-1)


def value_baseline(episodes: Episodes, to_go: torch.Tensor, horizon: int) -> torch.Tensor:
    """V(s_t, t) [T, N]: the least-squares fit of ``to_go`` on :func:`value_features` over the live
    steps (ridge 1e-6 for the columns a short batch cannot tell apart); 0 on masked steps."""
    x = value_features(episodes, horizon)
    live = episodes.mask
    xs, ys = x[live], to_go.double()[live]
    coef = torch.linalg.solve(xs.T @ xs + 1e-6 * torch.eye(xs.shape[1], dtype=xs.dtype), xs.T @ ys)
    return (x @ coef * live).float()


def gae(per_step: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, lam: float) -> torch.Tensor:
    """``A_t = sum_l lam^l (x_{t+l} + V_{t+l+1} - V_{t+l})`` per episode (undiscounted; V = 0 after
    the episode's last step)."""
    next_values = torch.cat([values[1:] * mask[1:], torch.zeros_like(values[:1])])
    delta = (per_step + next_values - values) * mask
    advantages = torch.zeros_like(delta)
    running = torch.zeros_like(delta[0])
    for t in range(delta.shape[0] - 1, -1, -1):
        running = delta[t] + lam * running * mask[t]
        advantages[t] = running
    return advantages


def score_function_estimate(
    policy: torch.nn.Module,
    episodes: Episodes,
    per_step: torch.Tensor,
    horizon: int,
    advantage: str = "reward-to-go",
    lam: float = 1.0,
) -> torch.Tensor:
    """Value ``sum_t per_step_t / H`` averaged over episodes, with the policy gradient of the module
    docs (weights: reward-to-go, or GAE over a fitted value baseline).

    ``per_step`` [T, N] is the per-step quantity (e.g. -reward or cost); masked steps are ignored.
    """
    per_step = per_step * episodes.mask
    to_go = per_step.flip(0).cumsum(0).flip(0)
    weights = to_go
    if advantage == "gae":
        weights = gae(per_step, value_baseline(episodes, to_go, horizon), episodes.mask, lam)
    log_prob = (
        torch.log_softmax(policy(episodes.obs), dim=-1).gather(-1, episodes.actions.unsqueeze(-1)).squeeze(-1)
    )
    scale = 1.0 / (episodes.num_episodes * horizon)
    surrogate = (log_prob * weights * episodes.mask).sum() * scale
    return per_step.sum() * scale + surrogate - surrogate.detach()


@dataclass
class SafeRLTask:
    """One client's CMDP: its physics and the shared cost definition."""

    name: str
    partition_id: int
    seed: int
    config: SafeRLConfig
    physics: CartPolePhysics
    eval_seed: int

    def make_model(self) -> torch.nn.Module:
        return make_model(self.seed, hidden=self.config.hidden)

    def sample_batch(self, rng: np.random.Generator, size: int, model: torch.nn.Module) -> Episodes:
        """``size`` fresh on-policy episodes of ``model``."""
        return rollout(model, self.physics, self.config, rng, check_batch_size(size))

    @property
    def trust_region(self) -> float:
        """KL radius of the client's natural-gradient local steps (0: plain gradient steps)."""
        return self.config.trust_region

    def estimate(self, model: torch.nn.Module, batch: Episodes, per_step: torch.Tensor) -> torch.Tensor:
        c = self.config
        return score_function_estimate(model, batch, per_step, c.horizon, c.advantage, c.gae_lambda)

    def f(self, model: torch.nn.Module, batch: Episodes) -> torch.Tensor:
        return self.estimate(model, batch, -batch.rewards)

    def g(self, model: torch.nn.Module, batch: Episodes) -> torch.Tensor:
        return self.estimate(model, batch, batch.costs) - self.config.budget

    def kl_from(self, model: torch.nn.Module, batch: Episodes) -> Callable[[], torch.Tensor]:
        """``KL(pi_now || pi_model)`` averaged over the batch's live states, as ``model`` moves from now."""
        with torch.no_grad():
            old = torch.log_softmax(model(batch.obs), dim=-1)
        mask = batch.mask.float()

        def kl() -> torch.Tensor:
            new = torch.log_softmax(model(batch.obs), dim=-1)
            return ((old.exp() * (old - new)).sum(-1) * mask).sum() / mask.sum()

        return kl

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """f, g, mean return, mean episode cost and length over ``eval_episodes`` episodes.

        The episodes use a fixed per-client seed (common random numbers), so two models
        are compared on the same initial states and action noise.
        """
        episodes = rollout(
            model, self.physics, self.config, np.random.default_rng(self.eval_seed), self.config.eval_episodes
        )
        ret = float((episodes.rewards * episodes.mask).sum(0).mean())
        cost = float((episodes.costs * episodes.mask).sum(0).mean())
        horizon = self.config.horizon
        return {
            "f": -ret / horizon,
            "g": cost / horizon - self.config.budget,
            "return": ret,
            "cost": cost,
            "episode_length": float(episodes.mask.sum(0).float().mean()),
        }


def load_client(partition_id: int, num_partitions: int, seed: int, **params: Any) -> SafeRLTask:
    """Client ``partition_id`` of ``num_partitions``; needs no data, only its physics."""
    check_partition(partition_id, num_partitions)
    config = parse_params(SafeRLConfig, params)
    instance_seed = seed if config.instance_seed is None else config.instance_seed
    physics = client_physics(partition_id, num_partitions, config.heterogeneity, instance_seed)
    eval_seed = int(np.random.default_rng([instance_seed, _EVAL_STREAM, partition_id]).integers(2**63))
    return SafeRLTask(f"client-{partition_id}", partition_id, seed, config, physics, eval_seed)
