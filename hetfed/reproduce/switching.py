"""Worst-client constrained FL (docs/algorithms.md section 2): softmax switching against its baselines.

``hetfed reproduce np-classification | fair-classification | safe-rl`` runs every method
of the experiment in two settings (full participation with E = 1; half the clients per
round with E = 5) for several seeds on the inline engine (the same ServerApp/ClientApp
code as a deployment), then writes ``<out>/<experiment>.md`` and ``.json`` (tables of the
final worst-client objective ``F = max_i f_i`` and constraint ``G = max_i g_i`` on the
clients' training data, with the alpha sweep) and PNGs of ``F(w_k)``, ``G(w_k)`` against
gradient evaluations with the tolerance line.

Every method of an experiment runs the same rounds, clients per round and local steps,
so all take the same number of gradient evaluations. A method's output is its averaged
model (switching and CRPO: over the rounds that stepped on the objective; penalty,
primal-dual, FedAvg: over all rounds); the last iterate is reported too. A baseline
family's "best feasible" member is the hyperparameter whose averaged model meets
``G <= eps`` in every seed with the lowest mean ``F``.

The runs' folders stay under ``--results-dir``; rerunning the command reuses every
completed run of an identical config, so an interrupted reproduction resumes, and
``--replot`` rewrites the report from the saved JSON alone.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import completed_run, run_many

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Method:
    """One method and hyperparameter; ``family`` groups a baseline's hyperparameter grid."""

    label: str
    family: str
    overrides: dict[str, Any]
    value: float = 0.0  # the family's hyperparameter, for ordering the report


FAMILIES = ("switching", "crpo", "penalty", "primal-dual (mean)", "primal-dual (max)", "fedavg")


def report_order(methods: Sequence[Method]) -> list[Method]:
    """Methods grouped by family (switching first), each family by increasing hyperparameter."""
    return sorted(methods, key=lambda m: (FAMILIES.index(m.family), m.value))


@dataclass(frozen=True)
class Setting:
    """Participation and local work: ``m`` clients per round (0 = all), E local steps, K rounds."""

    name: str
    m: int
    local_steps: int
    rounds: int


@dataclass(frozen=True)
class Quick:
    """An experiment's smoke run (CI): its settings, methods and evaluation spacing, fewer seeds."""

    settings: tuple[Setting, ...]
    methods: tuple[Method, ...]
    eval_every: dict[str, int]
    seeds: int = 2
    base: dict[str, Any] = field(default_factory=dict)  # run-config values it changes


@dataclass(frozen=True)
class Experiment:
    """What one ``hetfed reproduce`` experiment runs and how its report reads."""

    name: str
    title: str
    nodes: int
    base: dict[str, Any]  # run config shared by every run (problem, eps, batches, steps)
    settings: tuple[Setting, ...]
    methods: tuple[Method, ...]
    seeds: int
    eval_every: dict[str, int]  # setting -> rounds between evaluations
    notes: str  # setup paragraph of the report
    plotted: tuple[str, ...] = ()  # labels drawn in the F/G figures (all if empty)
    theory: dict[str, float] = field(default_factory=dict)  # D, L when the steps are the theorem's
    extras: tuple[tuple[str, str], ...] = ()  # (aggregate key, column title): a further table per setting
    discussion: str = ""  # what the tables mean for this task (after the tables)
    quick: Quick | None = None  # the smoke run (--quick)

    def smoke(self) -> Experiment:
        """This experiment as its smoke run."""
        if self.quick is None:
            raise ValueError(f"{self.name} has no --quick variant")
        q = self.quick
        return replace(
            self, settings=q.settings, methods=q.methods, seeds=q.seeds, eval_every=q.eval_every,
            base={**self.base, **q.base}, quick=None,
        )

    @property
    def eps(self) -> float:
        return float(self.base["switching-eps"])


def switching(alpha: float) -> Method:
    return Method(
        f"switching alpha={alpha:g}",
        "switching",
        {"strategy": "softmax-switching", "switching-alpha": alpha},
        alpha,
    )


def penalty(rho: float) -> Method:
    return Method(f"penalty rho={rho:g}", "penalty", {"strategy": "penalty", "penalty-rho": rho}, rho)


def primal_dual(step: str, lr: float) -> Method:
    return Method(
        f"primal-dual {step} lr={lr:g}",
        f"primal-dual ({step})",
        {"strategy": "primal-dual", "pd-dual-step": step, "pd-dual-lr": lr},
        lr,
    )


