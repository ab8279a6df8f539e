"""A silo's own policy: what the operator may ask of this silo, enforced on the silo.

The silo admin names a TOML file in the node config (``policy = "/etc/hetfed/policy.toml"``);
:func:`policy_mod`, a Flower ClientApp mod (client/app.py), checks every message against it
before the ClientApp runs, and every reply before it leaves. A message that breaks a rule is
refused with one line naming the rule (:class:`PolicyRefusal`): it becomes the reply's error,
so the server records the client as failed for that exchange (rounds.csv) and the run goes on
without it; the silo logs it and its ledger records it (client/ledger.py). Every key is
optional and a missing key allows everything (deploy/policy.example.toml, docs/user-guide.md):

- ``strategies`` / ``losses``: the allowed run-config strategy names (the message's ``method``)
  and losses (``loss``);
- ``max-rounds``: the highest ``server-round`` served; ``max-local-epochs``: the highest
  ``local-epochs`` (a message carries every setting of the strategy family, also those its
  method does not use, e.g. FedAvg's ``interp-local-epochs``, so only this one is bounded);
- ``metrics``: the metric names (shell globs) a reply may carry; a reply with another is
  refused, not filtered: a reply missing a metric the server expects would pass as complete
  and change (or break) the aggregate, while a refusal is explicit on both sides;
- ``require-secure-aggregation``: an update (a train reply, or any reply with arrays) leaves
  only in a round whose message declares secure aggregation (``secagg-step``);
  ``require-dp``: only in a round whose message declares DP (``dp-clip`` > 0); ``max-epsilon``
  (implies ``require-dp``): and declares an epsilon budget (``dp-epsilon``, enforced by the
  server before round 1, server/privacy.py) no larger. Under local DP the silo does not take
  the server's word: ``max-epsilon`` (this run) and ``lifetime-epsilon`` (every run it served)
  bound its own count of the releases it made (its ledger; client/silo_budget.py), at
  ``budget-delta`` (default 1e-5); under central DP the silo cannot check the noise, and
  ``max-epsilon`` trusts the run's declaration. A message that does not declare what a rule
  needs is refused with the reason that the run did not declare it;
- ``min-secagg-threshold``, ``min-round-clients``, ``secagg-tolerated-corrupt`` (c): this silo
  shares its secure-aggregation keys (``query.secagg_shares``) only for a threshold t at least the
  minimum, a round of at least that many participants m, and 2t > m + c with the silo's own c
  (the protocol itself already refuses 2t <= m + c for the run's declared c).

Discovery (``query.info``: the partition's name and size) is not checked against the rules, so
a refusing silo stays in the run's client list and each refusal is a failed exchange in
rounds.csv rather than an abort of the run; the file itself is validated at the first message,
discovery included, and a malformed file (:class:`PolicyError`, one line with the file, the
line or key and the culprit) leaves the silo out of the run. The file is read once per
ClientApp process (the warm runtime's worker lives as long as its SuperNode): restart the
SuperNode after editing it.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecordValues, Context, Message

from hetfed.client.ledger import ledger_path
from hetfed.client.refusal import Refusal
from hetfed.client.silo_budget import DEFAULT_DELTA, epsilon, release_of, releases
from hetfed.jsonl import read_entries
from hetfed.methods import METHODS, SECAGG_EXCHANGES
from hetfed.methods.decision import LOSSES
from hetfed.paths import read_toml


class PolicyError(ValueError):
    """The node's policy file cannot be read or is malformed (one line: file, line or key, culprit)."""


class PolicyRefusal(Refusal):
    """A message (or its reply) breaks this silo's policy: one line naming the rule."""


