"""Synthetic labelled images that need no download and that a small CNN learns in a few steps.

Each class has a fixed pattern: a smooth random image (a coarse grid of random colours, upsampled),
drawn from the seed alone. Sample ``k`` draws its label and a Gaussian noise image from a generator
seeded by ``(seed, k)`` and returns ``pattern[label] + noise``. So, as in data/text.py, sample ``k``
of the run is a function of the seed and ``k`` alone: a replica asks for its share of step ``s``
without producing the others', and a resumed run continues from its sample counter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PATTERN_GRID = 4  # each class pattern is a 4x4 grid of colours, smoothly upsampled
DEFAULT_NOISE_STD = 1.0  # as loud as the patterns per pixel; a CNN still separates classes quickly


class SyntheticImages:
    def __init__(
        self,
        num_classes: int,
        image_size: int,
        seed: int,
        *,
        noise_std: float = DEFAULT_NOISE_STD,
    ) -> None:
        if num_classes < 2 or image_size < 1:
            raise ValueError(
                f"synthetic images need at least 2 classes and 1 pixel, got num_classes="
                f"{num_classes}, image_size={image_size}"
            )
        self.num_classes, self.image_size, self.seed = num_classes, image_size, seed
        self.noise_std = noise_std
        self.patterns = self._patterns()

    def _patterns(self) -> torch.Tensor:
        """One ``(3, H, W)`` pattern per class, drawn from the seed only."""
        # -1 - seed wraps to 2**64 - 1 - seed: far above every sample stream (seed * 1_000_003 + k)
        generator = torch.Generator().manual_seed(-1 - self.seed)
        grid = torch.randn(self.num_classes, 3, PATTERN_GRID, PATTERN_GRID, generator=generator)
        size = (self.image_size, self.image_size)
        return F.interpolate(grid, size=size, mode="bilinear", align_corners=False)

    def samples(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``first .. first + count - 1``: images ``(count, 3, H, W)`` float32 and labels
        ``(count,)`` int64."""
        labels, noises = [], []
        for k in range(first, first + count):
            label, noise = self._draw(k)
            labels.append(label)
            noises.append(noise)
        labels_tensor = torch.stack(labels)
        return self.patterns[labels_tensor] + torch.stack(noises), labels_tensor

    def _draw(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # the same derivation as data/text.py
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + k)
        label = torch.randint(0, self.num_classes, (), generator=generator)
        shape = (3, self.image_size, self.image_size)
        return label, torch.randn(shape, generator=generator) * self.noise_std
