"""Summed rounds: how the round loop gets a strategy's weighted sum, in clear or secure, with DP.

A strategy whose round needs only ``sum_j a_j x_j`` and ``sum_j a_j`` says so
(``FederatedStrategy.sums``); with ``secure-aggregation`` or ``dp`` on, the round loop runs that
summed phase here instead of sending it plainly: every train message gets the round's
``sum-weight``, clip and local noise (client/secure_aggregation.py applies them), the sum comes
from the replies in clear or from SecAgg+ (server/secure_aggregation.py), the server adds the
central DP noise (server/privacy.py), and the strategy's ``aggregate_sum`` turns the sum into its
update. A phase whose values are private whatever the run (``Phase.secure_mean``: FedRSPO+'s shared
calibration) always runs on the same SecAgg+ round here (:meth:`Summation.secure_mean`). The
protocol is written once, here, for every strategy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Message

from hetfed import secagg
from hetfed.config import ConfigError
from hetfed.server.pool import ClientPool, with_config
from hetfed.server.privacy import DPSettings, Privacy
from hetfed.server.secure_aggregation import BelowThreshold, FixedPointCode, SecureRound, threshold_for
from hetfed.strategies.base import FederatedStrategy, WeightedSum, reply_metrics

RELEASES = "privacy.json"  # in the run folder: the local-DP releases the server has received


class Summation:
    """The run's summing settings and DP state (see the module docs)."""

    def __init__(self, cfg: Mapping[str, Any], pool: ClientPool) -> None:
        self.pool = pool
        self.secure = bool(cfg["secure-aggregation"])
        self.requested_threshold = int(cfg["secagg-threshold"])
        self.corrupt = int(cfg["secagg-tolerated-corrupt"])
        self.bits, self.range = int(cfg["secagg-bits"]), float(cfg["secagg-range"])
        self.requested_max_weight = float(cfg["secagg-max-weight"])
        self.code = FixedPointCode(self.bits, self.range, self.requested_max_weight or 1.0)
        self.dp = DPSettings.from_config(cfg)
        # The clients sum the bit 1{||x|| <= S} (adaptive clipping's count), except under local DP,
        # whose clients release nothing un-noised (client/secure_aggregation.py).
        self.within_bit = self.dp.mode != "local"
        self.privacy: Privacy | None = None
        self.summed_rounds = 0  # the plan's summed rounds (each one release under DP)
        # Whether every secure round's clients authenticated their peers' keys (a roster each); None
        # before the first keys exchange.
        self.authenticated: bool | None = None

    @property
    def active(self) -> bool:
        """Whether summed phases run here (else they are sent plainly and summed in clear)."""
        return self.secure or self.dp.on

    def start(self, strategy: FederatedStrategy) -> None:
        """Before round 1 (or on resume): the threshold against the round's clients, and the DP plan
        against the budget (each a one-line ConfigError)."""
        n = len(self.pool.partitions)
        m = strategy.planned_sample(n)
        if self.secure:
            self._check_secure_plan(strategy, m, n)
        if not self.dp.on:
            return
        self.privacy = Privacy(self.dp, n, m)
        self.privacy.update_noise_multiplier()  # adaptive clipping: refused here if it leaves no noise
        self.summed_rounds = sum(1 for r in range(1, strategy.num_rounds + 1) if strategy.sums(r))
        if self.dp.secret_sample:
            self._check_secret_sample(strategy, n, m)
        self.privacy.check_budget(self.summed_rounds)

    def _check_secure_plan(self, strategy: FederatedStrategy, m: int, n: int) -> None:
        """The threshold and the fixed-point code the clients will check, refused here first (one line
        naming the keys), for the plan's m clients per round; fixes the weight bound of the code."""
        if m < max(2, self.requested_threshold):
            raise ConfigError(
                f"run config 'secagg-threshold': secure aggregation needs at least "
                f"{max(2, self.requested_threshold)} clients per round, the plan has {m} of {n}; "
                "raise 'fraction' (or 'switching-m'), add clients or lower secagg-threshold"
            )
        t = threshold_for(self.requested_threshold, m, self.corrupt)
        if problem := secagg.threshold_problem(t, m, self.corrupt):
            raise ConfigError(
                f"run config 'secagg-threshold' / 'secagg-tolerated-corrupt': {problem}; every client would "
                "refuse it"
            )
        sizes = {p: self.pool.clients[p].num_examples for p in self.pool.partitions}
        max_weight = self.requested_max_weight or (1.0 if self.dp.on else strategy.max_sum_weight(sizes))
        self.code = FixedPointCode(self.bits, self.range, max(max_weight, 1e-12))
        if problem := secagg.code_problem(m, self.bits, self.range, self.code.max_weight):
            raise ConfigError(
                f"run config 'secagg-bits' / 'secagg-range' / 'secagg-max-weight': {problem}; lower "
                "secagg-bits or raise secagg-range"
            )

    def _check_secret_sample(self, strategy: FederatedStrategy, n: int, m: int) -> None:
        """ConfigError (one line) when the strategy cannot keep its sample secret: it draws it for an
        exchange beside the summed one (which names the sampled clients), sums no round, or trains
        every client (nothing to keep secret)."""
        why = ""
        if not strategy.samples_in_sum:
            why = "draws its clients outside the summed round (an exchange the server reads names them)"
        elif not self.summed_rounds:
            why = "sums no round (no release to sample for)"
        elif m >= n:
            why = f"trains every client in every summed round ({m} of {n}): there is no sample to keep secret"
        if why:
            raise ConfigError(
                f"run config 'dp-sampling': strategy {strategy.method!r} {why}; use dp-sampling = public"
            )

    def run(
        self,
        strategy: FederatedStrategy,
        train: list[Message],
        server_round: int,
        check: Callable[[Message], str | None] | None = None,
    ) -> tuple[list[Message], WeightedSum | None, dict[str, float]]:
        """Send the round's ``train`` messages; the replies (metrics), the (noised) weighted sum and
        the round's DP columns. The sum is None when no reply is usable or secure aggregation fails.
        In clear (DP without secure aggregation) the replies ``check`` refuses are rejected first."""
        weights = {
            self.pool.partition_to(m): self._weight(strategy.sum_weight(self.pool.partition_to(m)))
            for m in train
        }
        extra: dict[str, Any] = dict(self.privacy.client_values() if self.privacy else {})
        if self.secure:
            extra |= {"secagg-step": self.code.step}
        messages = [
            with_config(m, {**extra, "sum-weight": weights[self.pool.partition_to(m)]}) for m in train
        ]
        layout = strategy.sum_layout()
        with self.pool.unlisted(self.dp.secret_sample):  # a secret sample: counts only (below)
            if self.secure:
                replies, flat = self._secure(
                    messages, server_round, layout, weights, self.code, self.within_bit
                )
            else:
                replies = self.pool.screen(self.pool.send(messages, server_round), check)
                flat = self._plain(strategy, replies, weights, layout)
        contributors = sorted(self._contributors(replies))
        counts: dict[str, float] = {}
        if self.dp.secret_sample:
            counts = {"clients-sampled": len(messages), "clients-failed": len(self.pool.failed)}
        if self.privacy is not None and self.dp.mode == "local" and (flat is not None or contributors):
            # The server holds noised updates (their sum): kept on disk before anything else, since
            # the round's checkpoint comes later and a stop before it makes the resume redo the round.
            self.privacy.received()
            self.pool.store.write_json(RELEASES, {"releases": self.privacy.releases})
        if flat is None:
            return replies, None, counts
        size = sum(math.prod(s) for s in layout.values())
        values, weight = flat[:size], float(flat[size])
        within = float(flat[size + 1]) if self.within_bit else None
        columns: dict[str, float] = dict(counts)
        if self.privacy is not None:
            values, noised = self.privacy.noised(values, within, len(contributors))
            columns |= noised
        return replies, WeightedSum(_unflatten(values, layout), weight, contributors), columns

    def secure_mean(
        self, messages: list[Message], server_round: int, layout: Mapping[str, tuple[int, ...]]
    ) -> tuple[list[Message], WeightedSum | None]:
        """Send a secure-mean phase's ``messages`` inside SecAgg+, whatever ``secure-aggregation``:
        the replies (masked) and sum_j x_j over the clients whose input the server holds, with the
        weight slot their number (a_j = 1); None below the threshold. The threshold follows the run's
        rule for the phase's m clients (refused in one line when no client would accept it), the code
        has step 2^-40 and the widest range the m clients' sum allows (:func:`hetfed.secagg.mean_code`;
        a value beyond it is clipped and counted in the reply metric ``secagg-clipped``)."""
        m = len(messages)
        t = threshold_for(self.requested_threshold, m, self.corrupt)
        if problem := secagg.threshold_problem(t, m, self.corrupt):
            raise ConfigError(
                f"run config 'secagg-threshold' / 'secagg-tolerated-corrupt': the secure mean of round "
                f"{server_round}: {problem}"
            )
        code = FixedPointCode(*secagg.mean_code(m), 1.0)
        sent = [with_config(msg, {"secagg-step": code.step, "sum-weight": 1.0}) for msg in messages]
        weights: dict[int, float | str] = {self.pool.partition_to(msg): 1.0 for msg in messages}
        # No dp-local-noise is sent: every client appends its within-clip bit (client/secure_aggregation.py).
        replies, flat = self._secure(sent, server_round, layout, weights, code, within_bit=True)
        if flat is None:
            return replies, None
        size = sum(math.prod(s) for s in layout.values())
        survivors = sorted(self.pool.partition_of(r) for r in replies)  # whose input is in the sum
        summed = WeightedSum(_unflatten(flat[:size], layout), float(flat[size]), survivors)
        return replies, summed

    def _weight(self, weight: float | str) -> float | str:
        """a_j; under DP a data-size weight becomes 1 (a weight scales the sensitivity)."""
        return 1.0 if self.dp.on and isinstance(weight, str) else weight

    def _contributors(self, replies: list[Message]) -> list[int]:
        return [
            self.pool.partition_of(r) for r in replies if self.pool.partition_of(r) not in self.pool.failed
        ]

    def _secure(
        self,
        messages: list[Message],
        server_round: int,
        layout: Mapping[str, tuple[int, ...]],
        weights: Mapping[int, float | str],
        code: FixedPointCode,
        within_bit: bool,
    ) -> tuple[list[Message], np.ndarray | None]:
        """One SecAgg+ round of ``messages`` with ``code``: the replies and the unmasked sum
        [sum a x, sum a, (sum c if ``within_bit``)], None below the threshold or when the server's
        checks refuse it (:func:`implausible_sum`)."""
        size = sum(math.prod(s) for s in layout.values()) + 1 + int(within_bit)
        t = threshold_for(self.requested_threshold, len(messages), self.corrupt)
        protocol = SecureRound(self.pool, server_round, threshold=t, code=code, log=self.pool.log)
        try:
            replies, unmasked = protocol.run(messages, size)
        except BelowThreshold as exc:
            self.pool.log(str(exc))
            return [], None
        finally:
            if protocol.keys:
                self.authenticated = protocol.authenticated and self.authenticated is not False
        expected = sum(self._known_weight(weights[self.pool.partition_of(r)], r) for r in replies)
        clip = self.privacy.clip if self.privacy is not None and self.dp.mode == "central" else None
        survivors = len(unmasked.survivors)
        if problem := implausible_sum(unmasked.total, expected, survivors, code.step, within_bit, clip):
            # A bad silo's masked input is arbitrary; what the server can check of the sum it checks.
            self.pool.log(f"round {server_round}: the secure sum is refused: {problem}; the round has no sum")
            if self.privacy is not None and self.dp.mode == "local":
                self.privacy.received()  # the server held the (noised) sum all the same
                self.pool.store.write_json(RELEASES, {"releases": self.privacy.releases})
            return [], None
        return replies, unmasked.total

    def _known_weight(self, weight: float | str, reply: Message) -> float:
        """a_j as the server knows it: the number it sent, or the reply's metric, which is in clear."""
        if not isinstance(weight, str):
            return float(weight)
        value = reply_metrics(reply.content).get(weight)
        return float(value) if isinstance(value, int | float) else math.nan

    def _plain(
        self,
        strategy: FederatedStrategy,
        replies: list[Message],
        weights: Mapping[int, float | str],
        layout: Mapping[str, tuple[int, ...]],
    ) -> np.ndarray | None:
        summed = strategy.plain_sum(replies, weights)
        if summed is None:
            return None
        within = [
            sum(
                float(reply_metrics(r.content).get("dp-within", 1))
                for r in replies
                if self.pool.partition_of(r) in summed.contributors
            )
        ]
        flat = [np.asarray(summed.total[k], dtype=np.float64).ravel() for k in sorted(layout)]
        return np.concatenate([*flat, [summed.weight], within if self.within_bit else []])

    def report(self) -> dict[str, Any]:
        """The summary's ``privacy``: what protected the updates, and the epsilon spent."""
        out: dict[str, Any] = {"secure-aggregation": self.secure, "dp": self.dp.mode}
        if self.secure:
            out |= {
                "secagg-step": self.code.step,
                "secagg-max-weight": self.code.max_weight,
                "secagg-tolerated-corrupt": self.corrupt,
                # Keys verified by every client against its silo's roster (malicious server), or not.
                "secagg-authenticated-keys": bool(self.authenticated),
            }
        if self.privacy is not None:
            out |= self.privacy.report()
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.privacy.state_dict() if self.privacy is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The checkpoint's DP state, with the local-DP releases the server received after it (a
        resume redoes those rounds); the budget is checked again with them."""
        if self.privacy is not None and state:
            received = (self.pool.store.read_json(RELEASES) or {}).get("releases", 0)
            self.privacy.load_state_dict(state, int(received) if self.dp.mode == "local" else 0)
            if self.privacy.redone:  # without, start() has checked this very plan
                self.privacy.check_budget(self.summed_rounds)


def _unflatten(values: np.ndarray, layout: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The arrays of ``layout`` (in sorted name order, as the clients flatten them) from ``values``."""
    out, at = {}, 0
    for key in sorted(layout):
        size = math.prod(layout[key])
        out[key] = values[at : at + size].reshape(layout[key])
        at += size
    return out


