"""The optimizer a stage steps: torch's own update functions (``torch.optim.adam.adam``,
``torch.optim.sgd.sgd``) over the stage's parameters, held without ``torch.optim.Optimizer``.

Why not the class: its constructor, ``state_dict`` and ``load_state_dict`` import
``torch._dynamo`` on first use (to keep themselves out of compiled graphs), about 1.1 s of CPU in
every process that builds one. That is half of a worker's start, paid again by every worker a
recovery restarts. The update functions import nothing.

The update is torch's, called with the arguments ``torch.optim.AdamW``, ``Adam`` and ``SGD`` pass
for one parameter group with a float learning rate and ``foreach=False`` (the same per-parameter
order on every worker, whatever it holds), so the weights match those classes' bit for bit (the
runtime tests compare with ``reference.py``, which steps the classes themselves). The state and
``state_dict`` have torch's layout (``{"state": {index: {...}}, "param_groups": [...]}``), so a
document from either loads into the other. No closures, no hooks, no sparse or complex
parameters: a stage has none of them.
"""

from __future__ import annotations

import torch

from runtime.config import OptimizerSettings


class StageOptimizer:
    """Steps ``params`` (each with its ``.grad``) as torch's optimizer of ``settings.kind``
    would; ``state`` maps a parameter to its state, as torch's ``Optimizer.state`` does."""

    def __init__(self, params, settings: OptimizerSettings) -> None:
        self.params: list[torch.Tensor] = list(params)
        assert len({id(p) for p in self.params}) == len(self.params), "a parameter twice"
        self.settings = settings
        self.state: dict[torch.Tensor, dict] = {}

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient (torch skips the others too)."""
        params = [p for p in self.params if p.grad is not None]
        if not params:
            return
        if self.settings.kind == "sgd":
            self._sgd(params)
        else:
            self._adam(params)

    def _adam(self, params: list[torch.Tensor]) -> None:
        from torch.optim.adam import adam

        for p in params:
            if not self.state.get(p):  # as Adam._init_group makes it (not capturable, not fused)
                self.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.get_default_dtype(), device="cpu"),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
        s = self.settings
        adam(
            params,
            [p.grad for p in params],
            [self.state[p]["exp_avg"] for p in params],
            [self.state[p]["exp_avg_sq"] for p in params],
            [],
            [self.state[p]["step"] for p in params],
            amsgrad=False,
            has_complex=False,
            beta1=s.betas[0],
            beta2=s.betas[1],
            lr=s.lr,
            weight_decay=s.weight_decay,
            eps=s.eps,
            maximize=False,
            foreach=False,
            capturable=False,
            differentiable=False,
            fused=None,
            grad_scale=None,
            found_inf=None,
            decoupled_weight_decay=s.kind == "adamw",
        )

    def _sgd(self, params: list[torch.Tensor]) -> None:
        from torch.optim.sgd import sgd

        s = self.settings
        buffers = [self.state.get(p, {}).get("momentum_buffer") for p in params]
        if s.momentum == 0:
            buffers = []  # SGD passes no buffers without momentum
        sgd(
            params,
            [p.grad for p in params],
            buffers,
            weight_decay=s.weight_decay,
            momentum=s.momentum,
            lr=s.lr,
            dampening=0,
            nesterov=False,
            maximize=False,
            has_sparse_grad=False,
            foreach=False,
            fused=None,
            grad_scale=None,
            found_inf=None,
        )
        for p, buffer in zip(params if s.momentum else (), buffers, strict=True):
            self.state.setdefault(p, {})["momentum_buffer"] = buffer  # made by the first step

    def state_dict(self) -> dict:
        """torch's layout: state by parameter index (the live tensors, as torch returns them),
        one parameter group."""
        index = {id(p): i for i, p in enumerate(self.params)}
        return {
            "state": {index[id(p)]: state for p, state in self.state.items()},
            "param_groups": [{**self.settings.group(), "params": list(range(len(self.params)))}],
        }

    def load_state_dict(self, document: dict) -> None:
        """Take the state of ``document`` (torch's layout, one group of as many parameters),
        each tensor moved to its parameter's device (and floating dtype), as torch does; the
        ``step`` counters stay on the CPU."""
        (group,) = document["param_groups"]
        if len(group["params"]) != len(self.params):
            raise ValueError(
                f"the saved optimizer state has {len(group['params'])} parameters, this stage "
                f"{len(self.params)}"
            )
        position = {saved: i for i, saved in enumerate(group["params"])}
        state: dict[torch.Tensor, dict] = {}
        for key, saved in document["state"].items():
            p = self.params[position[int(key)]]
            state[p] = {name: _placed(name, value, p) for name, value in saved.items()}
        self.state = state


def _placed(name: str, value, param: torch.Tensor):
    if not isinstance(value, torch.Tensor) or name == "step":
        return value
    if param.is_floating_point():
        return value.to(dtype=param.dtype, device=param.device)
    return value.to(device=param.device)
