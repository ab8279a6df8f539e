"""The energy reproduction's report: energy.md from energy.json alone (templates/energy.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetfed.reproduce.common import render
from hetfed.reproduce.energy.plan import ABLATION, EXTRA, VARIANT_LABELS

PER_ZONE = ("MSE", "SPO+", "SPO+ +P", "RSPO+ fed-only, per-client lam", "full (annealing and freezing)")


def storm_facts(storm: dict[str, Any], learning: dict[str, Any]) -> dict[str, Any]:
    """The storm paragraph's numbers: means over zones, and the RSPO+ runs' late swing per split."""
    zones = storm["zones"].values()

    def mean(f: Any) -> float:
        return float(np.mean([f(z) for z in zones]))

    def swing(runs: dict[str, Any]) -> str:
        late = [c["late-swing"] for run, c in runs.items() if run.startswith("rspo+")]
        return f"{np.mean(late):.1f}" if late else "n/a"

    return {
        "ratio": mean(lambda z: z["lam0"] / z["lam0-no-storm"]),
        "sq": mean(lambda z: z["share-sum-sq-norm-%"]),
        "share": mean(lambda z: z["share-sum-norm-%"]),
        "dec": mean(lambda z: z["decisiveness"]),
        "dec_clean": mean(lambda z: z["decisiveness-no-storm"]),
        "swing": {v: swing(learning.get(v, {})) for v in VARIANT_LABELS},
    }


def trace_facts(block: dict[str, Any]) -> dict[str, Any]:
    """When the personal model goes wrong, and whether validation saw it ({} without cases)."""
    cases = [c for by_seed in block["cases"].values() for c in by_seed.values()]
    if not cases:
        return {}
    val_better = [c["val-%"][-1] < c["fed-val-%"] for c in cases]
    test_worse = [c["test"][-1] > c["fed-test"] for c in cases]
    return {
        "last": str(max(map(int, block["rounds"]))),
        "n": len(cases),
        "val_better": sum(val_better),
        "test_worse": sum(test_worse),
        "both": sum(v and w for v, w in zip(val_better, test_worse, strict=True)),
        "frozen": [c["frozen-at"] for c in cases if c["frozen-at"]],
    }


def markdown(data: dict[str, Any]) -> str:
    """docs/results/energy.md from energy.json alone."""
    from hetfed.problems.energy import zone_quota

    cold = data["cold-start"]
    feds = cold["federated"]
    short = [b for days, b in cold["local"].items() if days != "0"]
    return render(
        "energy.md",
        d=data,
        engine=data.get("engine", "inline"),
        labels=VARIANT_LABELS,
        ablation=list(ABLATION),
        extra=list(EXTRA),
        per_zone=PER_ZONE,
        quota=zone_quota,
        cold_beaten={
            v: [d for d, b in cold["local"].items() if d != "0" and b["absolute"]["mean"]["mean"] > f]
            for v, block in feds.items()
            for f in [block["absolute"]["mean"]["mean"]]
        },
        cold_wins={
            days: [
                sum(f["absolute"]["per-zone"][z]["mean"] < zones[z]["mean"] for z in zones)
                for f in feds.values()
            ]
            for days, block in cold["local"].items()
            for zones in [block["absolute"]["per-zone"]]
        },
        cold_short=short
        and {
            "val": np.mean([b["val-relative-%"]["mean"]["mean"] for b in short]),
            "test": np.mean([b["test-relative-%"]["mean"]["mean"] for b in short]),
        },
        storm=storm_facts(data["storm"], data["learning"]),
        trace={v: trace_facts(b) for v, b in data["personalization-trace"].items()},
    )
