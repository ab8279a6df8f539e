"""The energy reproduction's plan: the settings, the runs of the ablation and the cold start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetfed.reproduce.plan import Job
from hetfed.reproduce.plan import Plan as RunPlan

PLAN = RunPlan.load("energy")  # plans/energy.toml: seeds, settings, schedule, the paper's numbers
ENERGY: dict[str, Any] = PLAN.base
VARIANTS = {"as-is": {}, "no-storm": {"energy-exclude-storm": True}}
VARIANT_LABELS = {"as-is": "training split as is", "no-storm": "storm days excluded from training"}
RUNS: dict[str, dict[str, Any]] = {  # run key -> overrides
    "mse": {"loss": "mse"},
    "spo+": {"loss": "spo+"},
    "rspo+-shared": {"loss": "rspo+", "per-client-calibration": False, "anneal": False},
    "rspo+-per-client": {"loss": "rspo+", "anneal": False},
    "rspo+-full": {"loss": "rspo+", "personal-trace": True},  # the personalization diagnosis reads it
}
# Table 5 rows: label -> (run key, stage); then rows the paper's table does not have.
ABLATION = {
    "MSE": ("mse", "fed"),
    "SPO+": ("spo+", "fed"),
    "RSPO+ fed-only, shared lam": ("rspo+-shared", "fed"),
    "+ personalization": ("rspo+-shared", "per"),
    "+ per-client lam/eta": ("rspo+-per-client", "per"),
    "full (annealing and freezing)": ("rspo+-full", "per"),
}
EXTRA = {
    "MSE +P": ("mse", "per"),
    "SPO+ +P": ("spo+", "per"),
    "RSPO+ fed-only, per-client lam": ("rspo+-full", "fed"),
}
PAPER_PJM: dict[str, float] = PLAN.paper["pjm"]
OPTNET_MULTS = (0.05, 0.1, 0.25)  # OptNet-style eps = mult * lam0_j, picked per seed on validation
EQUAL_QUOTA = 8  # Table 13's equal demands: every zone buys 8 hours a day (the D_j average 7.7)
# The paper's other energy tables (4, 13, 15 and the compositions): run key -> overrides.
MORE: dict[str, dict[str, Any]] = {
    "interp-dffl": {"loss": "spo+", "interp-dffl": True, "personal-rounds": 0},
    **{f"optnet-{m:g}": {"loss": "optnet", "optnet-mult": m} for m in OPTNET_MULTS},
    "fedprox": {"loss": "rspo+", "proximal-mu": 0.01},
    "ditto": {"loss": "rspo+", "ditto-mu": 0.1, "personal-rounds": 0},
    **{f"local-{loss}": {"strategy": "local-only", "loss": loss} for loss in ("mse", "spo+", "rspo+")},
    **{f"equal-{loss}": {"loss": loss, "energy-quota": EQUAL_QUOTA} for loss in ("mse", "spo+", "rspo+")},
}


@dataclass(frozen=True)
class Plan:
    """What a reproduction runs: seeds, zones, schedule and the cold-start grid."""

    seeds: tuple[int, ...]
    zones: tuple[str, ...]
    schedule: dict[str, int]
    targets: tuple[str, ...]
    days: tuple[int, ...]

    @classmethod
    def make(cls, seeds: int, quick: bool) -> Plan:
        from hetfed.problems.energy import ERCOT_ZONES

        chosen = PLAN.chosen_seeds(seeds, quick)
        days = tuple(PLAN.axes["quick-cold-days" if quick else "cold-days"])
        if quick:
            return cls(chosen, ERCOT_ZONES[:4], PLAN.quick, ERCOT_ZONES[:1], days)
        return cls(chosen, ERCOT_ZONES, {}, ERCOT_ZONES, days)


def _name(*parts: Any) -> str:
    return "-".join(str(p) for p in parts)


def split_jobs(plan: Plan, kind: str, runs: dict[str, dict[str, Any]]) -> list[Job]:
    """Every run of ``runs`` (label -> overrides) on both training splits, all of the plan's zones,
    each seed: keys ``(kind, split, label)``, run names ``kind-split-label-s<seed>``."""
    return [
        Job(
            (kind, variant, run),
            seed,
            {
                **ENERGY,
                **plan.schedule,
                **extra,
                **overrides,
                "seed": seed,
                "run-name": _name(kind, variant, run.replace(" ", "-"), f"s{seed}"),
            },
        )
        for seed in plan.seeds
        for variant, extra in VARIANTS.items()
        for run, overrides in runs.items()
    ]


def ablation_jobs(plan: Plan) -> list[Job]:
    """Every run of the ablation: run types x data variants x seeds, on all of the plan's zones."""
    return split_jobs(plan, "ablation", RUNS)


def more_jobs(plan: Plan) -> list[Job]:
    """The runs of the paper's other energy tables (:data:`MORE`) on both splits, all zones."""
    return split_jobs(plan, "more", MORE)


def cold_fed_jobs(plan: Plan) -> list[Job]:
    """FedRSPO+ warm starts without the target zone (personal-rounds 0: the federated model only)."""
    return [
        Job(
            ("cold-fed", variant, target),
            seed,
            {
                **ENERGY,
                **plan.schedule,
                **extra,
                "loss": "rspo+",
                "personal-rounds": 0,
                "energy-zones": ",".join(z for z in plan.zones if z != target),
                "seed": seed,
                "run-name": _name("cold-fed", variant, target, f"s{seed}"),
            },
        )
        for seed in plan.seeds
        for variant, extra in VARIANTS.items()
        for target in plan.targets
    ]


def cold_local_jobs(plan: Plan) -> list[Job]:
    """The target zone alone (local-only FedRSPO+ protocol) on its last K training days."""
    return [
        Job(
            ("cold-local", target, str(days)),
            seed,
            {
                **ENERGY,
                **plan.schedule,
                "strategy": "local-only",
                "loss": "rspo+",
                "energy-zones": target,
                "energy-train-days": days,
                "seed": seed,
                "run-name": _name("cold-local", target, f"d{days}", f"s{seed}"),
            },
        )
        for seed in plan.seeds
        for target in plan.targets
        for days in plan.days
    ]


# --- reading runs back ----------------------------------------------------------------------------
