"""Client side of the constrained worst-case methods (docs/algorithms.md section 2) and their baselines.

One client class serves the softmax-weighted switching strategy and every baseline
on the same harness. Per round k:

- ``query.fg`` carries ``w_k``; the client returns ``f_i(w_k, xi)`` and ``g_i(w_k, xi)``
  on a fresh batch of ``batch-zeta`` samples (two scalars) and KEEPS ``w_k`` in its
  :class:`~hetfed.client.state.ClientState`;
- ``train`` carries no arrays, only the local objective and the step sizes; starting
  from the kept ``w_k`` the client takes E steps ``w <- w - gamma grad h_i(w, xi_e)``
  with a fresh batch of ``batch-size`` samples per step, where ``h_i`` is ``f_i``,
  ``g_i``, ``f_i + rho max(g_i, 0)`` (penalty) or ``f_i + lambda g_i`` (Lagrangian),
  and returns the normalised update ``u_i = (w_k - w_{k,E}) / (gamma E)``;
- ``evaluate`` carries the iterate (``arrays``) and, once there is one, the averaged
  model (``average``); the client returns ``f``, ``g`` and its task's other metrics on
  its whole training data (``avg-`` prefixed for the average). A task whose features were
  standardised with the silo's own statistics (``scaling``: problem ``tabular``) also keeps
  both models (``last``, ``average``), ``scaling`` and a ``manifest`` in the client's state,
  overwritten at each evaluation, so the state holds the run's final models for ``hetfed predict``.

All batch randomness comes from ``default_rng([seed, stream, partition, round])``,
so every engine draws the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, MetricRecordValues, RecordDict

from hetfed.client.session import ClientSession
from hetfed.client.state import ClientState
from hetfed.client.trust_region import natural_step
from hetfed.methods.constrained import ConstrainedParams
from hetfed.problems.base import Standardization
from hetfed.problems.constrained import ConstrainedClientTask
from hetfed.problems.models import model_manifest
from hetfed.records import scalar, to_numpy, to_record

QUERY_STREAM, TRAIN_STREAM = 11, 12  # batch RNG streams of the two exchanges
KEPT = "switching-w"  # ClientState group holding the w_k of the last query
SCALING, MANIFEST = "scaling", "manifest"  # ClientState groups for hetfed predict (as the decision client's)
MODEL_NAMES = {"arrays": "last", "average": "average"}  # evaluate's arrays -> the ClientState group kept
OBJECTIVES = ("f", "g", "penalty", "lagrangian")

Objective = Callable[[torch.nn.Module, Any], torch.Tensor]


def local_objective(task: ConstrainedClientTask, objective: str, multiplier: float = 0.0) -> Objective:
    """``h_i(w, xi)``: ``f``, ``g``, ``f + multiplier max(g, 0)`` (penalty) or ``f + multiplier g``."""
    if objective == "f":
        return task.f
    if objective == "g":
        return task.g
    if objective == "penalty":
        return lambda model, batch: task.f(model, batch) + multiplier * torch.relu(task.g(model, batch))
    if objective == "lagrangian":
        return lambda model, batch: task.f(model, batch) + multiplier * task.g(model, batch)
    raise ValueError(
        f"train config 'objective': unknown value {objective!r}; choose one of {list(OBJECTIVES)}"
    )


def local_steps(
    task: ConstrainedClientTask,
    model: torch.nn.Module,
    objective: Objective,
    *,
    gamma: float,
    steps: int,
    batch_size: int,
    rng: np.random.Generator,
) -> float:
    """E steps ``w <- w - gamma grad h(w, xi_e)``, a fresh batch per step; returns the last h.

    A task with a ``trust_region`` > 0 (safe RL) takes TRPO-style steps instead
    (client/trust_region.py: natural gradient, mean KL <= trust_region, gamma unused).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    radius = float(getattr(task, "trust_region", 0.0))
    kl_from = getattr(task, "kl_from", None) if radius > 0 else None
    value = float("nan")
    for _ in range(steps):
        batch = task.sample_batch(rng, batch_size, model)
        loss = objective(model, batch)
        if kl_from is not None:
            natural_step(params, loss, kl_from(model, batch), radius)
            value = float(loss.detach())
            continue
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            for p, grad in zip(params, grads, strict=True):
                if grad is not None:
                    p.sub_(gamma * grad)
        value = float(loss.detach())
    return value