def implausible_sum(
    total: np.ndarray, expected_weight: float, survivors: int, step: float, counted: bool, clip: float | None
) -> str | None:
    """What of an unmasked sum [sum a x, sum a, (sum c if ``counted``)] contradicts what the server
    knows: the weight slot is the known sum of the survivors' weights, the count is within 0..m, and
    with central DP's ``clip`` S, ||sum a x|| <= (sum a) S; each up to m half-steps of rounding
    (docs/algorithms.md "Secure aggregation"). Range proofs are out of scope: within these a bad
    silo's input still counts (docs/security.md, the threat model)."""
    # Rounding: half a step per client, and the decode's float64 (codes beyond 2^53 steps lose bits).
    slack = survivors * step / 2 * (1 + 1e-9) + 4 * 2.0**-53 * abs(expected_weight)
    size = total.size - 1 - int(counted)  # the values; then the weight (and the count)
    weight = float(total[size])
    if not abs(weight - expected_weight) <= slack:
        return f"its weight slot is {weight:.6g}, the survivors' weights sum to {expected_weight:.6g}"
    if counted and not -slack <= (count := float(total[size + 1])) <= survivors + slack:
        return f"its within-clip count is {count:.6g}, outside 0..{survivors}"
    if clip is not None:
        norm = float(np.linalg.norm(total[:size]))
        bound = expected_weight * clip + slack * math.sqrt(size)
        if norm > bound:
            return f"its norm {norm:.6g} exceeds the survivors' weights times the clip ({bound:.6g})"
    return None