FEDAVG = Method("fedavg (unconstrained)", "fedavg", {"strategy": "fedavg-unconstrained"})
CRPO = Method("parallel CRPO", "crpo", {"strategy": "crpo"})

# NP classification: L = max ||(x, 1)|| over the 569 standardised public rows (the logistic
# losses are L-Lipschitz in (w, b)); D = 30 is the assumed diameter of the parameter set.
NP_D, NP_L = 30.0, 20.6


# 50k gradient evaluations: 10 clients x E=1 x 5000 rounds, or 5 clients x E=5 x 2000 rounds.
NP_CLASSIFICATION = Experiment(
    name="np-classification",
    title="Neyman-Pearson classification (breast cancer, 10 clients)",
    nodes=10,
    base={
        "problem": "np-classification",
        "np-r": 0.2,
        "switching-eps": 0.05,
        "switching-theory-d": NP_D,
        "switching-theory-l": NP_L,
        "batch-zeta": 32,
        "batch-size": 32,
    },
    settings=(Setting("full", 0, 1, 5000), Setting("partial", 5, 5, 2000)),
    methods=(  # most informative first (runs go method by method)
        switching(100.0),
        penalty(10.0),
        primal_dual("max", 1.0),
        switching(10.0),
        switching(1.0),
        primal_dual("mean", 1.0),
        penalty(100.0),
        penalty(1.0),
        FEDAVG,
    ),
    seeds=5,
    eval_every={"full": 100, "partial": 40},
    notes=(
        "Wisconsin breast cancer (569 rows, 30 features z-scored with the public statistics), "
        "10 clients with Dirichlet(0.5) label skew (at least 5 rows of each class each, split "
        "re-drawn per seed), logistic regression; `f_i` = logistic loss on the client's benign "
        "rows, `g_i` = logistic loss on its malignant rows minus r = 0.2; tolerance eps = 0.05. "
        f"Steps: the theorem's `eta = D/(L sqrt(8K))`, `gamma = eta/E`, threshold eps/2, with "
        f"L = {NP_L} (max norm of (x, 1) over the public rows: the losses are L-Lipschitz) and "
        f"an assumed parameter-set diameter D = {NP_D:g}. Batches of 32 rows per class "
        "(whole classes for smaller clients) for the f/g query and for every local step. "
        "The training rows are linearly separable for every seed, so without the constraint "
        "and the step budget the objective could be driven to 0: the numbers compare what "
        "each method reaches in 50k gradient evaluations."
    ),
    plotted=(
        "switching alpha=10",
        "switching alpha=100",
        "penalty rho=10",
        "primal-dual mean lr=1",
        "primal-dual max lr=1",
        "fedavg (unconstrained)",
    ),
    theory={"D": NP_D, "L": NP_L},
    discussion=(
        "Feasibility in every seed needs alpha large enough for the softmax gap: with m sampled "
        "clients an objective round only bounds the worst sampled constraint by the threshold "
        "plus ln(m)/alpha (the lines under the tables), and at alpha = 10 that slack (0.23 for "
        "m = 10, 0.16 for m = 5) is several times eps = 0.05, so the averaged model of alpha = 10 "
        "is not feasible in every seed here; alpha = 100 is above the theory's 2 ln(m)/eps and "
        "is. alpha = 1 weighs the clients almost equally and, like primal-dual on the mean "
        "constraint, enforces the average constraint rather than the worst one. The penalty "
        "needs rho >= 10 to be feasible and then pays for it in the objective; primal-dual on "
        "the max of the sampled g_i is feasible with every client sampled, less reliably with "
        "half of them (its multiplier follows whichever clients were sampled)."
    ),
    quick=Quick(
        settings=(Setting("full", 0, 1, 30), Setting("partial", 5, 5, 12)),
        methods=(switching(1.0), switching(100.0), penalty(10.0)),
        eval_every={"full": 5, "partial": 2},
    ),
)


