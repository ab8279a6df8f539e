"""The energy reproduction's analysis: tables from the runs' summaries, the storm and model evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import stat
from hetfed.reproduce.energy.plan import ABLATION, EXTRA, OPTNET_MULTS, PLAN, RUNS, VARIANTS, Job, Plan
from hetfed.reproduce.runs import curves

# Each loss's Table 5 run (its fed stage: Fed, its per stage: Fed+P); the predictions' runs too.
LOSS_RUNS = {"mse": "mse", "spo+": "spo+", "rspo+": "rspo+-full"}


def grouped(jobs: list[Job], summaries: list[dict[str, Any]]) -> dict[tuple[str, str], dict[int, Any]]:
    """The summaries of jobs keyed ``(kind, split, run)``: ``{(split, run): {seed: summary}}``."""
    out: dict[tuple[str, str], dict[int, Any]] = {}
    for job, summary in zip(jobs, summaries, strict=True):
        out.setdefault((job.key[1], job.key[2]), {})[job.seed] = summary
    return out


def paired(a: list[float], b: list[float], seeds: list[int], count: str) -> dict[str, Any]:
    """The per-seed differences ``a - b`` (stat) and, as ``count``, in how many seeds ``a < b``."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    return {**stat(diffs, seeds), count: sum(d < 0 for d in diffs)}


def mean_by_round(by_round: list[dict[int, float]]) -> dict[int, float]:
    """Per round, the mean over the curves that reach it."""
    rounds = sorted({t for c in by_round for t in c})
    return {t: float(np.mean([c[t] for c in by_round if t in c])) for t in rounds}


