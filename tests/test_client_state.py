"""Client state persists across rounds in context.state and survives a SuperNode restart via state-dir."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from hetfed.client.state import ClientState, list_states, optimizer_from_state, optimizer_to_state, run_key


def _context() -> Context:
    return Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})


def test_state_round_trips_in_memory_and_is_scoped_by_run() -> None:
    ctx = _context()
    st = ClientState(ctx, "run-a", None)
    assert st.arrays("model") is None and st.values("schedule") is None
    st.set_arrays("model", {"w": np.arange(6.0).reshape(2, 3)})
    st.set_values("schedule", {"lam": 0.5, "frozen": True, "round": 3})
    again = ClientState(ctx, "run-a", None)  # the next message of the same run
    np.testing.assert_array_equal(again.arrays("model")["w"], np.arange(6.0).reshape(2, 3))
    assert again.values("schedule") == {"lam": 0.5, "frozen": True, "round": 3}
    assert ClientState(ctx, "run-b", None).arrays("model") is None


def test_state_dir_restores_after_a_restart(tmp_path) -> None:
    st = ClientState(_context(), "run-a", tmp_path)
    st.set_arrays("model", {"w": np.ones(3) * 2.5})
    st.set_values("schedule", {"lam": 0.25})
    fresh = ClientState(_context(), "run-a", tmp_path)  # a restarted SuperNode: empty context.state
    np.testing.assert_array_equal(fresh.arrays("model")["w"], np.ones(3) * 2.5)
    assert fresh.values("schedule") == {"lam": 0.25}
    assert sorted(p.name for p in (tmp_path / "run-a").iterdir()) == [
        "model.npz",
        "run.json",
        "schedule.json",
    ]
    assert fresh.found and not ClientState(_context(), "run-b", tmp_path).found


def test_a_run_reusing_a_name_never_reads_the_earlier_runs_state(tmp_path) -> None:
    """Keys carry the run id: the second run named "x" starts fresh, both are listed with their ids."""
    first = ClientState(
        _context(), run_key("x", "aaaa", 2), tmp_path, {"run-name": "x", "run-id": "aaaa", "partition-id": 2}
    )
    first.set_arrays("personal", {"w": np.ones(4)})
    second = ClientState(
        _context(), run_key("x", "bbbb", 2), tmp_path, {"run-name": "x", "run-id": "bbbb", "partition-id": 2}
    )
    assert not second.found and second.arrays("personal") is None
    second.set_values("schedule", {"round": 1})
    listed = list_states(tmp_path)
    assert [(s.run_name, s.run_id, s.partition_id, s.key) for s in listed] == [
        ("x", "aaaa", 2, "x.aaaa"),
        ("x", "bbbb", 2, "x.bbbb"),
    ]
    npz = (tmp_path / "x.aaaa-p2" / "personal.npz").stat().st_size
    assert listed[0].size == npz + (tmp_path / "x.aaaa-p2" / "run.json").stat().st_size


@pytest.mark.parametrize("bad", ["", "../x", ".hidden"])
def test_invalid_run_keys_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="run key"):
        ClientState(_context(), bad, None)


def test_adam_state_round_trip_continues_identically() -> None:
    """Saving and restoring Adam mid-training gives the same next steps as never stopping."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 4, dtype=torch.float64), torch.randn(32, 1, dtype=torch.float64)

    def make():
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 1).double()
        return model, torch.optim.Adam(model.parameters(), lr=0.05)

    def step(model, opt):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()

    model, opt = make()
    for _ in range(3):
        step(model, opt)
    arrays, values = optimizer_to_state(opt)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(2):
        step(model, opt)

    model2, opt2 = make()
    model2.load_state_dict(weights)
    optimizer_from_state(opt2, arrays, values)
    for _ in range(2):
        step(model2, opt2)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_redone_round_starts_from_the_state_it_started_from(tmp_path) -> None:
    """A client wrote round 4's state, the server resumed from its round-3 checkpoint: round 4 starts
    again from the state after round 3; state newer than both kept versions is refused with a note."""
    st = ClientState(_context(), "r", tmp_path)
    for rnd in (1, 2, 3, 4):
        st.set_round_arrays("personal", {"w": np.full(2, float(rnd))}, rnd)
    fresh = ClientState(_context(), "r", tmp_path)  # the restarted node
    np.testing.assert_array_equal(fresh.round_arrays("personal", 5)["w"], [4.0, 4.0])  # the next round
    np.testing.assert_array_equal(fresh.round_arrays("personal", 4)["w"], [3.0, 3.0])  # round 4 redone
    fresh.set_round_arrays("personal", {"w": np.full(2, 40.0)}, 4)  # the redo keeps round 3's version
    np.testing.assert_array_equal(fresh.round_arrays("personal", 4)["w"], [3.0, 3.0])
    assert fresh.note == "" and fresh.round_arrays("personal", 3) is None
    assert fresh.note.startswith("its personal state was written after round 2, where the server resumed")
