"""Built-in GPT layers: shapes match specs.py, a split anywhere computes the same function, the same
seed gives the same weights, and the tiny GPT learns from the byte corpus in seconds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from runtime.data.text import ByteCorpus  # noqa: E402
from runtime.models.gpt import build_layers, next_token_loss  # noqa: E402
from runtime.models.specs import GptSpec, model_spec  # noqa: E402
from runtime.reference import TrainConfig, reference_losses  # noqa: E402

TINY = model_spec("gpt-tiny")


def _count(layers) -> list[int]:
    seen, counts = set(), []
    for layer in layers:
        fresh = [p for p in layer.parameters() if id(p) not in seen]
        seen.update(id(p) for p in fresh)
        counts.append(sum(p.numel() for p in fresh))
    return counts


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt-mini"])
def test_parameter_counts_match_the_spec(name):
    spec = model_spec(name)
    assert _count(build_layers(spec, seed=0)) == list(spec.layer_parameters())


def test_grouped_query_and_gated_blocks_build_and_run():
    spec = GptSpec(
        name="gqa",
        description="",
        num_blocks=2,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=48,
        seq_len=16,
        vocab_size=64,
        gated_mlp=True,
        bias=False,
        tied_embeddings=False,
    )
    layers = build_layers(spec, seed=1)
    assert _count(layers) == list(spec.layer_parameters())
    ids = torch.randint(0, 64, (3, 16))
    assert nn.Sequential(*layers)(ids).shape == (3, 16, 64)


@pytest.mark.parametrize("cut", range(1, TINY.num_layers))
def test_any_split_computes_the_same_function(cut):
    layers = build_layers(TINY, seed=3)
    ids = torch.randint(0, 256, (2, TINY.seq_len), generator=torch.Generator().manual_seed(0))
    whole = nn.Sequential(*layers)(ids)
    first, second = nn.Sequential(*layers[:cut]), nn.Sequential(*layers[cut:])
    assert torch.equal(second(first(ids)), whole)


def test_same_seed_same_weights_and_the_global_generator_is_left_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = build_layers(TINY, seed=7), build_layers(TINY, seed=7)
    assert torch.rand(1).item() == before.item()
    for x, y in zip(nn.Sequential(*a).parameters(), nn.Sequential(*b).parameters(), strict=True):
        assert torch.equal(x, y)


def test_samples_depend_on_seed_and_index_only():
    corpus = ByteCorpus.stdlib(max_bytes=2**20)
    x1, y1 = corpus.samples(10, 4, seq_len=32, seed=5)
    x2, _ = corpus.samples(12, 1, seq_len=32, seed=5)
    assert torch.equal(x1[2], x2[0]) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(corpus.samples(10, 4, seq_len=32, seed=6)[0], x1)


def test_the_tiny_gpt_learns_bytes_in_seconds():
    corpus = ByteCorpus.stdlib(max_bytes=2**20)
    config = TrainConfig(steps=40, global_batch_size=16, microbatch_size=4, learning_rate=3e-3)
    losses = reference_losses(TINY, corpus, config)
    assert abs(losses[0] - torch.log(torch.tensor(256.0)).item()) < 0.3  # uniform guess at first
    assert sum(losses[-5:]) / 5 < 0.75 * losses[0]
    assert reference_losses(TINY, corpus, config)[:3] == losses[:3]  # deterministic


def test_loss_is_mean_cross_entropy():
    logits = torch.zeros(2, 3, 4)
    targets = torch.zeros(2, 3, dtype=torch.long)
    assert next_token_loss(logits, targets).item() == pytest.approx(
        torch.log(torch.tensor(4.0)).item()
    )
