"""Independent NumPy reference of federated LSA (docs/algorithms.md section 3), for the tests and
bench/pflsa.py.

N agents solve ``A_bar_c theta = b_bar_c`` from samples. An *oracle* returns one draw for
every agent: ``A`` [N, d, d] and ``b`` [N, d] (each the mean of ``batch`` samples).
With ``g_c = A_c theta_c - b_c`` evaluated on agent c's own draw:

* single-agent LSA: ``theta_c <- theta_c - eta g_c`` (no communication);
* PF-LSA: ``theta_c <- theta_c - eta beta g_c - eta (1 - beta) mean_c' g_c'``;
* FedLSA: H local LSA steps from the shared theta, then ``theta <- mean_c theta_c``;
* SCAFFLSA: H local steps ``theta_c <- theta_c - eta (g_c - xi_c)``, then
  ``theta <- mean_c theta_c`` and ``xi_c <- xi_c + (theta - theta_c) / (eta H)``;
  at the fixed point ``theta = theta_lim`` and ``xi_c = A_bar_c (theta_lim - theta_c*)``.

Every algorithm draws from the oracle once per local iteration, in this order.
Run ``python bench/lsa_reference.py`` to print the Garnet measurements of the spec.

A missing agent (hetfed's extension, not the papers'; ``missing`` = (round, agent) pairs,
rounds 1-based) sits the round out and its last reply stands in for it:

* PF-LSA (round = iteration t): ``g_c^t = g_c^{t-1}`` in the mean, and theta_c does not move in
  iteration t (its next step starts from theta_c^{t-1} with its own g_c^{t-1});
* FedLSA / SCAFFLSA (round r): its local parameter is ``theta^{r-1} + delta_c``, ``delta_c`` the
  local step ``theta_c^{k,H} - theta^{k-1}`` of the last round k it took part in; SCAFFLSA updates
  its xi_c with that stand-in like every other agent's.

An agent missing before it ever replied has no last reply: ValueError.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from hetfed.problems.garnet import GarnetAgent, make_agents

Oracle = Callable[[], tuple[np.ndarray, np.ndarray]]


def exact_oracle(a_bar: np.ndarray, b_bar: np.ndarray) -> Oracle:
    """Noise-free oracle: always returns the exact means ``A_bar`` [N, d, d], ``b_bar`` [N, d]."""
    return lambda: (a_bar, b_bar)


def garnet_oracle(agents: Sequence[GarnetAgent], rng: np.random.Generator, batch: int = 1) -> Oracle:
    """TD(0) oracle: for every agent, the mean over ``batch`` fresh (s ~ mu_c, s' ~ P_c(s, .)) of
    ``A(Z) = phi(s)(phi(s) - gamma phi(s'))'`` and ``b(Z) = r_c(s) phi(s)``, all agents from ``rng``.

    Vectorised over agents and sampled independently of ``GarnetAgent.sample`` (a cross-check of
    it); its numbers are not those of any client's own stream, see :func:`per_agent_oracle`.
    """
    phi = agents[0].features
    gamma = agents[0].gamma
    mu_cdf = np.cumsum([agent.mu for agent in agents], axis=1)  # [N, S]
    p_cdf = np.cumsum([agent.kernel for agent in agents], axis=2)  # [N, S, S]
    rewards = np.array([agent.rewards for agent in agents])  # [N, S]
    n_agents, n_states = rewards.shape
    rows = np.arange(n_agents)[:, None]

    def draw() -> tuple[np.ndarray, np.ndarray]:
        # inverse CDF; min() guards against cdf[-1] = 1 - 1e-16 < u
        s = np.minimum((rng.random((n_agents, batch, 1)) >= mu_cdf[:, None, :]).sum(-1), n_states - 1)
        u = rng.random((n_agents, batch, 1))
        s_next = np.minimum((u >= p_cdf[rows, s]).sum(-1), n_states - 1)
        phi_s, phi_next = phi[s], phi[s_next]  # [N, batch, d]
        a = np.einsum("nbi,nbj->nij", phi_s, phi_s - gamma * phi_next) / batch
        b = np.einsum("nb,nbi->ni", rewards[rows, s], phi_s) / batch
        return a, b

    return draw


def per_agent_oracle(
    agents: Sequence[GarnetAgent], rngs: Sequence[np.random.Generator], batch: int = 1
) -> Oracle:
    """Agent c draws with ``agents[c].sample(rngs[c], batch)``: the same stream a client calling
    ``agent.g(theta, rng, batch)`` once per local iteration consumes, so a federated run whose
    clients hold these generators can be compared with the reference up to round-off.
    """
    if len(rngs) != len(agents):
        raise ValueError(f"rngs must hold one generator per agent ({len(agents)}); got {len(rngs)}")

    def draw() -> tuple[np.ndarray, np.ndarray]:
        samples = [agent.sample(rng, batch) for agent, rng in zip(agents, rngs, strict=True)]
        return np.array([a.mean(axis=0) for a, _ in samples]), np.array([b.mean(axis=0) for _, b in samples])

    return draw


def _residuals(oracle: Oracle, thetas: np.ndarray) -> np.ndarray:
    """``g_c = A_c theta_c - b_c`` for every agent on one fresh draw; thetas [N, d] -> [N, d]."""
    a, b = oracle()
    return np.einsum("nij,nj->ni", a, thetas) - b


def single_lsa(oracle: Oracle, theta0: np.ndarray, eta: float, n_iter: int) -> np.ndarray:
    """Each agent alone: ``theta_c <- theta_c - eta g_c``. Returns thetas [n_iter + 1, N, d]."""
    return pflsa(oracle, theta0, eta, 1.0, n_iter)


def pflsa(
    oracle: Oracle,
    theta0: np.ndarray,
    eta: float,
    beta: float,
    n_iter: int,
    missing: Collection[tuple[int, int]] = (),
) -> np.ndarray:
    """PF-LSA: ``theta_c <- theta_c - eta beta g_c - eta (1 - beta) mean(g)``. Returns [n_iter + 1, N, d].

    ``thetas[t - 1]`` is the parameter iteration t evaluates its residual at; with ``missing``
    (iteration, agent) pairs, the rule of the module docs.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1]; got {beta}")
    thetas = np.empty((n_iter + 1, *np.shape(theta0)))
    thetas[0] = theta0
    g_last: np.ndarray | None = None
    for t in range(n_iter):
        g = _residuals(oracle, thetas[t])
        for c in _absent(missing, t + 1):
            if g_last is None:
                raise ValueError(f"agent {c} misses iteration 1: it has no earlier update")
            g[c] = g_last[c]
        thetas[t + 1] = thetas[t] - eta * beta * g - eta * (1.0 - beta) * g.mean(axis=0)
        for c in _absent(missing, t + 2):  # it sits out iteration t + 2: it does not move
            thetas[t + 1, c] = thetas[t, c]
        g_last = g
    return thetas


def _absent(missing: Collection[tuple[int, int]], server_round: int) -> list[int]:
    """The agents missing in ``server_round``."""
    return sorted(c for r, c in missing if r == server_round)


def fedlsa(
    oracle: Oracle,
    theta0: np.ndarray,
    eta: float,
    n_local: int,
    n_rounds: int,
    n_agents: int,
    missing: Collection[tuple[int, int]] = (),
) -> np.ndarray:
    """FedLSA: H = ``n_local`` local LSA steps from the shared theta, then averaging.

    Returns the shared theta after each round, [n_rounds + 1, d] (round r ends at iteration r H).
    ``missing``: (round, agent) pairs, the rule of the module docs.
    """
    shared, _ = _rounds(
        oracle,
        theta0,
        eta,
        n_local,
        n_rounds,
        np.zeros((n_agents, np.size(theta0))),
        update_xi=False,
        missing=missing,
    )
    return shared


def scafflsa(
    oracle: Oracle,
    theta0: np.ndarray,
    eta: float,
    n_local: int,
    n_rounds: int,
    xi0: np.ndarray,
    missing: Collection[tuple[int, int]] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """SCAFFLSA from control variates ``xi0`` [N, d] (zeros in the paper).

    Returns the shared theta after each round [n_rounds + 1, d] and the final xi [N, d].
    ``missing``: (round, agent) pairs, the rule of the module docs.
    """
    return _rounds(oracle, theta0, eta, n_local, n_rounds, xi0, update_xi=True, missing=missing)


def _rounds(
    oracle: Oracle,
    theta0: np.ndarray,
    eta: float,
    n_local: int,
    n_rounds: int,
    xi0: np.ndarray,
    update_xi: bool,
    missing: Collection[tuple[int, int]] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Rounds of H local steps on ``g_c - xi_c`` then averaging; xi frozen unless ``update_xi``.

    An agent of ``missing`` repeats its last local step (the module docs).
    """
    shared = np.empty((n_rounds + 1, np.size(theta0)))
    shared[0] = theta0
    xi = np.array(xi0, dtype=float)
    delta = np.full(xi.shape, np.nan)  # each agent's last local step
    for r in range(n_rounds):
        local = np.broadcast_to(shared[r], xi.shape).copy()
        for _ in range(n_local):
            local -= eta * (_residuals(oracle, local) - xi)
        absent = _absent(missing, r + 1)
        for c in range(len(local)):
            if c not in absent:
                delta[c] = local[c] - shared[r]
            elif np.isnan(delta[c]).any():
                raise ValueError(f"agent {c} misses round {r + 1}: it has no earlier update")
            else:
                local[c] = shared[r] + delta[c]
        shared[r + 1] = local.mean(axis=0)
        if update_xi:
            xi += (shared[r + 1] - local) / (eta * n_local)
    return shared, xi


def theta_lim(a_bar: np.ndarray, b_bar: np.ndarray) -> np.ndarray:
    """FedLSA's limit for H = 1: ``(sum_c A_bar_c)^{-1} sum_c b_bar_c``."""
    return np.linalg.solve(a_bar.sum(axis=0), b_bar.sum(axis=0))


def mean_sq_error(thetas: np.ndarray, theta_star: np.ndarray) -> np.ndarray:
    """``(1/N) sum_c ||theta_c - theta_c*||^2`` along the trajectory.

    ``thetas`` is [T, N, d] (one parameter per agent) or [T, d] (one shared parameter).
    """
    if thetas.ndim == 2:
        thetas = thetas[:, None, :]
    return np.sum((thetas - theta_star) ** 2, axis=-1).mean(axis=-1)


def iterations_to_fraction(errors: np.ndarray, fraction: float = 1e-2) -> int | None:
    """First t with ``errors[t] <= fraction * errors[0]`` (None if never reached)."""
    hits = np.flatnonzero(errors <= fraction * errors[0])
    return int(hits[0]) if hits.size else None


def stacked(agents: Sequence[GarnetAgent]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A_bar`` [N, d, d], ``b_bar`` [N, d], ``theta_star`` [N, d] of the agents."""
    return (
        np.array([a.A_bar for a in agents]),
        np.array([a.b_bar for a in agents]),
        np.array([a.theta_star for a in agents]),
    )


# ---------------------------------------------------------------------------
# The measurements the method's specification reports for PF-LSA (gamma 0.95, theta^0 = 0, seed 42).


def fig1_errors(
    seed: int,
    zeta: float,
    n_iter: int,
    n_runs: int,
    n_agents: int = 10,
    n_local: int = 1,
    eta_single: float = 0.2,
) -> dict[str, np.ndarray]:
    """Mean-over-runs error curves of Fig. 1 at ``zeta_ker = zeta_rew = zeta``.

    Step sizes: single ``eta_single``, PF-LSA ``eta_single N / 2`` with beta = 1/N, FedLSA
    ``eta_single N`` (FedLSA's curve is sampled at the end of each round, every H iterations).
    """
    agents = make_agents(n_agents, seed, zeta, zeta)
    _, _, star = stacked(agents)
    theta0 = np.zeros_like(star)
    curves: dict[str, list[np.ndarray]] = {"single": [], "pflsa": [], "fedlsa": []}
    for run in range(n_runs):
        rng = np.random.default_rng([seed, run])
        oracle = garnet_oracle(agents, rng)
        curves["single"].append(mean_sq_error(single_lsa(oracle, theta0, eta_single, n_iter), star))
        pf = pflsa(oracle, theta0, eta_single * n_agents / 2, 1.0 / n_agents, n_iter)
        curves["pflsa"].append(mean_sq_error(pf, star))
        fed = fedlsa(oracle, theta0[0], eta_single * n_agents, n_local, n_iter // n_local, n_agents)
        curves["fedlsa"].append(mean_sq_error(fed, star))
    return {name: np.mean(c, axis=0) for name, c in curves.items()}


def speedup(
    seed: int,
    n_agents: int,
    zeta_ker: float,
    zeta_rew: float,
    n_runs: int,
    n_iter: int = 6000,
    eta_single: float = 0.2,
    eta_per_agent: float = 0.1,
) -> tuple[int | None, int | None]:
    """Iterations for the run-averaged error to reach 1e-2 of its start: (single-agent, PF-LSA).

    Fig. 2: PF-LSA with eta = ``eta_per_agent`` N and beta = 1/N; single-agent LSA with ``eta_single``.
    """
    agents = make_agents(n_agents, seed, zeta_ker, zeta_rew)
    _, _, star = stacked(agents)
    theta0 = np.zeros_like(star)
    single, pf = [], []
    for run in range(n_runs):
        oracle = garnet_oracle(agents, np.random.default_rng([seed, run]))
        single.append(mean_sq_error(single_lsa(oracle, theta0, eta_single, n_iter), star))
        pf_thetas = pflsa(oracle, theta0, eta_per_agent * n_agents, 1.0 / n_agents, n_iter)
        pf.append(mean_sq_error(pf_thetas, star))
    return iterations_to_fraction(np.mean(single, axis=0)), iterations_to_fraction(np.mean(pf, axis=0))


def spectral_radii(seed: int, n_agents: int, zeta: float, eta: float, beta: float) -> dict[str, float]:
    """Spectral radius of the noise-free iteration of each method (< 1 means stable in the mean)."""
    a_bar, _, _ = stacked(make_agents(n_agents, seed, zeta, zeta))
    d = a_bar.shape[1]
    eye = np.eye(d)
    # PF-LSA on the stacked error e [N d]:
    # e <- (I - eta beta blockdiag(A_c) - eta (1 - beta) (1/N) 1 (A_1 .. A_N)) e
    block = np.kron(np.eye(n_agents), eye) - eta * beta * _block_diag(a_bar)
    block -= eta * (1.0 - beta) / n_agents * np.tile(np.hstack(list(a_bar)), (n_agents, 1))
    fed = np.mean([eye - eta * a for a in a_bar], axis=0)
    return {"pflsa": _rho(block), "fedlsa_H1": _rho(fed), "single": max(_rho(eye - eta * a) for a in a_bar)}


def _block_diag(blocks: np.ndarray) -> np.ndarray:
    n, d, _ = blocks.shape
    out = np.zeros((n * d, n * d))
    for c in range(n):
        out[c * d : (c + 1) * d, c * d : (c + 1) * d] = blocks[c]
    return out


def _rho(matrix: np.ndarray) -> float:
    return float(np.max(np.abs(np.linalg.eigvals(matrix))))


def main(seed: int = 42, n_runs: int = 5) -> None:
    print(f"Garnet (S=10, d=5, A=10, b=3, gamma=0.95), seed {seed}, theta0 = 0, {n_runs} runs\n")
    print("Stability (spectral radius of the mean iteration, N=10, Fig. 1 steps; Fig. 2 steps):")
    for zeta in (0.0, 0.5, 1.0):
        r1 = spectral_radii(seed, 10, zeta, 0.2 * 10 / 2, 0.1)
        r_single = spectral_radii(seed, 10, zeta, 0.2, 1.0)["single"]
        r_fed = spectral_radii(seed, 10, zeta, 0.2 * 10, 0.1)["fedlsa_H1"]
        r2 = [spectral_radii(seed, n, zeta, 0.1 * n, 1.0 / n)["pflsa"] for n in (2, 8, 16)]
        print(
            f"  zeta={zeta}: single {r_single:.4f}, PF-LSA {r1['pflsa']:.4f}, FedLSA {r_fed:.4f}; "
            f"Fig. 2 PF-LSA N=2/8/16 " + "/".join(f"{r:.4f}" for r in r2)
        )
    # PF-LSA's personal part contracts at eta beta lambda_min(A_bar_c) ~ 2e-4 per iteration: the noise
    # floor needs ~2e4 iterations; the first 6e3 still carry the transient.
    n_iter, tail = 20000, 5000
    print(f"\nFig. 1 (N=10), mean error over iterations {n_iter - tail}..{n_iter} (and 4000..6000):")
    for zeta, spec_fed, spec_pf in ((0.5, 10.5, 0.33), (1.0, 41.1, 0.44)):
        curves = fig1_errors(seed, zeta, n_iter, n_runs)
        fed, pf, single = (curves[k] for k in ("fedlsa", "pflsa", "single"))
        print(
            f"  zeta_ker=zeta_rew={zeta}: FedLSA {fed[-tail:].mean():.2f} ({fed[4000:6000].mean():.2f}) "
            f"spec {spec_fed}; PF-LSA {pf[-tail:].mean():.3f} ({pf[4000:6000].mean():.3f}) spec {spec_pf}; "
            f"single {single[-tail:].mean():.3f}; max error over the runs "
            f"{max(c.max() for c in curves.values()):.0f} (finite: stable)"
        )
    curves = fig1_errors(seed, 0.0, 3000, n_runs)
    it_pf, it_single = iterations_to_fraction(curves["pflsa"]), iterations_to_fraction(curves["single"])
    print(
        f"  (0,0) iterations to 1e-2 of the initial error: PF-LSA {it_pf} (spec 252), "
        f"single {it_single} (spec 1275)"
    )
    spec = {(0.0, 0.0): (1.0, 3.9, 8.0), (0.9, 0.9): (0.97, 2.2, 3.4)}
    print("\nFig. 2 speed-up (single iterations / PF-LSA iterations to 1e-2), eta = 0.1 N, beta = 1/N:")
    for zetas in ((0.0, 0.0), (0.01, 0.01), (0.5, 0.5), (0.9, 0.9)):
        cells = []
        for n in (2, 8, 16):
            it_single, it_pf = speedup(seed, n, *zetas, n_runs)
            ratio = it_single / it_pf if it_single and it_pf else float("nan")
            cells.append(f"N={n}: {ratio:.2f} ({it_single}/{it_pf})")
        print(f"  {zetas}: " + ", ".join(cells) + (f"   spec {spec[zetas]}" if zetas in spec else ""))


if __name__ == "__main__":
    main()
