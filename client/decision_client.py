"""The decision client: FedAvg's and FedRSPO+'s (handler ``decision``), and the shared base of every
decision-focused client. The other kinds, each in its own module:

- Ditto's personal model step (client/ditto.py) and Interp-DFFL's blend (client/interp_dffl.py), which
  this client runs when the run's ``ditto-mu`` / ``interp-dffl`` ask for them;
- the local-only baseline's client (client/local_only.py) and the centralized yardstick's (client/
  pooled.py), subclasses of this one;
- the calibration every kind shares (client/calibration.py).

One client holds features -> costs data and its own polytope. Handlers:

- ``query.info``: partition, name, n_j.
- ``query.calibrate``: checks that the client can calibrate, ``R_j = max_{w in S_j} ||w||``,
  ``lam0_j = mean_i ||c_i|| / R_j``, ``lr0_j = alpha lam0_j / 4`` (docs/algorithms.md 1.3); the client
  keeps them.
- ``query.masked_calibration`` (shared calibration only): ``(lam0_j, lr0_j)`` as the reply of a
  secure sum, which client/secure_aggregation.py masks (SecAgg+); refused in any message outside
  that protocol, so only their mean can be recovered by the server. Neither value nor the radius
  ever leaves in the clear.
- every training message's ``lam`` / ``lr``, when it carries them (a shared calibration, or the
  run's lr for a loss without one), replace the client's own ``lam0_j`` / ``lr0_j``.
- ``train``: one warm-start round: validation metrics of the received model, then E epochs
  with a fresh Adam (clip per array), optional FedProx term ``(mu/2)||theta - theta_g||^2``
  and Ditto update of the persistent personal model; replies with the new weights.
  Local-only: the client trains its own stored model instead and replies with scalars only.
- ``train.personalize``: all R_per personalization rounds locally (docs/algorithms.md 1.5); the
  personal model, Adam state and schedule are saved after every round, so a re-sent
  instruction continues where a restarted node stopped. The lam_t, lr_t path stays in the
  client's state (``personal-log``); the reply carries the freeze statistic and losses only.
- ``evaluate``: test-set decision quality of the federated model and, when present, of the
  personal model (and of the Interp-DFFL blend when enabled); with both, the silo deploys the one
  better on its own validation data (``dep-`` metrics, kept in its state as ``deployed``).

The handlers run typed functions of the client's data and params (``step_sizes``,
``personal_schedule``, ``personalize``, ``evaluation``); ``personalize_and_evaluate`` runs the last
two without messages or state, for a client that receives a model outside a federation (the energy
reproduction's cold start).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, MetricRecordValues, RecordDict

from hetfed.client.adam import Adam
from hetfed.client.batch_losses import make_loss
from hetfed.client.calibration import check_projection, own_calibration, step_sizes
from hetfed.client.decision import (
    BATCHES,
    MONITOR,
    NOISE,
    BatchLoss,
    batch_generator,
    decision_metrics,
    proximal_term,
    train_epochs,
)
from hetfed.client.ditto import ditto_step
from hetfed.client.interp_dffl import interp_dffl
from hetfed.client.personalization import PersonalSchedule
from hetfed.client.session import ClientSession
from hetfed.client.state import ROUND_KEY, ClientState, optimizer_from_state, optimizer_to_state
from hetfed.methods.decision import DecisionParams
from hetfed.problems.base import DecisionClientData
from hetfed.problems.metrics import qp_lp_gap
from hetfed.problems.models import load_record, make_mlp, model_manifest, model_record
from hetfed.records import scalar, to_record

DEPLOYED = "deployed"  # the client-state group of the model this silo deploys (evaluate)
FEDERATED = "federated"  # the federated model as this silo received it for its final evaluation
SCALING = "scaling"  # the feature standardisation this silo trained with (mean, std)
MANIFEST = "manifest"  # what the kept models take and return, and what the silo's problem was read from


MODEL_NAMES = {"fed": "federated", "per": "personal"}  # evaluate's metric prefixes -> state groups


def personal_schedule(
    data: DecisionClientData, params: DecisionParams, shared: tuple[float, float] | None = None
) -> PersonalSchedule:
    """The personalization schedule of a client holding ``data`` (docs/algorithms.md 1.5), from its
    :func:`step_sizes` for the personalization loss."""
    loss = params.phase_loss("personal")
    lam, lr = step_sizes(data, params, loss, shared)
    return PersonalSchedule.from_params(params, loss, lam, lr)


def train_local(
    data: DecisionClientData,
    params: DecisionParams,
    model: torch.nn.Module,
    optimizer: Adam,
    loss: BatchLoss,
    epochs: int,
    generator: torch.Generator,
    penalty: Callable[[], torch.Tensor] | None = None,
) -> float:
    """``epochs`` epochs of ``loss`` on the client's training data in mini-batches drawn by ``generator``."""
    return train_epochs(
        model,
        [(data.train, loss)],
        optimizer,
        epochs=epochs,
        batch_size=params.batch_size,
        generator=generator,
        clip_norm=params.clip_norm,
        penalty=penalty,
    )