# 5 clients x E=1 x 1200 rounds = 6000 = 3 clients x E=5 x 400 rounds gradient evaluations.
FAIR_CLASSIFICATION = Experiment(
    name="fair-classification",
    title="Fair classification (UCI Adult, clients by race)",
    nodes=5,
    base={
        "problem": "fair-classification",
        "fair-delta": 0.05,
        "fair-hidden": 32,
        "switching-eps": 0.02,
        "switching-threshold": 0.01,
        "switching-eta": 0.5,
        "batch-zeta": 128,
        "batch-size": 128,
    },
    settings=(Setting("full", 0, 1, 1200), Setting("partial", 3, 5, 400)),
    methods=(  # most informative first (runs go method by method)
        switching(10.0),
        penalty(10.0),
        primal_dual("max", 1.0),
        switching(1.0),
        switching(100.0),
        primal_dual("mean", 1.0),
        penalty(1.0),
        FEDAVG,
    ),
    seeds=5,
    eval_every={"full": 40, "partial": 16},
    notes=(
        "UCI Adult `adult.data`, one client per race (White, Asian-Pac-Islander, "
        "Amer-Indian-Eskimo, Other, Black: 27,816 to 271 rows), an MLP with 32 hidden units; "
        "`f_i` = BCE, `g_i` = demographic-parity gap between women and men minus delta = 0.05; "
        "tolerance eps = 0.02. Fixed steps eta = 0.5 and gamma = eta/E (the theorem's pairing; "
        "the Lipschitz constants of an MLP are not known, so eta is chosen, not derived), "
        "threshold eps/2, batches of 128 rows. Partial participation: 3 of the 5 clients per round."
    ),
    quick=Quick(
        settings=(Setting("full", 0, 1, 40), Setting("partial", 3, 5, 16)),
        methods=(switching(10.0), penalty(10.0)),
        eval_every={"full": 10, "partial": 4},
    ),
)


# 4 clients x E=1 x 300 rounds = 1200 = 2 clients x E=5 x 120 rounds gradient evaluations.
SAFE_RL = Experiment(
    name="safe-rl",
    title="Federated safe RL (heterogeneous CartPole CMDPs, 4 clients)",
    nodes=4,
    base={
        "problem": "safe-rl",
        "rl-horizon": 200,
        "rl-budget": 0.05,
        "rl-heterogeneity": 0.5,
        "rl-eval-episodes": 32,
        # the first reproduction's estimator and cost: REINFORCE steps, no fall cost
        "rl-fall-cost": False,
        "rl-advantage": "reward-to-go",
        "rl-trust-region": 0.0,
        "switching-eps": 0.02,
        "switching-threshold": 0.01,
        "switching-eta": 2.0,
        "batch-zeta": 8,
        "batch-size": 8,
    },
    settings=(Setting("full", 0, 1, 300), Setting("partial", 2, 5, 120)),
    methods=(  # most informative first (runs go method by method)
        switching(10.0),
        CRPO,
        penalty(10.0),
        primal_dual("max", 1.0),
        switching(1.0),
        switching(100.0),
        FEDAVG,
    ),
    seeds=5,
    eval_every={"full": 25, "partial": 10},
    notes=(
        "Gymnasium CartPole dynamics with per-client pole length, pole mass, cart mass and "
        "force (factors exp(+-0.5)), horizon 200, a linear softmax policy trained by REINFORCE; "
        "`f_i` = -return/H, `g_i` = (cost/H) - 0.05 where a step costs 1 outside |x| <= 1, "
        "|theta| <= 8 degrees; tolerance eps = 0.02. Fixed steps eta = 2, gamma = eta/E, "
        "threshold eps/2, 8 fresh on-policy episodes per query and per local step; F and G on "
        "32 evaluation episodes per client (fixed seeds). Partial participation: 2 of 4 clients."
    ),
    extras=(("episode_length", "episode length"), ("cost", "cost per episode")),
    discussion=(
        "Episode length and cost per episode are means over clients (32 evaluation episodes each) "
        "and seeds. The cost is summed over the steps an episode lasts and divided by the fixed "
        "horizon H, so a policy also lowers `g` by letting the pole fall sooner: the REINFORCE "
        "gradient of `g` (reward-to-go of costs) rewards shorter episodes as much as safer ones. "
        "The constrained methods (switching at every alpha, penalty, primal-dual, parallel CRPO) "
        "settle on episodes of well under half the horizon with the cost at the budget and the "
        "return far from the maximum (primal-dual with partial participation escapes in some "
        "seeds and is then infeasible in others), while unconstrained FedAvg reaches the full "
        "horizon: its last iterate drifts out of |x| <= 1 (infeasible), but the average of its "
        "iterates "
        "balances for the whole horizon at a small cost, so feasible policies with the best "
        "return exist (the module docstring of `problems/safe_rl.py` gives one). The ranking of "
        "the constrained methods on this task therefore says which one is stuck least, not how "
        "well they trade return for safety. A cost that also counts the steps after a fall "
        "(a fallen pole is outside |theta| <= 8 degrees; run config `rl-fall-cost = true`) "
        "removes the shortcut, but makes g of order 1, and the baseline-free REINFORCE "
        "estimate of its gradient then destabilises every constrained method at these steps: "
        "a 5-seed trial at eta = 0.2 had runs of each method collapse to a deterministic fall "
        "and no method feasible in every seed. It needs variance reduction (a baseline) first, "
        "so this reproduction keeps the plain cost."
    ),
    quick=Quick(
        settings=(Setting("full", 0, 1, 10), Setting("partial", 2, 5, 4)),
        methods=(switching(10.0), CRPO),
        eval_every={"full": 5, "partial": 2},
        base={"rl-eval-episodes": 16},
    ),
)


