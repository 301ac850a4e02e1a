"""Single-process training: the yardstick the distributed runtime must match step for step.

The same layers (models/gpt.py, same seed), the same samples (data/text.py: sample ``k`` of the run
depends on the seed and ``k`` only) and the same arithmetic order as a pipeline replica: each
microbatch's loss is scaled by ``microbatch_size / global_batch_size`` before its backward, so the
accumulated gradient is the global batch's mean.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.config import TrainConfig
from runtime.data.text import ByteCorpus
from runtime.models.gpt import build_layers, next_token_loss
from runtime.models.protocol import TokenInputs
from runtime.models.specs import GptSpec
from runtime.precision import autocast


def make_optimizer(parameters, config: TrainConfig) -> torch.optim.Optimizer:
    """torch's own optimizer class for ``config``: the yardstick for the stages' optimizer
    (runtime/optim.py), which must match it bit for bit."""
    settings = config.optimizer_settings()
    # foreach=False: the same per-parameter update order on every worker, whatever it holds
    common = {"lr": settings.lr, "weight_decay": settings.weight_decay, "foreach": False}
    if settings.kind == "sgd":
        return torch.optim.SGD(parameters, momentum=settings.momentum, **common)
    if settings.kind == "adam":
        return torch.optim.Adam(parameters, **common)
    return torch.optim.AdamW(parameters, **common)


def reference_losses(spec: GptSpec, corpus: ByteCorpus, config: TrainConfig) -> list[float]:
    """The loss of every step of a single-process run of a GPT on ``corpus``."""
    from runtime.workload import Workload

    def text(first: int, count: int):
        return corpus.samples(first, count, seq_len=spec.seq_len, seed=config.seed)

    layers = build_layers(spec, seed=config.seed)
    workload = Workload(
        layers=layers,
        samples=text,
        loss=next_token_loss,
        inputs=TokenInputs(seq_len=spec.seq_len, vocab_size=spec.vocab_size),
        tied=layers[0].tokens.weight if spec.tied_embeddings else None,
    )
    return workload_losses(workload, config)


def workload_losses(workload, config: TrainConfig, *, skipped: list | None = None) -> list[float]:
    """The loss of every step of a single-process run (mean over the global batch), with torch's
    own mixed precision (autocast, GradScaler) and ``clip_grad_norm_``; ``skipped`` collects the
    steps GradScaler skipped (fp16-mixed)."""
    model = nn.Sequential(*workload.layers)
    optimizer = make_optimizer(model.parameters(), config)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=config.initial_loss_scale, enabled=config.precision == "fp16-mixed"
    )
    scale = config.microbatch_size / config.global_batch_size
    losses = []
    for step in range(config.steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for first in range(0, config.global_batch_size, config.microbatch_size):
            inputs, targets = workload.samples(
                step * config.global_batch_size + first, config.microbatch_size
            )
            with autocast(config.precision, None):
                loss = workload.loss(model(inputs), targets) * scale
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(optimizer)
        if config.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
        before = scaler.get_scale() if scaler.is_enabled() else None
        scaler.step(optimizer)
        scaler.update()
        if skipped is not None and before is not None and scaler.get_scale() < before:
            skipped.append(step)
        losses.append(total)
    return losses
