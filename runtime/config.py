"""What a run trains with, as plain data: the training settings a stage and the single-process
reference share (``TrainConfig``), an optimizer's hyperparameters (``OptimizerSettings``), the
model to build (``ModelSource``; models/protocol.py builds it) and what it reads (``DataSource``;
workload.py reads it).

No torch here: the driver builds these to start its workers and never trains itself, so it need
not import torch (~1 s of CPU in every driver process, a restarted one's too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")  # runtime/precision.py says what each does
KINDS = ("adamw", "adam", "sgd")


@dataclass(frozen=True)
class OptimizerSettings:
    """One optimizer's hyperparameters (torch's defaults where the recipe has no field)."""

    kind: str  # adamw, adam or sgd
    lr: float
    weight_decay: float
    momentum: float = 0.0  # sgd's
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        # torch's classes check these when built, with these words; ``not 0 <= x`` refuses NaN
        checks = [
            ("learning rate", self.lr),
            ("weight_decay value", self.weight_decay),
            ("momentum value", self.momentum),
            ("epsilon value", self.eps),
        ]
        for what, value in checks:
            if not 0.0 <= value:
                raise ValueError(f"Invalid {what}: {value}")
        for index, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {index}: {beta}")

    def group(self) -> dict:
        """The hyperparameters as torch's classes record them in ``param_groups``."""
        common = {"lr": self.lr, "weight_decay": self.weight_decay, "maximize": False}
        flags = {"foreach": False, "differentiable": False, "fused": None}
        if self.kind == "sgd":
            return {**common, "momentum": self.momentum, "dampening": 0, "nesterov": False, **flags}
        return {
            **common,
            "betas": self.betas,
            "eps": self.eps,
            "amsgrad": False,
            "capturable": False,
            "decoupled_weight_decay": self.kind == "adamw",
            **flags,
        }


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int
    global_batch_size: int
    microbatch_size: int
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    optimizer: str = "adamw"  # adamw, adam or sgd
    momentum: float = 0.0  # sgd's
    grad_clip_norm: float | None = None  # the global gradient norm's bound (precision.py)
    precision: str = "fp32"  # fp32, bf16-mixed or fp16-mixed (precision.py)
    initial_loss_scale: float = 2.0**16  # fp16-mixed's first loss scale (GradScaler's default)

    def __post_init__(self) -> None:
        assert self.global_batch_size % self.microbatch_size == 0, "microbatches divide the batch"
        assert self.optimizer in KINDS, self.optimizer
        assert self.precision in PRECISIONS, self.precision

    def optimizer_settings(self) -> OptimizerSettings:
        return OptimizerSettings(
            kind=self.optimizer,
            lr=self.learning_rate,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
        )


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """Which model to build: ``kind`` is ``builtin`` (``target`` a built-in name), ``module``
    (``target`` ``"package.module:function"``) or ``hf`` (``target`` a model type such as
    ``gpt2``); ``args`` go to the function (the HF config's fields for ``hf``); ``weights``: a
    local folder or ``s3://`` prefix with the HF weights, else weights from ``seed``."""

    kind: str
    target: str
    args: Mapping = field(default_factory=dict)
    weights: str | None = None

    def __post_init__(self) -> None:
        assert self.kind in ("builtin", "module", "hf"), self.kind
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))

    @property
    def label(self) -> str:
        return self.target if self.kind == "builtin" else f"{self.kind}:{self.target}"

    def __reduce__(self):  # a MappingProxyType does not pickle: Ray ships sources to workers
        return (_source, (self.kind, self.target, dict(self.args), self.weights))


def _source(kind, target, args, weights) -> ModelSource:
    return ModelSource(kind=kind, target=target, args=args, weights=weights)


def builtin(name: str) -> ModelSource:
    return ModelSource(kind="builtin", target=name)


@dataclass(frozen=True, kw_only=True)
class DataSource:
    """What the model reads: ``builtin`` (the byte corpus, or synthetic images), ``tokens``
    (token files at ``url``, data/tokens.py) or ``shards`` (WebDataset-style tar shards at
    ``url``, data/shards.py: each epoch visits the shards, and each shard's samples, in an
    order of its own: data/epochs.py); ``log_samples``: report the sample ids each step read."""

    kind: str = "builtin"
    url: str | None = None
    dtype: str = "uint16"
    log_samples: bool = False

    def __post_init__(self) -> None:
        assert self.kind in ("builtin", "tokens", "shards"), self.kind
        assert self.kind == "builtin" or self.url, "token files need a url"
