"""What a worker trains: a built-in model's layers, its samples and its loss, by model family.

GPT decoders read the byte corpus (data/text.py) and predict the next byte; CNNs classify synthetic
images (data/images.py). Sample ``k`` of a run depends only on the seed and ``k`` for both, so any
stage of any replica can draw its own inputs or targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from runtime.models.specs import CnnSpec, GptSpec, model_spec


@dataclass
class Workload:
    spec: GptSpec | CnnSpec
    layers: list[nn.Module]
    samples: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (first, count) -> (x, y)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # mean over the microbatch

    @property
    def tied(self) -> nn.Parameter | None:
        """A weight the first and last layer share (tied GPT embeddings), if any."""
        if isinstance(self.spec, GptSpec) and self.spec.tied_embeddings:
            return self.layers[0].tokens.weight
        return None

    def boundary(self, layer: int, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of the activation entering ``layer`` for one microbatch."""
        x = self.samples(0, microbatch_size)[0]
        with torch.no_grad():
            for module in self.layers[:layer]:
                x = module(x)
        return tuple(x.shape), x.dtype


def build_workload(model: str, *, seed: int, corpus_bytes: int = 2**20) -> Workload:
    spec = model_spec(model)
    if isinstance(spec, GptSpec):
        from runtime.data.text import ByteCorpus
        from runtime.models.gpt import build_layers, next_token_loss

        corpus = ByteCorpus.stdlib(max_bytes=corpus_bytes)

        def text(first: int, count: int):
            return corpus.samples(first, count, seq_len=spec.seq_len, seed=seed)

        return Workload(spec, build_layers(spec, seed=seed), text, next_token_loss)
    from runtime.data.images import SyntheticImages
    from runtime.models.cnn import build_layers as build_cnn
    from runtime.models.cnn import classification_loss

    images = SyntheticImages(spec.num_classes, spec.image_size, seed)
    return Workload(spec, build_cnn(spec, seed=seed), images.samples, classification_loss)
