"""Restore a stage from a checkpoint written by another layout: other layer splits, other replica
counts (the driver re-plans after losing nodes, and the new plan may cut the model elsewhere).

A worker's checkpoint holds its module's state under the stage's own keys (``"3.mlp.up.weight"``
for the stage's fourth layer) with its layer range, and its optimizer state by parameter index with
``param_names``: each optimizer index's global name (``"<layer>.<rest>"``; ``"tied"`` for a weight the first
and last layer share). So any stage of any layout can take its layers' weights and optimizer state
from the files that hold them: the replicas of a stage hold the same state after a step, so one
file per old stage is enough. A stage split by tensor parallelism wrote one file per worker of its
group, each with its shards and the dimension each is cut on (``state["tp"]``): ``merged`` joins
them into whole tensors, ``cut`` takes a worker's shards of the new degree. What does not carry
over: the cross-region compression residual
(it belongs to a region leader of the old layout; error feedback starts again from zero).
"""

from __future__ import annotations

import torch
from torch import nn

from runtime import tensor_parallel as tp
from runtime.optim import StageOptimizer

TIED = "tied"


def global_key(start: int, local: str) -> str:
    """A stage's state key (``"1.mlp.up.weight"``) as the model's (``"<start + 1>.mlp..."``)."""
    index, _, rest = local.partition(".")
    return f"{start + int(index)}.{rest}"


def global_names(module: nn.Module, start: int, tied: nn.Parameter | None) -> list[str]:
    """The global name of each of ``module.parameters()``, in order."""
    names = []
    for local, parameter in module.named_parameters():
        names.append(TIED if parameter is tied else global_key(start, local))
    return names


def merged(states: list[dict]) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """Module tensors by global key and optimizer state by global parameter name, over ``states``
    (one per old stage, or one per worker of a stage's tensor-parallel group)."""
    tensors: dict[str, torch.Tensor] = {}
    optimizer: dict[str, dict] = {}
    for state in _joined(states):
        start = state["layers"][0]
        for local, tensor in state["module"].items():
            tensors[global_key(start, local)] = tensor
        for index, name in enumerate(state["param_names"]):  # the optimizer's order
            if index in state["optimizer"]["state"]:
                optimizer[name] = state["optimizer"]["state"][index]
        tied_state = state.get("tied_optimizer")
        if tied_state and 0 in tied_state["state"]:
            optimizer[TIED] = tied_state["state"][0]
    return tensors, optimizer


def _joined(states: list[dict]) -> list[dict]:
    """One state per stage: the shards of a tensor-parallel group's states joined."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for state in states:
        groups.setdefault(tuple(state["layers"]), []).append(state)
    joined = []
    for group in groups.values():
        group.sort(key=lambda st: tp_of(st)["rank"])
        first, degree = group[0], tp_of(group[0])["degree"]
        if degree == 1:
            joined.append(first)
            continue
        if [tp_of(st)["rank"] for st in group] != list(range(degree)):
            raise KeyError(
                f"layers {first['layers']}: {len(group)} of {degree} tensor-parallel shards"
            )
        dims = tp_of(first)["dims"]
        module = {
            key: tp.join([st["module"][key] for st in group], dims[key]) if key in dims else value
            for key, value in first["module"].items()
        }
        optimizer = _join_optimizer(group, dims)
        joined.append({**first, "module": module, "optimizer": optimizer, "tp": None})
    return joined


def _join_optimizer(group: list[dict], dims: dict[str, int]) -> dict:
    """The first shard's optimizer document with each split parameter's state joined."""
    first = group[0]
    start = first["layers"][0]
    document = {**first["optimizer"], "state": dict(first["optimizer"]["state"])}
    for index, name in enumerate(first["param_names"]):
        local = _local_key(name, start)
        if local not in dims or index not in document["state"]:
            continue
        document["state"][index] = {
            key: tp.join([st["optimizer"]["state"][index][key] for st in group], dims[local])
            if _shaped_like(value, first["module"][local])
            else value
            for key, value in first["optimizer"]["state"][index].items()
        }
    return document


def cut(
    tensors: dict[str, torch.Tensor],
    optimizer: dict[str, dict],
    dims: dict[str, int],
    *,
    rank: int,
    degree: int,
) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """Worker ``rank``'s shards (of ``degree``) of the whole tensors and optimizer states that
    ``merged`` gives; ``dims``: the split dimension of each split tensor, by global key."""
    tensors = {
        key: tp.cut(t, dims[key], rank=rank, degree=degree) if key in dims else t
        for key, t in tensors.items()
    }
    optimizer = {
        name: {
            key: tp.cut(v, dims[name], rank=rank, degree=degree)
            if name in dims and _shaped_like(v, tensors[name], whole_on=(dims[name], degree))
            else v
            for key, v in state.items()
        }
        for name, state in optimizer.items()
    }
    return tensors, optimizer


def _shaped_like(value: object, tensor: torch.Tensor, whole_on: tuple[int, int] | None = None):
    """Whether an optimizer state ``value`` has its parameter's shape (moments do, steps not);
    ``whole_on`` (dim, degree): ``tensor`` is a shard and ``value`` the whole."""
    if not isinstance(value, torch.Tensor) or value.dim() != tensor.dim() or value.dim() == 0:
        return False
    shape = list(tensor.shape)
    if whole_on is not None:
        shape[whole_on[0]] *= whole_on[1]
    return list(value.shape) == shape


def _local_key(name: str, start: int) -> str:
    index, _, rest = name.partition(".")
    return f"{int(index) - start}.{rest}" if name != TIED else name


def tp_of(state: dict) -> dict:
    return state.get("tp") or {"rank": 0, "degree": 1, "dims": {}}


def load_module(module: nn.Module, start: int, tensors: dict[str, torch.Tensor]) -> None:
    wanted = {}
    for local in module.state_dict():
        key = global_key(start, local)
        if key not in tensors:
            raise KeyError(f"no checkpointed tensor for layer key {key!r}")
        wanted[local] = tensors[key]
    tp.load_local_state(module, wanted)


def load_optimizer(optimizer: StageOptimizer, names: list[str], states: dict[str, dict]) -> None:
    """Give ``optimizer`` (whose parameters are named ``names``, in order) the saved state of each
    parameter that has one."""
    document = optimizer.state_dict()
    document["state"] = {i: states[name] for i, name in enumerate(names) if name in states}
    optimizer.load_state_dict(document)
