"""Softmax-weighted switching gradient for worst-client constrained FL (docs/algorithms.md section 2).

Problem: ``min_w max_i f_i(w)`` subject to ``max_i g_i(w) <= 0``. Round k:

1. sample ``I_k``, ``|I_k| = m`` of the n clients (seeded, by partition);
   exchange ``query.fg`` sends ``w_k``, each ``i in I_k`` returns ``f_i``, ``g_i`` on a
   fresh batch and keeps ``w_k``;
2. ``p = softmax_{I_k}(alpha f)``, ``q = softmax_{I_k}(alpha g)``, ``G_k = <q, g>``,
   ``1_k = [G_k <= threshold]``;
3. exchange ``train`` (no arrays): E local steps of size gamma on ``grad f_i`` if
   ``1_k`` else ``grad g_i``; reply ``u_i = (w_k - w_{k,E}) / (gamma E)``;
4. ``w_{k+1} = w_k - eta sum_{i in I_k} (1_k p_i + (1 - 1_k) q_i) u_i``;
5. output the average of ``w_k`` over the rounds with ``1_k = 1`` (and the last iterate).

A round's phases (strategies/base.py): ``query`` (step 1; its fold makes step 2's decision,
the state's ``plan``), ``train`` (summed; step 3 from the plan, step 4 in its fold), and
``evaluate`` when due (round 0: the initial model's, when evaluating every few rounds).

:class:`ConstrainedRounds` is that harness with step 2 left to :meth:`ConstrainedRounds.decide`;
:class:`SoftmaxSwitching` fills it in, and the baselines of
:mod:`hetfed.strategies.constrained_baselines` (penalty, primal-dual, unconstrained FedAvg,
parallel CRPO) fill it in differently, so every method shares the sampling, the
traffic, the update rule, the counting of gradient evaluations and the evaluation.

Every ``switching-eval-every`` rounds (and after the last) an ``evaluate`` exchange
sends the iterate and the running average to all clients, which return ``f``, ``g``
on their whole training data; the server row records ``F = max_i f_i``,
``G = max_i g_i`` (``avg-F``, ``avg-G`` for the average) against ``grad-evals``, the
cumulative number of local gradient steps taken by all clients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.typing import MetricRecordValues

from hetfed.methods.constrained import ConstrainedParams, SwitchingParams
from hetfed.params import ConfigError
from hetfed.problems.constrained import require
from hetfed.problems.models import model_record
from hetfed.problems.registry import get_problem
from hetfed.records import to_numpy, to_record
from hetfed.strategies.base import FederatedStrategy, Folded, Phase, WeightedSum, drawn, reply_metrics
from hetfed.strategies.result_summary import summarize

SAMPLING_STREAM = 61  # the client-sampling RNG is default_rng(SeedSequence([seed, SAMPLING_STREAM]))


def masked_softmax(values: np.ndarray, mask: np.ndarray, alpha: float) -> np.ndarray:
    """``softmax_I(alpha v)``: ``exp(alpha v_i - M) / sum_{j in I} exp(alpha v_j - M)`` for i in I, else 0.

    ``I = {i : mask_i}``, ``M = max_{j in I} alpha v_j`` (log-sum-exp shift: no overflow for
    any finite ``alpha v``); entries outside I may hold anything, even NaN.
    """
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        raise ValueError("masked_softmax: the mask selects no entry")
    scaled = alpha * np.asarray(values, dtype=np.float64)[mask]
    weights = np.exp(scaled - scaled.max())
    out = np.zeros(mask.shape, dtype=np.float64)
    out[mask] = weights / weights.sum()
    return out


@dataclass(frozen=True)
class SwitchingDecision:
    """Step 2 of the method: the mode of round k and the weights of its update."""

    indicator: bool  # 1_k = [G_k <= threshold]: step on the objectives
    G: float  # G_k = <q, g>
    p: np.ndarray  # softmax_I(alpha f)
    q: np.ndarray  # softmax_I(alpha g)

    @property
    def weights(self) -> np.ndarray:
        """``1_k p + (1 - 1_k) q``."""
        return self.p if self.indicator else self.q


def switching_decision(
    f: np.ndarray, g: np.ndarray, mask: np.ndarray, alpha: float, threshold: float
) -> SwitchingDecision:
    """``p``, ``q``, ``G_k = <q, g>`` and ``1_k = [G_k <= threshold]`` over the sampled entries ``mask``."""
    p = masked_softmax(f, mask, alpha)
    q = masked_softmax(g, mask, alpha)
    G = float(np.dot(q[mask], np.asarray(g, dtype=np.float64)[mask]))
    return SwitchingDecision(G <= threshold, G, p, q)


def weighted_step(w: Mapping[str, np.ndarray], summed: WeightedSum, eta: float) -> dict[str, np.ndarray]:
    """``w - eta sum_i a_i u_i / sum_i a_i`` per array (float64 arithmetic, w's dtype), over the
    clients whose update arrived (``summed``): the plan's weights, renormalised when one is lost."""
    step = summed.mean()
    return {k: (v.astype(np.float64) - eta * step[k]).astype(v.dtype) for k, v in w.items()}


@dataclass(frozen=True)
class RoundPlan:
    """What a method decides from the queried ``f_i``, ``g_i`` of round k."""

    objective: str  # the clients' local objective: "f", "g", "penalty" or "lagrangian"
    weights: dict[int, float]  # partition -> weight of its u_i (summing to 1 over the sampled clients)
    multiplier: float = 0.0  # rho (penalty) or lambda (lagrangian)
    averaged: bool = True  # does w_k enter the output average?
    metrics: dict[str, float] = field(default_factory=dict)  # server-row columns of the round
    columns: dict[int, dict[str, float]] = field(default_factory=dict)  # per-client columns of the round
    state: dict[str, Any] = field(default_factory=dict)  # the method's state it changes (the dual variable)


def alpha_min(m: int, eps: float) -> float:
    """``2 ln(m) / eps``: the smallest alpha with which an objective round is eps-feasible (see
    :func:`theory_defaults`)."""
    return 2 * math.log(m) / eps


def theory_defaults(D: float, L: float, K: int, E: int, eps: float, m: int) -> dict[str, float]:
    """The paper's theoretical settings, for users who know the problem constants.

    ``D``: diameter bound of the feasible parameter set, ``L``: Lipschitz constant of
    the f_i and g_i, ``K``: number of rounds, ``E``: local steps, ``eps``: target
    tolerance, ``m``: clients sampled per round. Returns

    * ``eta = D / (L sqrt(8K))`` (server step), ``gamma = D / (L E sqrt(8K))`` (local step),
    * ``threshold = eps / 2`` (switch to the objective when ``<q, g> <= threshold``),
    * ``alpha_min = 2 ln(m) / eps'`` with ``eps' = eps``: since
      ``<softmax(alpha g), g> >= max_i g_i - ln(m)/alpha``, this alpha makes every
      objective round satisfy ``max_i g_i <= threshold + eps/2 = eps``.

    On losses below 1, ``alpha_min`` can be far too small in practice (the spec
    measured that NP classification needed ``alpha >= 10``).
    """
    for key, value in (("D", D), ("L", L), ("eps", eps)):
        require(value > 0, key, f"must be positive, got {value!r}")
    for key, value in (("K", K), ("E", E), ("m", m)):
        require(isinstance(value, int) and value >= 1, key, f"must be a positive integer, got {value!r}")
    root = math.sqrt(8 * K)
    return {
        "eta": D / (L * root),
        "gamma": D / (L * E * root),
        "threshold": eps / 2,
        "alpha_min": alpha_min(m, eps),
    }


@dataclass(frozen=True)
class Steps:
    """The resolved step sizes and sample count of a run."""

    m: int  # clients sampled per round
    eta: float  # server step
    gamma: float  # local step
    local_steps: int  # E
    threshold: float
    alpha_min: float  # 2 ln(m) / eps, the theory's lower bound on alpha (reported, not enforced)


def resolve_steps(params: ConstrainedParams, *, num_clients: int, num_rounds: int) -> Steps:
    """The run's steps; with ``theory_d``, ``theory_l`` > 0: the theory's eta, gamma and threshold.

    ``clients_per_round`` = 0 means all. Raises ConfigError (naming the run-config key) for more
    clients per round than are connected, or a theory setting given only half.
    """
    m = params.clients_per_round or num_clients
    local_steps, eps = params.local_steps, params.eps
    theory_d, theory_l = params.theory_d, params.theory_l
    if m > num_clients:
        raise ConfigError(
            f"run config 'switching-m': {m} clients per round, but only {num_clients} clients are connected"
        )
    if (theory_d > 0) != (theory_l > 0):
        key = "switching-theory-l" if theory_d > 0 else "switching-theory-d"
        raise ConfigError(f"run config '{key}': the theory settings need both D and L > 0 (or both 0)")
    if theory_d > 0:
        theory = theory_defaults(theory_d, theory_l, num_rounds, local_steps, eps, m)
        return Steps(m, theory["eta"], theory["gamma"], local_steps, theory["threshold"], theory["alpha_min"])
    return Steps(m, params.eta, params.gamma, local_steps, params.threshold, alpha_min(m, eps))


class ConstrainedRounds(FederatedStrategy):
    """The two-exchange round of docs/algorithms.md 2 with the method's decision left to :meth:`decide`."""

    family = "constrained"
    client_handler = "constrained"
    robust_refusal: ClassVar[str] = ""  # its summed round is a (plan-weighted) model average
    params_type: ClassVar[type[ConstrainedParams]] = ConstrainedParams
    params: ConstrainedParams

    @classmethod
    def build(cls, cfg: Mapping[str, Any]) -> FederatedStrategy:
        """The strategy with the task's own seeded model (problems/registry.py make_model)."""
        make_model = get_problem(cfg["problem"]).make_model
        assert make_model is not None  # a constrained task: build_strategy checked the family
        model = model_record(make_model(cfg))
        params = cls.params_type.from_config(cfg)
        return cls(initial_arrays=model, num_rounds=cfg["num-rounds"], seed=cfg["seed"], params=params)

    def __init__(
        self,
        *,
        initial_arrays: ArrayRecord,
        num_rounds: int = 10,
        seed: int = 42,
        params: ConstrainedParams | None = None,
    ) -> None:
        """``num_rounds`` rounds from ``initial_arrays``; ``params``: clients per round m (0 = all),
        server step eta, E local steps of size gamma, tolerance eps (theory_d, theory_l > 0 set eta,
        gamma and the threshold by theory), F, G evaluated every eval_every rounds (0 = after the
        last) and the clients' batches; ``seed``: the sampling stream."""
        super().__init__(num_rounds=num_rounds, params=params, initial_arrays=initial_arrays)
        self.rng = np.random.default_rng(np.random.SeedSequence([int(seed), SAMPLING_STREAM]))
        self.sampled: list[int] = []  # the round's I_k (its query phase's draw)
        self._steps: Steps | None = None  # resolved in setup(), once the clients are known
        self.total: dict[str, np.ndarray] | None = None  # sum of the averaged w_k (float64)
        self.count = 0  # rounds in the average
        self.grad_evals = 0
        self.plan: RoundPlan | None = None  # this round's decision (query phase), None: no usable query reply

    @property
    def model(self) -> ArrayRecord:
        """The current iterate w_k (every constrained strategy holds one from the start)."""
        assert self.arrays is not None
        return self.arrays

    @property
    def steps(self) -> Steps:
        """The resolved steps (after ``setup``)."""
        if self._steps is None:
            raise RuntimeError(f"{type(self).__name__}: steps are resolved in setup(), with the clients")
        return self._steps

    # --- the method ------------------------------------------------------------------
    def decide(self, server_round: int, f: Mapping[int, float], g: Mapping[int, float]) -> RoundPlan:
        """Step 2: the local objective, the weights and whether w_k is averaged, from f_i, g_i."""
        raise NotImplementedError

    def settings(self) -> dict[str, float]:
        """The method's hyperparameters, for the log and the summary."""
        s = self.steps
        return {"m": s.m, "eta": s.eta, "gamma": s.gamma, "local-steps": s.local_steps}

    # --- the harness -----------------------------------------------------------------
    def setup(self) -> None:
        """The steps, from the number of connected clients."""
        n = len(self.pool.partitions)
        self._steps = resolve_steps(self.params, num_clients=n, num_rounds=self.rounds)
        self.log(f"{type(self).__name__}: " + ", ".join(f"{k}={v:.4g}" for k, v in self.settings().items()))

    def phases(self, server_round: int) -> list[Phase]:
        """Round k: ``query``, ``train`` (summed), ``evaluate`` (when due); round 0: ``evaluate`` of
        w_0 when evaluating every few rounds."""
        evaluate = Phase("evaluate", self.evaluate_messages, self.aggregate_evaluate)
        if server_round == 0:
            return [evaluate] if self.params.eval_every else []
        return [
            Phase(
                "query",
                self.query_messages,
                self.aggregate_query,
                check=self.unusable_query,
                draw=self.draw_sample,
            ),
            self.summed_phase("train", server_round, self.train_messages, self.aggregate_sum),
            evaluate,
        ]

    def sample(self, rng: np.random.Generator) -> list[int]:
        """``I_k``: m partitions uniformly without replacement, from the sampling stream ``rng``."""
        chosen = rng.choice(self.pool.partitions, size=self.steps.m, replace=False)
        return sorted(int(p) for p in chosen)

    def draw_sample(self, server_round: int) -> dict[str, Any]:
        """The query phase's draw: I_k and the sampling stream after it."""
        return drawn(self.rng, self.sample)

    def query_messages(self, server_round: int) -> list[Message]:
        """Step 1: w_k to the sample ``I_k`` (the phase's draw), which returns f_i, g_i."""
        config = self.round_config(server_round)
        return [
            self.pool.message(
                pid, "query.fg", RecordDict({"arrays": self.model, "config": config}), server_round
            )
            for pid in self.sampled
        ]

    @staticmethod
    def unusable_query(reply: Message) -> str | None:
        """Why a query reply's f_i, g_i cannot be used (non-finite), else None."""
        metrics = reply_metrics(reply.content)
        fi, gi = float(metrics["f"]), float(metrics["g"])
        return None if math.isfinite(fi) and math.isfinite(gi) else f"non-finite f={fi} or g={gi}"

    def aggregate_query(self, server_round: int, replies: list[Message]) -> Folded:
        """Step 2: the round's ``plan`` from the usable f_i, g_i (None when there are none); w_k enters
        the output average if the plan says so."""
        f, g = {}, {}
        for reply in replies:
            metrics, pid = reply_metrics(reply.content), self.pool.partition_of(reply)
            f[pid], g[pid] = float(metrics["f"]), float(metrics["g"])
        if not f:
            self.log(f"round {server_round}: no usable query reply; the model is unchanged")
            return Folded(state={"plan": None})
        plan = self.decide(server_round, f, g)
        state = {**plan.state, "plan": plan}
        if plan.averaged:
            w = to_numpy(self.model)
            state["total"] = {
                k: v.astype(np.float64) + (self.total[k] if self.total else 0.0) for k, v in w.items()
            }
            state["count"] = self.count + 1
        return Folded(state=state)

    def train_messages(self, server_round: int) -> list[Message]:
        """Step 3: the plan's local objective to the clients that answered the query (none without a plan)."""
        plan = self.plan
        if plan is None:
            return []
        train_config = ConfigRecord(
            {
                **self.round_config(server_round),
                "objective": plan.objective,
                "multiplier": float(plan.multiplier),
                "gamma": float(self.steps.gamma),
                "local-steps": int(self.steps.local_steps),
            }
        )
        return [
            self.pool.message(pid, "train", RecordDict({"config": train_config}), server_round)
            for pid in sorted(plan.weights)
        ]

    def planned_sample(self, population: int) -> int:
        return self.params.clients_per_round or population

    # --- the summed round: w_{k+1} = w_k - eta sum_i a_i u_i / sum_i a_i, a_i = the plan's weight ----
    def sums(self, server_round: int) -> bool:
        return True

    def sum_weight(self, partition_id: int) -> float | str:
        assert self.plan is not None  # the query phase planned this round
        return float(self.plan.weights[partition_id])

    def sum_layout(self) -> dict[str, tuple[int, ...]]:
        return {k: v.shape for k, v in to_numpy(self.model).items()}

    def aggregate_sum(self, server_round: int, replies: list[Message], summed: WeightedSum | None) -> Folded:
        """Step 4: w_{k+1} = w_k - eta sum_i a_i u_i / sum_i a_i (unchanged without a usable update)."""
        plan = self.plan
        assert plan is not None  # the query phase planned this round, whose train phase sent
        grad_evals = self.grad_evals + sum(int(reply_metrics(r.content)["local-steps"]) for r in replies)
        notes = {
            pid: columns
            for pid, columns in plan.columns.items()
            if pid in self.pool.partitions and pid not in self.pool.failed
        }
        used = summed.contributors if summed is not None else []
        metrics: dict[str, MetricRecordValues] = {
            **plan.metrics,
            "grad-evals": grad_evals,
            "clients-used": len(used),
            "averaged-rounds": self.count,
        }
        state: dict[str, Any] = {"grad_evals": grad_evals}
        if summed is None or summed.weight <= 0:
            self.log(f"round {server_round}: no usable update; the model is unchanged")
        else:
            state["arrays"] = to_record(weighted_step(to_numpy(self.model), summed, self.steps.eta))
        return Folded(metrics, state, notes)

    def average(self) -> ArrayRecord | None:
        """The average of the w_k with ``averaged`` rounds so far (None before the first)."""
        if not self.count or self.total is None:
            return None
        dtypes = {k: v.dtype for k, v in to_numpy(self.model).items()}
        return to_record({k: (v / self.count).astype(dtypes[k]) for k, v in self.total.items()})

    def evaluate_messages(self, server_round: int) -> list[Message]:
        """Every ``eval_every`` rounds and after the last: w_k and the average to every client."""
        every = self.params.eval_every
        if not (server_round == self.num_rounds or (every and server_round % every == 0)):
            return []
        # The run's name: a silo keeps its models for inference under it (client state).
        config = self.round_config(server_round)
        average = self.average()
        messages = []
        for pid in self.pool.partitions:  # a RecordDict each: a message owns its content
            content = RecordDict({"arrays": self.model, "config": config})
            if average is not None:
                content["average"] = average
            messages.append(self.pool.message(pid, "evaluate", content, server_round))
        return messages

    def aggregate_evaluate(self, server_round: int, replies: list[Message]) -> Folded:
        """Worst-client ``F = max_i f_i``, ``G = max_i g_i`` (and of the average) over the replies; the
        per-client results are the state's ``evaluation``. Round 0's curves start at zero gradient
        evaluations."""
        per_client = {self.pool.name(self.pool.partition_of(r)): reply_metrics(r.content) for r in replies}
        out: dict[str, float] = {}
        for prefix in ("", "avg-"):
            for key, name in (("f", "F"), ("g", "G")):
                values = [m[prefix + key] for m in per_client.values() if prefix + key in m]
                if values:
                    out[prefix + name] = float(max(values))
                    out[f"{prefix}mean-{key}"] = float(np.mean(values))
        failed = {self.pool.name(p): e for p, e in self.pool.failed.items()}
        if server_round == 0:
            out["grad-evals"] = 0
        return Folded(out, {"evaluation": summarize(per_client, failed=failed)})

    def finish(self) -> dict[str, Any]:
        """Per-client final metrics; the aggregate adds F, G (and avg-F, avg-G), counts and settings."""
        last = self.history.get(self.num_rounds, {})
        eps = self.params.eps
        extra = {k: v for k, v in last.items() if k in ("F", "G", "avg-F", "avg-G")}
        extra.update(
            {
                "grad-evals": self.grad_evals,
                "averaged-rounds": self.count,
                "feasible": float(extra.get("G", math.inf) <= eps),
                "avg-feasible": float(extra.get("avg-G", math.inf) <= eps),
                **{f"setting-{k}": float(v) for k, v in self.settings().items()},
            }
        )
        self.evaluation["aggregate"] = {**self.evaluation.get("aggregate", {}), **extra}
        return self.evaluation

    def final_models(self) -> dict[str, np.ndarray]:
        """The last model and, when rounds were averaged, the average (``last/...``, ``average/...``)."""
        models = {f"last/{k}": v for k, v in to_numpy(self.model).items()}
        average = self.average()
        if average is not None:
            models.update({f"average/{k}": v for k, v in to_numpy(average).items()})
        return models

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "rng": self.rng.bit_generator.state,
            "steps": self._steps,
            "total": self.total,
            "count": self.count,
            "grad-evals": self.grad_evals,
            "plan": self.plan,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.rng.bit_generator.state = state["rng"]
        self._steps = state["steps"]
        self.total = state["total"]
        self.count = int(state["count"])
        self.grad_evals = int(state["grad-evals"])
        self.plan = state.get("plan")


class SoftmaxSwitching(ConstrainedRounds):
    """docs/algorithms.md 2: softmax-weighted switching between the worst objectives and constraints."""

    params_type = SwitchingParams
    params: SwitchingParams

    def settings(self) -> dict[str, float]:
        return {
            **super().settings(),
            "alpha": self.params.alpha,
            "threshold": self.steps.threshold,
            "alpha-min": self.steps.alpha_min,
        }

    def setup(self) -> None:
        """The steps; a note when alpha is below the theory's bound."""
        super().setup()
        alpha = self.params.alpha
        if alpha < self.steps.alpha_min:
            self.log(
                f"note: switching-alpha = {alpha:g} is below the theory's "
                f"2 ln(m)/eps = {self.steps.alpha_min:.4g}"
            )

    def decide(self, server_round: int, f: Mapping[int, float], g: Mapping[int, float]) -> RoundPlan:
        parts = self.pool.partitions
        mask = np.array([pid in f for pid in parts])  # the sampled clients that answered
        fv = np.array([f.get(pid, np.nan) for pid in parts])
        gv = np.array([g.get(pid, np.nan) for pid in parts])
        d = switching_decision(fv, gv, mask, self.params.alpha, self.steps.threshold)
        weights = d.weights
        sampled = [(j, pid) for j, pid in enumerate(parts) if mask[j]]
        return RoundPlan(
            objective="f" if d.indicator else "g",
            weights={pid: float(weights[j]) for j, pid in sampled},
            averaged=d.indicator,
            metrics={
                "indicator": float(d.indicator),
                "G-sampled": d.G,
                "max-f-sampled": float(fv[mask].max()),
                "max-g-sampled": float(gv[mask].max()),
            },
            columns={
                pid: {"p": float(d.p[j]), "q": float(d.q[j]), "weight": float(weights[j])}
                for j, pid in sampled
            },
        )
