"""Residual CNNs of ConvNeXt-style blocks as a list of layers that a pipeline may split anywhere.

``build_layers(spec)`` returns ``[Stem, Block x num_blocks, Head]`` (specs.py's ``CnnSpec`` counts
layers the same way and its ``layer_parameters()`` matches these modules exactly). Each layer maps
one tensor to the next: images ``(batch, 3, H, W)`` into the stem, feature maps
``(batch, channels, h, w)`` between layers, logits ``(batch, classes)`` out of the head, so a stage
is ``nn.Sequential(*layers[start:end])``.

- Stem: a 4x4 convolution with stride 4 ("patchify"), then a LayerNorm over channels.
- Block: ``x + gamma * pw2(gelu(pw1(norm(dw7x7(x)))))``, a depthwise 7x7 convolution followed by a
  pointwise MLP (``mlp_ratio`` times wider) and a learned per-channel layer scale ``gamma``. The first
  block of every stage after the first carries the stage's downsampling (LayerNorm + 2x2 convolution
  with stride 2) in front, so that downsampling needs no layer of its own and any split stays valid.
- Head: global average pooling, LayerNorm, linear classifier.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.specs import CnnSpec

INIT_STD = 0.02  # ConvNeXt's truncated-normal initialisation of convolutions and linears
# ConvNeXt starts the residual branches almost shut so that deep stacks (36 blocks in the large
# model) begin close to identity and stay stable; the branch opens as gamma learns.
LAYER_SCALE_INIT = 1e-6
STEM_STRIDE = 4
DOWNSAMPLE_STRIDE = 2


class ChannelNorm(nn.Module):
    """LayerNorm over the channel axis of ``(batch, channels, h, w)`` feature maps."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Stem(nn.Module):
    def __init__(self, spec: CnnSpec) -> None:
        super().__init__()
        width = spec.widths[0]
        self.conv = nn.Conv2d(3, width, kernel_size=STEM_STRIDE, stride=STEM_STRIDE)
        self.norm = ChannelNorm(width)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(images))


class Downsample(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm = ChannelNorm(in_channels)
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size=DOWNSAMPLE_STRIDE, stride=DOWNSAMPLE_STRIDE
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.norm(x))


class Block(nn.Module):
    def __init__(self, width: int, mlp_ratio: int, downsample_from: int | None) -> None:
        super().__init__()
        self.downsample = (
            Downsample(downsample_from, width) if downsample_from is not None else None
        )
        self.depthwise = nn.Conv2d(width, width, kernel_size=7, padding=3, groups=width)
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, mlp_ratio * width)
        self.down = nn.Linear(mlp_ratio * width, width)
        self.gamma = nn.Parameter(torch.full((width,), LAYER_SCALE_INIT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        # the pointwise MLP runs channels-last so that nn.Linear acts on channels
        y = self.depthwise(x).permute(0, 2, 3, 1)
        y = self.down(F.gelu(self.up(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class Head(nn.Module):
    def __init__(self, spec: CnnSpec) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(spec.widths[-1])
        self.linear = nn.Linear(spec.widths[-1], spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x.mean(dim=(2, 3))))


def build_layers(spec: CnnSpec, *, seed: int) -> list[nn.Module]:
    """The model's layers, initialised from ``seed`` (the same seed gives the same weights); the
    global random generator is left as it was."""
    _check_image_size(spec)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[nn.Module] = [Stem(spec)]
        for stage, (depth, width) in enumerate(zip(spec.depths, spec.widths, strict=True)):
            for index in range(depth):
                entering = stage > 0 and index == 0
                previous = spec.widths[stage - 1] if entering else None
                layers.append(Block(width, spec.mlp_ratio, previous))
        layers.append(Head(spec))
        for layer in layers:
            _init(layer)
    finally:
        torch.random.set_rng_state(generator_state)
    return layers


def _check_image_size(spec: CnnSpec) -> None:
    if len(spec.depths) != len(spec.widths) or min(spec.depths, default=0) < 1:
        raise ValueError(
            f"model {spec.name!r}: depths {spec.depths} and widths {spec.widths} must have one "
            "entry per stage and at least one block per stage"
        )
    reduction = STEM_STRIDE * DOWNSAMPLE_STRIDE ** (len(spec.depths) - 1)
    if spec.image_size % reduction:
        raise ValueError(
            f"model {spec.name!r}: image_size {spec.image_size} must be a multiple of {reduction} "
            f"(the stem divides by {STEM_STRIDE}, each later stage by {DOWNSAMPLE_STRIDE}); "
            f"use e.g. {max(reduction, spec.image_size // reduction * reduction)}"
        )


def _init(module: nn.Module) -> None:
    """ConvNeXt's scheme: truncated normal(0.02) for convolution and linear weights, zero biases;
    norms keep (1, 0) and layer scales keep their constructor value."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.trunc_normal_(layer.weight, std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
            nn.init.zeros_(layer.bias)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits (batch, classes)`` against integer ``labels (batch,)``."""
    return F.cross_entropy(logits, labels)