# The paper's safe-RL setting: TRPO-style client updates (natural gradient, mean KL <= 0.01 per
# local step) on GAE advantages over a fitted value baseline, and the cost that also counts the
# steps after a fall, so falling early no longer lowers it.
SAFE_RL_TRPO = replace(
    SAFE_RL,
    name="safe-rl-trpo",
    title="Federated safe RL with TRPO-style updates and the fall cost (CartPole CMDPs, 4 clients)",
    base={
        **SAFE_RL.base,
        "rl-trust-region": 0.01,
        "rl-advantage": "gae",
        "rl-gae-lambda": 1.0,
        "rl-fall-cost": True,
    },
    notes=(
        "As safe-rl.md, but every client's local step is TRPO's: the natural gradient of its "
        "objective (conjugate gradient on Fisher-vector products) scaled to a mean KL divergence "
        "of 0.01 between the old and new policy, halved until it stays within it, with advantages "
        "over a value baseline fitted by least squares on each batch (GAE with lambda = 1: the "
        "reward-to-go minus the baseline, unbiased; at lambda = 0.95 the bootstrapped advantages "
        "inherit the fitted baseline's error at the fall step, where the cost jumps by the steps "
        "left, and in trial runs the constrained methods then stalled far above the budget); the "
        "cost also counts the steps after a fall (`rl-fall-cost = true`). gamma = eta/E only "
        "normalises the update, so the server averages the clients' end points."
    ),
    discussion=(
        "With TRPO-style steps over a fitted baseline the fall cost no longer destabilises the "
        "estimates, and the shortcut of safe-rl.md is gone: every method learns to balance for "
        "(nearly) the whole horizon. Switching with alpha = 10 is feasible in every seed in both "
        "settings at the full return, with no more constraint violation than parallel CRPO, so "
        "it matches or beats CRPO on worst-client return here. The margin is nil, though, "
        "because the return saturates: a balancing policy maximises the return and stays well "
        "inside the budget, so even unconstrained FedAvg ends feasible in most seeds. This CMDP "
        "no longer separates the methods; a tighter budget or a safe zone the best-return policy "
        "leaves would. alpha = 100 (full participation) and alpha = 1 (partial) in some seeds "
        "never take an objective round, so their averaged model does not exist (n/a)."
    ),
)

EXPERIMENTS = {e.name: e for e in (NP_CLASSIFICATION, FAIR_CLASSIFICATION, SAFE_RL, SAFE_RL_TRPO)}


