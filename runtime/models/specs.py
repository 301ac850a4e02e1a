"""Shapes of the built-in models, as data (no torch import here).

Each model is a sequence of layers that a pipeline may split anywhere: for GPT-style decoders the
layers are ``[embedding, block_0 .. block_{n-1}, head]`` (SAILOR counts them the same way: OPT-350M
has 26); for the CNN they are ``[stem, block_0 .. block_{n-1}, head]``. The orchestrator reads these
shapes to validate recipes and to estimate profiles analytically; the runtime builds the modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, kw_only=True)
class GptSpec:
    """A decoder-only transformer (GPT/OPT/LLaMA style) trained on next-token prediction."""

    name: str
    description: str
    num_blocks: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int | None = None  # grouped-query attention (LLaMA-3); None = num_heads
    ffn_hidden_size: int
    seq_len: int
    vocab_size: int
    gated_mlp: bool = False  # SwiGLU (three projections) instead of two
    bias: bool = True
    learned_positions: bool = True
    tied_embeddings: bool = True
    sailor_name: str | None = None  # the model's name in SAILOR's published profiles
    family: str = "gpt"

    @property
    def num_layers(self) -> int:
        """Pipeline-splittable layers: embedding, the blocks, the head."""
        return self.num_blocks + 2

    def block_parameters(self) -> int:
        h, kv = self.hidden_size, (self.num_kv_heads or self.num_heads)
        head_dim = h // self.num_heads
        attention = 2 * h * h + 2 * h * kv * head_dim
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_hidden_size
        biases = (3 * h + 2 * kv * head_dim + self.ffn_hidden_size) if self.bias else 0
        norms = 2 * 2 * h
        return attention + mlp + biases + norms

    def embedding_parameters(self) -> int:
        positions = self.seq_len * self.hidden_size if self.learned_positions else 0
        return self.vocab_size * self.hidden_size + positions

    def head_parameters(self) -> int:
        final_norm = 2 * self.hidden_size
        return final_norm + (0 if self.tied_embeddings else self.vocab_size * self.hidden_size)

    def tied_parameters(self) -> int:
        """Parameters the first and last layer share: the token embedding when the head is tied."""
        return self.vocab_size * self.hidden_size if self.tied_embeddings else 0

    def layer_parameters(self) -> tuple[int, ...]:
        blocks = (self.block_parameters(),) * self.num_blocks
        return (self.embedding_parameters(), *blocks, self.head_parameters())

    def parameter_count(self) -> int:
        return sum(self.layer_parameters())


@dataclass(frozen=True, kw_only=True)
class CnnSpec:
    """A residual CNN of ConvNeXt-style blocks (depthwise 7x7 + pointwise MLP) for image classes."""

    name: str
    description: str
    depths: tuple[int, ...]  # blocks per stage
    widths: tuple[int, ...]  # channels per stage
    image_size: int
    num_classes: int
    mlp_ratio: int = 4
    family: str = "cnn"

    @property
    def num_blocks(self) -> int:
        return sum(self.depths)

    @property
    def num_layers(self) -> int:
        """Pipeline-splittable layers: stem, the blocks, the head."""
        return self.num_blocks + 2

    def _block_parameters(self, width: int) -> int:
        depthwise = 7 * 7 * width + width
        pointwise = 2 * self.mlp_ratio * width * width + self.mlp_ratio * width + width
        return depthwise + pointwise + 2 * width + width  # + norm + layer scale

    def layer_parameters(self) -> tuple[int, ...]:
        stem = 3 * self.widths[0] * 4 * 4 + self.widths[0] + 2 * self.widths[0]
        layers = [stem]
        for stage, (depth, width) in enumerate(zip(self.depths, self.widths, strict=True)):
            for block in range(depth):
                params = self._block_parameters(width)
                if stage > 0 and block == 0:  # the downsampling layer enters the stage
                    previous = self.widths[stage - 1]
                    params += 2 * previous + previous * width * 2 * 2 + width
                layers.append(params)
        head = 2 * self.widths[-1] + self.widths[-1] * self.num_classes + self.num_classes
        layers.append(head)
        return tuple(layers)

    def parameter_count(self) -> int:
        return sum(self.layer_parameters())


@dataclass(frozen=True, kw_only=True)
class CustomSpec:
    """A user's model (models/protocol.py) as built once: its layers' parameters, read off the
    modules (a shared weight counted in the first layer holding it), and what it reads. No
    formula gives its FLOPs: its times are measured (``profile: auto``)."""

    name: str
    description: str
    params: tuple[int, ...]  # per layer
    seq_len: int  # tokens per sample (1 for images)
    inputs: str  # "tokens" or "images"
    tied: int = 0  # parameters the first and last layer share
    family: str = "custom"

    @property
    def num_layers(self) -> int:
        return len(self.params)

    def layer_parameters(self) -> tuple[int, ...]:
        return self.params

    def parameter_count(self) -> int:
        return sum(self.params)

    def tied_parameters(self) -> int:
        return self.tied


ModelSpec = GptSpec | CnnSpec | CustomSpec

_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        GptSpec(
            name="gpt-tiny",
            description="byte-level GPT that trains on 2 CPU cores in seconds",
            num_blocks=4,
            hidden_size=64,
            num_heads=4,
            ffn_hidden_size=256,
            seq_len=64,
            vocab_size=256,
        ),
        GptSpec(
            name="gpt-mini",
            description="byte-level GPT, a few minutes per 100 steps on CPU",
            num_blocks=6,
            hidden_size=256,
            num_heads=8,
            ffn_hidden_size=1024,
            seq_len=128,
            vocab_size=256,
        ),
        GptSpec(
            name="gpt2-small",
            description="GPT-2 small shape (124M)",
            num_blocks=12,
            hidden_size=768,
            num_heads=12,
            ffn_hidden_size=3072,
            seq_len=1024,
            vocab_size=50257,
        ),
        GptSpec(
            name="opt-350m",
            description="OPT-350M shape as SAILOR trained it (seq 2048)",
            num_blocks=24,
            hidden_size=1024,
            num_heads=16,
            ffn_hidden_size=4096,
            seq_len=2048,
            vocab_size=50272,
            sailor_name="OPT-350",
        ),
        GptSpec(
            name="gpt-neo-2.7b",
            description="GPT-Neo-2.7B shape (seq 2048)",
            num_blocks=32,
            hidden_size=2560,
            num_heads=20,
            ffn_hidden_size=10240,
            seq_len=2048,
            vocab_size=50257,
            sailor_name="GPT-Neo-2.7",
        ),
        GptSpec(
            name="llama-3-8b",
            description="LLaMA-3-8B shape (GQA, SwiGLU, untied head; seq 8192, as SAILOR profiled it)",
            num_blocks=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            ffn_hidden_size=14336,
            seq_len=8192,
            vocab_size=128256,
            gated_mlp=True,
            bias=False,
            learned_positions=False,
            tied_embeddings=False,
            sailor_name="LLAMA-3-8",
        ),
        GptSpec(
            name="opt-30b",
            description="OPT-30B shape (seq 2048)",
            num_blocks=48,
            hidden_size=7168,
            num_heads=56,
            ffn_hidden_size=28672,
            seq_len=2048,
            vocab_size=50272,
            sailor_name="OPT-30",
        ),
        GptSpec(
            name="roberta-xlm-sized",
            description="XLM-RoBERTa-large-sized transformer (560M), as in Erben et al.",
            num_blocks=24,
            hidden_size=1024,
            num_heads=16,
            ffn_hidden_size=4096,
            seq_len=512,
            vocab_size=250002,
        ),
        CnnSpec(
            name="cnn-tiny",
            description="small residual CNN for CPU tests (32x32 synthetic images)",
            depths=(1, 1, 2, 1),
            widths=(16, 32, 64, 128),
            image_size=32,
            num_classes=10,
        ),
        CnnSpec(
            name="convnext-large-sized",
            description="ConvNeXt-Large-sized CNN (198M), as in Erben et al.",
            depths=(3, 3, 27, 3),
            widths=(192, 384, 768, 1536),
            image_size=224,
            num_classes=1000,
        ),
    )
}

BUILTIN_MODELS = MappingProxyType(_MODELS)


def model_spec(name: str) -> ModelSpec:
    """The built-in model of that name; KeyError if there is none."""
    return BUILTIN_MODELS[name]
