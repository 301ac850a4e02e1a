"""Compression of the cross-region hop of the hierarchical all-reduce, with error feedback.

Only region leaders run it, on the region's summed gradient: fp16 sends 2 bytes per element; int8
sends 1 byte per element plus one fp32 scale per block of 1024 (``simulator/collectives.py`` counts
the same bytes). Leaders exchange their compressed gradients (all-gather), then each decompresses
and sums them in rank order, so every leader holds the same result. Error feedback: what
compression dropped from this leader's gradient is kept and added to the next step's, so nothing is
lost over steps, only delayed (as in 1-bit Adam and PowerSGD).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

BLOCK = 1024  # int8 elements per fp32 scale


class CrossRegionCompressor:
    def __init__(self, kind: str) -> None:
        assert kind in ("fp16", "int8"), kind
        self.kind = kind
        self.residual: torch.Tensor | None = None  # error feedback, fp32, this leader's

    def all_reduce(self, flat: torch.Tensor, group, size: int) -> int:
        """Sum ``flat`` over the leaders of ``group`` in place; return the bytes this leader sent
        (its payload, to each other leader)."""
        corrected = flat if self.residual is None else flat + self.residual
        payload = self._compress(corrected)
        self.residual = corrected - self._decompress(payload, flat.numel())
        gathered = [[torch.empty_like(part) for _ in range(size)] for part in payload]
        for parts, part in zip(gathered, payload, strict=True):
            dist.all_gather(parts, part, group=group)
        total = torch.zeros_like(flat)
        for member in range(size):
            total += self._decompress(tuple(parts[member] for parts in gathered), flat.numel())
        flat.copy_(total)
        return sum(p.numel() * p.element_size() for p in payload) * (size - 1)

    def _compress(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.kind == "fp16":
            return (x.to(torch.float16),)
        padded = torch.nn.functional.pad(x, (0, (-x.numel()) % BLOCK)).view(-1, BLOCK)
        scales = padded.abs().amax(dim=1).clamp_min(1e-30) / 127.0
        quantized = torch.round(padded / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return quantized.view(-1), scales

    def _decompress(self, payload: tuple[torch.Tensor, ...], numel: int) -> torch.Tensor:
        if self.kind == "fp16":
            return payload[0].to(torch.float32)
        quantized, scales = payload
        values = quantized.view(-1, BLOCK).to(torch.float32) * scales[:, None]
        return values.view(-1)[:numel]

    def state_dict(self) -> dict:
        return {"kind": self.kind, "residual": self.residual}

    def load_state_dict(self, state: dict) -> None:
        self.residual = state["residual"]
