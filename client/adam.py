"""Adam, as ``torch.optim.Adam(params, lr)`` computes it on the CPU, without ``torch.optim``.

Every ``torch.optim`` optimizer imports ``torch._dynamo`` (and SymPy with it) when a parameter
group is added and on every ``step``, although nothing is compiled: about 70 MB in every silo's
worker (docs/benchmarks.md, "Per-silo memory"). This class takes the same step with the same
tensor operations in the same order as torch 2.x's single-tensor Adam with its defaults
(``foreach`` is off for CPU tensors, no AMSGrad, no weight decay), so training gives bit for bit
the same models (tests/test_adam.py compares with ``torch.optim.Adam``), and its ``state_dict``
has torch's layout, so optimizer state saved by either loads into either.

Per parameter ``p`` with gradient ``g`` at step ``t`` (Kingma & Ba, 2015)::

    m <- m + (1 - beta1) (g - m)                  (torch's lerp_)
    v <- beta2 v + (1 - beta2) g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

# torch.optim.Adam's defaults; the keys every param group of its state_dict carries.
DEFAULTS: dict[str, Any] = {
    "lr": 1e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": None,
    "decoupled_weight_decay": False,
}
SLOTS = ("step", "exp_avg", "exp_avg_sq")


class Adam:
    """``torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)`` for CPU tensors, one param group."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = DEFAULTS["lr"],
        betas: tuple[float, float] = DEFAULTS["betas"],
        eps: float = DEFAULTS["eps"],
    ) -> None:
        group = {**DEFAULTS, "lr": lr, "betas": tuple(betas), "eps": eps, "params": list(params)}
        self.param_groups: list[dict[str, Any]] = [group]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        """Drop the gradients (torch's default, ``set_to_none=True``)."""
        for p in self.param_groups[0]["params"]:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step for every parameter that has a gradient (the equations above)."""
        group = self.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.setdefault(p, {})
            if not state:  # torch keeps the step count as a float32 CPU tensor
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
            step_t += 1
            exp_avg.lerp_(p.grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            step = step_t.item()
            step_size = lr / (1 - beta1**step)
            denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: ``{"state": {index: {step, exp_avg, exp_avg_sq}}, "param_groups": [...]}``."""
        params = self.param_groups[0]["params"]
        group = {key: value for key, value in self.param_groups[0].items() if key != "params"}
        return {
            "state": {i: dict(self.state[p]) for i, p in enumerate(params) if p in self.state},
            "param_groups": [{**group, "params": list(range(len(params)))}],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state saved by :meth:`state_dict` or by ``torch.optim.Adam`` (same options)."""
        (saved,) = state_dict["param_groups"]
        params = self.param_groups[0]["params"]
        for key in ("amsgrad", "maximize", "weight_decay", "capturable", "differentiable"):
            if saved.get(key, DEFAULTS[key]) != DEFAULTS[key]:
                raise ValueError(f"Adam state with {key}={saved[key]!r}: only torch's default is supported")
        if len(saved["params"]) != len(params):
            count = len(saved["params"])
            raise ValueError(f"Adam state for {count} parameters, this model has {len(params)}")
        betas, eps = tuple(saved.get("betas", DEFAULTS["betas"])), saved.get("eps", DEFAULTS["eps"])
        self.param_groups[0].update(lr=saved["lr"], betas=betas, eps=eps)
        self.state = {}
        for index, slots in state_dict["state"].items():
            p = params[saved["params"].index(int(index))]
            self.state[p] = {
                name: slots[name].to(torch.float32) if name == "step" else slots[name].to(p.dtype).clone()
                for name in SLOTS
            }
