"""The energy reproduction's plan (plans/energy.toml): settings, and the runs of each table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetfed.reproduce.plan import Job
from hetfed.reproduce.plan import Plan as RunPlan

PLAN = RunPlan.load("energy")
VARIANTS = {"as-is": {}, "no-storm": {"energy-exclude-storm": True}}
VARIANT_LABELS = {"as-is": "training split as is", "no-storm": "storm days excluded from training"}


def table_runs(table: str) -> dict[str, dict[str, Any]]:
    """The plan's runs of ``table`` (``ablation``, ``more``, ``pilot``): method -> config overrides."""
    return {run["method"]: run["config"] for run in PLAN.runs if run["table"] == table}


RUNS, MORE = table_runs("ablation"), table_runs("more")
# Table 5's rows, label -> (run, stage), then rows the paper's table does not have.
ABLATION, EXTRA = PLAN.budget["table-5"], PLAN.budget["table-5-extra"]
OPTNET_MULTS = tuple(c["optnet-mult"] for c in MORE.values() if "optnet-mult" in c)


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

    def job(self, key: tuple[str, ...], seed: int, overrides: dict[str, Any], *name: str) -> Job:
        """A run of ``key``: the base config, the schedule, then ``overrides``; its name is ``name``
        (default: ``key``) and the seed."""
        run_name = "-".join([*(name or key), f"s{seed}"]).replace(" ", "-")
        return Job(key, seed, {**PLAN.base, **self.schedule, **overrides, "seed": seed, "run-name": run_name})

    def split_jobs(self, kind: str) -> list[Job]:
        """Every run of the plan's table ``kind`` on both training splits, all zones, each seed:
        keys ``(kind, split, label)``."""
        return [
            self.job((kind, variant, run), seed, {**extra, **overrides})
            for seed in self.seeds
            for variant, extra in VARIANTS.items()
            for run, overrides in table_runs(kind).items()
        ]

    def others(self, target: str) -> str:
        """Every zone but ``target`` (``energy-zones``)."""
        return ",".join(z for z in self.zones if z != target)

    def cold_fed_jobs(self) -> list[Job]:
        """FedRSPO+ warm starts without the target zone (personal-rounds 0: the federated model only)."""
        return [
            self.job(
                ("cold-fed", variant, target),
                seed,
                {**extra, "loss": "rspo+", "personal-rounds": 0, "energy-zones": self.others(target)},
            )
            for seed in self.seeds
            for variant, extra in VARIANTS.items()
            for target in self.targets
        ]

    def cold_local_jobs(self) -> list[Job]:
        """The target zone alone (local-only FedRSPO+ protocol) on its last K training days."""
        alone = {"strategy": "local-only", "loss": "rspo+"}
        return [
            self.job(
                ("cold-local", target, str(days)),
                seed,
                {**alone, "energy-zones": target, "energy-train-days": days},
                *("cold-local", target, f"d{days}"),
            )
            for seed in self.seeds
            for target in self.targets
            for days in self.days
        ]
