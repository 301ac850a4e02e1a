"""The model protocol: how any PyTorch model reaches the runtime, built-in ones included.

A model is a function ``build(*, seed, **args) -> ModelParts``: its layers in order (a pipeline
may cut between any two), its loss, and what its first layer reads. ``seed`` must decide the
initial weights: every worker builds the whole model with the same seed and keeps its stage's
layers, so all replicas start equal with no broadcast. docs/models.md has a worked example.

- ``layers``: ``nn.Module`` objects, each mapping one tensor to the next (the first takes the
  samples' inputs, the last's output goes to ``loss``). A layer that returns a tuple (as Hugging
  Face blocks do) must be wrapped to return its hidden states only.
- ``loss(output, targets)``: the mean loss of a microbatch, a scalar tensor.
- ``inputs``: ``TokenInputs(seq_len, vocab_size)`` (token ids in, next-token targets) or
  ``ImageInputs(image_size, num_classes)``; the job's data source is checked against it.
- ``tied``: a parameter the first and the last layer share (tied input and output embeddings),
  or None. Pipelines that put them on different stages keep the two copies equal.
- ``tp_plan(layer) -> {submodule: style}``: how tensor parallelism splits a layer, or None when
  the model has no plan (the planner then plans no tensor parallelism for it). A style is
  ``"colwise"`` or ``"rowwise"`` (torch's ``ColwiseParallel`` / ``RowwiseParallel``; those need
  ``nn.Linear`` or ``nn.Embedding`` submodules) or a ``ParallelStyle`` of
  ``torch.distributed.tensor.parallel``; a layer left whole gets ``{}``. A layer's forward must
  read head counts from its tensors' shapes (``view(batch, seq, -1, head_dim)``): a worker of a
  tensor-parallel group holds some of the heads only.

A recipe names a model three ways (``ModelSource``): a built-in one (``name``), the user's
function (``module: "my_pkg.model:build"`` with ``args``), or a Hugging Face causal LM built from
its config class (``hf: gpt2`` with ``config``; models/hf.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

# the model to build is plain data (config.py: the driver names it without importing torch)
from runtime.config import ModelSource, builtin  # noqa: F401


@dataclass(frozen=True, kw_only=True)
class TokenInputs:
    """Token ids ``(batch, seq_len)`` in, each below ``vocab_size``; targets the same shape."""

    seq_len: int
    vocab_size: int


@dataclass(frozen=True, kw_only=True)
class ImageInputs:
    """Images ``(batch, 3, image_size, image_size)`` in, class ids ``(batch,)`` as targets."""

    image_size: int
    num_classes: int


@dataclass(kw_only=True)
class ModelParts:
    """What a model's build function returns (see the module's docstring)."""

    layers: list[nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    inputs: TokenInputs | ImageInputs
    tied: nn.Parameter | None = None
    tp_plan: Callable[[nn.Module], Mapping[str, object]] | None = None

    def __post_init__(self) -> None:
        self.layers = list(self.layers)


class ModelError(ValueError):
    """A model source that cannot be built: names it and what to do."""


def build_model(source: ModelSource, *, seed: int) -> ModelParts:
    """The model's parts, its weights initialised from ``seed`` (or loaded from ``weights``)."""
    if source.kind == "builtin":
        from runtime.models.builtin import build_builtin

        return build_builtin(source.target, seed=seed)
    if source.kind == "hf":
        from runtime.models.hf import build_hf

        return build_hf(source.target, dict(source.args), seed=seed, weights=source.weights)
    build = _imported(source.target)
    with torch.random.fork_rng(devices=[]):  # a build that seeds torch leaves ours as it was
        try:
            parts = build(seed=seed, **dict(source.args))
        except TypeError as error:  # most often: arguments the function does not take
            raise ModelError(
                f"model {source.target}(seed=..., {', '.join(source.args)}): {error}; the "
                "function takes seed and model.args as keyword arguments"
            ) from error
    check_parts(parts, what=source.target)
    return parts


def _imported(target: str) -> Callable[..., ModelParts]:
    module_name, _, function = target.partition(":")
    if not module_name or not function:
        raise ModelError(
            f"model module {target!r} is not 'package.module:function'; write e.g. "
            "'my_models.gpt:build'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ModelError(
            f"model module {module_name!r} cannot be imported ({error}); ship its code with "
            "the job (it must be importable from the recipe's folder) or install it on the nodes"
        ) from None
    build = getattr(module, function, None)
    if not callable(build):
        raise ModelError(f"{module_name} has no function {function!r} (model {target!r})")
    return build


def owned_parameters(layers: Sequence[nn.Module]) -> list[list[nn.Parameter]]:
    """Each layer's parameters, a shared one (the tied weight) in the first layer holding it."""
    seen: set[int] = set()
    owned = []
    for layer in layers:
        mine = [p for p in layer.parameters() if id(p) not in seen]
        seen.update(id(p) for p in mine)
        owned.append(mine)
    return owned


def check_parts(parts: object, *, what: str) -> None:
    """Refuse what the runtime cannot train, naming the model and the part."""
    if not isinstance(parts, ModelParts):
        raise ModelError(
            f"model {what} returned {type(parts).__name__}; return runtime.models.protocol."
            "ModelParts(layers=..., loss=..., inputs=...)"
        )
    if not parts.layers or not all(isinstance(m, nn.Module) for m in parts.layers):
        raise ModelError(f"model {what}: layers must be a non-empty list of torch.nn.Module")
    if not callable(parts.loss):
        raise ModelError(f"model {what}: loss must be a function (output, targets) -> tensor")
    if not isinstance(parts.inputs, TokenInputs | ImageInputs):
        raise ModelError(f"model {what}: inputs must be TokenInputs(...) or ImageInputs(...)")
    if parts.tp_plan is not None and not callable(parts.tp_plan):
        raise ModelError(f"model {what}: tp_plan must be a function (layer) -> dict, or None")
    if parts.tied is not None:
        first = {id(p) for p in parts.layers[0].parameters()}
        last = {id(p) for p in parts.layers[-1].parameters()}
        if id(parts.tied) not in first or id(parts.tied) not in last:
            raise ModelError(
                f"model {what}: tied must be a parameter of both the first and the last layer"
            )
