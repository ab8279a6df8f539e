"""``hetfed decide``: a silo turns its trained model into decisions on new data, offline.

Everything it needs is in the silo's own client state
(``<state-dir>/<run>.<run-id>-p<partition>/``, kept by
the final evaluation, client/decision_client.py ``save_inference``): the models (``deployed``,
``personal``, ``federated``; ``.npz``), the feature standardisation (``scaling.npz``) and the
manifest (``manifest.json``: feature and variable names, the LP file and its sha256). For each
row of the new features it computes

    c_hat = model((x - mean) / std),   w = argmin_{w in S} c_hat'w  (max for a Maximize file),

on the silo's LP (problems/lp.py), checks that ``w`` is feasible (max violation <= 1e-7) and writes
one row per id: the decision, the predicted costs and the predicted objective ``c_hat'w``.
Each row is solved from HiGHS's cold start, so among tied minimisers the one written depends on
that row's predicted costs only (not on the other rows or their order).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hetfed.paths import check_output_file, write_csv_atomically

if TYPE_CHECKING:
    from hetfed.problems.lp import Samples

MODELS = ("deployed", "personal", "federated")
FEASIBILITY_TOL = 1e-7


class DecideError(ValueError):
    """The state, the features or the LP cannot give decisions; one line says which and why."""


@dataclass(frozen=True)
class SiloModel:
    """One model a silo kept for a run, with what it takes and returns."""

    directory: Path
    manifest: dict[str, Any]
    model: torch.nn.Module
    mean: np.ndarray
    std: np.ndarray

    @property
    def features(self) -> list[str]:
        return list(self.manifest["features"])

    @property
    def variables(self) -> list[str]:
        return list(self.manifest["variables"])

    def predict(self, x: np.ndarray) -> torch.Tensor:
        """``model((x - mean) / std)`` for raw features ``x [n, p]``."""
        # Features far outside the training data may overflow: refuse_non_finite names their rows.
        with torch.no_grad(), np.errstate(over="ignore", invalid="ignore"):
            return self.model(torch.from_numpy((x - self.mean) / self.std))


def state_folder(state_dir: Path, run: str, partition: int | None = None) -> Path:
    """The folder of ``run`` (its name, or ``<name>.<run-id>`` when several runs used the name) in
    a silo's state dir (client/state.py ``run_key``), among those that kept a model."""
    from hetfed.client.state import list_states

    if not state_dir.is_dir():
        raise DecideError(f"--state-dir {state_dir}: no such folder")
    kept = [s for s in list_states(state_dir) if (s.path / "manifest.json").is_file()]
    found = [s for s in kept if run in (s.run_name, s.key) and partition in (None, s.partition_id)]
    if not found and partition is not None and (held := [s for s in kept if run in (s.run_name, s.key)]):
        partitions = ", ".join(sorted({str(s.partition_id) for s in held}))
        raise DecideError(
            f"--partition {partition}: run {run!r} kept a model here for partition {partitions} only"
        )
    if not found:
        names = sorted({s.run_name for s in kept})
        hint = f"; runs with a kept model there: {', '.join(names)}" if names else "; no run kept one there"
        raise DecideError(f"--state-dir {state_dir}: run {run!r} kept no model here{hint}")
    runs = {s.key: s.created for s in found}
    if len(runs) > 1:
        listed = ", ".join(f"{key} (made {made})" for key, made in sorted(runs.items(), key=lambda kv: kv[1]))
        raise DecideError(
            f"--state-dir {state_dir}: {len(runs)} runs named {run!r} kept a model here ({listed}); "
            "name one as --run <name>.<run-id>"
        )
    if len(found) > 1:
        raise DecideError(
            f"--state-dir {state_dir}: run {run!r} has state for several partitions "
            f"({', '.join(s.path.name for s in found)}); name one with --partition"
        )
    return found[0].path


def refuse_non_finite(
    path: Path, rows: Samples, values: np.ndarray, what: str, error: type[DecideError]
) -> None:
    """``error`` naming the first row of ``path`` (its id and file row) whose ``values`` (one row per
    sample) are NaN or infinite: features far outside the training range overflow the model, and a
    solver given them fails without saying where."""
    bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if bad.size:
        i = int(bad[0])
        where = f"{path} row {rows.rows[i]}" if rows.rows else str(path)
        raise error(
            f"{where} (id {rows.ids[i]!r}): the {what} are not finite (features far outside the training "
            f"data?); {bad.size} row(s) like it"
        )


