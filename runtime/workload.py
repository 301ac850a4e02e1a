"""What a worker trains: a model's layers and loss (models/protocol.py) and the samples it reads.

Token models read the byte corpus (data/text.py) and predict the next byte; image models classify
synthetic images (data/images.py). Sample ``k`` of a run depends only on the seed and ``k`` for
both, so any stage of any replica can draw its own inputs or targets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from runtime.config import DataSource  # noqa: F401 - plain data, named here too
from runtime.models.protocol import (
    ImageInputs,
    ModelError,
    ModelParts,
    ModelSource,
    TokenInputs,
    build_model,
    builtin,
)


@dataclass
class Workload:
    layers: list[nn.Module]
    samples: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (first, count) -> (x, y)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # mean over the microbatch
    inputs: TokenInputs | ImageInputs
    tied: nn.Parameter | None = None  # a weight the first and last layer share, if any
    # the set's sample ids that samples (first, count) reads, where the source logs them
    sample_ids: Callable[[int, int], list[int]] | None = None
    # how tensor parallelism splits a layer (models/protocol.py), None: the model has no plan
    tp_plan: Callable[[nn.Module], Mapping[str, object]] | None = None

    def boundary(self, layer: int, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of the activation entering ``layer`` for one microbatch."""
        x = self.samples(0, microbatch_size)[0]
        with torch.no_grad():
            for module in self.layers[:layer]:
                x = module(x)
        return tuple(x.shape), x.dtype


def build_workload(
    model: ModelSource | str,
    *,
    seed: int,
    corpus_bytes: int = 2**20,
    data: DataSource | None = None,
) -> Workload:
    """The model (a source, or a built-in model's name) with the samples its inputs ask for."""
    source = builtin(model) if isinstance(model, str) else model
    parts = build_model(source, seed=seed)
    workload = Workload(
        layers=parts.layers,
        samples=_samples(parts, seed=seed, corpus_bytes=corpus_bytes, label=source.label),
        loss=parts.loss,
        inputs=parts.inputs,
        tied=parts.tied,
        tp_plan=parts.tp_plan,
    )
    if data is not None and data.kind == "tokens":
        _read_tokens(workload, data, seed=seed, label=source.label)
    elif data is not None and data.kind == "shards":
        _read_shards(workload, data, seed=seed)
    return workload


def _read_shards(workload: Workload, data: DataSource, *, seed: int) -> None:
    from runtime.data.epochs import ShardEpochs
    from runtime.data.shards import ShardReader
    from runtime.storage import open_store

    reader = ShardReader(open_store(data.url), "")
    order = ShardEpochs(reader.require_index("reading a set by epochs"), seed=seed)

    def ids(first: int, count: int) -> list[int]:
        return [order(k) for k in range(first, first + count)]

    workload.samples = lambda first, count: reader.samples_at(ids(first, count))
    if data.log_samples:
        workload.sample_ids = ids


def _read_tokens(workload: Workload, data: DataSource, *, seed: int, label: str) -> None:
    from runtime.data.tokens import TokenFiles
    from runtime.storage import open_store

    if not isinstance(workload.inputs, TokenInputs):
        raise ModelError(f"model {label} reads images; token files are for language models")
    files = TokenFiles(
        open_store(data.url), dtype=data.dtype, seq_len=workload.inputs.seq_len, seed=seed
    )
    workload.samples = files.samples
    if data.log_samples:
        workload.sample_ids = lambda first, count: [
            files.window(k) for k in range(first, first + count)
        ]


def _samples(parts: ModelParts, *, seed: int, corpus_bytes: int, label: str):
    inputs = parts.inputs
    if isinstance(inputs, TokenInputs):
        from runtime.data.text import ByteCorpus

        if inputs.vocab_size < 256:
            raise ModelError(
                f"model {label} has a vocabulary of {inputs.vocab_size}; the built-in text is "
                "bytes (256 token ids): give it a vocabulary of at least 256, or token data"
            )
        corpus = ByteCorpus.stdlib(max_bytes=corpus_bytes)

        def text(first: int, count: int):
            return corpus.samples(first, count, seq_len=inputs.seq_len, seed=seed)

        return text
    from runtime.data.images import SyntheticImages

    return SyntheticImages(inputs.num_classes, inputs.image_size, seed).samples