def personalize(
    data: DecisionClientData,
    params: DecisionParams,
    model: torch.nn.Module,
    optimizer: Adam,
    sched: PersonalSchedule,
    seed: int,
    partition_id: int,
    path: dict[str, float],
    checkpoint: Callable[[], None] | None = None,
) -> dict[str, float]:
    """The personalization rounds after ``sched.round``, up to R_per (docs/algorithms.md 1.5): lam_t,
    lr_t, the freeze on the QP-LP gap U_t of a monitor subset of the validation data and the stop
    follow ``sched``; ``model`` and ``optimizer`` train in place, ``path`` gains each round's
    ``r<t>-lam`` / ``r<t>-lr`` and ``checkpoint`` (if any) runs after every round. Returns the
    per-round metrics (freeze statistic, loss, validation regret) and where the schedule ended."""
    loss_name = params.phase_loss("personal")
    metrics: dict[str, float] = {}
    monitor = np.random.default_rng(np.random.SeedSequence([seed, MONITOR, partition_id]))
    size = min(params.monitor_size, len(data.val))
    for t in range(1, params.personal_rounds + 1):
        # Draw the monitor subset every round, also for rounds already done, to keep the stream aligned.
        index = torch.from_numpy(np.sort(monitor.choice(len(data.val), size=size, replace=False)))
        if t <= sched.round:
            continue
        if not sched.trains(t):
            break  # a frozen client trains freeze-extra-rounds more and then stops
        sched.begin(t)
        for group in optimizer.param_groups:
            group["lr"] = sched.lr
        noise = batch_generator(seed, NOISE, partition_id, 1000 + t)
        loss = make_loss(loss_name, data.train, data.polytope, params, sched.lam, noise)
        batches = batch_generator(seed, BATCHES, partition_id, 1000 + t)
        train_loss = train_local(data, params, model, optimizer, loss, params.personal_epochs, batches)
        u = qp_lp_gap(data.val.c[index], data.polytope, sched.lam)
        sched.end(t, u)
        val = decision_metrics(model, data.val, data.polytope)
        path.update({f"r{t}-lam": sched.lam, f"r{t}-lr": sched.lr})
        metrics.update(
            {
                f"r{t}-freeze-stat": u,
                f"r{t}-train-loss": train_loss,
                f"r{t}-val-relative-regret": val["relative-regret"],
            }
        )
        if params.personal_trace:  # a diagnosis: the test metrics the evaluation reports, per round
            test = decision_metrics(model, data.test, data.polytope)
            metrics.update({f"r{t}-test-{k}": test[k] for k in ("absolute-regret", "relative-regret")})
        if checkpoint is not None:
            checkpoint()
    return {
        **metrics,
        "rounds-trained": sched.round,
        "frozen-at": sched.frozen_at,
        "num-examples": len(data.train),
    }


