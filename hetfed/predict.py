"""``hetfed predict``: a silo's per-row predictions on new features with its kept model, offline.

The constrained classification tasks on a silo's own table (problem ``tabular``,
problems/tabular.py) keep, at every evaluation, in the silo's client state
(``<state-dir>/<run>.<run-id>-p<partition>/``, client/constrained.py ``save_inference``): the models
(``average``: the method's output, the mean of the averaged rounds' iterates, docs/algorithms.md 2, step 5;
``last``: the last iterate; ``.npz``), the feature standardisation (``scaling.npz``: the mean and
std of the silo's training rows) and the manifest (``manifest.json``: features, label, group column,
constraint, run, method, round). For each row of the new features

    z = model((x - mean) / std),   probability = sigmoid(z),   prediction = [probability > 0.5],

(``prediction = [z > 0]``, as the tasks' accuracy and error rates count), written one row per id,
with a JSON sidecar. The run's folder is found as ``hetfed decide`` finds it (hetfed/decide.py
``state_folder``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetfed.decide import DecideError, read_scaling, refuse_non_finite, state_folder
from hetfed.paths import check_output_file, write_csv_atomically

MODELS = ("average", "last")


class PredictError(DecideError):
    """The state or the features cannot give predictions; one line says which and why."""


def load_tabular_model(folder: Path, which: str | None) -> tuple[str, dict[str, Any], torch.nn.Module]:
    """Model ``which`` (default: ``average`` when kept, else ``last``) of a ``tabular`` run folder, its
    name and the manifest."""
    from hetfed.problems.tabular import model_from_arrays

    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("problem") != "tabular":
        raise PredictError(
            f"{folder}: this run's problem was not a silo's own table (problem 'tabular'); "
            "for problem 'lp' use hetfed decide"
        )
    kept = [m for m in MODELS if m in manifest.get("models", []) and (folder / f"{m}.npz").is_file()]
    name = which or (kept[0] if kept else "average")
    if name not in kept:
        raise PredictError(f"{folder}: no {name} model (kept: {', '.join(kept) or 'none'})")
    with np.load(folder / f"{name}.npz", allow_pickle=False) as stored:
        model = model_from_arrays({k: stored[k] for k in stored.files if not k.startswith("@")})
    return name, manifest, model


def predict(
    state_dir: Path,
    run: str,
    features_file: Path,
    out: Path,
    *,
    model: str | None = None,
    partition: int | None = None,
) -> dict[str, Any]:
    """Write ``out`` (``id``, ``probability``, ``prediction`` per input row) and ``out`` with suffix
    ``.json`` (the sidecar); returns the sidecar's contents."""
    from hetfed.problems.lp import file_sha256, read_samples
    from hetfed.problems.models import hetfed_version

    folder = state_folder(state_dir, run, partition)
    which, manifest, net = load_tabular_model(folder, model)
    mean, std = read_scaling(folder)
    features = list(manifest["features"])
    if len(features) != len(mean):
        raise PredictError(
            f"{folder}: the manifest names {len(features)} features, scaling.npz has {len(mean)}"
        )
    check_output_file("--out", out, {"--features": features_file})
    rows = read_samples(features_file, features, ())  # refuses a file lacking a trained feature
    with torch.no_grad(), np.errstate(over="ignore", invalid="ignore"):  # refused below, with the row
        logits = net(torch.from_numpy((rows.x - mean) / std)).squeeze(-1)
        probability = torch.sigmoid(logits).numpy()
    refuse_non_finite(features_file, rows, logits.numpy()[:, None], "predicted logit", PredictError)
    prediction = (logits.numpy() > 0).astype(int)
    write_predictions(out, rows.ids, probability, prediction)
    sidecar = {
        "run": run,
        "model": which,
        "state": str(folder.resolve()),
        "method": manifest.get("method", ""),
        "round": manifest.get("round"),
        "problem": "tabular",
        "constraint": manifest.get("constraint", ""),
        "features": features,
        "label": manifest.get("label", ""),
        "group": manifest.get("group", ""),
        "trained-with-hetfed": manifest.get("hetfed-version", ""),
        "hetfed-version": hetfed_version(),
        "samples-sha256": manifest.get("samples-sha256", ""),
        "features-file": str(features_file.resolve()),
        "features-sha256": file_sha256(features_file),
        "rows": len(rows.ids),
        "predicted-1": int(prediction.sum()),
        "ignored-columns": list(rows.ignored),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out.with_suffix(".json").write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def write_predictions(
    out: Path, ids: tuple[str, ...], probability: np.ndarray, prediction: np.ndarray
) -> None:
    """``id``, ``probability`` (of label 1, full precision), ``prediction`` (0/1), written atomically."""
    rows = zip(ids, probability.tolist(), prediction.tolist(), strict=True)
    cells = ([i, repr(float(p)), int(y)] for i, p, y in rows)
    write_csv_atomically(out, ["id", "probability", "prediction"], cells)


def summary_line(sidecar: Mapping[str, Any], out: Path) -> str:
    return (
        f"{sidecar['rows']} predictions of run {sidecar['run']} ({sidecar['model']} model, "
        f"{sidecar['predicted-1']} predicted 1) in {out}; sidecar {out.with_suffix('.json')}"
    )
