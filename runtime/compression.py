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

    def all_reduce(self, flat: torch.Tensor, group, size: int, sample=lambda: None) -> int:
        """Sum ``flat`` over the leaders of ``group`` in place; return the bytes this leader sent
        (its payload, to each other leader). ``sample`` is called where memory peaks."""
        # in place where it can be: ``flat`` is overwritten with the sum anyway, so the extra memory
        # is the residual, one decompressed fp32 copy at a time and the gathered payloads
        if self.residual is not None:
            flat += self.residual
        payload = self._compress(flat)
        if self.residual is None:
            self.residual = torch.empty_like(flat)
        torch.sub(flat, self._decompress(payload, flat.numel()), out=self.residual)
        gathered = [[torch.empty_like(part) for _ in range(size)] for part in payload]
        for parts, part in zip(gathered, payload, strict=True):
            dist.all_gather(parts, part, group=group)
        flat.zero_()
        for member in range(size):
            part = self._decompress(tuple(parts[member] for parts in gathered), flat.numel())
            sample()  # the residual, every leader's payload and one decompressed copy
            flat += part
            del part
        return sum(p.numel() * p.element_size() for p in payload) * (size - 1)

    def _compress(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.kind == "fp16":
            return (x.to(torch.float16),)
        padded = torch.nn.functional.pad(x, (0, (-x.numel()) % BLOCK)).view(-1, BLOCK)
        scales = padded.abs().amax(dim=1).clamp_min(1e-30) / 127.0
        # ``pad`` returns a new tensor even with nothing to add: scaling it in place leaves x alone
        quantized = padded.div_(scales[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        return quantized.view(-1), scales

    def _decompress(self, payload: tuple[torch.Tensor, ...], numel: int) -> torch.Tensor:
        if self.kind == "fp16":
            return payload[0].to(torch.float32)
        quantized, scales = payload
        values = quantized.view(-1, BLOCK).to(torch.float32).mul_(scales[:, None])
        return values.view(-1)[:numel]

    def state_dict(self) -> dict:
        return {"kind": self.kind, "residual": self.residual}

    def load_state_dict(self, state: dict) -> None:
        self.residual = state["residual"]