def evaluation(
    data: DecisionClientData, models: Mapping[str, torch.nn.Module | None]
) -> tuple[dict[str, float], str]:
    """Test-set decision quality (LP oracle) and validation relative regret
    (``<prefix>-val-relative-regret``) of each model present, by metric prefix. With two, the
    deployed model (``dep-``) is the one with the lower validation regret (``fed`` on a tie).
    Returns the metrics and the deployed model's prefix ("" without a model)."""
    metrics: dict[str, float] = {}
    tested: dict[str, dict[str, float]] = {}
    val: dict[str, float] = {}
    for prefix, model in models.items():
        if model is not None:
            tested[prefix] = decision_metrics(model, data.test, data.polytope)
            metrics.update({f"{prefix}-{k}": v for k, v in tested[prefix].items()})
            val[prefix] = decision_metrics(model, data.val, data.polytope)["relative-regret"]
            metrics[f"{prefix}-val-relative-regret"] = val[prefix]
    chosen = next(iter(tested), "")  # the only model, when there is one
    if len(tested) == 2:  # this silo deploys whichever model is better on its own validation days
        chosen = "per" if val["per"] < val["fed"] else "fed"
        metrics.update({f"dep-{k}": v for k, v in tested[chosen].items()})
        metrics["dep-val-relative-regret"] = val[chosen]
        metrics["dep-personal"] = int(chosen == "per")
    return metrics, chosen


def personalize_and_evaluate(
    data: DecisionClientData, params: DecisionParams, arrays: Mapping[str, np.ndarray], seed: int
) -> dict[str, float]:
    """What a decision client holding ``data`` (partition 0 of 1, the run's ``seed``) does with a
    received federated model ``arrays`` at the end of FedRSPO+, without messages or state: its own
    calibration, every personalization round (:func:`personalize`), then the evaluation of the
    personal (``per-``) and the received (``fed-``) model (:func:`evaluation`). The handlers
    ``train.personalize`` and ``evaluate`` run the same functions (Interp-DFFL aside)."""
    fed = make_mlp(data.num_features, params.hidden, data.num_costs, seed=seed)
    fed.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
    personal = make_mlp(data.num_features, params.hidden, data.num_costs, seed=seed)
    personal.load_state_dict(fed.state_dict())
    sched = personal_schedule(data, params)
    optimizer = Adam(personal.parameters(), lr=sched.lr0)
    personalize(data, params, personal, optimizer, sched, seed, 0, {})
    return evaluation(data, {"per": personal, "fed": fed})[0]


