"""Restore a stage from a checkpoint written by another layout: other layer splits, other replica
counts (the driver re-plans after losing nodes, and the new plan may cut the model elsewhere).

A worker's checkpoint holds its module's state under the stage's own keys (``"3.mlp.up.weight"``
for the stage's fourth layer) with its layer range, and its optimizer state by parameter index with
``param_names``: each optimizer index's global name (``"<layer>.<rest>"``; ``"tied"`` for a weight the first
and last layer share). So any stage of any layout can take its layers' weights and optimizer state
from the files that hold them: the replicas of a stage hold the same state after a step, so one
file per old stage is enough. What does not carry over: the cross-region compression residual
(it belongs to a region leader of the old layout; error feedback starts again from zero).
"""

from __future__ import annotations

import torch
from torch import nn

TIED = "tied"


def global_names(module: nn.Module, start: int, tied: nn.Parameter | None) -> list[str]:
    """The global name of each of ``module.parameters()``, in order."""
    names = []
    for local, parameter in module.named_parameters():
        index, _, rest = local.partition(".")
        names.append(TIED if parameter is tied else f"{start + int(index)}.{rest}")
    return names


def merged(states: list[dict]) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """Module tensors by global key and optimizer state by global parameter name, over ``states``
    (one per old stage)."""
    tensors: dict[str, torch.Tensor] = {}
    optimizer: dict[str, dict] = {}
    for state in states:
        start = state["layers"][0]
        for local, tensor in state["module"].items():
            index, _, rest = local.partition(".")
            tensors[f"{start + int(index)}.{rest}"] = tensor
        for index, name in enumerate(state["param_names"]):  # the optimizer's order
            if index in state["optimizer"]["state"]:
                optimizer[name] = state["optimizer"]["state"][index]
        tied_state = state.get("tied_optimizer")
        if tied_state and 0 in tied_state["state"]:
            optimizer[TIED] = tied_state["state"][0]
    return tensors, optimizer


def load_module(module: nn.Module, start: int, tensors: dict[str, torch.Tensor]) -> None:
    wanted = {}
    for local in module.state_dict():
        index, _, rest = local.partition(".")
        key = f"{start + int(index)}.{rest}"
        if key not in tensors:
            raise KeyError(f"no checkpointed tensor for layer key {key!r}")
        wanted[local] = tensors[key]
    module.load_state_dict(wanted)


def load_optimizer(
    optimizer: torch.optim.Optimizer, names: list[str], states: dict[str, dict]
) -> None:
    """Give ``optimizer`` (whose parameters are named ``names``, in order) the saved state of each
    parameter that has one."""
    document = optimizer.state_dict()
    document["state"] = {i: states[name] for i, name in enumerate(names) if name in states}
    optimizer.load_state_dict(document)
