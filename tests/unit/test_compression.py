"""The cross-region compressor's codecs and error feedback (no process group needed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime.compression import BLOCK, CrossRegionCompressor  # noqa: E402


@pytest.mark.parametrize(("kind", "tolerance"), [("fp16", 1e-3), ("int8", 1e-2)])
def test_round_trip_error_is_small_and_payload_has_the_simulated_size(kind, tolerance):
    codec = CrossRegionCompressor(kind)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(0))
    payload = codec._compress(x)
    back = codec._decompress(payload, x.numel())
    assert (back - x).abs().max().item() <= tolerance * x.abs().max().item()
    sent = sum(p.numel() * p.element_size() for p in payload)
    blocks = -(-x.numel() // BLOCK)
    assert sent == (2 * x.numel() if kind == "fp16" else blocks * BLOCK + 4 * blocks)


def test_error_feedback_carries_what_compression_dropped():
    codec = CrossRegionCompressor("int8")
    generator = torch.Generator().manual_seed(1)
    sent_total, true_total = torch.zeros(2048), torch.zeros(2048)
    for _ in range(20):
        x = torch.randn(2048, generator=generator)
        corrected = x if codec.residual is None else x + codec.residual
        payload = codec._compress(corrected)
        codec.residual = corrected - codec._decompress(payload, x.numel())
        sent_total += codec._decompress(payload, x.numel())
        true_total += x
    # what was sent over 20 steps differs from the truth only by the last residual
    assert torch.allclose(sent_total + codec.residual, true_total, atol=1e-4)
