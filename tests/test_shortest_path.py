"""Grid shortest paths (hetfed.problems.shortest_path) against PyEPO's law, brute force and a QP reference;
the registry wiring and the quick reproduction end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.config import validate
from hetfed.problems.polytope import PROJECTION_ACCURACY, GridFlowPolytope
from hetfed.problems.registry import get_problem
from hetfed.problems.shortest_path import ShortestPathParams, load_client, route_law
from tests.conftest import hetfed_cli, reproduce_quick
from tests.test_polytope import kkt_residual, reference_projection


def pyepo_costs(x: np.ndarray, B: np.ndarray, deg: int, eps: np.ndarray) -> np.ndarray:
    """PyEPO's ``shortestpath.genData`` loop, sample by sample:
    ``((B x / sqrt(p) + 3)^deg + 1) / 3.5^deg * eps``."""
    p = x.shape[1]
    out = np.zeros((x.shape[0], B.shape[0]))
    for i in range(x.shape[0]):
        ci = (np.dot(B, x[i].reshape(p, 1)).T / np.sqrt(p) + 3) ** deg + 1
        ci /= 3.5**deg
        out[i] = ci * eps[i]
    return out


def test_homogeneous_case_is_pyepos_generator() -> None:
    """corners + no terrain: every client's costs are PyEPO's, from its own streams."""
    params = ShortestPathParams(
        grid_size=4,
        num_features=3,
        degree=2,
        noise=0.3,
        terrain=0.0,
        endpoints="corners",
        n_train=50,
        n_val=5,
        n_test=20,
    )
    seed, j = 7, 2
    data = load_client(params, seed, j)
    B = np.random.default_rng(np.random.SeedSequence([seed])).binomial(1, 0.5, size=(24, 3))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 + j, 1]))
    x_raw = rng.standard_normal((50, 3))
    eps = rng.uniform(0.7, 1.3, size=(50, 24))
    np.testing.assert_allclose(data.train.c.numpy(), pyepo_costs(x_raw, B, 2, eps), rtol=1e-12)
    np.testing.assert_allclose(data.train.x.numpy(), (x_raw - x_raw.mean(0)) / x_raw.std(0), atol=1e-12)
    assert data.polytope.source == (0, 0) and data.polytope.sink == (3, 3)
    assert data.train.c.shape == (50, 24) and data.val.c.shape == (5, 24) and data.test.x.shape == (20, 3)
    assert bool((data.train.c > 0).all())  # noise < 1 keeps every edge cost positive


def test_terrain_is_a_fixed_per_edge_multiplier_exp_t_h() -> None:
    """Same seed and client with terrain t and 0: c_t / c_0 is one vector m_j = exp(t h_j) for every
    sample, with h_j (one hill minus one valley, each a bump <= 1) the same for every t."""
    base = dict(grid_size=5, n_train=30, n_val=3, n_test=3)
    flat = load_client(ShortestPathParams(**base, terrain=0.0), 4, 1)
    ratios = {}
    for t in (0.5, 1.0):
        hilly = load_client(ShortestPathParams(**base, terrain=t), 4, 1)
        ratio = (hilly.train.c / flat.train.c).numpy()
        np.testing.assert_allclose(ratio, np.broadcast_to(ratio[0], ratio.shape), rtol=1e-12)
        np.testing.assert_allclose(ratio[0], route_law(ShortestPathParams(**base, terrain=t), 4, 1).terrain)
        ratios[t] = np.log(ratio[0]) / t
    np.testing.assert_allclose(ratios[0.5], ratios[1.0], atol=1e-12)
    h = ratios[1.0]
    assert np.abs(h).max() <= 1.0 and h.max() > 0.3 and h.min() < -0.3  # a hill and a valley on the map
    assert hilly.polytope.source == flat.polytope.source  # terrain leaves the route alone


def test_endpoints_per_mode() -> None:
    k = 5
    corners = [route_law(ShortestPathParams(endpoints="corners"), 3, j) for j in range(4)]
    assert {(law.source, law.sink) for law in corners} == {((0, 0), (4, 4))}
    diagonals = [route_law(ShortestPathParams(endpoints="diagonals"), 3, j) for j in range(8)]
    assert [(law.source, law.sink) for law in diagonals[:4]] == [
        ((0, 0), (4, 4)),
        ((4, 4), (0, 0)),
        ((0, 4), (4, 0)),
        ((4, 0), (0, 4)),
    ]
    assert [(law.source, law.sink) for law in diagonals[4:]] == [
        (law.source, law.sink) for law in diagonals[:4]
    ]
    routes = [route_law(ShortestPathParams(endpoints="random"), 3, j) for j in range(20)]
    for law in routes:
        assert abs(law.source[0] - law.sink[0]) + abs(law.source[1] - law.sink[1]) >= k - 1
        assert all(0 <= v < k for v in (*law.source, *law.sink))
    assert len({(law.source, law.sink) for law in routes}) >= 10  # the clients really differ
    again = route_law(ShortestPathParams(endpoints="random"), 3, 7)
    assert (again.source, again.sink) == (routes[7].source, routes[7].sink)


def monotone_paths(k: int, source: tuple[int, int], sink: tuple[int, int]) -> list[np.ndarray]:
    """Every monotone source -> sink path as an edge-indicator vector, with the slot layout written
    out here: horizontal (r, c)-(r, c+1) at r(k-1) + c, vertical (r, c)-(r+1, c) at k(k-1) + rk + c."""
    dr, dc = np.sign(sink[0] - source[0]), np.sign(sink[1] - source[1])
    paths: list[list[int]] = []

    def walk(node: tuple[int, int], used: list[int]) -> None:
        if node == sink:
            paths.append(used)
            return
        r, c = node
        if c != sink[1]:
            walk((r, c + dc), used + [r * (k - 1) + min(c, c + dc)])
        if r != sink[0]:
            walk((r + dr, c), used + [k * (k - 1) + min(r, r + dr) * k + c])

    walk(source, [])
    out = []
    for used in paths:
        w = np.zeros(2 * k * (k - 1))
        w[used] = 1.0
        out.append(w)
    return out


def test_lp_oracle_is_the_cheapest_path_by_brute_force() -> None:
    params = ShortestPathParams(grid_size=5, n_train=40, n_val=2, n_test=2)
    for j in range(6):
        data = load_client(params, 11, j)
        poly = data.polytope
        paths = np.array(monotone_paths(5, poly.source, poly.sink))
        w = poly.solve_lp(data.train.c).numpy()
        best = (data.train.c.numpy() @ paths.T).min(axis=1)
        np.testing.assert_allclose((data.train.c.numpy() * w).sum(1), best, rtol=1e-12)
        assert all((paths == wi).all(axis=1).any() for wi in w)  # each decision is a path


@pytest.mark.parametrize("k", [5, 12])
def test_rspo_projections_match_a_certified_reference(k: int) -> None:
    """The points RSPO+ projects (w_lam(c) at the calibrated lam0 and an annealed lam0/10, and
    w_lam(2 c_hat - c)) on generated client data: DAQP to 1e-8 of a KKT-certified Clarabel
    reference, OSQP (the fallback backend) to its stated accuracy."""
    params = ShortestPathParams(grid_size=k, n_train=20, n_val=2, n_test=2)
    rng = np.random.default_rng(k)
    per_client = 3 if k == 5 else 1
    for j in range(4 if k == 5 else 2):
        data = load_client(params, 5, j)
        poly = data.polytope
        c = data.train.c[:per_client]
        lam0 = float(data.train.c.norm(dim=1).mean()) / poly.radius()
        c_hat = c * torch.from_numpy(rng.uniform(0.5, 1.5, c.shape))
        for theta, lam in ((c, lam0), (c, lam0 / 10), (2 * c_hat - c, lam0)):
            w = poly.regularized_argmin(theta, lam).numpy()
            v = (-theta / lam).numpy()
            ref = reference_projection(poly, v)
            assert np.abs(w - ref).max() <= 1e-8, poly
            assert max(kkt_residual(poly, vi, wi) for vi, wi in zip(v, w, strict=True)) <= 1e-8
            osqp = poly.regularized_argmin(theta, lam, backend="osqp").numpy()
            assert np.abs(osqp - ref).max() <= PROJECTION_ACCURACY["osqp"]


def test_registry_builds_the_clients_the_run_config_describes() -> None:
    spec = get_problem("shortest-path")
    for k in (5, 12):
        cfg = validate(
            {
                "problem": "shortest-path",
                "grid-size": k,
                "num-features": 5,
                "n-train": 10,
                "sp-endpoints": "diagonals",
                "sp-terrain": 0.2,
                "seed": 3,
            }
        )
        data = spec.load_client(cfg, 2, 4, None)
        assert spec.model_dims(cfg) == (data.num_features, data.num_costs) == (5, 2 * k * (k - 1))
        assert isinstance(data.polytope, GridFlowPolytope)
        assert (data.polytope.source, data.polytope.sink) == ((0, k - 1), (k - 1, 0))
        direct = load_client(
            ShortestPathParams(
                grid_size=k,
                num_features=5,
                n_train=10,
                endpoints="diagonals",
                terrain=0.2,
                degree=4,
                noise=0.5,
            ),
            3,
            2,
        )
        torch.testing.assert_close(data.train.c, direct.train.c, rtol=0, atol=0)


@pytest.mark.parametrize(
    "bad", [{"grid_size": 1}, {"noise": 1.0}, {"terrain": -1.0}, {"endpoints": "anywhere"}, {"n_train": 0}]
)
def test_bad_parameters_are_refused(bad: dict) -> None:
    """Built directly, the parameters are checked against their run-config keys (named in the error)."""
    with pytest.raises(ValueError, match=next(iter(bad)).replace("_", "-")):
        ShortestPathParams(**bad)


def test_quick_reproduction_writes_every_part_and_a_part_run_alone_keeps_the_others(tmp_path: Path) -> None:
    from hetfed.reproduce.shortest_path import paired

    out = reproduce_quick("shortest-path", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = (tmp_path / "out" / "shortest-path.md").read_text()
    assert "The paper's settings (Table 8)" in doc and "Warcraft" in doc and "PyEPO" in doc
    data = json.loads((tmp_path / "out" / "shortest-path.json").read_text())
    runs = tmp_path / "runs"

    def gap(run: str, stage: str) -> float:
        """A run's gap: the mean over its clients of their relative regrets, in %."""
        summary = json.loads((runs / run / "summary.json").read_text())
        return 100 * float(np.mean([m[f"{stage}-relative-regret"] for m in summary["clients"].values()]))

    def config(run: str) -> dict:
        return json.loads((runs / run / "config.json").read_text())["config"]

    # Table 8's settings reach the runs: fraction 0.5, 2 personalization epochs, lam0 = 2 for all
    t8 = data["table8"]
    cfg = config("t8-k5-rspo+-s42")
    assert (cfg["fraction"], cfg["personal-epochs"], cfg["fixed-lam0"], cfg["grid-size"]) == (0.5, 2, 2.0, 5)
    for loss in ("mse", "pfyl", "dpo", "spo+", "rspo+"):
        for stage in ("fed", "per"):
            cell = t8["tables"]["5"][loss][stage]
            assert cell["seeds"] == [42] and cell["values"] == [
                pytest.approx(gap(f"t8-k5-{loss}-s42", stage))
            ]
    spo, rspo = t8["tables"]["5"]["spo+"]["per"], t8["tables"]["5"]["rspo+"]["per"]
    assert paired(spo, rspo)["values"] == pytest.approx([spo["values"][0] - rspo["values"][0]])
    # the sweep's points change only what they name, and say so in the run's name
    d1 = config("t8-k5-spo+-degree=1-hidden=0-s42")
    assert (d1["degree"], d1["hidden"], d1["fixed-lam0"], d1["fraction"]) == (1, 0, 2.0, 0.5)
    assert data["sweep"]["tables"]["degree-model"]["d1-linear"]["spo+"]["per"]["values"] == [
        pytest.approx(gap("t8-k5-spo+-degree=1-hidden=0-s42", "per"))
    ]
    assert config("t8-k5-rspo+-kappa-lam=0-s42")["kappa-lam"] == 0.0
    # the heterogeneity rows keep the knapsack protocol (calibrated lam0, fraction 0.4)
    for row in ("corners-t0", "random-t0.5"):
        cfg = config(f"k5-{row}-rspo+-s42")
        assert (cfg["fixed-lam0"], cfg["fraction"], cfg["personal-epochs"]) == (0.0, 0.4, 1)  # calibrated
        assert data["heterogeneity"]["tables"][row]["rspo+"]["per"]["values"] == [
            pytest.approx(gap(f"k5-{row}-rspo+-s42", "per"))
        ]
        # decision-focused RSPO+ beats the MSE baseline after personalization even on the short schedule
        losses = data["heterogeneity"]["tables"][row]
        assert losses["rspo+"]["per"]["mean"] < losses["mse"]["per"]["mean"]
    for name in ("gap", "regret-per-round", "sweep", "heterogeneity"):
        assert (tmp_path / "out" / f"shortest-path-{name}.png").stat().st_size > 10_000

    # one part again (its runs are on disk, so nothing trains): the other parts' entries stay as they are
    path = tmp_path / "out" / "shortest-path.json"
    data["heterogeneity"]["marker"] = "kept"
    path.write_text(json.dumps(data))
    again = hetfed_cli(
        "reproduce",
        "shortest-path",
        "--quick",
        "--part",
        "sweep",
        "--results-dir",
        str(runs),
        "--out",
        str(tmp_path / "out"),
    )
    assert again.returncode == 0, again.stderr[-3000:]
    after = json.loads(path.read_text())
    assert after["heterogeneity"] == data["heterogeneity"] and after["table8"] == data["table8"]
    assert after["sweep"]["tables"] == data["sweep"]["tables"]


def test_the_committed_report_is_what_its_json_renders_and_says_it_is_not_warcraft() -> None:
    from hetfed.reproduce.shortest_path import markdown
    from tests.conftest import REPO

    results = REPO / "docs" / "results"
    text = (results / "shortest-path.md").read_text()
    assert text == markdown(json.loads((results / "shortest-path.json").read_text()))
    first_paragraph = text.split("\n\n")[1]
    assert "Not the paper's benchmark" in first_paragraph and "Warcraft" in first_paragraph
