"""The expected error of federated LSA on a finite-state TD(0) problem, computed exactly (no sampling).

N agents iterate with one fresh sample Z_c^t each (independent, as hetfed's clients draw them):
theta_c <- theta_c - eta sum_j W_cj g_j, g_j = A_j(Z_j) theta_j - b_j(Z_j), W = beta I + (1 - beta) 11'/N
(beta in (0, 1): PF-LSA; 1: single-agent LSA; 0 from a common start: FedLSA with one local step).
With e_c = theta_c - theta_c* and the mean-zero noise eps_c(Z) = A_c(Z) theta_c* - b_c(Z), the moments
m = E e and S = E e e' [N d, N d] follow a closed linear recursion (M = W blockdiag(Abar_c)):

    m' = m - eta M m,
    S' = S - eta (M S + S M') + eta^2 (M S M' + W blockdiag_c(V_c) W'),
    V_c = E[A_c S_cc A_c'] - Abar_c S_cc Abar_c' + E[A_c m_c eps_c'] + E[eps_c m_c' A_c'] + E[eps_c eps_c'],

the expectations over the finite law of one sample (GarnetAgent.transitions). trace(S)/N is the mean
error over infinitely many runs; when rho(I - eta M) < 1, S -> S_inf, the noise floor trace(S_inf)/N.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.linalg import block_diag

from hetfed.problems.garnet import GarnetAgent


class LSAMoments:
    """The exact moment recursion of federated LSA with mixing weight ``beta`` and step ``eta``."""

    def __init__(self, agents: Sequence[GarnetAgent], eta: float, beta: float) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must lie in [0, 1]; got {beta}")
        self.n, self.d = len(agents), agents[0].dim
        self.eta, self.beta = float(eta), float(beta)
        n, d = self.n, self.d
        self.theta_star = np.array([a.theta_star for a in agents])  # [N, d]
        self.W = np.kron(beta * np.eye(n) + (1.0 - beta) / n * np.ones((n, n)), np.eye(d))
        self.A_bars = np.array([a.A_bar for a in agents])
        self.M = self.W @ block_diag(*self.A_bars)
        k, x, c = [], [], []
        for agent in agents:
            p, a, b = agent.transitions()
            eps = a @ agent.theta_star - b
            # vec(E[A X A']) = K vec(X), row-major vec: K[(i, l), (j, m)] = E[A_ij A_lm]
            k.append(np.einsum("k,kij,klm->iljm", p, a, a).reshape(d * d, d * d))
            x.append(np.einsum("k,kij,kl->ijl", p, a, eps))  # E[A_ij eps_l]
            c.append(np.einsum("k,ki,kj->ij", p, eps, eps))
        self.K, self.X, self.C = np.array(k), np.array(x), np.array(c)

    def _moduli(self) -> np.ndarray:
        return np.abs(np.linalg.eigvals(np.eye(self.n * self.d) - self.eta * self.M))

    def spectral_radius(self) -> float:
        """rho(I - eta M): the mean contracts iff < 1, by this factor per iteration in the long run."""
        return float(self._moduli().max())

    def contraction(self) -> float:
        """The largest |eigenvalue| of I - eta M below 1: the rate at which the mean reaches its limit
        (at beta = 0 the consensus directions, eigenvalue 1, keep their value)."""
        moduli = self._moduli()
        return float(moduli[moduli < 1.0 - 1e-9].max())

    def noise(self, s: np.ndarray, m: np.ndarray) -> np.ndarray:
        """``blockdiag_c(V_c)`` for second moment ``s`` [N d, N d] and mean ``m`` [N, d]."""
        n, d = self.n, self.d
        blocks = s.reshape(n, d, n, d)[np.arange(n), :, np.arange(n), :]  # the S_cc, [N, d, d]
        cross = np.einsum("cijl,cj->cil", self.X, m)
        v = (
            np.einsum("cab,cb->ca", self.K, blocks.reshape(n, d * d)).reshape(n, d, d)
            - self.A_bars @ blocks @ self.A_bars.transpose(0, 2, 1)
            + cross
            + cross.transpose(0, 2, 1)
            + self.C
        )
        return block_diag(*v)

    def step(self, m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One iteration of the recursion (module docs): (m, S) -> (m', S')."""
        eta, big_m = self.eta, self.M
        ms = big_m @ s
        s_next = s - eta * (ms + ms.T) + eta**2 * (ms @ big_m.T + self.W @ self.noise(s, m) @ self.W.T)
        m_next = m - eta * (big_m @ m.ravel()).reshape(self.n, self.d)
        return m_next, s_next

    def curve(self, iterations: int, every: int = 1) -> np.ndarray:
        """Expected error ``trace(S_t)/N`` at t = 0, every, ..., ``iterations`` from theta^0 = 0 (as runs)."""
        m = -self.theta_star
        s = np.outer(m.ravel(), m.ravel())
        out = [np.trace(s) / self.n]
        for t in range(1, iterations + 1):
            m, s = self.step(m, s)
            if t % every == 0:
                out.append(np.trace(s) / self.n)
        return np.array(out)

    def mean_path(self, iterations: int) -> np.ndarray:
        """E theta_c^t [N, d] after ``iterations`` from theta^0 = 0: noise-free LSA's path."""
        e = -self.theta_star.ravel()
        step = np.linalg.matrix_power(np.eye(self.n * self.d) - self.eta * self.M, iterations)
        return (step @ e).reshape(self.n, self.d) + self.theta_star

    def stationary(self) -> np.ndarray:
        """``S_inf`` [N d, N d], the recursion's fixed point with m = 0 (ValueError if unstable): solves
        (M S + S M') - eta (M S M' + W Q(S) W') = eta W C W', Q(S) = blockdiag(E[A_c S_cc A_c'] -
        Abar_c S_cc Abar_c'), with row-major vec(A X B) = (A kron B') vec(X)."""
        rho = self.spectral_radius()
        if rho >= 1.0:
            raise ValueError(
                f"eta = {self.eta:g}, beta = {self.beta:g}: unstable (spectral radius {rho:.4f})"
            )
        n, d, nd = self.n, self.d, self.n * self.d
        eye = np.eye(nd)
        q = np.zeros((nd * nd, nd * nd))
        for c in range(n):
            idx = ((c * d + np.arange(d))[:, None] * nd + (c * d + np.arange(d))[None, :]).ravel()
            q[np.ix_(idx, idx)] = self.K[c] - np.kron(self.A_bars[c], self.A_bars[c])
        big_m, w = self.M, self.W
        op = (
            np.kron(big_m, eye) + np.kron(eye, big_m) - self.eta * (np.kron(big_m, big_m) + np.kron(w, w) @ q)
        )
        rhs = self.eta * (w @ block_diag(*self.C) @ w.T).ravel()
        s = np.linalg.solve(op, rhs).reshape(nd, nd)
        return (s + s.T) / 2

    def floor(self) -> float:
        """The noise floor ``trace(S_inf)/N``: the expected error the iteration settles at."""
        return float(np.trace(self.stationary()) / self.n)
