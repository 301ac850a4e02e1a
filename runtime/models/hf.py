"""Hugging Face causal language models through the model protocol (protocol.py), with no download.

``model: {hf: gpt2, config: {n_layer: 4, n_embd: 128, ...}}`` builds ``GPT2LMHeadModel`` from
``GPT2Config(**config)`` (transformers' own classes; the ``hf`` extra installs them), its weights
initialised by transformers' own scheme under ``seed``, or loaded with ``from_pretrained`` from
``weights``: a local folder or an ``s3://`` prefix holding ``config.json`` and the weight files
(copied to a temporary folder first). Nothing is fetched from the Hub.

The layers a pipeline may cut between: ``[embedding (token + position embeddings, dropout), block
x n_layer, head (final norm, LM head)]``, the head's weight tied to the token embedding as in the
model itself. A block is called as the model calls it (no cache, no attention mask: causal
attention within the sequence), and hands on its hidden states only. GPT-2's ``Conv1D``
projections become ``nn.Linear`` (the same numbers, transposed) and its fused ``c_attn`` three
linears ``q``, ``k``, ``v``, at every tensor-parallel degree, so checkpoints name the same
tensors whatever the degree; ``tp_plan`` splits them as Megatron-LM does.

Families: GPT-2 (``gpt2``). Another family needs its own split here (where its embeddings,
blocks and head live): say which, and we add it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

from runtime.models.protocol import ModelError, ModelParts, TokenInputs

FAMILIES = ("gpt2",)


class GPT2Embedding(nn.Module):
    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.wte(ids) + self.wpe(positions))


class HiddenStates(nn.Module):
    """A transformers block that returns its hidden states only (they return tuples)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attention = self.block.attn
        # the q|k|v split as this worker holds it (some heads only under tensor parallelism)
        attention.split_size = attention.c_attn.width()
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


class QKV(nn.Module):
    """GPT-2's fused ``c_attn`` as three linears, returning ``q|k|v`` concatenated as it did."""

    def __init__(self, fused: nn.Module, hidden: int) -> None:
        super().__init__()
        weight, bias = fused.weight.detach(), fused.bias.detach()  # Conv1D: (in, 3 * hidden)
        self.q, self.k, self.v = (
            _linear(weight[:, i * hidden : (i + 1) * hidden], bias[i * hidden : (i + 1) * hidden])
            for i in range(3)
        )

    def width(self) -> int:
        """Output features of q this worker holds (a shard's under tensor parallelism)."""
        from runtime.tensor_parallel import local

        return local(self.q.weight).shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    """An ``nn.Linear`` computing what a ``Conv1D`` of ``weight`` (in, out) and ``bias`` does."""
    linear = nn.Linear(weight.shape[0], weight.shape[1], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight.t())
        linear.bias.copy_(bias)
    return linear


def _as_linears(block: nn.Module, hidden: int) -> None:
    """Swap a GPT2Block's Conv1D projections for linears (see the module's docstring)."""
    attention, mlp = block.attn, block.mlp
    attention.c_attn = QKV(attention.c_attn, hidden)
    attention.c_proj = _linear(attention.c_proj.weight.detach(), attention.c_proj.bias.detach())
    mlp.c_fc = _linear(mlp.c_fc.weight.detach(), mlp.c_fc.bias.detach())
    mlp.c_proj = _linear(mlp.c_proj.weight.detach(), mlp.c_proj.bias.detach())


GPT2_TP_PLAN = {
    "block.attn.c_attn.q": "colwise",
    "block.attn.c_attn.k": "colwise",
    "block.attn.c_attn.v": "colwise",
    "block.attn.c_proj": "rowwise",
    "block.mlp.c_fc": "colwise",
    "block.mlp.c_proj": "rowwise",
}


def gpt2_tp_plan(layer: nn.Module) -> dict[str, str]:
    """Blocks split by heads and hidden units (Megatron-LM's plan); embeddings and head whole."""
    return dict(GPT2_TP_PLAN) if isinstance(layer, HiddenStates) else {}


class GPT2Head(nn.Module):
    def __init__(self, ln_f: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    )


def build_hf(family: str, config: dict, *, seed: int, weights: str | None = None) -> ModelParts:
    if family not in FAMILIES:
        raise ModelError(
            f"Hugging Face model family {family!r} has no layer split yet; supported: "
            f"{', '.join(FAMILIES)} (or wrap your model with model.module: see docs/models.md)"
        )
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise ModelError(
            "model.hf needs transformers: pip install 'geo-orchestrator[hf]'"
        ) from None
    if weights is not None:
        model = _pretrained(GPT2LMHeadModel, weights)
    else:
        try:
            hf_config = GPT2Config(**config)
        except (TypeError, ValueError) as error:
            raise ModelError(f"model.config for {family}: {error}") from None
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            model = GPT2LMHeadModel(hf_config)
        finally:
            torch.random.set_rng_state(state)
    model.train()
    body = model.transformer
    layers: list[nn.Module] = [GPT2Embedding(body.wte, body.wpe, body.drop)]
    for block in body.h:
        _as_linears(block, model.config.n_embd)
    layers += [HiddenStates(block) for block in body.h]
    layers.append(GPT2Head(body.ln_f, model.lm_head))
    tied = body.wte.weight if model.lm_head.weight is body.wte.weight else None
    return ModelParts(
        layers=layers,
        loss=next_token_loss,
        inputs=TokenInputs(seq_len=model.config.n_positions, vocab_size=model.config.vocab_size),
        tied=tied,
        tp_plan=gpt2_tp_plan,
    )


def _pretrained(model_class, weights: str):
    """``from_pretrained`` on a local folder, or on a copy of an ``s3://`` prefix."""
    if "://" not in weights:
        if not Path(weights).is_dir():
            raise ModelError(f"model.weights {weights!r} is not a folder on this node")
        return model_class.from_pretrained(weights, local_files_only=True)
    from runtime.storage import open_store

    store = open_store(weights)
    with tempfile.TemporaryDirectory(prefix="geo-hf-") as folder:
        for key in store.keys(""):
            if "/" not in key:  # the folder's own files (config.json, *.safetensors)
                (Path(folder) / key).write_bytes(store.get(key))
        return model_class.from_pretrained(folder, local_files_only=True)
