"""GPT-style decoders as a list of layers that a pipeline may split anywhere.

``build_layers(spec)`` returns ``[Embedding, Block x num_blocks, Head]`` (specs.py counts layers the
same way). Each layer maps one activation tensor to the next: token ids ``(batch, seq)`` into the
embedding, hidden states ``(batch, seq, hidden)`` between layers, logits ``(batch, seq, vocab)`` out
of the head, so a stage is ``nn.Sequential(*layers[start:end])``.

Blocks are pre-norm: ``x + attention(norm(x))`` then ``x + mlp(norm(x))``; attention is causal with
optional grouped-query heads (``num_kv_heads``); the MLP is GELU or SwiGLU (``gated_mlp``). With
``tied_embeddings`` the head projects with the embedding's weight: the very same Parameter when both
are built in one process. A pipeline that puts them on different stages holds two copies, which the
runtime keeps equal by summing their gradients (as Megatron-LM does for its first and last stage).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.specs import GptSpec

INIT_STD = 0.02  # GPT-2's initialisation


class Embedding(nn.Module):
    def __init__(self, spec: GptSpec) -> None:
        super().__init__()
        self.tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.positions = (
            nn.Embedding(spec.seq_len, spec.hidden_size) if spec.learned_positions else None
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return x


class Attention(nn.Module):
    def __init__(self, spec: GptSpec) -> None:
        super().__init__()
        self.heads, self.kv_heads = spec.num_heads, spec.num_kv_heads or spec.num_heads
        self.head_dim = spec.hidden_size // spec.num_heads
        kv_size = self.kv_heads * self.head_dim
        # q, k and v apart (not one fused matrix): tensor parallelism splits each by heads
        self.q = nn.Linear(spec.hidden_size, spec.hidden_size, bias=spec.bias)
        self.k = nn.Linear(spec.hidden_size, kv_size, bias=spec.bias)
        self.v = nn.Linear(spec.hidden_size, kv_size, bias=spec.bias)
        self.out = nn.Linear(spec.hidden_size, spec.hidden_size, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # head counts from the shapes: under tensor parallelism a worker holds some heads only
        batch, seq, _ = x.shape
        q = self.q(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each k/v head
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, -1))


class Mlp(nn.Module):
    def __init__(self, spec: GptSpec) -> None:
        super().__init__()
        # SwiGLU's gate apart from up (not one fused matrix), for tensor parallelism
        self.gate = (
            nn.Linear(spec.hidden_size, spec.ffn_hidden_size, bias=spec.bias)
            if spec.gated_mlp
            else None
        )
        self.up = nn.Linear(spec.hidden_size, spec.ffn_hidden_size, bias=spec.bias)
        self.down = nn.Linear(spec.ffn_hidden_size, spec.hidden_size, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, spec: GptSpec) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(spec.hidden_size), nn.LayerNorm(spec.hidden_size)
        self.attention, self.mlp = Attention(spec), Mlp(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    def __init__(self, spec: GptSpec, tied: nn.Parameter | None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(spec.hidden_size)
        if tied is not None:
            self.weight = tied
        else:
            self.weight = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
            nn.init.normal_(self.weight, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.weight)


def build_layers(spec: GptSpec, *, seed: int) -> list[nn.Module]:
    """The model's layers, initialised from ``seed`` (the same seed gives the same weights)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        embedding = Embedding(spec)
        blocks = [Block(spec) for _ in range(spec.num_blocks)]
        for module in [embedding, *blocks]:
            _init(module, spec)
        head = Head(spec, embedding.tokens.weight if spec.tied_embeddings else None)
    finally:
        torch.random.set_rng_state(generator_state)
    return [embedding, *blocks, head]


def _init(module: nn.Module, spec: GptSpec) -> None:
    """GPT-2's scheme: normal(0.02) weights, zero biases, output projections scaled by depth."""
    for name, parameter in module.named_parameters():
        if "norm" in name:
            continue
        if name.endswith("bias"):
            nn.init.zeros_(parameter)
        elif name.endswith(("out.weight", "down.weight")):
            nn.init.normal_(parameter, std=INIT_STD / math.sqrt(2 * spec.num_blocks))
        else:
            nn.init.normal_(parameter, std=INIT_STD)


# Megatron-LM's split of a block (as torchtitan's plans write it for torch's tensor parallelism):
# q, k, v and the MLP's inputs by output columns (heads, hidden units), the attention's and the
# MLP's outputs by input rows, so a block's two all-reduces are its only communication. Norms,
# embeddings and the head stay whole on every worker of the group.
BLOCK_TP_PLAN = {
    "attention.q": "colwise",
    "attention.k": "colwise",
    "attention.v": "colwise",
    "attention.out": "rowwise",
    "mlp.up": "colwise",
    "mlp.down": "rowwise",
}


def tp_plan(layer: nn.Module) -> dict[str, str]:
    """The tensor-parallel plan of one layer (models/protocol.py): blocks split, the rest whole."""
    if not isinstance(layer, Block):
        return {}
    plan = dict(BLOCK_TP_PLAN)
    if layer.mlp.gate is not None:
        plan["mlp.gate"] = "colwise"
    return plan


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``targets`` (the inputs shifted by one token)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