@dataclass(frozen=True)
class Policy:
    """A silo's rules (None: no limit)."""

    path: str
    strategies: tuple[str, ...] | None = None
    losses: tuple[str, ...] | None = None
    max_rounds: int | None = None
    max_local_epochs: int | None = None
    metrics: tuple[str, ...] | None = None
    require_secure_aggregation: bool = False
    require_dp: bool = False
    max_epsilon: float | None = None
    lifetime_epsilon: float | None = None
    budget_delta: float = DEFAULT_DELTA
    min_secagg_threshold: int | None = None
    min_round_clients: int | None = None
    secagg_tolerated_corrupt: int | None = None

    def check_message(
        self, kind: str, config: Mapping[str, ConfigRecordValues], ledger: list[dict[str, Any]] | None = None
    ) -> None:
        """PolicyRefusal when the message asks what the rules do not allow (before the ClientApp runs);
        ``ledger``: this silo's ledger entries (None: it keeps none), its own count of local-DP releases."""
        self._allowed("strategies", self.strategies, "method", "strategy", config)
        self._allowed("losses", self.losses, "loss", "loss", config)
        if self.max_rounds is not None:
            if "server-round" not in config:
                self.refuse("max-rounds", "the run did not declare the message's round (server-round)")
            if (server_round := _number(config["server-round"])) > self.max_rounds:
                self.refuse("max-rounds", f"round {server_round:g} > {self.max_rounds}")
        if self.max_local_epochs is not None:
            if "local-epochs" not in config:
                self.refuse("max-local-epochs", "the run did not declare its local epochs (local-epochs)")
            if (epochs := _number(config["local-epochs"])) > self.max_local_epochs:
                self.refuse("max-local-epochs", f"local-epochs {epochs:g} > {self.max_local_epochs}")
        if kind == "train":
            self._protected(config)
            if (z := release_of(config)) is not None:
                self._own_budget(z, str(config.get("run-id", "")), ledger)
        if kind == "query.secagg_shares":
            self._secure_round(config)

    def check_reply(self, kind: str, config: Mapping[str, ConfigRecordValues], reply: Message) -> None:
        """PolicyRefusal when the reply would carry what the rules keep on the silo."""
        if self.metrics is not None:
            names = sorted({k for record in reply.content.metric_records.values() for k in record})
            if others := [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in self.metrics)]:
                self.refuse("metrics", f"the reply carries metrics {', '.join(others)}, which may not leave")
        # The secure aggregation protocol's own exchanges carry keys and shares, not updates.
        if kind not in SECAGG_EXCHANGES and reply.content.array_records:
            self._protected(config)

    def _allowed(
        self,
        rule: str,
        allowed: tuple[str, ...] | None,
        key: str,
        what: str,
        config: Mapping[str, ConfigRecordValues],
    ) -> None:
        if allowed is None:
            return
        if key not in config:
            self.refuse(rule, f"the run did not declare its {what} ({key})")
        if str(config[key]) not in allowed:
            listed = ", ".join(allowed) or "none"
            self.refuse(rule, f"{what} {str(config[key])!r} is not allowed (allowed: {listed})")

    def _protected(self, config: Mapping[str, ConfigRecordValues]) -> None:
        """An update may leave only as the secure aggregation / DP rules require."""
        if self.require_secure_aggregation and "secagg-step" not in config:
            self.refuse("require-secure-aggregation", "the run did not declare secure aggregation for it")
        if not (self.require_dp or self.max_epsilon is not None):
            return
        clip = config.get("dp-clip", 0.0)
        if not isinstance(clip, int | float) or clip <= 0:
            self.refuse("require-dp", "the run did not declare differential privacy for it (dp-clip)")
        if self.max_epsilon is None or release_of(config) is not None:
            return  # local DP: the silo counts its own releases (_own_budget), whatever the run declares
        budget = _number(config.get("dp-epsilon", 0.0))
        if budget <= 0:
            self.refuse("max-epsilon", "the run did not declare an epsilon budget (dp-epsilon)")
        if budget > self.max_epsilon:
            self.refuse("max-epsilon", f"the run's epsilon budget {budget:g} > {self.max_epsilon:g}")

    def _own_budget(self, z: float, run_id: str, ledger: list[dict[str, Any]] | None) -> None:
        """Local DP: one more release at noise multiplier z, counted with those this silo's ledger
        holds, against max-epsilon (this run) and lifetime-epsilon (every run; client/silo_budget.py)."""
        limits = [
            ("max-epsilon", self.max_epsilon, run_id),
            ("lifetime-epsilon", self.lifetime_epsilon, None),
        ]
        for rule, limit, run in limits:
            if limit is None:
                continue
            if ledger is None:
                self.refuse(rule, "this silo keeps no ledger (no state-dir) to count its releases")
            made = releases(ledger or [], run)
            spent = epsilon([*made, z], self.budget_delta)
            if spent > limit:
                where = "this run" if run is not None else "all runs"
                self.refuse(
                    rule,
                    f"one more local-DP release at noise multiplier {z:g} would make {len(made) + 1} in "
                    f"{where}, epsilon {spent:.4g} at delta {self.budget_delta:g} by this silo's own count, "
                    f"over {limit:g}",
                )

    def _secure_round(self, config: Mapping[str, ConfigRecordValues]) -> None:
        """Before this silo shares its keys: the round's threshold t and participants m against the
        silo's own minimums and its tolerance of colluding silos (2t > m + c, hetfed/secagg.py)."""
        from hetfed import secagg  # the protocol's rule, one place for the run's c and the silo's

        peers, t = config.get("secagg-peers"), config.get("secagg-threshold")
        m = len(peers) if isinstance(peers, list) else 0
        t = int(t) if isinstance(t, int) and not isinstance(t, bool) else 0
        if self.min_round_clients is not None and m < self.min_round_clients:
            self.refuse(
                "min-round-clients", f"the round has {m} participants, fewer than {self.min_round_clients}"
            )
        if self.min_secagg_threshold is not None and t < self.min_secagg_threshold:
            self.refuse("min-secagg-threshold", f"threshold {t} < {self.min_secagg_threshold}")
        if self.secagg_tolerated_corrupt is not None and (
            problem := secagg.threshold_problem(t, m, self.secagg_tolerated_corrupt)
        ):
            self.refuse("secagg-tolerated-corrupt", problem)

    def refuse(self, rule: str, why: str) -> None:
        raise PolicyRefusal(f"refused by this silo's policy, rule {rule!r}: {why} (policy file {self.path})")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# key -> (field, what it must be, check). Lists are of strings; numbers are >= 0.
