"""hetfed's Adam (client/adam.py) against torch.optim.Adam: bit for bit, state interchangeable."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hetfed.client.adam import Adam
from hetfed.client.state import optimizer_from_state, optimizer_to_state


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def train(model: torch.nn.Module, optimizer, steps: range, lrs: list[float]) -> None:  # noqa: ANN001
    """Mini-batch steps on a fixed regression task; the lr changes per step, as a schedule does."""
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(200, 6, generator=gen), torch.randn(200, 4, generator=gen)
    for t in steps:
        for group in optimizer.param_groups:
            group["lr"] = lrs[t]
        idx = torch.arange(t * 13, t * 13 + 32) % 200
        optimizer.zero_grad()
        loss = (model(x[idx]) - y[idx]).pow(2).mean()
        loss.backward()
        if t % 5 == 4:  # a parameter without a gradient is skipped (its state stays unborn)
            model[2].bias.grad = None
        optimizer.step()


def assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


LRS = [0.05 * 0.9**t for t in range(40)]


@pytest.mark.parametrize("betas, eps", [((0.9, 0.999), 1e-8), ((0.8, 0.99), 1e-6)])
def test_steps_bit_for_bit(betas: tuple[float, float], eps: float) -> None:
    ours, theirs = mlp(0), mlp(0)
    opt_ours = Adam(ours.parameters(), lr=0.05, betas=betas, eps=eps)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=0.05, betas=betas, eps=eps)
    train(ours, opt_ours, range(40), LRS)
    train(theirs, opt_theirs, range(40), LRS)
    assert_same(ours, theirs)
    assert not torch.equal(ours[0].weight, mlp(0)[0].weight)  # it did train
    sd_ours, sd_theirs = opt_ours.state_dict(), opt_theirs.state_dict()
    assert sd_ours["state"].keys() == sd_theirs["state"].keys()
    for i, slots in sd_theirs["state"].items():
        assert list(sd_ours["state"][i]) == list(slots)  # same slots, same order
        for name, value in slots.items():
            ours = sd_ours["state"][i][name]
            assert torch.equal(ours, value) and ours.dtype == value.dtype
    group_ours, group_theirs = sd_ours["param_groups"][0], sd_theirs["param_groups"][0]
    assert set(group_ours) == set(group_theirs)
    assert group_ours == group_theirs


@pytest.mark.parametrize("saved_by", ["torch", "hetfed"])
@pytest.mark.parametrize("loaded_by", ["torch", "hetfed"])
def test_saved_state_resumes_in_either(saved_by: str, loaded_by: str) -> None:
    """Train 15 steps, save through the client's state helpers, load into a fresh optimizer (of
    either kind) and train 15 more: the same model as 30 uninterrupted steps of torch's Adam."""
    kinds = {"torch": torch.optim.Adam, "hetfed": Adam}
    whole = mlp(1)
    train(whole, torch.optim.Adam(whole.parameters(), lr=0.05), range(30), LRS)

    first = mlp(1)
    opt = kinds[saved_by](first.parameters(), lr=0.05)
    train(first, opt, range(15), LRS)
    arrays, values = optimizer_to_state(opt)
    second = mlp(2)
    second.load_state_dict(first.state_dict())
    resumed = kinds[loaded_by](second.parameters(), lr=0.5)  # the saved lr wins
    optimizer_from_state(resumed, arrays, values)
    assert resumed.param_groups[0]["lr"] == LRS[14]
    train(second, resumed, range(15, 30), LRS)
    assert_same(second, whole)


def test_refuses_state_it_cannot_continue() -> None:
    model = mlp(3)
    saved = torch.optim.Adam(model.parameters(), lr=0.05, amsgrad=True)
    train(model, saved, range(3), LRS)
    with pytest.raises(ValueError, match="amsgrad=True"):
        Adam(model.parameters()).load_state_dict(saved.state_dict())
    with pytest.raises(ValueError, match="for 4 parameters, this model has 2"):
        Adam(model[0].parameters()).load_state_dict(Adam(model.parameters()).state_dict())


def test_training_does_not_import_dynamo() -> None:
    """The reason this class exists: torch.optim imports torch._dynamo (~70 MB) on every step."""
    code = (
        "import sys, torch\n"
        "from hetfed.client.adam import Adam\n"
        "m = torch.nn.Linear(3, 2); o = Adam(m.parameters(), lr=0.1)\n"
        "m(torch.ones(1, 3)).sum().backward(); o.step(); o.zero_grad()\n"
        "print('torch._dynamo' in sys.modules)\n"
        "torch.optim.Adam(m.parameters()); print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]  # the second line shows the check can see it
