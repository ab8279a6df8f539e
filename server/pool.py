"""The server's view of its clients: partitions, not node ids.

Flower addresses SuperNodes by node id, which differs between engines and
between restarts. Strategies address clients by *partition id* (the private data
a node holds, from its node config), so that the same seed samples the same
clients on every engine. :class:`ClientPool` discovers the partition of every
node with a ``query.info`` exchange, sends per-partition messages, maps replies
(and errors, which the SuperLink may send on a node's behalf) back to partitions,
and records one results row per client and exchange (:meth:`ClientPool.unlisted`: none, for the
exchanges of a secret sample, which name no client anywhere). Every message it builds carries the
strategy's client settings (``settings``: the client handler's name and the method values it
reads) in its ConfigRecord, beside the exchange's own values.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ConfigRecord, ConfigRecordValues, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from hetfed.records import scalar, to_numpy
from hetfed.server.store import RunStore, split_local_rounds
from hetfed.strategies.base import FederationError

POLL_INTERVAL = 0.1  # seconds between pulls (Flower's own loop sleeps 3 s)


@dataclass(frozen=True)
class ClientInfo:
    """One connected client: its partition, node, name and training-set size."""

    partition_id: int
    node_id: int
    name: str
    num_examples: int


class ClientPool:
    """Discovers clients and runs exchanges with them over a Flower ``Grid``."""

    def __init__(
        self,
        grid: Grid,
        store: RunStore,
        *,
        required: int,
        wait_timeout: float,
        round_timeout: float,
        audit: bool = False,
        log: Callable[[str], None] = print,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.grid = grid
        self.settings = dict(settings or {})
        self.store = store
        self.required = required
        self.wait_timeout = wait_timeout
        self.round_timeout = round_timeout
        self.audit = audit
        self.log = log
        self.clients: dict[int, ClientInfo] = {}
        self.run_name = ""
        self.run_id = store.run_id  # config.json's: every message carries it (client state key)
        self.holds_state: set[int] = set()  # partitions that kept client state in an earlier exchange
        self._node_to_partition: dict[int, int] = {}  # every node id a partition ever had
        self.failed: dict[int, str] = {}  # partition -> reason, for the last exchange
        self.left_out: dict[str, str] = {}  # client name -> why it was left out at discovery
        self._sent: dict[str, int] = {}  # message id -> partition
        self._sent_aside: dict[str, int] = {}  # the same, for the last send_aside
        self._rows: dict[int, dict[str, Any]] = {}  # partition -> results row of the last exchange
        self.listing = True  # False within :meth:`unlisted`

    # --- discovery ----------------------------------------------------------------
    def connect(self, run_name: str) -> None:
        """Wait (bounded) for the required nodes, then learn each node's partition.

        ``required`` = 0 means: as many as the nodes' ``num-partitions``. A node that fails the
        discovery query (bad data, no reply) is left out, with its reason in :attr:`left_out` and
        a ``query.info`` row; the run goes on while ``required`` clients remain, else one line
        names every partition left out.
        """
        deadline = time.time() + self.wait_timeout
        wanted = max(self.required, 1)
        while len(ids := list(self.grid.get_node_ids())) < wanted and time.time() < deadline:
            time.sleep(0.2)
        found = _Discovery()
        self._discover(ids, run_name, found)
        seen = set(ids)
        while len(found.infos) < found.expected(self.required) and time.time() < deadline:
            if found.hopeless(self.required):
                break  # the partitions still to come cannot make up for the bad ones
            time.sleep(0.5)
            new = [n for n in self.grid.get_node_ids() if n not in seen]
            seen.update(new)
            self._discover(new, run_name, found)
        self.left_out = found.left_out()
        if found.reports:
            self.store.path.mkdir(parents=True, exist_ok=True)
            (self.store.path / "silos.json").write_text(
                json.dumps(
                    {
                        "run-name": run_name,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "silos": {f"partition-{pid}": v for pid, v in sorted(found.reports.items())},
                    },
                    indent=2,
                )
            )
        for (pid, node), (name, reason) in zip(found.bad_keys(), self.left_out.items(), strict=True):
            self.store.add_row(  # also when the run cannot go on: each refusal is in rounds.csv
                round=0,
                exchange="query.info",
                **{"partition-id": "" if pid is None else pid},
                client=name,
                status="failed",
                error=reason,
            )
            self.log(f"{name} is left out (node {node}): {reason}")
        expected = found.expected(self.required)
        if len(found.infos) < expected or not found.infos:
            if self.left_out and not (self.store.path / "progress.json").exists():
                self.store.commit(0, 0)  # a fresh run: its rows say who was left out and why
            raise FederationError(found.shortfall(expected, self.wait_timeout))
        infos = found.infos
        self.clients = {
            pid: ClientInfo(pid, i["node"], i["name"], i["num-examples"]) for pid, i in sorted(infos.items())
        }
        self.run_name = run_name
        self._node_to_partition = {c.node_id: pid for pid, c in self.clients.items()}
        self.log(f"{len(self.clients)} clients: " + ", ".join(c.name for c in self.clients.values()))

    def refresh(self) -> None:
        """Map SuperNodes that joined since discovery to their partitions.

        A restarted SuperNode (without node authentication) comes back under a new node id;
        its partition, from its node config, tells which client it is.
        """
        known = {c.node_id for c in self.clients.values()}
        new = [n for n in self.grid.get_node_ids() if n not in known]
        if not new:
            return
        found = _Discovery()
        try:
            self._discover(new, self.run_name, found)
        except FederationError as exc:
            self.log(f"a new node could not be identified: {exc}")
            return
        for (_, node), (name, reason) in zip(found.bad_keys(), found.left_out().items(), strict=True):
            self.log(f"{name} (node {node}) could not rejoin: {reason}")
        for pid, i in found.infos.items():
            if pid in self.clients:
                self.clients[pid] = ClientInfo(pid, i["node"], i["name"], i["num-examples"])
                self._node_to_partition[i["node"]] = pid
                self.log(f"{i['name']} (partition {pid}) reconnected as node {i['node']}")
            else:
                self.log(f"node {i['node']} holds partition {pid}, which is not part of this run; ignored")

    def _discover(self, node_ids: list[int], run_name: str, found: _Discovery) -> None:
        """Ask ``node_ids`` for their partition; record the answers and the failures in ``found``."""
        if not node_ids:
            return
        content = self.with_settings(RecordDict({"config": ConfigRecord({"run-name": run_name})}))
        msgs = [Message(content, dst_node_id=n, message_type="query.info", group_id="0") for n in node_ids]
        replies, refused = self._push_pull(msgs)
        infos: dict[int, dict[str, Any]] = {}
        for msg, reply in zip(msgs, replies, strict=True):
            node = msg.metadata.dst_node_id
            if reply is None:
                found.lost[node] = (
                    f"no answer to the discovery query within {self.round_timeout:g} s "
                    f"({refused.get(node, 'no reply')})"
                )
                continue
            if reply.has_error():
                claim = _claim(reply.error.reason or "")
                if claim is None:
                    found.lost[node] = _reason(reply)
                else:
                    pid, n, reason = claim
                    found.bad[pid] = (node, reason)
                    found.num_partitions.add(n)
                    refusal = _REFUSED.search(reason)
                    if refusal:  # the silo's SuperNode refused the app build and said what it approves
                        found.reports.setdefault(pid, {}).update(
                            {
                                "approved-apps": [h.strip() for h in refusal[1].split(",")],
                                "reported-by": "SuperNode refusal (hash prefixes)",
                            }
                        )
                continue
            info, metrics = reply.content.config_records["info"], reply.content.metric_records["metrics"]
            pid = int(scalar(info["partition-id"]))
            if pid in infos:
                raise FederationError(
                    f"nodes {infos[pid]['node']} and {node} both claim partition-id {pid}; "
                    "give every SuperNode its own partition-id"
                )
            infos[pid] = {
                "node": node,
                "name": str(info["name"]),
                "num-partitions": int(scalar(info["num-partitions"])),
                "num-examples": int(scalar(metrics["num-examples"])),
            }
            found.num_partitions.add(int(scalar(info["num-partitions"])))
            found.bad.pop(pid, None)  # a node that failed before and now answers
            if "approved-apps" in info:  # the silo's allow-list, read on the silo
                found.reports.setdefault(pid, {}).update(
                    {
                        "approved-apps": [str(h) for h in info["approved-apps"]],  # type: ignore[union-attr]
                        "reported-by": "ClientApp query.info",
                    }
                )
            if "notes" in info:  # what the silo noticed in its own files (ignored columns, relaxations)
                found.reports.setdefault(pid, {})["notes"] = [str(n) for n in info["notes"]]  # type: ignore[union-attr]
        found.infos.update(infos)
        if len(found.num_partitions) > 1:
            raise FederationError(f"nodes disagree on num-partitions: {sorted(found.num_partitions)}")

    # --- exchanges ---------------------------------------------------------------
    @contextmanager
    def unlisted(self, secret: bool = True) -> Iterator[None]:
        """With ``secret``, the exchanges within name none of their clients (dp-sampling = secret,
        whose sample is written nowhere): no results rows (the caller writes counts in the server's
        row), traffic.jsonl lines without a partition, no record of client state, logs without names."""
        before, self.listing = self.listing, self.listing and not secret
        try:
            yield
        finally:
            self.listing = before

    def who(self, partition_id: int) -> str:
        """A client as logs name it: name and partition, or nobody within :meth:`unlisted`."""
        return f"{self.name(partition_id)} (partition {partition_id})" if self.listing else "a sampled client"

    @property
    def partitions(self) -> list[int]:
        """Partition ids of the connected clients, sorted."""
        return sorted(self.clients)

    def name(self, partition_id: int) -> str:
        return self.clients[partition_id].name

    def message(
        self, partition_id: int, message_type: str, content: RecordDict, server_round: int
    ) -> Message:
        """An instruction for the node holding ``partition_id`` (with the client settings)."""
        # The client says in its reply when the state it kept earlier is not there (hetfed.client.session).
        expected = {"state-expected": partition_id in self.holds_state}
        return Message(
            self.with_settings(content, expected),
            dst_node_id=self.clients[partition_id].node_id,
            message_type=message_type,
            group_id=str(server_round),
        )

    def with_settings(
        self, content: RecordDict, extra: Mapping[str, ConfigRecordValues] | None = None
    ) -> RecordDict:
        """``content`` with the client settings, the run id and ``extra`` added to its ConfigRecord
        (a new RecordDict: one content may be sent to several clients)."""
        settings = {**self.settings, "run-id": self.run_id, **(extra or {})}
        return RecordDict({**content, "config": ConfigRecord({**settings, **config_of(content)})})

    def partition_of(self, reply: Message) -> int:
        """The partition a reply came from."""
        return self._sent[reply.metadata.reply_to_message_id]

    def send(self, messages: Iterable[Message], server_round: int) -> list[Message]:
        """Send instructions and return the successful replies.

        Failures (an error reply, a dead node, no reply within ``round-timeout``) are
        logged, recorded in the client's results row and kept in :attr:`failed`; they
        never stop the round.
        """
        ok, self.failed, self._sent, self._rows = self._exchange(list(messages), server_round)
        return ok

    def send_aside(self, messages: Iterable[Message], server_round: int) -> list[Message]:
        """:meth:`send` for an exchange beside the round's main one (secure aggregation's key and
        unmasking exchanges): its rows and failures are recorded, while :attr:`failed`,
        :meth:`partition_of` and :meth:`reject` keep referring to the main exchange."""
        ok, _, self._sent_aside, _ = self._exchange(list(messages), server_round)
        return ok

    def partition_of_aside(self, reply: Message) -> int:
        """The partition a reply of the last :meth:`send_aside` came from."""
        return self._sent_aside[reply.metadata.reply_to_message_id]

    def partition_to(self, message: Message) -> int:
        """The partition an instruction is addressed to."""
        return self._node_to_partition[message.metadata.dst_node_id]

    def _exchange(
        self, msgs: list[Message], server_round: int
    ) -> tuple[list[Message], dict[int, str], dict[str, int], dict[int, dict[str, Any]]]:
        """Push, pull and record one exchange: (replies, failed, message id -> partition, rows)."""
        replies, refused = self._push_pull(msgs)
        failed: dict[int, str] = {}
        sent: dict[str, int] = {}
        rows: dict[int, dict[str, Any]] = {}
        ok: list[Message] = []
        for msg, reply in zip(msgs, replies, strict=True):
            pid = self._node_to_partition[msg.metadata.dst_node_id]
            kind = msg.metadata.message_type
            local_rounds: dict[int, dict[str, Any]] = {}
            row: dict[str, Any] = {
                "round": server_round,
                "exchange": kind,
                "partition-id": pid,
                "client": self.name(pid),
                "status": "ok",
                "error": "",
            }
            if reply is None:
                failed[pid] = refused.get(
                    msg.metadata.dst_node_id, f"no reply within {self.round_timeout:g} s"
                )
            elif reply.has_error():
                failed[pid] = _reason(reply)
            else:
                sent[msg.metadata.message_id] = pid
                ok.append(reply)
                metrics, local_rounds = split_local_rounds(_scalar_metrics(reply.content))
                row.update(metrics)
                if self.listing:  # which clients hold state would tell who took part
                    self._client_state(pid, reply.content, row, f"round {server_round} {kind}")
                if self.audit:
                    self.store.audit(
                        _traffic(server_round, kind, pid if self.listing else None, reply.content)
                    )
            if pid in failed:
                row.update(status="failed", error=failed[pid])
                if self.listing:  # a client's reason may name its partition
                    self.log(f"round {server_round} {kind}: {self.who(pid)} failed: {failed[pid]}")
            rows[pid] = self._record(row)  # reject() and note() complete this row
            if pid not in failed and local_rounds and self.listing:
                self.store.add_local_rounds(row, local_rounds)
        if failed and not self.listing:
            self.log(f"round {server_round} {kind}: {len(failed)} of {len(msgs)} clients failed")
        return ok, failed, sent, rows

    def _record(self, row: dict[str, Any]) -> dict[str, Any]:
        """A client's row of an exchange: added to rounds.csv, or, within :meth:`unlisted`, kept for
        this exchange only (:meth:`reject` and :meth:`note` complete it) and never written."""
        return self.store.add_row(**row) if self.listing else row

    def _client_state(self, pid: int, content: RecordDict, row: dict[str, Any], where: str) -> None:
        """Which clients hold state (``client-state`` ``kept``) and whose state was lost (``lost``:
        one line, in the client's row; the client went on by its method's rule, docs/user-guide.md
        "Client state")."""
        report = content.config_records.get("client-state")
        if report is None:
            return
        if report.get("kept"):
            self.holds_state.add(pid)
        if lost := str(report.get("lost", "")):
            row["error"] = f"client state lost: {lost}"
            self.log(f"{where}: {self.name(pid)} (partition {pid}): client state lost: {lost}")

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of the pool: which partitions hold client state."""
        return {"holds-state": sorted(self.holds_state)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.holds_state = {int(p) for p in state.get("holds-state", [])}

    def reject(self, reply: Message, reason: str) -> None:
        """Record that the strategy could not use a reply (NaN, wrong shape) and why."""
        pid = self.partition_of(reply)
        self.failed[pid] = reason
        self._rows[pid].update(status="rejected", error=reason)
        self.log(f"rejected the reply of {self.who(pid)}: {reason}")

    def screen(self, replies: list[Message], check: Callable[[Message], str | None] | None) -> list[Message]:
        """The replies ``check`` finds usable; the others are rejected (:meth:`reject`)."""
        if check is None:
            return replies
        usable = []
        for reply in replies:
            problem = check(reply)
            if problem is None:
                usable.append(reply)
            else:
                self.reject(reply, problem)
        return usable

    def note(self, partition_id: int, **values: Any) -> None:
        """Add strategy-computed columns (e.g. a weight) to the client's row of the last exchange."""
        self._rows[partition_id].update(values)

    def _push_pull(self, msgs: list[Message]) -> tuple[list[Message | None], dict[int, str]]:
        """Push ``msgs`` and pull their replies until all arrived or ``round-timeout`` passed."""
        ids = list(self.grid.push_messages(msgs))
        by_id = {mid: i for i, mid in enumerate(ids) if mid}
        out: list[Message | None] = [None] * len(msgs)
        refused = {
            msgs[i].metadata.dst_node_id: "the SuperLink refused the message"
            for i, mid in enumerate(ids)
            if not mid
        }
        pending = set(by_id)
        deadline = time.time() + self.round_timeout
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid in pending:
                    out[by_id[mid]] = reply
                    pending.discard(mid)
            if not pending or time.time() >= deadline:
                break
            time.sleep(POLL_INTERVAL)
        if pending or any(reply is not None and reply.has_error() for reply in out):
            # A `flwr stop` that lands while a pull is inside the SuperLink answers every message of
            # the stopped run as unavailable: ask the SuperLink once more (refused for a stopped
            # run, like every call after the stop) before recording failures nobody caused.
            self.grid.get_node_ids()
        return out, refused


@dataclass
class _Discovery:
    """What the discovery queries found: usable clients, bad partitions, unidentified nodes."""

    infos: dict[int, dict[str, Any]] = field(default_factory=dict)  # partition -> its info
    bad: dict[int, tuple[int, str]] = field(default_factory=dict)  # partition -> (node, reason)
    lost: dict[int, str] = field(default_factory=dict)  # node (partition unknown) -> reason
    num_partitions: set[int] = field(default_factory=set)
    # partition -> what its silo says of itself: the app builds it approves, notes on its own files
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)

    def expected(self, required: int) -> int:
        """How many usable clients the run needs (0 while no node has told its num-partitions)."""
        return required or max(self.num_partitions, default=0)

    def hopeless(self, required: int) -> bool:
        """Whether bad nodes leave too few partitions to reach ``required`` clients (no use waiting)."""
        n, failures = max(self.num_partitions, default=0), len(self.bad) + len(self.lost)
        return n > 0 and failures > 0 and n - failures < self.expected(required)

    def bad_keys(self) -> list[tuple[int | None, int]]:
        """(partition or None, node) of every failure, in the order of :meth:`left_out`."""
        return [(pid, node) for pid, (node, _) in sorted(self.bad.items())] + [
            (None, node) for node in sorted(self.lost)
        ]

    def left_out(self) -> dict[str, str]:
        """Client name (``partition-<i>``, or ``node-<id>`` when the partition is unknown) -> reason."""
        out = {f"partition-{pid}": reason for pid, (_, reason) in sorted(self.bad.items())}
        out.update({f"node-{node}": reason for node, reason in sorted(self.lost.items())})
        return out

    def shortfall(self, expected: int, waited: float) -> str:
        """One line: how many clients are usable, every partition left out and why, who is missing."""
        if not self.infos and not self.bad and not self.lost:
            return f"no client connected after {waited:g} s; start the SuperNodes or check the federation"
        if not self.bad and not self.lost:
            missing = sorted(set(range(expected)) - set(self.infos))
            return (
                f"only {len(self.infos)} of {expected} required clients connected after {waited:g} s "
                f"(missing partition-id {missing[:10]}); start more SuperNodes or lower 'num-clients'"
            )
        reasons = "; ".join(f"{name}: {reason}" for name, reason in self.left_out().items())
        missing = sorted(set(range(expected)) - set(self.infos) - set(self.bad))
        absent = f"; missing partition-id {missing[:10]}" if missing else ""
        return (
            f"only {len(self.infos)} of {expected or '?'} required clients are usable, "
            f"{len(self.bad) + len(self.lost)} left out ({reasons}){absent}; "
            "fix their data or lower 'num-clients'"
        )


