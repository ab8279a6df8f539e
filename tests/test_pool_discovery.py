"""ClientPool's discovery query: every node's answer (or silence) is recorded, in any order."""

from __future__ import annotations

from types import SimpleNamespace

from hetfed.server.pool import ClientPool, _Discovery


def test_a_refused_build_then_a_silent_node_are_both_recorded(task_identity) -> None:
    # The refusal's reason once overwrote the push's per-node failures (same variable name), so
    # a node without an answer after it failed the discovery with AttributeError.
    pool = ClientPool.__new__(ClientPool)  # only what _discover reads
    pool.settings, pool.round_timeout, pool.run_id = {}, 1.0, ""
    reason = f"partition 3 of 4: refused app build {'a' * 64}: not approved by this silo (approved: abc)"
    refused = SimpleNamespace(has_error=lambda: True, error=SimpleNamespace(code=0, reason=reason))
    pool._push_pull = lambda msgs: ([refused, None], {2: "timed out"})
    found = _Discovery()
    pool._discover([1, 2], "run", found)
    assert found.bad[3][0] == 1 and found.reports[3]["approved-apps"] == ["abc"]
    assert found.lost == {2: "no answer to the discovery query within 1 s (timed out)"}