def load_silo_model(folder: Path, which: str) -> SiloModel:
    """Model ``which`` of a silo's run folder, its manifest and standardisation (NumPy, no pickle)."""
    from hetfed.problems.models import mlp_from_arrays

    manifest = json.loads((folder / "manifest.json").read_text())
    if not manifest.get("variables") or not manifest.get("problem-file"):
        raise DecideError(
            f"{folder}: this run's problem was not a silo's own LP (problem 'lp'), so there is no LP "
            "file to decide on"
        )
    path = folder / f"{which}.npz"
    if not path.is_file():
        kept = [m for m in MODELS if (folder / f"{m}.npz").is_file()]
        raise DecideError(f"{folder}: no {which} model (kept: {', '.join(kept) or 'none'})")
    with np.load(path, allow_pickle=False) as stored:
        # "@round" and other bookkeeping (client/state.py) are not layers
        model = mlp_from_arrays({k: stored[k] for k in stored.files if not k.startswith("@")})
    mean, std = read_scaling(folder)
    return SiloModel(folder, manifest, model.eval(), mean, std)


def read_scaling(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The recorded standardisation ``(mean, std)`` of a silo's run folder (NumPy, no pickle)."""
    path = folder / "scaling.npz"
    if not path.is_file():
        raise DecideError(
            f"{folder}: scaling.npz (the standardisation the model was trained with) is missing"
        )
    with np.load(path, allow_pickle=False) as scaling:
        return scaling["mean"], scaling["std"]


def decide(
    state_dir: Path,
    run: str,
    features_file: Path,
    out: Path,
    *,
    model: str = "deployed",
    problem: Path | None = None,
    partition: int | None = None,
) -> dict[str, Any]:
    """Write ``out`` (one decision per input id) and ``out`` with suffix ``.json`` (the sidecar);
    returns the sidecar's contents."""
    from hetfed.problems.lp import file_sha256, read_lp, read_samples

    silo = load_silo_model(state_folder(state_dir, run, partition), model)
    manifest = silo.manifest
    recorded = Path(manifest["problem-file"])
    lp_path = problem or recorded
    if problem is None:
        if not recorded.is_file():
            raise DecideError(f"the LP file this silo trained on, {recorded}, is gone; pass --problem FILE")
        if file_sha256(recorded) != manifest["problem-sha256"]:
            raise DecideError(
                f"{recorded} changed since run {run!r} trained on it (sha256 differs from the manifest's); "
                "pass --problem FILE to decide on a changed LP"
            )
    check_output_file("--out", out, {"--features": features_file, "--problem": lp_path})
    lp = read_lp(lp_path, silo.variables, relax_integers=bool(manifest.get("relaxed-integers")))
    rows = read_samples(features_file, silo.features, ())
    c_hat = silo.predict(rows.x)
    refuse_non_finite(features_file, rows, c_hat.numpy(), "predicted costs", DecideError)
    w = lp.decisions(lp.minimisation_set.solve_lp(c_hat, backend="highs-cold"))
    violation = lp.feasible_set.max_violation(w)
    worst = int(torch.argmax(violation))
    if float(violation[worst]) > FEASIBILITY_TOL:
        raise DecideError(
            f"the decision for id {rows.ids[worst]!r} violates {lp_path} by {float(violation[worst]):.3g} "
            f"(> {FEASIBILITY_TOL:g})"
        )
    objective = (c_hat * w).sum(dim=1)
    write_decisions(out, rows.ids, silo.variables, w.numpy(), c_hat.numpy(), objective.numpy())
    sidecar = {
        "run": run,
        "model": model,
        "state": str(silo.directory.resolve()),
        "method": manifest.get("method", ""),
        "loss": manifest.get("loss", ""),
        "trained-with-hetfed": manifest.get("hetfed-version", ""),
        "hetfed-version": _version(),
        "problem-file": str(lp_path.resolve()),
        "problem-sha256": file_sha256(lp_path),
        "trained-problem-sha256": manifest["problem-sha256"],
        "sense": "maximize" if lp.maximize else "minimize",
        "features-file": str(features_file.resolve()),
        "features-sha256": file_sha256(features_file),
        "rows": len(rows.ids),
        "max-violation": float(violation.max()) if len(rows.ids) else 0.0,
        "ignored-columns": list(rows.ignored),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out.with_suffix(".json").write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def write_decisions(
    out: Path,
    ids: tuple[str, ...],
    variables: list[str],
    w: np.ndarray,
    c_hat: np.ndarray,
    objective: np.ndarray,
) -> None:
    """``id``, one column per variable, ``cost:<variable>`` (predicted), ``objective`` (predicted)."""
    from hetfed.problems.lp import COST_PREFIX

    write_csv_atomically(
        out,
        ["id", *variables, *(COST_PREFIX + v for v in variables), "objective"],
        (
            [ident, *map(repr, w[i].tolist()), *map(repr, c_hat[i].tolist()), repr(float(objective[i]))]
            for i, ident in enumerate(ids)
        ),
    )


def _version() -> str:
    from hetfed.problems.models import hetfed_version

    return hetfed_version()


def summary_line(sidecar: Mapping[str, Any], out: Path) -> str:
    return (
        f"{sidecar['rows']} decisions of run {sidecar['run']} ({sidecar['model']} model, "
        f"{sidecar['sense']} over {Path(sidecar['problem-file']).name}, max violation "
        f"{sidecar['max-violation']:.1e}) in {out}; sidecar {out.with_suffix('.json')}"
    )
