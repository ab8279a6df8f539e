"""Shortest paths on a k x k grid with PyEPO's features-to-cost law, one route per client.

Client j routes one unit from its source to its sink over the grid's ``d = 2k(k-1)`` edges,
``min_{w in S_j} c'w`` with ``S_j`` = the flow polytope of :class:`hetfed.problems.polytope.GridFlowPolytope`
(docs/algorithms.md 1.2; edges oriented source -> sink, LP by dynamic program, projection by
DAQP). Generative law::

    B      ~ Bernoulli(0.5)^{d x p}                                             (shared, PyEPO's B)
    x      ~ N(0, I_p)
    c_e    = m_{j,e} ((B x / sqrt(p) + 3)_e^deg + 1) / 3.5^deg * eps_e,  eps_e ~ U[1 - noise, 1 + noise]

PyEPO's ``shortestpath.genData`` is the case ``m = 1``, source top-left, sink bottom-right.
The clients differ in two ways:

* **source and sink** (``endpoints``): ``"corners"`` every client goes top-left -> bottom-right
  (PyEPO); ``"diagonals"`` client j takes diagonal ``j mod 4`` of (top-left -> bottom-right,
  bottom-right -> top-left, top-right -> bottom-left, bottom-left -> top-right); ``"random"`` client j
  draws its own source and sink with Manhattan distance >= k - 1. The edge slots are the same for
  every client, so one model predicts every client's costs; edges outside a client's
  source-sink rectangle carry no flow.
* **terrain** (``terrain`` = t >= 0): ``m_{j,e} = exp(t h_j(e))`` with
  ``h_j(e) = sum_{b=1,2} s_b exp(-||mid(e) - z_b||^2 / (2 (k/4)^2))`` at the edge's midpoint, one
  hill (``s = +1``, dearer) and one valley (``s = -1``, cheaper) at uniform random grid positions
  ``z_b``: a region of client j's map the features know nothing about. ``t = 0`` gives ``m = 1``.

Random streams: the shared B from ``SeedSequence([seed])``; client j's route and terrain from
``SeedSequence([seed, 1 + j])`` and its samples from ``SeedSequence([seed, 1 + j, 1])``, so a client
generates only its own data, independent of the number of clients. Features are z-scored with the
client's own training statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetfed.problem_params import ShortestPathParams  # the run config's shortest-path keys, typed
from hetfed.problems.base import DecisionClientData, generated_client


@dataclass(frozen=True)
class RouteLaw:
    """Client j's route and terrain: everything except the sampled features and noise."""

    source: tuple[int, int]
    sink: tuple[int, int]
    terrain: np.ndarray  # [d] multipliers m_{j,e}


def edge_midpoints(k: int) -> np.ndarray:
    """``[d, 2]`` (row, col) midpoints of the edges in GridFlowPolytope's slot order
    (horizontal edges row-major, then vertical edges row-major)."""
    horizontal = [(r, c + 0.5) for r in range(k) for c in range(k - 1)]
    vertical = [(r + 0.5, c) for r in range(k - 1) for c in range(k)]
    return np.array(horizontal + vertical)


def shared_matrix(params: ShortestPathParams, seed: int) -> np.ndarray:
    """PyEPO's ``B ~ Bernoulli(0.5)^{d x p}``, shared by every client."""
    rng = np.random.default_rng(np.random.SeedSequence([seed]))
    return rng.binomial(1, 0.5, size=(params.num_edges, params.num_features)).astype(np.float64)


def endpoints_of(params: ShortestPathParams, partition_id: int, rng: np.random.Generator) -> tuple:
    """Client ``partition_id``'s (source, sink) under ``params.endpoints`` (see the module docstring)."""
    last = params.grid_size - 1
    if params.endpoints == "corners":
        return (0, 0), (last, last)
    if params.endpoints == "diagonals":
        diagonals = (
            ((0, 0), (last, last)),
            ((last, last), (0, 0)),
            ((0, last), (last, 0)),
            ((last, 0), (0, last)),
        )
        return diagonals[partition_id % 4]
    while True:  # "random": rejection keeps the route at least k - 1 steps long
        source, sink = (tuple(int(v) for v in rng.integers(0, params.grid_size, 2)) for _ in range(2))
        if abs(source[0] - sink[0]) + abs(source[1] - sink[1]) >= last:
            return source, sink


def route_law(params: ShortestPathParams, seed: int, partition_id: int) -> RouteLaw:
    """Client ``partition_id``'s source, sink and terrain multipliers ``m_j = exp(t h_j)``."""
    if partition_id < 0:
        raise ValueError(f"shortest-path partition_id must be >= 0, got {partition_id}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 + partition_id]))
    source, sink = endpoints_of(params, partition_id, rng)
    k = params.grid_size
    centres = rng.uniform(0, k - 1, size=(2, 2))  # drawn whatever t is, so t only rescales the field
    mid = edge_midpoints(k)
    width = k / 4
    field = sum(
        sign * np.exp(-((mid - centre) ** 2).sum(1) / (2 * width**2))
        for sign, centre in zip((1.0, -1.0), centres, strict=True)
    )
    return RouteLaw(source, sink, np.exp(params.terrain * field))


def sample_costs(
    B: np.ndarray, law: RouteLaw, params: ShortestPathParams, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` features x [n, p] ~ N(0, I) and costs c [n, d] by the law of the module docstring."""
    p, deg = params.num_features, params.degree
    x = rng.standard_normal((n, p))
    base = ((x @ B.T / np.sqrt(p) + 3.0) ** deg + 1.0) / 3.5**deg
    eps = rng.uniform(1.0 - params.noise, 1.0 + params.noise, size=base.shape)
    return x, law.terrain * base * eps


def load_client(params: ShortestPathParams, seed: int, partition_id: int) -> DecisionClientData:
    """Generate client ``partition_id``'s train/val/test data and its flow polytope."""
    from hetfed.problems.polytope import GridFlowPolytope  # lazy: pulls in the solvers

    law = route_law(params, seed, partition_id)
    B = shared_matrix(params, seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 + partition_id, 1]))
    splits = [sample_costs(B, law, params, n, rng) for n in (params.n_train, params.n_val, params.n_test)]
    return generated_client(partition_id, splits, GridFlowPolytope(params.grid_size, law.source, law.sink))