_REFUSED = re.compile(r"^refused app build [0-9a-f]{64}: not approved by this silo \(approved: ([^)]*)\)")
_CLAIM = re.compile(r"partition (\d+) of (\d+): (.*?)(?:'>)?\s*$", re.S)


def _claim(reason: str) -> tuple[int, int, str] | None:
    """(partition, num-partitions, message) of a client's error that names its partition, else None.

    A client's data errors read ``partition <i> of <n>: <what is wrong>`` (hetfed.client.session); Flower
    wraps them as ``<class '...'>:<'...'>`` on every engine.
    """
    match = _CLAIM.search(reason)
    if match is None:
        return None
    return int(match[1]), int(match[2]), " ".join(match[3].split())


def _reason(reply: Message) -> str:
    """A failed reply's error as rounds.csv records it: a silo's refusal as its own line
    (client/refusal.py), any other error with its code."""
    err = reply.error
    if err.code == ErrorCode.MOD_FAILED_PRECONDITION:
        return str(err.reason)
    return f"[code {err.code}] {err.reason}"


def config_of(content: RecordDict) -> Mapping[str, ConfigRecordValues]:
    """A message's ConfigRecord ``config`` (empty if it has none)."""
    records = content.config_records
    return records["config"] if "config" in records else {}


def with_config(message: Message, values: Mapping[str, Any], **records: ConfigRecord) -> Message:
    """``message`` again, its ConfigRecord ``config`` updated with ``values`` and ``records`` added."""
    content = RecordDict(
        {**message.content, **records, "config": ConfigRecord({**config_of(message.content), **values})}
    )
    return Message(
        content,
        dst_node_id=message.metadata.dst_node_id,
        message_type=message.metadata.message_type,
        group_id=message.metadata.group_id,
    )