def ablation_table(jobs: list[Job], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """``{variant: {label: {"absolute": stat, "relative-%": stat, "per-zone": {zone: mean}}}}``."""
    runs_of = grouped(jobs, summaries)
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        for label, (run, stage) in {**ABLATION, **EXTRA}.items():
            seeds, rs = list(runs_of[(variant, run)]), list(runs_of[(variant, run)].values())
            out.setdefault(variant, {})[label] = {
                "run": run,
                "stage": stage,
                "absolute": stat([r["aggregate"][f"{stage}-absolute-regret"] for r in rs], seeds),
                "relative-%": stat([100 * r["aggregate"][f"{stage}-relative-regret"] for r in rs], seeds),
                "per-zone": {
                    z: float(np.mean([r["clients"][z][f"{stage}-absolute-regret"] for r in rs]))
                    for z in sorted(rs[0]["clients"])
                },
            }
    return out


def ladder_steps(table: dict[str, Any]) -> dict[str, Any]:
    """Each step of Table 5's ladder, paired by seed: per split, row k minus row k - 1 per seed
    and in how many seeds the step lowered the regret."""
    labels = list(ABLATION)
    out: dict[str, Any] = {}
    for variant, rows in table.items():
        steps = out.setdefault(variant, {})
        for before, after in zip(labels, labels[1:], strict=False):
            a, b = rows[after]["absolute"], rows[before]["absolute"]
            if a["seeds"] != b["seeds"]:  # a pairing by position must pair the same seeds
                raise ValueError(f"{variant}: {after!r} and {before!r} ran other seeds")
            steps[f"{before} -> {after}"] = paired(a["values"], b["values"], a["seeds"], "lower")
    return out


def learning_check(results_dir: Path, jobs: list[Job]) -> dict[str, Any]:
    """Validation relative regret (%) per warm-start and per personalization round, mean over the
    seeds' runs; ``late-swing``: mean over seeds of max - min over the warm start's second half."""
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        for run in RUNS:
            runs = [curves(results_dir / j.config["run-name"]) for j in jobs if j.key[1:] == (variant, run)]
            late = [[v for t, v in c["warm"].items() if t > len(c["warm"]) // 2] for c in runs]
            out.setdefault(variant, {})[run] = {
                "warm": mean_by_round([c["warm"] for c in runs]),
                "personal": mean_by_round([c["personal"] for c in runs]),
                "late-swing": float(np.mean([max(v) - min(v) for v in late if v])),
            }
    return out


def final_model(run_dir: Path) -> Any:
    """A run's final federated model (ERCOT features -> 24 prices), from its models.npz."""
    from hetfed.problems.models import mlp_from_arrays
    from hetfed.server.store import read_models

    return mlp_from_arrays(read_models(run_dir)["global"])


def cold_start_table(
    plan: Plan, results_dir: Path, fed: list[Job], local: list[Job], local_summaries: list[dict[str, Any]]
) -> dict[str, Any]:
    """``{"federated": {variant: block}, "local": {days: block}}``, each block ``{metric: target_stats}``
    of the test absolute and the validation and test relative regret (%). The federated model (of a
    federation without the target) is judged here, on the target's days with the LP oracle."""
    from hetfed.client.decision import decision_metrics

    values: dict[tuple[str, str], dict[str, dict[str, dict[int, float]]]] = {}

    def put(group: tuple[str, str], target: str, seed: int, metrics: tuple[float, float, float]) -> None:
        absolute, val, test = metrics
        named = {"absolute": absolute, "val-relative-%": 100 * val, "test-relative-%": 100 * test}
        for metric, value in named.items():
            values.setdefault(group, {}).setdefault(metric, {}).setdefault(target, {})[seed] = value

    for job in fed:
        _, variant, target = job.key
        model, data = final_model(results_dir / job.config["run-name"]), zone_data(target)
        test, val = (decision_metrics(model, days, data.polytope) for days in (data.test, data.val))
        metrics = (test["absolute-regret"], val["relative-regret"], test["relative-regret"])
        put(("federated", variant), target, job.seed, metrics)
    for job, summary in zip(local, local_summaries, strict=True):
        _, target, days = job.key
        agg = summary["aggregate"]
        metrics = (agg["per-absolute-regret"], agg["per-val-relative-regret"], agg["per-relative-regret"])
        put(("local", days), target, job.seed, metrics)

    out: dict[str, Any] = {"federated": {}, "local": {}}
    for (kind, key), by_metric in values.items():
        out[kind][key] = {metric: target_stats(plan, by_zone) for metric, by_zone in by_metric.items()}
    return out


def target_stats(plan: Plan, by_zone: dict[str, dict[int, float]]) -> dict[str, Any]:
    """``{"per-zone": {zone: stat}, "mean": stat}`` of a value per target zone and seed; ``mean``
    is over seeds of the mean over target zones."""
    seeds = list(plan.seeds)
    return {
        "per-zone": {z: stat([by_zone[z][s] for s in seeds], seeds) for z in plan.targets},
        "mean": stat([float(np.mean([by_zone[z][s] for z in plan.targets])) for s in seeds], seeds),
    }


def decisiveness(data: Any, lam: float) -> float:
    """How far ``w_lam(c)`` moves from the uniform purchase ``u = D/24`` towards the LP decision on
    the training days: ``mean_i ||w_lam(c_i) - u|| / ||w*(c_i) - u||`` (0: uniform, 1: the vertex)."""
    poly, c = data.polytope, data.train.c
    uniform = poly.quota / poly.dim
    smooth = (poly.regularized_argmin(c, lam) - uniform).norm(dim=1)
    vertex = (poly.solve_lp(c) - uniform).norm(dim=1)
    return float((smooth / vertex).mean())


def storm_evidence(plan: Plan) -> dict[str, Any]:
    """Per zone: lam0 with and without the storm days, the storm days' share of the training sums
    that scale the losses (sum ||c|| for lam0, sum ||c||^2 for the MSE gradient), and how decisive
    w_lam0(c) is on the ordinary (non-storm) training days under either lam0."""
    from hetfed.client.calibration import own_calibration
    from hetfed.methods.decision import CalibratedParams
    from hetfed.problems.energy import STORM_DAYS

    params = CalibratedParams.from_config(PLAN.base)
    out: dict[str, Any] = {"storm-days": [str(d) for d in STORM_DAYS], "zones": {}}
    for zone in plan.zones:
        full, clean = (zone_data(zone, **extra) for extra in VARIANTS.values())
        norms, clean_norms = full.train.c.norm(dim=1), clean.train.c.norm(dim=1)
        sq, clean_sq = (norms**2).sum(), (clean_norms**2).sum()
        lam0, lam0_clean = (own_calibration(d, params)["lam0"] for d in (full, clean))
        out["zones"][zone] = {
            "storm-days-in-train": len(full.train) - len(clean.train),
            "train-days": len(full.train),
            "lam0": lam0,
            "lam0-no-storm": lam0_clean,
            "share-sum-norm-%": 100 * float(norms.sum() - clean_norms.sum()) / float(norms.sum()),
            "share-sum-sq-norm-%": 100 * float(sq - clean_sq) / float(sq),
            "decisiveness": decisiveness(clean, lam0),
            "decisiveness-no-storm": decisiveness(clean, lam0_clean),
            "max-train-price": float(full.train.c.max()),
            "max-test-price": float(full.test.c.max()),
            "mean-test-price": float(full.test.c.mean()),
        }
    return out


def zone_data(zone: str, **extra: Any) -> Any:
    """One zone's client data as its node loads it (in this process, cached)."""
    from hetfed.client.session import load_partition

    return load_partition({"problem": "energy", "energy-zones": zone, **extra}, 0, 1, None)


def zone_similarity(plan: Plan) -> dict[str, float]:
    """How alike the zones' test prices are: mean and min over zone pairs of the correlation of
    the hourly prices and of the intra-day shapes (each price minus its day's mean)."""
    prices = np.array([zone_data(zone).test.c.numpy() for zone in plan.zones])  # [zones, days, 24]
    pairs = np.triu_indices(len(plan.zones), 1)
    hourly = np.corrcoef(prices.reshape(len(plan.zones), -1))[pairs]
    shape = np.corrcoef((prices - prices.mean(2, keepdims=True)).reshape(len(plan.zones), -1))[pairs]
    return {
        "price-corr-mean": float(hourly.mean()),
        "price-corr-min": float(hourly.min()),
        "shape-corr-mean": float(shape.mean()),
        "shape-corr-min": float(shape.min()),
    }


def predictions(plan: Plan, results_dir: Path, jobs: list[Job]) -> dict[str, Any]:
    """What the first seed's final federated models predict on the test days, mean over zones:
    the mean predicted and true price ($/MWh) and the within-day correlation of prediction and truth."""
    import torch

    out: dict[str, Any] = {}
    for job in (j for j in jobs if j.seed == plan.seeds[0] and j.key[2] in LOSS_RUNS.values()):
        model = final_model(results_dir / job.config["run-name"])
        predicted, true, corr = [], [], []
        for zone in plan.zones:
            test = zone_data(zone).test
            with torch.no_grad():
                c_hat = model(test.x).numpy()
            c = test.c.numpy()
            predicted.append(c_hat.mean())
            true.append(c.mean())
            corr.append(np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(c_hat, c, strict=True)]))
        out.setdefault(job.key[1], {})[job.key[2]] = {
            "mean-predicted-price": float(np.mean(predicted)),
            "mean-true-price": float(np.mean(true)),
            "within-day-corr": float(np.mean(corr)),
        }
    return out


def more_tables(
    plan: Plan, jobs: list[Job], summaries: list[dict[str, Any]], cold: dict[str, Any], cold_p: dict[str, Any]
) -> dict[str, Any]:
    """The paper's other energy tables per training split from the runs of Table 5 and "more" and the
    cold start (mean absolute regret, stats over seeds): Tables 4, 11, 12, 13, 15 and compositions."""
    by, seeds = grouped(jobs, summaries), list(plan.seeds)

    def cell(variant: str, run: str, stage: str) -> dict[str, Any]:
        return stat([by[(variant, run)][s]["aggregate"][f"{stage}-absolute-regret"] for s in seeds], seeds)

    def fed_per(variant: str, run: str) -> dict[str, Any]:
        return {"fed": cell(variant, run, "fed"), "per": cell(variant, run, "per")}

    def optnet(variant: str) -> dict[str, Any]:
        options = {m: by[(variant, f"optnet-{m:g}")] for m in OPTNET_MULTS}
        picked = [
            min(OPTNET_MULTS, key=lambda m: options[m][s]["aggregate"]["per-val-relative-regret"])
            for s in seeds
        ]
        regret = [
            options[m][s]["aggregate"]["per-absolute-regret"] for s, m in zip(seeds, picked, strict=True)
        ]
        return {**stat(regret, seeds), "multipliers": picked}

    def t15(variant: str, loss: str) -> dict[str, Any]:
        return {
            "centralized": cell(variant, f"centralized-{loss}", "fed"),  # the one pooled model
            "local-only": cell(variant, f"local-{loss}", "per"),
            "Fed": cell(variant, LOSS_RUNS[loss], "fed"),
            "Fed+P": cell(variant, LOSS_RUNS[loss], "per"),
        }

    def t11(variant: str, days: str) -> dict[str, Any]:
        return {
            "local": cold["local"][days]["absolute"]["mean"],
            "Fed": cold["federated"][variant]["absolute"]["mean"],
            "Fed+P": cold_p[variant][days]["mean"],
        }

    def t12(variant: str, days: str) -> dict[str, Any]:
        fed = cold["federated"][variant]["absolute"]["per-zone"]
        local = cold["local"][days]["absolute"]["per-zone"]
        reduction = [100 * (local[z]["mean"] - fed[z]["mean"]) / local[z]["mean"] for z in fed]
        q1, median, q3 = np.percentile(reduction, [25, 50, 75])
        return {
            "zones": len(reduction),
            "federated-better": sum(r > 0 for r in reduction),
            "median-reduction-%": float(median),
            "iqr-%": [float(q1), float(q3)],
        }

    compositions = {
        "FedRSPO+": "rspo+-full",
        "FedRSPO+ with FedProx mu=0.01": "fedprox",
        "Ditto mu=0.1 (RSPO+)": "ditto",
    }
    short_days = [days for days in cold["local"] if days != "0"]
    return {
        "t4": {
            v: {
                "Interp-DFFL": cell(v, "interp-dffl", "interp"),
                "OptNet-style": optnet(v),
                "FedRSPO+": cell(v, "rspo+-full", "per"),
            }
            for v in VARIANTS
        },
        "compositions": {
            v: {label: fed_per(v, run) for label, run in compositions.items()} for v in VARIANTS
        },
        "t11": {v: {days: t11(v, days) for days in cold_p[v]} for v in VARIANTS},
        "t12": {v: {days: t12(v, days) for days in short_days} for v in VARIANTS},
        "t13": {v: {loss: fed_per(v, f"equal-{loss}") for loss in LOSS_RUNS} for v in VARIANTS},
        "t15": {v: {loss: t15(v, loss) for loss in LOSS_RUNS} for v in VARIANTS},
    }


def personalized_on_target(run_dir: Path, config: dict[str, Any], target: str, days: int) -> dict[str, float]:
    """The cold start's Fed+P: the target's client, in this process, personalizes a federation's final
    model on its last ``days`` training days and evaluates it as FedRSPO+ does; the metrics
    (``per-``: personalized, ``fed-``: as received)."""
    from hetfed.client.decision_client import personalize_and_evaluate
    from hetfed.client.session import load_partition
    from hetfed.config import validate
    from hetfed.methods.decision import CalibratedParams
    from hetfed.server.store import read_models

    cfg: dict[str, Any] = validate({**config, "energy-zones": target, "energy-train-days": days})
    data = load_partition(cfg, 0, 1, None)  # the target's data, as its node loads them
    params = CalibratedParams.from_config(cfg)
    return personalize_and_evaluate(data, params, read_models(run_dir)["global"], cfg["seed"])


def cold_personalized(plan: Plan, results_dir: Path, fed: list[Job]) -> dict[str, Any]:
    """Table 11's Fed+P: ``{variant: {K: target_stats}}`` of the federated model's absolute regret
    (trained without the target) personalized on the target's last K days."""
    from hetfed.config import defaults

    values: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
    for job in fed:
        _, variant, target = job.key
        rounds = plan.schedule.get("personal-rounds", defaults()["personal-rounds"])  # the Fed run had 0
        config = {**job.config, "personal-rounds": rounds}
        for days in plan.days:
            metrics = personalized_on_target(results_dir / job.config["run-name"], config, target, days)
            by_zone = values.setdefault(variant, {}).setdefault(str(days), {})
            by_zone.setdefault(target, {})[job.seed] = float(metrics["per-absolute-regret"])
    return {
        variant: {days: target_stats(plan, by_zone) for days, by_zone in by_days.items()}
        for variant, by_days in values.items()
    }


def personalization_trace(results_dir: Path, jobs: list[Job]) -> dict[str, Any]:
    """Why personalization hurts, from the full FedRSPO+ runs (``personal-trace``): per zone and seed
    the federated and per-round personal regrets (validation relative %, test $), the freeze round
    and the lam_t, lr_t path (the client's schedule replayed with its U_t); ``{variant: {"cases":
    {zone: {seed: case}}, "rounds": {t: means over cases still training}, "zones": {zone: means}}}``."""
    from hetfed.client.decision_client import personal_schedule
    from hetfed.config import validate
    from hetfed.methods.decision import CalibratedParams
    from hetfed.server.store import RunResult

    out: dict[str, Any] = {}
    for variant, extra in VARIANTS.items():
        cases: dict[str, dict[str, Any]] = {}
        for job in (j for j in jobs if j.key[1:] == (variant, "rspo+-full")):
            run = RunResult.read(results_dir / job.config["run-name"])
            params = CalibratedParams.from_config(validate(job.config))
            freeze, val = run.local_rounds("freeze-stat"), run.local_rounds("val-relative-regret")
            test = run.local_rounds("test-absolute-regret")
            frozen = run.by_client("frozen-at", "train.personalize")
            for zone, trained in run.by_client("rounds-trained", "train.personalize").items():
                m, local_rounds = run.summary["clients"][zone], range(1, int(trained) + 1)
                sched = personal_schedule(zone_data(zone, **extra), params)  # as the client's own
                path = sched.replay({t: freeze[zone][t] for t in local_rounds})
                cases.setdefault(zone, {})[str(job.seed)] = {
                    "fed-val-%": 100 * m["fed-val-relative-regret"],
                    "fed-test": m["fed-absolute-regret"],
                    "per-test": m["per-absolute-regret"],
                    "frozen-at": int(frozen[zone]),
                    "rounds-trained": int(trained),
                    "val-%": [100 * val[zone][t] for t in local_rounds],
                    "test": [test[zone][t] for t in local_rounds],
                    "lam": [path[t][0] for t in local_rounds],
                    "lr": [path[t][1] for t in local_rounds],
                }
        flat = [c for by_seed in cases.values() for c in by_seed.values()]
        rounds = {}
        for t in range(1, max((c["rounds-trained"] for c in flat), default=0) + 1):
            live = [c for c in flat if c["rounds-trained"] >= t]
            rounds[str(t)] = {
                "cases": len(live),
                "test-minus-fed": float(np.mean([c["test"][t - 1] - c["fed-test"] for c in live])),
                "val-minus-fed-points": float(np.mean([c["val-%"][t - 1] - c["fed-val-%"] for c in live])),
                "worse-on-test": sum(c["test"][t - 1] > c["fed-test"] for c in live),
            }
        zones = {}
        for zone, by_seed in cases.items():
            seeds = list(by_seed.values())
            zones[zone] = {
                "fed-test": float(np.mean([c["fed-test"] for c in seeds])),
                "per-test": float(np.mean([c["per-test"] for c in seeds])),
                "first-round-test": float(np.mean([c["test"][0] for c in seeds])),
                "val-change-points": float(np.mean([c["val-%"][-1] - c["fed-val-%"] for c in seeds])),
                "frozen-at": [c["frozen-at"] for c in seeds],
                "lam0": seeds[0]["lam"][0],
                "lr0": seeds[0]["lr"][0],
                "lam-last": float(np.mean([c["lam"][-1] for c in seeds])),
            }
        out[variant] = {"cases": cases, "rounds": rounds, "zones": zones}
    return out