def normalised_update(
    start: dict[str, np.ndarray], end: dict[str, np.ndarray], gamma: float, steps: int
) -> dict[str, np.ndarray]:
    """``u = (w_k - w_{k,E}) / (gamma E)`` per array, in float64 arithmetic, in the arrays' own dtype."""
    return {
        key: ((start[key].astype(np.float64) - end[key].astype(np.float64)) / (gamma * steps)).astype(
            start[key].dtype
        )
        for key in start
    }


_SKELETONS: dict[int, tuple[ConstrainedClientTask, torch.nn.Module]] = {}


def _skeleton(task: ConstrainedClientTask) -> torch.nn.Module:
    """One model object per task and process, whose weights every message overwrites.

    ``task.make_model()`` reseeds torch (a few ms per call on CPU-only torch, more than the
    client's whole computation on the small tasks), and the initial weights are never used here.
    """
    if id(task) not in _SKELETONS:  # the task is kept with its model, so its id is never reused
        _SKELETONS[id(task)] = (task, task.make_model())
    return _SKELETONS[id(task)][1]


def num_examples(task: ConstrainedClientTask) -> int:
    """The task's training-set size when it states one (``num_examples``), else 0 (e.g. simulated RL)."""
    return int(getattr(task, "num_examples", 0))


class ConstrainedClient:
    """Handlers of one client holding a :class:`~hetfed.problems.constrained.ConstrainedClientTask`."""

    def __init__(self, session: ClientSession, context: Context, settings: Mapping[str, Any]) -> None:
        self.session = session
        self.cfg = session.cfg  # the problem's keys only (seed, data)
        self.settings = settings  # the message's ConfigRecord (strategy's client_settings)
        self.params = ConstrainedParams.from_config(settings)  # the method's parameters, typed
        self.task: ConstrainedClientTask = session.data()
        self.context = context

    def query_info(self, content: RecordDict) -> RecordDict:
        """Who this client is (scalars only), and the silo's notes on its own file (ignored columns),
        which the run records."""
        info: dict[str, Any] = {
            "name": self.task.name,
            "partition-id": self.session.partition_id,
            "num-partitions": self.session.num_partitions,
        }
        notes = dict(getattr(self.task, "about", {})).get("notes")
        if notes:
            info["notes"] = [str(n) for n in notes]
        return RecordDict(
            {
                "info": ConfigRecord(info),
                "metrics": MetricRecord({"num-examples": num_examples(self.task)}),
            }
        )

    def model(self, arrays: ArrayRecord | Mapping[str, np.ndarray]) -> torch.nn.Module:
        """The task's model holding ``arrays`` (an ArrayRecord or NumPy arrays)."""
        model = _skeleton(self.task)
        weights = to_numpy(arrays) if isinstance(arrays, ArrayRecord) else arrays
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()}, strict=True)
        return model

    def rng(self, stream: int, server_round: int) -> np.random.Generator:
        return np.random.default_rng([int(self.cfg["seed"]), stream, self.session.partition_id, server_round])

    def state(self, config: ConfigRecord) -> ClientState:
        return self.session.state(self.context, config)

    def query_fg(self, content: RecordDict) -> RecordDict:
        """f_i(w_k, xi), g_i(w_k, xi) on a fresh batch of ``batch-zeta``; keep w_k for the train exchange."""
        config = content.config_records["config"]
        server_round = int(scalar(config["server-round"]))
        w_k = to_numpy(content.array_records["arrays"])
        model = self.model(w_k)
        batch = self.task.sample_batch(self.rng(QUERY_STREAM, server_round), self.params.batch_zeta, model)
        with torch.no_grad():
            f, g = float(self.task.f(model, batch)), float(self.task.g(model, batch))
        state = self.state(config)
        state.set_arrays(KEPT, w_k)
        state.set_values(KEPT, {"round": server_round})
        return RecordDict({"metrics": MetricRecord({"f": f, "g": g})})

    def train(self, content: RecordDict) -> RecordDict:
        """E local steps from the kept w_k on the instructed objective; reply u_i
        (docs/algorithms.md section 2, step 3)."""
        config = content.config_records["config"]
        server_round = int(scalar(config["server-round"]))
        state = self.state(config)
        kept, start = state.values(KEPT), state.arrays(KEPT)
        if kept is None or start is None or int(kept["round"]) != server_round:
            have = "none" if kept is None or start is None else f"round {kept['round']}"
            raise ValueError(
                f"{self.task.name}: no model kept from the query.fg exchange of round {server_round} "
                f"(kept: {have}); the train instruction carries no model, so the query must come first"
            )
        model = self.model(start)
        gamma, steps = float(scalar(config["gamma"])), int(scalar(config["local-steps"]))
        objective = local_objective(self.task, str(config["objective"]), float(scalar(config["multiplier"])))
        last = local_steps(
            self.task,
            model,
            objective,
            gamma=gamma,
            steps=steps,
            batch_size=self.params.batch_size,
            rng=self.rng(TRAIN_STREAM, server_round),
        )
        end = {key: value.detach().numpy() for key, value in model.state_dict().items()}
        update = normalised_update(start, end, gamma, steps)
        return RecordDict(
            {
                "arrays": to_record(update),
                "metrics": MetricRecord({"local-steps": steps, "last-objective": last}),
            }
        )

    def evaluate(self, content: RecordDict) -> RecordDict:
        """The task's metrics (``f``, ``g``, ...) of the iterate and, if sent, of the averaged model;
        a task with a ``scaling`` keeps both models for inference (:meth:`save_inference`)."""
        metrics: dict[str, MetricRecordValues] = {}
        arrays = content.array_records
        models: dict[str, dict[str, np.ndarray]] = {}
        for name, prefix in (("arrays", ""), ("average", "avg-")):
            if name in arrays:
                models[MODEL_NAMES[name]] = to_numpy(arrays[name])
                values = self.task.evaluate(self.model(models[MODEL_NAMES[name]]))
                metrics.update({prefix + key: float(value) for key, value in values.items()})
        scaling = getattr(self.task, "scaling", None)
        if models and isinstance(scaling, Standardization):
            self.save_inference(content.config_records["config"], models, scaling)
        return RecordDict({"metrics": MetricRecord(metrics)})

    def save_inference(
        self, config: ConfigRecord, models: Mapping[str, Mapping[str, np.ndarray]], scaling: Standardization
    ) -> None:
        """Everything ``hetfed predict`` needs on this silo: the evaluated models (``last``, and
        ``average`` once there is one), the feature standardisation (``scaling``: mean, std of its
        training rows) and the ``manifest`` (layers, run, method, round, the task's ``about``: features,
        label, group column, constraint, samples file). Nothing of it leaves the silo."""
        run = str(config["run-name"])
        state = self.session.state(self.context, config)
        for name, arrays in models.items():
            state.set_arrays(name, arrays)
        state.set_arrays(SCALING, scaling.arrays())
        about = {
            "run": run,
            "method": str(self.settings.get("method", "")),
            "client": self.task.name,
            "partition-id": self.session.partition_id,
            "round": int(scalar(config["server-round"])),
            "models": list(models),
            "standardized": True,
            **dict(getattr(self.task, "about", {})),
        }
        state.set_values(MANIFEST, model_manifest(next(iter(models.values())), **about))