def experiment(name: str, quick: bool = False) -> Experiment:
    """The experiment ``name``; ``quick``: its smoke run (few rounds and seeds, a handful of methods)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment: unknown name {name!r}; choose {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name].smoke() if quick else EXPERIMENTS[name]


# --- running ------------------------------------------------------------------------------------------


def run_config(exp: Experiment, setting: Setting, method: Method, seed: int) -> dict[str, Any]:
    """The run config of one run; without the theory's steps, ``gamma = eta / E`` (the theorem's pairing)."""
    steps = {} if exp.theory else {"switching-gamma": exp.base["switching-eta"] / setting.local_steps}
    return {
        **exp.base,
        **steps,
        **method.overrides,
        "seed": seed,
        "num-rounds": setting.rounds,
        "switching-m": setting.m,
        "switching-local-steps": setting.local_steps,
        "switching-eval-every": exp.eval_every[setting.name],
        "checkpoint-every": 0,
        "run-name": f"{exp.name}-{setting.name}-{_slug(method.label)}-s{seed}",
    }


def read_result(folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """A completed run's final aggregate and its evaluation curve (the server rows with F, G)."""
    from hetfed.server.store import RunResult

    rows = [r for r in RunResult.read(folder).rows_of(client="server") if "F" in r]
    required = ("grad-evals", "F", "G")
    curve: dict[str, list[float | None]] = {
        key: [float(r[key]) for r in rows] for key in required if all(r.get(key) for r in rows)
    }
    # the averaged model exists from the first round that stepped on the objective: None before
    curve.update({key: [float(r[key]) if r.get(key) else None for r in rows] for key in ("avg-F", "avg-G")})
    keys = ("F", "G", "avg-F", "avg-G", "grad-evals", "averaged-rounds")
    return {
        "final": {k: summary["aggregate"].get(k) for k in keys},
        "aggregate": {k: v for k, v in summary["aggregate"].items() if not k.startswith("setting-")},
        "curve": curve,
        "wall-s": summary["wall-time-s"],
    }


def jobs(exp: Experiment) -> list[tuple[Setting, Method, int]]:
    """Every (setting, method, seed) of ``exp``, method-major in the experiment's order, so an
    interrupted reproduction has its first methods complete."""
    return [
        (setting, method, seed)
        for method in exp.methods
        for setting in exp.settings
        for seed in range(exp.seeds)
    ]