class DecisionClient:
    """Handlers of one client holding a decision problem (features -> LP costs)."""

    def __init__(self, session: ClientSession, context: Context, settings: Mapping[str, Any]) -> None:
        self.session = session
        self.cfg = session.cfg  # the problem's keys only (seed, data)
        self.settings = settings  # the message's ConfigRecord (strategy's client_settings)
        self.params = DecisionParams.from_config(settings)  # the method's parameters, typed
        self.data: DecisionClientData = session.data()
        self.context = context
        self.pid = session.partition_id

    # --- helpers ---------------------------------------------------------------------------
    def new_model(self) -> torch.nn.Module:
        return make_mlp(
            self.data.num_features, self.params.hidden, self.data.num_costs, seed=self.cfg["seed"]
        )

    def model(self, arrays: ArrayRecord) -> torch.nn.Module:
        """A model with the received weights."""
        return load_record(self.new_model(), arrays)

    def stored_model(self, state: ClientState, name: str) -> torch.nn.Module | None:
        """The model saved under ``name`` in the client's state, or None."""
        arrays = state.arrays(name)
        if arrays is None:
            return None
        arrays.pop(ROUND_KEY, None)
        return self.model_of(arrays)

    def model_of(self, arrays: Mapping[str, np.ndarray]) -> torch.nn.Module:
        """A new model holding ``arrays``."""
        model = self.new_model()
        model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
        return model

    def state(self, content: RecordDict) -> ClientState:
        return self.session.state(self.context, content.config_records["config"])

    def gen(self, stream: int, server_round: int) -> torch.Generator:
        return batch_generator(self.cfg["seed"], stream, self.pid, server_round)

    def fit(
        self,
        model: torch.nn.Module,
        optimizer: Adam,
        loss: BatchLoss,
        epochs: int,
        server_round: int,
        penalty: Callable[[], torch.Tensor] | None = None,
    ) -> float:
        generator = self.gen(BATCHES, server_round)
        return train_local(self.data, self.params, model, optimizer, loss, epochs, generator, penalty)

    # --- handlers --------------------------------------------------------------------------
    def query_info(self, content: RecordDict) -> RecordDict:
        """Who this client is: its partition and sample count (scalars only), and the silo's notes on
        its own files (ignored columns, relaxed integer variables), which the run records."""
        info: dict[str, Any] = {
            "name": self.data.name,
            "partition-id": self.pid,
            "num-partitions": self.session.num_partitions,
        }
        if self.data.source.get("notes"):
            info["notes"] = list(self.data.source["notes"])
        return RecordDict(
            {
                "info": ConfigRecord(info),
                "metrics": MetricRecord({"num-examples": len(self.data.train)}),
            }
        )

    def calibration(self) -> dict[str, float]:
        """This client's ``lam0_j``, ``lr0_j`` and radius, from its own data (they stay here)."""
        return own_calibration(self.data, self.params)

    @staticmethod
    def shared(config: ConfigRecord) -> tuple[float, float] | None:
        """A training message's shared calibration (``shared-lam``, ``shared-lr``), if it carries one."""
        if "shared-lam" not in config:
            return None
        return float(scalar(config["shared-lam"])), float(scalar(config["shared-lr"]))

    def query_calibrate(self, content: RecordDict) -> RecordDict:
        """Can this client take part (its projection and calibration work)? Its lam0_j, lr0_j and
        radius stay here."""
        check_projection(self.data, self.params)
        self.calibration()
        return RecordDict({"metrics": MetricRecord({"num-examples": len(self.data.train)})})

    def query_masked_calibration(self, content: RecordDict) -> RecordDict:
        """``(lam0_j, lr0_j)`` as a secure sum's reply (array ``calibration``), which the ClientApp masks
        before it leaves (client/secure_aggregation.py ``finish_reply``: the server recovers only the
        sum over the clients); refused in a message that is not a secure sum's (no ``secagg-step``)."""
        config = content.config_records["config"]
        if "secagg-step" not in config or "sum-weight" not in config:
            raise PermissionError(
                f"{self.data.name}: refused to send its calibration outside secure aggregation (the "
                "message declares no secagg-step)"
            )
        cal = self.calibration()
        # metrics: where finish_reply counts a value its code clipped (the server refuses the mean then)
        return RecordDict(
            {
                "arrays": to_record({"calibration": np.array([cal["lam0"], cal["lr0"]])}),
                "metrics": MetricRecord(),
            }
        )

    def train(self, content: RecordDict) -> RecordDict:
        """One warm-start round: this round's loss and step sizes, then :meth:`train_round`."""
        config = content.config_records["config"]
        rnd = int(scalar(config["server-round"]))
        name = self.params.phase_loss("warm")
        lam, lr = step_sizes(self.data, self.params, name, self.shared(config))
        loss = make_loss(name, self.data.train, self.data.polytope, self.params, lam, self.gen(NOISE, rnd))
        return self.train_round(content, loss, lr, self.params.local_epochs, rnd)

    def train_round(
        self, content: RecordDict, loss: BatchLoss, lr: float, epochs: int, rnd: int
    ) -> RecordDict:
        """The received model after ``epochs`` epochs (with FedProx's term, and Ditto's step for the
        personal model); replies with its weights."""
        model = self.model(content.array_records["arrays"])
        val = decision_metrics(model, self.data.val, self.data.polytope)
        optimizer = Adam(model.parameters(), lr=lr)
        mu = self.params.proximal_mu
        penalty = proximal_term(model, model, mu) if mu > 0 else None
        if self.params.ditto_mu > 0:
            ditto_step(self, self.state(content), content.array_records["arrays"], loss, lr, epochs, rnd)
        train_loss = self.fit(model, optimizer, loss, epochs, rnd, penalty)
        return RecordDict(
            {
                "arrays": model_record(model),
                "metrics": MetricRecord(
                    {
                        "num-examples": len(self.data.train),
                        "train-loss": train_loss,
                        "val-relative-regret": val["relative-regret"],
                    }
                ),
            }
        )

    def train_personalize(self, content: RecordDict) -> RecordDict:
        """All personalization rounds t = 1..R_per, locally (:func:`personalize`); the personal model,
        its Adam state and the schedule are kept after every round when the state is on disk."""
        params, config = self.params, content.config_records["config"]
        state = self.state(content)
        sched = personal_schedule(self.data, params, self.shared(config))
        kept = state.values("schedule")
        if kept is None:  # a fresh start
            model = self.personal_start(state, content)
            optimizer = Adam(model.parameters(), lr=sched.lr0)
        else:  # a restarted node continues where it stopped
            sched.resume(kept)
            personal = self.stored_model(state, "personal")
            saved_arrays, saved_values = state.arrays("optimizer"), state.values("optimizer")
            if personal is None or saved_arrays is None or saved_values is None:  # saved before the schedule
                raise ValueError(
                    f"{self.data.name}: client state holds a personalization schedule but not the personal "
                    "model and its optimizer state"
                )
            model = personal
            optimizer = Adam(model.parameters(), lr=sched.lr0)
            optimizer_from_state(optimizer, saved_arrays, saved_values)
        path = state.values("personal-log") or {}  # lam_t, lr_t: derived from lam0_j, so kept here

        def checkpoint() -> None:
            self.save_personal(state, model, optimizer, sched.position())
            state.set_values("personal-log", path)

        each = checkpoint if state.directory is not None else None  # on disk: a restarted node resumes there
        done = personalize(self.data, params, model, optimizer, sched, self.cfg["seed"], self.pid, path, each)
        checkpoint()
        metrics: dict[str, MetricRecordValues] = dict(done)
        return RecordDict({"metrics": MetricRecord(metrics)})

    def personal_start(self, state: ClientState, content: RecordDict) -> torch.nn.Module:
        """The model personalization starts from: the received federated model."""
        return self.model(content.array_records["arrays"])

    def evaluated_models(self, state: ClientState, content: RecordDict) -> dict[str, torch.nn.Module | None]:
        """The models the evaluation tests (by metric prefix): the personal and the federated one."""
        return {
            "per": self.stored_model(state, "personal"),
            "fed": self.model(content.array_records["arrays"]),
        }

    @staticmethod
    def save_personal(
        state: ClientState, model: torch.nn.Module, optimizer: Adam, sched: dict[str, Any]
    ) -> None:
        """The personal model, its Adam state and the schedule, in the client's state."""
        state.set_arrays("personal", model.state_dict())
        arrays, values = optimizer_to_state(optimizer)
        state.set_arrays("optimizer", arrays)
        state.set_values("optimizer", values)
        state.set_values("schedule", sched)

    def evaluate(self, content: RecordDict) -> RecordDict:
        """Test and validation quality of the federated and the personal model and the one this silo
        deploys (:func:`evaluation`), which is kept in the client's state (``deployed``) with which
        one it is."""
        state = self.state(content)
        models = self.evaluated_models(state, content)
        scores, chosen = evaluation(self.data, models)
        metrics: dict[str, MetricRecordValues] = dict(scores)
        if chosen:
            deployed = models[chosen]
            assert deployed is not None  # evaluation deploys only a model that exists
            state.set_arrays(DEPLOYED, deployed.state_dict())
            state.set_values(DEPLOYED, {"model": "personal" if chosen == "per" else "federated"})
            if (fed := models.get("fed")) is not None:
                state.set_arrays(FEDERATED, fed.state_dict())
            kept = [MODEL_NAMES[p] for p, model in models.items() if model is not None]
            self.save_inference(state, content, deployed, kept=kept)
        if self.params.interp_dffl and (fed := models.get("fed")) is not None:
            metrics.update({f"interp-{k}": v for k, v in interp_dffl(self, fed).items()})
        metrics["num-examples"] = len(self.data.test)
        return RecordDict({"metrics": MetricRecord(metrics)})

    def save_inference(
        self, state: ClientState, content: RecordDict, model: torch.nn.Module, kept: list[str]
    ) -> None:
        """Everything ``hetfed decide`` needs on this silo, beside the kept models: the feature
        standardisation (``scaling``) and the manifest (names, layers, run, method, loss, the
        problem file's sha256). Nothing of it leaves the silo."""
        data = self.data
        if data.scaling is not None:
            state.set_arrays(SCALING, data.scaling.arrays())
        arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        source = {k: v for k, v in data.source.items() if k != "notes"}
        about = {
            "run": str(content.config_records["config"]["run-name"]),
            "method": str(self.settings.get("method", "")),
            "loss": self.params.loss,
            "client": data.name,
            "partition-id": self.pid,
            "features": list(data.feature_names),
            "variables": list(data.variable_names),
            "models": kept,
            "standardized": data.scaling is not None,
            **source,
        }
        state.set_values(MANIFEST, model_manifest(arrays, **about))
