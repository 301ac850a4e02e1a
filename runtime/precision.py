"""Mixed precision and gradient clipping, the same in one process and across stages and replicas.

``training.precision``: ``fp32`` runs as is; ``bf16-mixed`` and ``fp16-mixed`` run every forward
under ``torch.autocast`` with that dtype (weights, gradients and the optimizer stay fp32, as
torch's automatic mixed precision keeps them). ``fp16-mixed`` also scales the loss, as
``torch.amp.GradScaler`` does with its defaults: the loss is multiplied by the scale before its
backward, the summed gradient is divided by it before clipping and the update; a step whose
gradient holds an inf or a NaN anywhere (any stage, any replica) is skipped by every worker and
halves the scale; 2000 steps in a row without one double it.

``grad_clip_norm``: the gradient of the whole model (every stage, the tied weight once) is scaled
by ``min(1, max_norm / (norm + 1e-6))``, with ``norm`` its L2 norm, as
``torch.nn.utils.clip_grad_norm_`` computes it on the single-process model. A pipeline gets its
norm from one all-reduce of each stage's sum of squares (replicas hold the same summed gradient).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from runtime.config import PRECISIONS

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def autocast(precision: str, device: torch.device | None):
    """The forward's context for ``precision`` on ``device`` (None: the host)."""
    assert precision in PRECISIONS, precision
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    return torch.autocast(device_type="cuda" if device is not None else "cpu", dtype=dtype)


@dataclass
class LossScaler:
    """GradScaler's dynamic loss scale, as plain state a checkpoint carries."""

    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0  # steps in a row without an inf or NaN

    def update(self, *, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])


def loss_scaler(precision: str, *, initial_scale: float = 2.0**16) -> LossScaler | None:
    return LossScaler(scale=initial_scale) if precision == "fp16-mixed" else None


def squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """The sum of squares of ``grads`` (float64: stages' partial sums add up without rounding
    away the small ones), a one-element tensor on their device."""
    if not grads:
        return torch.zeros(1, dtype=torch.float64)
    return torch.stack([g.detach().double().pow(2).sum() for g in grads]).sum().reshape(1)


def clip_factor(total_squares: float, *, scale: float, max_norm: float | None) -> float:
    """What to multiply the (scaled) summed gradient by: unscale, then clip to ``max_norm``."""
    factor = 1.0 / scale
    if max_norm is not None:
        norm = math.sqrt(total_squares) / scale
        factor *= min(1.0, max_norm / (norm + CLIP_EPS))
    return factor