RULES: dict[str, tuple[str, str, Callable[[Any], bool]]] = {
    "strategies": ("strategies", "a list of strategy names", _strings),
    "losses": ("losses", "a list of loss names", _strings),
    "metrics": ("metrics", "a list of metric names or globs", _strings),
    "max-rounds": ("max_rounds", "an integer >= 0", _count),
    "max-local-epochs": ("max_local_epochs", "an integer >= 0", _count),
    "require-secure-aggregation": (
        "require_secure_aggregation",
        "true or false",
        lambda v: isinstance(v, bool),
    ),
    "require-dp": ("require_dp", "true or false", lambda v: isinstance(v, bool)),
    "max-epsilon": (
        "max_epsilon",
        "a number > 0",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0,
    ),
    "lifetime-epsilon": (
        "lifetime_epsilon",
        "a number > 0",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0,
    ),
    "budget-delta": (
        "budget_delta",
        "a number in (0, 0.5]",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 0.5,
    ),
    "min-secagg-threshold": ("min_secagg_threshold", "an integer >= 0", _count),
    "min-round-clients": ("min_round_clients", "an integer >= 0", _count),
    "secagg-tolerated-corrupt": ("secagg_tolerated_corrupt", "an integer >= 0", _count),
}


@functools.cache
def load(path: str) -> Policy:
    """The policy in TOML file ``path`` (read once per process); PolicyError in one line."""
    raw = read_toml(path, "policy", "policy", PolicyError)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in RULES:
            raise PolicyError(f"policy file {path}: unknown key {key!r} (keys: {', '.join(RULES)})")
        field, what, ok = RULES[key]
        if not ok(value):
            raise PolicyError(f"policy file {path}: {key!r} must be {what}, got {value!r}")
        known = _registered(key)
        if known and (unknown := [v for v in value if v not in known]):
            # A typo would make the silo refuse every run, and say so only when one comes.
            raise PolicyError(
                f"policy file {path}: {key!r} names {', '.join(map(repr, unknown))}, which hetfed does not "
                f"have (known: {', '.join(known)})"
            )
        values[field] = tuple(value) if isinstance(value, list) else value
    return Policy(path, **values)


def _registered(key: str) -> tuple[str, ...]:
    """The names an allow list ``key`` may hold (empty: any)."""
    return {"strategies": tuple(METHODS), "losses": tuple(LOSSES)}.get(key, ())


def policy_mod(
    message: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """Refuse ``message`` (or its reply) when it breaks the node's policy (node config ``policy``);
    without one, pass everything."""
    path = str(context.node_config.get("policy", "") or "")
    if not path:
        return call_next(message, context)
    try:
        policy = load(path)
    except PolicyError as exc:
        # The server's discovery reads "partition <i> of <n>: " to leave this partition out.
        node = context.node_config
        raise PolicyError(
            f"partition {node.get('partition-id')} of {node.get('num-partitions')}: {exc}"
        ) from None
    kind = message.metadata.message_type
    if kind == "query.info":  # discovery: the partition's name and size (see the module docs)
        return call_next(message, context)
    records = message.content.config_records
    config: Mapping[str, ConfigRecordValues] = records["config"] if "config" in records else {}
    policy.check_message(kind, config, _ledger(context) if release_of(config) is not None else None)
    reply = call_next(message, context)
    if not reply.has_error():
        policy.check_reply(kind, config, reply)
    return reply


def _ledger(context: Context) -> list[dict[str, Any]] | None:
    """This silo's ledger entries (its own count of releases), [] before its first reply, None without
    a state dir."""
    path = ledger_path(context)
    if path is None:
        return None
    return read_entries(path) if path.exists() else []


def _number(value: Any) -> float:
    """A message's number; anything else counts as infinite, so no limit lets it pass."""
    return float(value) if isinstance(value, int | float) else float("inf")
