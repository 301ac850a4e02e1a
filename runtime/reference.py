"""Single-process training: the yardstick the distributed runtime must match step for step.

The same layers (models/gpt.py, same seed), the same samples (data/text.py: sample ``k`` of the run
depends on the seed and ``k`` only) and the same arithmetic order as a pipeline replica: each
microbatch's loss is scaled by ``microbatch_size / global_batch_size`` before its backward, so the
accumulated gradient is the global batch's mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.data.text import ByteCorpus
from runtime.models.gpt import build_layers, next_token_loss
from runtime.models.specs import GptSpec


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int
    global_batch_size: int
    microbatch_size: int
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        assert self.global_batch_size % self.microbatch_size == 0, "microbatches divide the batch"


def make_optimizer(parameters, config: TrainConfig) -> torch.optim.Optimizer:
    # foreach=False: the same per-parameter update order on every worker, whatever it holds
    return torch.optim.AdamW(
        parameters, lr=config.learning_rate, weight_decay=config.weight_decay, foreach=False
    )


def reference_losses(spec: GptSpec, corpus: ByteCorpus, config: TrainConfig) -> list[float]:
    """The loss of every step of a single-process run of a GPT on ``corpus``."""
    from runtime.workload import Workload

    def text(first: int, count: int):
        return corpus.samples(first, count, seq_len=spec.seq_len, seed=config.seed)

    layers = build_layers(spec, seed=config.seed)
    return workload_losses(Workload(spec, layers, text, next_token_loss), config)


def workload_losses(workload, config: TrainConfig) -> list[float]:
    """The loss of every step of a single-process run (mean over the global batch)."""
    model = nn.Sequential(*workload.layers)
    optimizer = make_optimizer(model.parameters(), config)
    scale = config.microbatch_size / config.global_batch_size
    losses = []
    for step in range(config.steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for first in range(0, config.global_batch_size, config.microbatch_size):
            inputs, targets = workload.samples(
                step * config.global_batch_size + first, config.microbatch_size
            )
            loss = workload.loss(model(inputs), targets) * scale
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return losses
