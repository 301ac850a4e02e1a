"""Tensor parallelism inside a stage: the model's plan applied with torch's own
``torch.distributed.tensor.parallel``, and the stage's view of its parameters as plain local
tensors.

A model declares how its layers split (``ModelParts.tp_plan``, models/protocol.py): per layer, a
mapping of submodule paths to ``"colwise"`` / ``"rowwise"`` (or any ``ParallelStyle``).
``shard_stage`` hands each layer's plan to ``parallelize_module`` over a one-dimensional device
mesh of the replica's tensor-parallel group; the weights of split linears become DTensors
(``Shard(0)`` for column-parallel, ``Shard(1)`` for row-parallel weights), everything else stays a
plain tensor that every worker of the group holds whole.

The rest of the runtime works on plain tensors: the optimizer steps each parameter's local shard
(a view of the DTensor's storage, so the update lands in the model), gradients accumulate in the
stage's flat buffer (each DTensor's ``.grad`` wraps a view of it), the data-parallel all-reduce
sums shard by shard between the replicas' workers of one tensor-parallel rank, and checkpoints
hold local shards with the dimension each is split on (``dims``), so reshard.py can join the
shards of a group and cut them again for another degree.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

import torch
from torch import nn

from runtime.layout import LayoutError

STYLES = ("colwise", "rowwise")


def shard_stage(
    module: nn.Module,
    plan: Callable[[nn.Module], Mapping[str, object]] | None,
    *,
    group,
    device_type: str,
    model: str,
) -> None:
    """Split the layers of ``module`` (an ``nn.Sequential`` of the stage's layers) over
    ``group`` (a process group of the replica's tensor-parallel workers), in place."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    if plan is None:
        raise LayoutError(
            f"model {model} declares no tensor-parallel plan (ModelParts.tp_plan): run it with "
            "tp 1, or give its build function a tp_plan (docs/models.md)"
        )
    mesh = DeviceMesh.from_group(group, device_type)
    degree = mesh.size()
    for index, layer in enumerate(module):
        styles = {path: _style(style, model) for path, style in dict(plan(layer)).items()}
        for path in styles:
            _check_divides(layer, path, degree, model=model, index=index)
        if styles:
            parallelize_module(layer, mesh, styles)
            _own_storage(layer)


def _own_storage(layer: nn.Module) -> None:
    """Give each split parameter a storage of its own: a shard cut along dim 0 is a view of the
    whole tensor, which would otherwise stay alive beside it (every worker builds the whole
    model, then keeps its part)."""
    from torch.distributed.tensor import DTensor

    for name, parameter in list(layer.named_parameters()):
        shard = local(parameter)
        if shard.untyped_storage().nbytes() <= shard.numel() * shard.element_size():
            continue
        owner, _, leaf = name.rpartition(".")
        whole = DTensor.from_local(
            shard.clone(), parameter.device_mesh, parameter.placements, run_check=False
        )
        setattr(layer.get_submodule(owner), leaf, nn.Parameter(whole, parameter.requires_grad))


def _style(style: object, model: str):
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    if isinstance(style, ParallelStyle):
        return style
    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel()
    raise LayoutError(
        f"model {model}'s tp_plan names style {style!r}; write 'colwise', 'rowwise' or a "
        "torch.distributed.tensor.parallel.ParallelStyle"
    )


def _check_divides(layer: nn.Module, path: str, degree: int, *, model: str, index: int) -> None:
    try:
        target = layer.get_submodule(path)
    except AttributeError:
        raise LayoutError(
            f"model {model}'s tp_plan names {path!r}, which layer {index} of the stage does not "
            "have"
        ) from None
    weight = getattr(target, "weight", None)
    if weight is not None and any(size % degree for size in weight.shape):
        raise LayoutError(
            f"model {model}: {path} of shape {tuple(weight.shape)} does not split {degree} ways; "
            f"plan a tensor-parallel degree that divides its heads and widths"
        )


def local(parameter: torch.Tensor) -> torch.Tensor:
    """The part of ``parameter`` this worker holds, as a plain tensor sharing its storage."""
    if not _is_dtensor(parameter):
        return parameter
    with torch.no_grad():  # a view without autograd history: a leaf the optimizer may step
        return parameter.to_local()


def shard_dim(tensor: torch.Tensor) -> int | None:
    """The dimension ``tensor`` is split on across the group, None if every worker holds it whole."""
    if not _is_dtensor(tensor):
        return None
    from torch.distributed.tensor import Shard

    dims = [p.dim for p in tensor.placements if isinstance(p, Shard)]
    return dims[0] if dims else None


def attach_grad(parameter: torch.Tensor, mine: torch.Tensor, view: torch.Tensor) -> None:
    """Make ``view`` (of the stage's flat gradient buffer) the gradient autograd accumulates
    into, for a DTensor parameter as for a plain one; ``mine``: ``local(parameter)``, the
    tensor the optimizer steps, which reads it as its ``.grad``."""
    if _is_dtensor(parameter):
        from torch.distributed.tensor import DTensor

        parameter.grad = DTensor.from_local(
            view, parameter.device_mesh, parameter.placements, run_check=False
        )
    mine.grad = view


def local_state(module: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """``module``'s state dict as plain local tensors, and the split dimension of each split one."""
    state, dims = {}, {}
    for key, value in module.state_dict().items():
        dim = shard_dim(value)
        if dim is not None:
            dims[key] = dim
        state[key] = value.to_local() if _is_dtensor(value) else value
    return state, dims


def load_local_state(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy local tensors (this worker's shards, or whole tensors) into ``module``'s state."""
    current = module.state_dict()
    missing = sorted(set(current) - set(state))
    unexpected = sorted(set(state) - set(current))
    if missing or unexpected:
        raise KeyError(f"state does not fit the stage: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for key, target in current.items():
            mine = target.to_local() if _is_dtensor(target) else target
            if mine.shape != state[key].shape:
                raise KeyError(
                    f"{key}: saved {tuple(state[key].shape)}, stage holds {tuple(mine.shape)}"
                )
            mine.copy_(state[key])


def join(shards: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The whole tensor from its shards, in tensor-parallel rank order."""
    return torch.cat(shards, dim=dim)


def cut(whole: torch.Tensor, dim: int, *, rank: int, degree: int) -> torch.Tensor:
    """Rank ``rank``'s shard of ``whole`` split ``degree`` ways on ``dim`` (as ``Shard`` splits)."""
    return whole.chunk(degree, dim=dim)[rank].contiguous()


def _is_dtensor(tensor: object) -> bool:
    # no DTensor exists before its module is loaded, and a stage without tensor parallelism never
    # loads it: importing it to ask would cost every worker ~0.5 CPU-s (it pulls in torch.fx's
    # symbolic shapes and sympy)
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)