def _scalar_metrics(content: RecordDict) -> dict[str, float | int]:
    """The scalar metrics of a reply, for its results row."""
    out: dict[str, float | int] = {}
    for record in content.metric_records.values():
        out.update({k: v for k, v in record.items() if isinstance(v, int | float)})
    return out


def _traffic(server_round: int, kind: str, pid: int | None, content: RecordDict) -> dict[str, Any]:
    """What a reply carried: array names with shapes and dtypes, metric and config names with value
    kinds; from partition ``pid`` (None: not said, a secret sample's exchange)."""
    numpy = {
        f"{name}/{key}": value
        for name, record in content.array_records.items()
        for key, value in to_numpy(record).items()
    }
    arrays = {key: list(value.shape) for key, value in numpy.items()}
    dtypes = {key: str(value.dtype) for key, value in numpy.items()}
    metrics = {
        f"{name}/{key}": type(value).__name__ + (f"[{len(value)}]" if isinstance(value, list) else "")
        for name, record in content.metric_records.items()
        for key, value in record.items()
    }
    configs = {
        f"{name}/{key}": type(value).__name__
        for name, record in content.config_records.items()
        for key, value in record.items()
    }
    return {
        "round": server_round,
        "exchange": kind,
        **({"partition-id": pid} if pid is not None else {}),
        "arrays": arrays,
        "dtypes": dtypes,
        "metrics": metrics,
        "configs": configs,
    }