def labelled(setting: Setting, method: Method, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    return {"setting": setting.name, "method": method.label, "family": method.family, "seed": seed, **result}


def available_runs(exp: Experiment, results_dir: Path) -> list[dict[str, Any]]:
    """The runs of ``exp`` already completed in ``results_dir`` (none is started)."""
    out = []
    for setting, method, seed in jobs(exp):
        cfg = run_config(exp, setting, method, seed)
        summary = completed_run(results_dir / cfg["run-name"], cfg)
        if summary is not None:
            out.append(labelled(setting, method, seed, read_result(results_dir / cfg["run-name"], summary)))
    return out


def progress_line(summary: Mapping[str, Any]) -> str:
    """The final F, G of a finished run for its progress line; ``nan`` for the averaged model of
    a run in which no round took an objective step (it has none)."""
    agg = {k: summary["aggregate"].get(k, math.nan) for k in ("avg-F", "avg-G", "F", "G")}
    return f": avg F={agg['avg-F']:.4f} G={agg['avg-G']:.4f} | last F={agg['F']:.4f} G={agg['G']:.4f}"


def run_all(exp: Experiment, results_dir: Path, workers: int, log: Any = print) -> list[dict[str, Any]]:
    """Every (setting, method, seed) run of ``exp``, ``workers`` processes at a time."""
    todo = jobs(exp)
    configs = [run_config(exp, s, m, seed) for s, m, seed in todo]

    summaries = run_many(
        configs, nodes=exp.nodes, results_dir=results_dir, workers=workers, log=log, describe=progress_line
    )
    return [
        labelled(setting, method, seed, read_result(results_dir / cfg["run-name"], summary))
        for (setting, method, seed), cfg, summary in zip(todo, configs, summaries, strict=True)
    ]


# --- tables and figures -------------------------------------------------------------------------------


OUTPUTS = {"averaged model": "avg-", "last iterate": ""}  # output -> prefix of its F, G keys


def summarize_runs(exp: Experiment, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per setting and method: mean/sd/max over seeds of the final F, G; feasibility; best baselines."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for setting in exp.settings:
        for method in report_order(exp.methods):
            finals = [
                r["final"] for r in runs if r["setting"] == setting.name and r["method"] == method.label
            ]
            if not finals:
                continue
            row: dict[str, Any] = {"family": method.family, "seeds": len(finals)}
            for key in ("avg-F", "avg-G", "F", "G"):
                values = np.array([np.nan if f[key] is None else f[key] for f in finals], dtype=float)
                row[key] = {
                    "mean": float(np.mean(values)),
                    "sd": float(np.std(values)),
                    "max": float(np.max(values)),
                }
            for prefix in OUTPUTS.values():
                row[f"{prefix}feasible-seeds"] = int(
                    sum(f[f"{prefix}G"] is not None and f[f"{prefix}G"] <= exp.eps for f in finals)
                )
            row["grad-evals"] = int(finals[0]["grad-evals"])
            table.setdefault(setting.name, {})[method.label] = row
    best: dict[str, dict[str, dict[str, str | None]]] = {}
    for output, prefix in OUTPUTS.items():
        for setting_name, rows in table.items():
            for family in dict.fromkeys(r["family"] for r in rows.values()):
                members = {k: r for k, r in rows.items() if r["family"] == family}
                feasible = {  # feasible in every seed of the experiment (a row may lack runs: --available)
                    k: r
                    for k, r in members.items()
                    if r[f"{prefix}feasible-seeds"] == r["seeds"] == exp.seeds
                }
                best.setdefault(output, {}).setdefault(setting_name, {})[family] = (
                    min(feasible, key=lambda k: feasible[k][f"{prefix}F"]["mean"]) if feasible else None
                )
    return {"table": table, "best-feasible": best}


def curves(exp: Experiment, runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Per setting and method: grad-evals and the mean, min and max over seeds of F(w_k), G(w_k)."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for setting in exp.settings:
        for method in report_order(exp.methods):
            chosen = [
                r["curve"] for r in runs if r["setting"] == setting.name and r["method"] == method.label
            ]
            if not chosen or not all("F" in c for c in chosen):
                continue
            length = min(len(c["F"]) for c in chosen)
            entry = {"grad-evals": chosen[0]["grad-evals"][:length]}
            for key in ("F", "G"):
                stack = np.array([c[key][:length] for c in chosen])
                entry.update(
                    {
                        key: stack.mean(0).tolist(),
                        f"{key}-min": stack.min(0).tolist(),
                        f"{key}-max": stack.max(0).tolist(),
                    }
                )
            out.setdefault(setting.name, {})[method.label] = entry
    return out


def plot(exp: Experiment, data: dict[str, Any], out: Path, suffix: str = "") -> list[Path]:
    """``<name>-<setting>.png`` (F and G of the plotted methods) and ``<name>-alpha.png`` (the sweep)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    groups = [
        (
            setting.name,
            [m.label for m in report_order(exp.methods) if not exp.plotted or m.label in exp.plotted],
        )
        for setting in exp.settings
    ]
    groups.append(("alpha", [m.label for m in report_order(exp.methods) if m.family == "switching"]))
    for name, labels in groups:
        settings = [s.name for s in exp.settings] if name == "alpha" else [name]
        fig, axes = plt.subplots(len(settings), 2, figsize=(11, 3.6 * len(settings)), squeeze=False)
        for row, setting in enumerate(settings):
            for col, key in enumerate(("F", "G")):
                ax = axes[row][col]
                for label in labels:
                    c = data.get(setting, {}).get(label)
                    if c is None:
                        continue
                    (line,) = ax.plot(c["grad-evals"], c[key], label=label, lw=1.4)
                    ax.fill_between(
                        c["grad-evals"], c[f"{key}-min"], c[f"{key}-max"], color=line.get_color(), alpha=0.15
                    )
                if key == "G":
                    ax.axhline(exp.eps, color="k", ls="--", lw=1, label=f"tolerance eps = {exp.eps:g}")
                    ax.axhline(0.0, color="grey", ls=":", lw=0.8)
                ax.set_xlabel("gradient evaluations")
                ax.set_ylabel(f"{key}(w_k) = max_i {key.lower()}_i")
                ax.set_title(
                    f"{setting} participation: {'worst objective' if key == 'F' else 'worst constraint'}"
                )
                ax.grid(alpha=0.3)
            axes[row][1].legend(fontsize=7, loc="upper right")
        fig.suptitle(f"{exp.title}: mean over {exp.seeds} seeds (band: min-max)", fontsize=10)
        fig.tight_layout()
        path = out / f"{exp.name}{suffix}-{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def markdown(
    exp: Experiment, summary: dict[str, Any], figures: list[Path], command: str, runs: list[dict[str, Any]]
) -> str:
    """The report: setup, per-setting tables, the comparison against the best feasible baselines."""
    lines = [
        f"# {exp.title}",
        "",
        f"Generated by `{command}` on the inline engine: {len(runs)} of {len(jobs(exp))} runs, "
        f"{sum(r['wall-s'] for r in runs) / 60:.0f} min of run time. docs/algorithms.md section 2.",
        "",
        "## Setup",
        "",
        exp.notes,
        "",
        "Settings (every method takes the same number of gradient evaluations = local steps of all clients):",
        "",
    ]
    for s in exp.settings:
        m = "all" if not s.m else str(s.m)
        lines.append(
            f"- **{s.name}**: {m} of {exp.nodes} clients per round, E = {s.local_steps}, {s.rounds} rounds"
        )
    lines += [
        "",
        "F = max_i f_i and G = max_i g_i on every client's training data; feasible = G <= eps = "
        f"{exp.eps:g}. Values are mean ± sd over {exp.seeds} seeds; `G max` is the worst seed.",
        "",
    ]
    table, best = summary["table"], summary["best-feasible"]
    for s in exp.settings:
        rows = table.get(s.name, {})
        lines += [
            f"## {s.name.capitalize()} participation",
            "",
            "| method | F (averaged) | G (averaged) | G max | feasible seeds | F (last) | G (last) "
            "| feasible seeds (last) | grad evals |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for label, r in rows.items():
            lines.append(
                f"| {label} | {_pm(r['avg-F'])} | {_pm(r['avg-G'])} | {r['avg-G']['max']:.4f} | "
                f"{r['avg-feasible-seeds']}/{r['seeds']} | {_pm(r['F'])} | {_pm(r['G'])} | "
                f"{r['feasible-seeds']}/{r['seeds']} | {r['grad-evals']} |"
            )
        lines += ["", _softmax_gap(exp, s)]
        lines += _extras_table(exp, s, runs)
        for output, prefix in OUTPUTS.items():
            lines += ["", f"**{output.capitalize()}:**", ""]
            lines += _verdict(rows, best[output].get(s.name, {}), prefix)
        lines.append("")
    if exp.discussion:
        lines += ["## Discussion", "", exp.discussion, ""]
    lines += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures] + [""]
    return "\n".join(lines)


def _extras_table(exp: Experiment, setting: Setting, runs: list[dict[str, Any]]) -> list[str]:
    """Per method: the mean over seeds of each ``exp.extras`` aggregate (mean over clients), for
    the averaged model and the last iterate."""
    if not exp.extras:
        return []
    titles = [f"{title} ({output})" for output in ("averaged", "last") for _, title in exp.extras]
    lines = ["", "| method | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]
    for method in report_order(exp.methods):
        mine = [r for r in runs if r["setting"] == setting.name and r["method"] == method.label]
        aggs = [r.get("aggregate", {}) for r in mine]
        if not aggs:
            continue
        cells = [
            f"{np.mean([a.get(prefix + key, np.nan) for a in aggs]):.1f}"
            for prefix in ("avg-", "")
            for key, _ in exp.extras
        ]
        lines.append(f"| {method.label} | " + " | ".join(cells) + " |")
    return lines


def _softmax_gap(exp: Experiment, setting: Setting) -> str:
    """What the switching test guarantees: ``<q, g> >= max_i g_i - ln(m)/alpha`` over the m sampled."""
    m = setting.m or exp.nodes
    threshold = exp.eps / 2 if exp.theory else float(exp.base["switching-threshold"])
    alphas = sorted(m_.value for m_ in exp.methods if m_.family == "switching")
    bounds = ", ".join(f"alpha = {a:g}: {threshold + math.log(m) / a:.3f}" for a in alphas)
    return (
        f"Softmax gap: since `<q, g> >= max_i g_i - ln(m)/alpha`, an objective round "
        f"(`G_k <= {threshold:g}`) only guarantees `max_i g_i(w_k) <= {threshold:g} + ln({m})/alpha` "
        "on the sampled batches "
        f"({bounds}); the theory asks `alpha >= 2 ln(m)/eps = {2 * math.log(m) / exp.eps:.1f}`."
    )


def _verdict(rows: dict[str, dict[str, Any]], best: dict[str, str | None], prefix: str) -> list[str]:
    """Sentences comparing switching with the best feasible baselines for one output (computed)."""
    F, G, ok = f"{prefix}F", f"{prefix}G", f"{prefix}feasible-seeds"
    out = []
    sweep = {k: r for k, r in rows.items() if r["family"] == "switching"}
    for label, r in sweep.items():
        out.append(
            f"- {label}: feasible in {r[ok]}/{r['seeds']} seeds (worst G over seeds {r[G]['max']:.4f}), "
            f"F = {_pm(r[F])}."
        )
    sw = best.get("switching")  # the feasible switching run with the lowest mean F
    baselines = {fam: lab for fam, lab in best.items() if fam != "switching" and lab is not None}
    infeasible = [fam for fam, lab in best.items() if fam != "switching" and lab is None]
    if baselines:
        ranked = sorted(baselines.values(), key=lambda lab: rows[lab][F]["mean"])
        out.append(
            "- Best feasible baselines (feasible in every seed, lowest mean F): "
            + "; ".join(f"{lab} F = {_pm(rows[lab][F])}" for lab in ranked)
            + "."
        )
    if infeasible:
        out.append("- Baselines with no member feasible in every seed: " + ", ".join(infeasible) + ".")
    if sw is not None and baselines:
        bl = min(baselines.values(), key=lambda k: rows[k][F]["mean"])
        a, b = rows[sw][F]["mean"], rows[bl][F]["mean"]
        verdict = "below" if a < b else "not below"
        out.append(
            f"- **Worst-client objective of the best feasible switching run ({sw}) is {verdict} the best "
            f"feasible baseline's ({bl}): {a:.4f} vs {b:.4f}.**"
        )
    elif sw is None and sweep:
        out.append("- **No switching run was feasible in every seed.**")
    return out


def _rounded(obj: Any) -> Any:
    """Floats to 6 significant digits (the JSON keeps every run's curve)."""
    if isinstance(obj, float):
        return float(f"{obj:.6g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_rounded(v) for v in obj]
    return obj


def _pm(stats: dict[str, float]) -> str:
    return f"{stats['mean']:.4f} ± {stats['sd']:.4f}" if math.isfinite(stats["mean"]) else "n/a"


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in label).strip("-").replace("--", "-")


# --- command line --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a few rounds, 2 seeds, 2-4 methods (< 1 min)")
    parser.add_argument("--seeds", type=int, help="override the number of seeds (default 5; quick 2)")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument(
        "--out", help="where the .md/.json/.png go (default docs/results; quick: results/reproduce)"
    )
    parser.add_argument(
        "--results-dir", help="where the runs' folders go (default results/reproduce/<experiment>[-quick])"
    )
    parser.add_argument(
        "--replot", action="store_true", help="rewrite the .md and figures from the saved .json, without runs"
    )
    parser.add_argument(
        "--available", action="store_true", help="report the runs already completed in --results-dir only"
    )


def run(args: argparse.Namespace) -> int:
    exp = experiment(args.experiment, quick=args.quick)
    if args.seeds is not None:
        if args.seeds < 1:
            raise ValueError(f"--seeds: must be >= 1, got {args.seeds}")
        exp = replace(exp, seeds=args.seeds)
    if args.workers < 1:
        raise ValueError(f"--workers: must be >= 1, got {args.workers}")
    tag = "-quick" if args.quick else ""
    out = (
        Path(args.out)
        if args.out
        else (REPO / "results" / "reproduce" if args.quick else REPO / "docs" / "results")
    )
    results_dir = (
        Path(args.results_dir) if args.results_dir else REPO / "results" / "reproduce" / f"{exp.name}{tag}"
    )
    out.mkdir(parents=True, exist_ok=True)
    command = f"hetfed reproduce {exp.name}" + (" --quick" if args.quick else "")
    json_path = out / f"{exp.name}{tag}.json"
    if args.replot:
        if not json_path.exists():
            raise FileNotFoundError(f"--replot: {json_path} does not exist; run the experiment first")
        runs = json.loads(json_path.read_text())["runs"]
    elif args.available:
        runs = available_runs(exp, results_dir)
        command += " --available"
    else:
        runs = run_all(exp, results_dir, args.workers)
    summary = summarize_runs(exp, runs)
    data = curves(exp, runs)
    figures = plot(exp, data, out, suffix=tag)
    (out / f"{exp.name}{tag}.md").write_text(markdown(exp, summary, figures, command, runs))
    payload = {
        "experiment": exp.name,
        "command": command,
        "base-config": exp.base,
        "theory": exp.theory,
        "eps": exp.eps,
        "settings": [asdict(s) for s in exp.settings],
        "methods": [asdict(m) for m in exp.methods],
        "seeds": exp.seeds,
        **summary,
        "curves": data,
        "runs": runs,  # per run: final F, G and its curve (for --replot)
    }
    json_path.write_text(json.dumps(_rounded(payload)) + "\n")
    print(f"wrote {out / f'{exp.name}{tag}.md'}, {json_path.name} and {len(figures)} figures")
    return 0
