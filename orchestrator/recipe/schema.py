"""The recipe: what to train, on what data, toward which objective, under which constraints.

Frozen dataclasses, one per YAML section. ``binder.bind`` fills them from YAML strictly (unknown
keys, wrong types and missing keys are errors); ``checks.check_recipe`` then checks values against
each other and against the catalog. Each field's ``help`` metadata is the "what to write" of its
errors. docs/recipe.md documents the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.recipe import limits as L
from orchestrator.recipe.binder import Settings, described

_help = described  # a field with its "what to write" and its limits


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """One of ``name`` (built in), ``hf`` (a Hugging Face family built from ``config``) or
    ``module`` (the user's build function, called with ``args``): runtime/models/protocol.py."""

    name: str | None = _help(
        "a built-in model, e.g. gpt-tiny, opt-350m, gpt-neo-2.7b (python -m orchestrator catalog "
        "models); or write hf: or module: instead",
        default=None,
    )
    hf: str | None = _help(
        "a Hugging Face model family built from its config class, offline: gpt2", default=None
    )
    config: Settings = _help(
        "hf: the config class's fields, e.g. {n_layer: 4, n_embd: 128, n_head: 4}",
        default=Settings(),
    )
    weights: str | None = _help(
        "hf: a folder or s3://bucket/prefix with the model's config.json and weights, or null "
        "(weights initialised from training.seed)",
        default=None,
    )
    module: str | None = _help(
        "your model: 'package.module:function' returning runtime.models.protocol.ModelParts, "
        "importable from the recipe's folder (docs/models.md)",
        default=None,
    )
    args: Settings = _help("module: keyword arguments of the function", default=Settings())
    code: str | None = _help(
        "module: the folder your package is in, shipped to the nodes with the job (relative to "
        "the recipe's folder) [the recipe's folder]",
        default=None,
    )
    profile: str = _help(
        "where per-layer times come from: auto, analytic, sailor, or a path to a profile .json",
        default="auto",
    )


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: Literal["auto", "builtin-text", "synthetic-images", "shards", "tokens"] = _help(
        "auto (the model's default), builtin-text, synthetic-images, shards or tokens",
        default="auto",
    )
    path: str | None = _help(
        "for shards and tokens: a local folder or s3://bucket/prefix (.tar shards, .bin token "
        "files)",
        default=None,
    )
    dtype: Literal["uint16", "uint32"] = _help(
        "tokens: the files' integer type, uint16 (vocabularies up to 65,536) or uint32",
        default="uint16",
    )
    log_samples: bool = _help(
        "write the ids of the samples each committed step read into metrics.jsonl (tokens)",
        default=False,
    )


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    name: Literal["adam", "adamw", "sgd"] = _help("adam, adamw or sgd", default="adamw")
    lr: float = _help(
        "learning rate, a positive number such as 3.0e-4", default=3e-4, most=L.MAX_LR
    )
    weight_decay: float = _help("weight decay, >= 0", default=0.0, most=L.MAX_WEIGHT_DECAY)
    momentum: float = _help("SGD momentum in [0, 1)", default=0.0, most=1.0)
    grad_clip_norm: float | None = _help(
        "clip the global gradient norm to this (> 0), or null",
        default=1.0,
        most=L.MAX_GRAD_CLIP_NORM,
    )


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    global_batch_size: int = _help(
        "samples per optimizer step, a positive whole number", most=L.MAX_GLOBAL_BATCH_SIZE
    )
    microbatch_sizes: tuple[int, ...] = _help(
        "microbatch sizes the planner may choose, each dividing global_batch_size, e.g. [1, 2, 4]",
        default=(1,),
        most=L.MAX_GLOBAL_BATCH_SIZE,
        items=L.MAX_MICROBATCH_SIZES,
    )
    steps: int = _help("optimizer steps to train, a positive whole number", most=L.MAX_STEPS)
    precision: Literal["fp32", "fp16-mixed", "bf16-mixed"] = _help(
        "fp32, fp16-mixed or bf16-mixed", default="fp32"
    )
    optimizer: OptimizerConfig = _help(
        "name, lr, weight_decay, momentum, grad_clip_norm", default_factory=OptimizerConfig
    )
    seed: int = _help(
        "random seed, a whole number from 0 to 4294967295", default=0, most=L.MAX_SEED
    )


@dataclass(frozen=True, kw_only=True)
class ObjectiveConfig:
    goal: Literal["max_throughput", "min_cost"] = _help(
        "max_throughput or min_cost", default="max_throughput"
    )
    budget_usd_per_hour: float | None = _help(
        "with goal max_throughput: spend at most this many $ per hour (> 0)",
        default=None,
        most=L.MAX_USD_PER_HOUR,
    )
    min_throughput_samples_per_s: float | None = _help(
        "with goal min_cost: keep at least this many samples/s (> 0)",
        default=None,
        most=L.MAX_SAMPLES_PER_S,
    )
    deadline_h: float | None = _help(
        "with goal min_cost: finish all steps within this many hours (> 0)",
        default=None,
        most=L.MAX_DEADLINE_H,
    )
    budget_usd: float | None = _help(
        "stop before total spend (compute + egress) exceeds this many $ (> 0)",
        default=None,
        most=L.MAX_USD,
    )
    risk_aware: bool = _help(
        "true to score plans by expected throughput under preemptions", default=False
    )


@dataclass(frozen=True, kw_only=True)
class ConstraintsConfig:
    locations: tuple[str, ...] = _help(
        "allowed places as cloud[/region[/zone]], e.g. [gcp/us-central1, aws]; empty: all the provider offers",
        default=(),
        items=L.MAX_LOCATIONS,
    )
    exclude_locations: tuple[str, ...] = _help(
        "places never to use, cloud[/region[/zone]]", default=(), items=L.MAX_LOCATIONS
    )
    gpu_types: tuple[str, ...] = _help(
        "allowed GPU types, e.g. [A100, V100]; empty: any", default=(), items=L.MAX_GPU_TYPES
    )
    max_gpus: int | None = _help(
        "at most this many GPUs in total (>= 1), or null", default=None, most=L.MAX_GPUS
    )
    min_locations: int = _help(
        "spread the GPUs over at least this many locations (zones), so that one location taken "
        "back at once does not stop the job (>= 1; 1: no spreading); when the market cannot "
        "give that many, the driver trains on fewer",
        default=1,
        most=L.MAX_LOCATIONS,
    )
    pricing: Literal["spot", "on_demand", "any"] = _help("spot, on_demand or any", default="any")


@dataclass(frozen=True, kw_only=True)
class ParallelismConfig:
    tensor_parallel: tuple[int, ...] = _help(
        "TP degrees the planner may use (powers of two, TP stays in a node)",
        default=(1, 2, 4, 8),
        most=L.MAX_TENSOR_PARALLEL,
        items=L.MAX_MICROBATCH_SIZES,
    )
    data_parallel: tuple[int, ...] = _help(
        "DP degrees the planner may use; empty: any",
        default=(),
        most=L.MAX_GLOBAL_BATCH_SIZE,
        items=L.MAX_LIST_ITEMS,
    )
    max_pipeline_stages: int | None = _help(
        "at most this many pipeline stages (>= 1), or null",
        default=None,
        most=L.MAX_PIPELINE_STAGES,
    )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    every_steps: int = _help(
        "write a checkpoint every this many steps (>= 1)", default=50, most=L.MAX_STEPS
    )
    path: str = _help(
        "a local folder, s3://bucket/prefix or gs://bucket/prefix", default="checkpoints"
    )
    asynchronous: bool = _help("true to write checkpoints while training goes on", default=True)
    keep_last: int = _help(
        "keep this many checkpoints (>= 1)", default=2, most=L.MAX_KEEP_CHECKPOINTS
    )


@dataclass(frozen=True, kw_only=True)
class RecoveryConfig:
    """How long the driver keeps recovering a job that does not move on (docs/driver.md)."""

    max_attempts: int = _help(
        "stop after this many recoveries in a row without progress past the furthest step (>= 1)",
        default=10,
        most=L.MAX_RECOVERY_ATTEMPTS,
    )
    max_seconds: float = _help(
        "stop when recoveries without progress have gone on this many seconds (> 0)",
        default=1800.0,
        most=L.MAX_RECOVERY_S,
    )
    backoff_s: float = _help(
        "wait this long before the second attempt in a row, doubling after (>= 0; the first "
        "attempt never waits)",
        default=2.0,
        most=L.MAX_BACKOFF_S,
    )
    max_backoff_s: float = _help(
        "the longest wait between attempts (>= backoff_s)", default=60.0, most=L.MAX_BACKOFF_S
    )
    controller_grace_s: float = _help(
        "a node whose controller has not answered for this long shuts itself down (the "
        "dead-man switch; > 0)",
        default=300.0,
        most=L.MAX_BACKOFF_S,
    )


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    allreduce: Literal["auto", "flat", "hierarchical"] = _help(
        "auto, flat or hierarchical", default="auto"
    )
    compression: Literal["none", "fp16", "int8"] = _help(
        "compression of the cross-region all-reduce hop: none, fp16 or int8", default="none"
    )
    streams: int = _help(
        "parallel TCP streams per cross-region link (1-256)", default=8, most=L.MAX_STREAMS
    )
    link_emulation: bool = _help(
        "on the local cloud, give links the latency and bandwidth of the places", default=True
    )


@dataclass(frozen=True, kw_only=True)
class LocalCloudConfig:
    preempt_at_steps: tuple[int, ...] = _help(
        "steps after which the simulated market takes one of the job's nodes back, e.g. [60]",
        default=(),
        most=L.MAX_STEPS,
        items=L.MAX_PREEMPTIONS,
    )
    preempt_location_at_steps: tuple[int, ...] = _help(
        "steps after which the simulated market takes back every node the job holds in one "
        "location at once (the location of its first node), e.g. [120]",
        default=(),
        most=L.MAX_STEPS,
        items=L.MAX_PREEMPTIONS,
    )
    preempt_driver_at_steps: tuple[int, ...] = _help(
        "steps after which the simulated market takes back the node the job's driver runs on "
        "(Ray restarts the driver on another node and it takes the job over), e.g. [90]",
        default=(),
        most=L.MAX_STEPS,
        items=L.MAX_PREEMPTIONS,
    )
    notice_s: float = _help(
        "market seconds between a preemption notice and the node's death (> 0)",
        default=2.0,
        most=L.MAX_NOTICE_S,
    )
    slow_nodes: int = _help(
        "the first this many GPU nodes the simulated market gives run `slowdown` times slower "
        "than their type (noisy neighbours: watch the driver re-balance the batch) (>= 0)",
        default=0,
        most=L.MAX_SLOW_NODES,
    )
    slowdown: float = _help(
        "how much slower a slow node computes (> 1)", default=2.0, most=L.MAX_SLOWDOWN
    )
    devices: Literal["auto", "cpu"] = _help(
        "what a simulated node's GPUs are: auto (this machine's CUDA GPUs where it has some, "
        "shared in turn when the market's nodes hold more; else CPU slots) or cpu (one CPU "
        "slot per GPU, a thread each)",
        default="auto",
    )
    vms: Literal["auto", "namespaces", "processes"] = _help(
        "what a simulated VM is: namespaces (a network namespace booted by the node bootstrap, "
        "joined over WireGuard; needs root, iproute2, nftables, wireguard-go, wireguard-tools), "
        "processes (Ray nodes on this machine's network) or auto (namespaces where they work)",
        default="auto",
    )
    offers: str | None = _help(
        "a CSV of the simulated market's offers (configs/local/offers.csv's columns, `local` "
        "rows), e.g. to offer nodes of 2 GPUs for tensor parallelism; relative to the recipe's "
        "folder [the shipped configs/local/offers.csv]",
        default=None,
    )


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str | None = _help(
        "a short name for the job: letters, digits, '.', '_' or '-', at most 64 characters; "
        "default: the file name",
        default=None,
    )
    provider: Literal["local", "skypilot", "aws", "gcp", "azure"] = _help(
        "where to run: local (the simulated cloud on this machine), skypilot, aws, gcp or azure",
        default="local",
    )
    market: str | None = _help(
        "a CSV of offers to plan against instead of the provider's (path)", default=None
    )
    model: ModelConfig = _help("name, profile")
    data: DataConfig = _help("source, path", default_factory=DataConfig)
    training: TrainingConfig = _help(
        "global_batch_size, microbatch_sizes, steps, precision, optimizer, seed"
    )
    objective: ObjectiveConfig = _help("goal and its limits", default_factory=ObjectiveConfig)
    constraints: ConstraintsConfig = _help(
        "locations, gpu_types, max_gpus, pricing", default_factory=ConstraintsConfig
    )
    parallelism: ParallelismConfig = _help(
        "tensor_parallel, data_parallel, max_pipeline_stages", default_factory=ParallelismConfig
    )
    checkpointing: CheckpointConfig = _help(
        "every_steps, path, asynchronous, keep_last", default_factory=CheckpointConfig
    )
    runtime: RuntimeConfig = _help(
        "allreduce, compression, streams, link_emulation", default_factory=RuntimeConfig
    )
    recovery: RecoveryConfig = _help(
        "max_attempts, max_seconds, backoff_s, max_backoff_s", default_factory=RecoveryConfig
    )
    local_cloud: LocalCloudConfig = _help(
        "preempt_at_steps, notice_s (provider: local only)", default_factory=LocalCloudConfig
    )

    def market_file(self) -> Path | None:
        """The offers the recipe plans against when not the provider's own: ``market``, or the
        local cloud's ``local_cloud.offers`` (its simulated market sells exactly those)."""
        if self.market is not None:
            return Path(self.market)
        if self.provider == "local" and self.local_cloud.offers is not None:
            return Path(self.local_cloud.offers)
        return None
