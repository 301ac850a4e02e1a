"""Our runtime against plain PyTorch on the same model, data, batch and optimizer, side by side.

Usage: python bench/runtime_vs_torch.py [--model gpt-mini] [--global-batch 16] [--microbatch 2]
       [--steps 4] [--warmup-steps 1] [--repeats 5] [--split L] [--allreduce flat]
       [--comparisons dp,pp,tp] [--quick] [--json]

Three comparisons, each with two processes of one thread (one CPU slot each):

- DP: our ``WorkerGroup`` with 2 data-parallel replicas of the whole model against
  ``DistributedDataParallel`` over gloo (what torchrun would start: 2 ranks, tcp rendezvous),
  accumulating gradients over the rank's microbatches under ``no_sync()`` except the last.
- PP: our 2-stage 1F1B pipeline against ``torch.distributed.pipelining``'s ``Schedule1F1B`` on
  the same split (in torch 2.13 the class is ``Schedule1F1B``; there is no ``ScheduleOneFOneB``).
- TP: our one stage split over a tensor-parallel group of 2 (runtime/tensor_parallel.py) against
  two gloo ranks that split the same layers themselves with torch's ``parallelize_module``
  (``ColwiseParallel``/``RowwiseParallel`` on the submodules ``runtime.models.gpt.tp_plan`` names,
  over a 1-D ``DeviceMesh``), both ranks reading every microbatch of the step, accumulating the
  gradients of all of them, then one AdamW step over the model's parameters (DTensor shards, as a
  torch user's optimizer gets them; ours steps the same shards as plain local tensors).

Same model: ``runtime.models.gpt.build_layers`` with one seed, every rank slicing its layers. Same
data: sample ``k`` of ``ByteCorpus.stdlib`` (same corpus size), rank ``i`` of DP taking the
``i``-th contiguous share of each step's batch, as our replicas do. Same optimizer:
``runtime.reference.make_optimizer``. Same loss scale: our microbatch loss is its mean times
``microbatch / global batch``, gradients summed over microbatches and replicas. DDP averages over
its 2 ranks, so its microbatch loss is scaled by ``2 x microbatch / global batch``; the pipeline
schedule's ``loss_fn`` multiplies by ``microbatch / global batch`` with ``scale_grads=False`` (its
default, ``scale_grads=True``, divides the summed gradients by the microbatch count afterwards: the
same mean, in another rounding order). The tied embedding/head weight sits on both pipeline stages;
torch's pipelining does not sync it, so its side all-reduces that gradient after each step, as ours
does (as Megatron-LM does). Under TP both ranks compute the same loss (the row-parallel outputs
are all-reduced, so the head sees whole activations): rank 0 reports it. Same allocator setting:
each torch rank keeps glibc's freed memory as our CPU workers do (runtime/memory.py
``keep_freed_memory``), so the comparison is of the runtimes.

Both sides stay started for the whole run and take turns, repeat by repeat (A, B, then B, A, ...),
because this VM is shared and its speed drifts: each turn runs ``--warmup-steps`` untimed steps and
then ``--steps`` timed ones, continuing the step count, so both sides train the same sequence of
steps and their losses can be compared step by step. Ours is timed at the driver around
``WorkerGroup.step`` (the Ray round trip per step is part of our cost); torch between barriers on
its ranks. Target: ours / torch >= 0.95 in samples/s (medians over repeats), for DP, PP and TP.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch_baselines import CORPUS_BYTES, WORLD, TorchSide, Turn  # noqa: E402  (bench/)

from runtime.layout import Layout, WorkerSpec  # noqa: E402
from runtime.models.specs import BUILTIN_MODELS, model_spec  # noqa: E402
from runtime.reference import TrainConfig  # noqa: E402

PLACE = "local/bench/bench-a"  # both workers of a comparison share one place
TARGET_RATIO = 0.95
KINDS = ("dp", "pp", "tp")  # the comparisons, in the order they run


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    model: str = "gpt-mini"
    global_batch: int = 16
    microbatch: int = 2
    steps: int = 4  # timed steps per turn
    warmup_steps: int = 1  # untimed steps before each turn's timed ones
    repeats: int = 5  # turns per side
    split: int | None = None  # first layer of stage 1; None: half the layers
    allreduce: str = "flat"  # our DP gradient sync: "flat" or "hierarchical"
    comparisons: tuple[str, ...] = KINDS  # which to run
    learning_rate: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in BUILTIN_MODELS:
            raise ValueError(
                f"--model {self.model} is not built in; one of {sorted(BUILTIN_MODELS)}"
            )
        spec = model_spec(self.model)
        if spec.family != "gpt":
            raise ValueError(f"--model {self.model} is a {spec.family}; use a GPT (gpt-tiny, ...)")
        microbatches, rest = divmod(self.global_batch, self.microbatch)
        if rest or microbatches % WORLD:
            raise ValueError(
                f"--global-batch {self.global_batch} must be a multiple of 2 x --microbatch "
                f"{self.microbatch} (an equal share of microbatches for each of 2 DP ranks)"
            )
        if min(self.steps, self.repeats) < 1 or self.warmup_steps < 0:
            raise ValueError("--steps and --repeats must be at least 1, --warmup-steps at least 0")
        if not 0 < self.split_layer < spec.num_layers:
            raise ValueError(f"--split {self.split} must be in 1 .. {spec.num_layers - 1}")
        unknown = sorted(set(self.comparisons) - set(KINDS))
        if unknown or not self.comparisons:
            raise ValueError(f"--comparisons {','.join(self.comparisons)}: name some of dp,pp,tp")
        # TP splits heads and widths in two (our runtime checks it too, but only once started)
        if "tp" in self.comparisons and any(
            n % WORLD for n in (spec.num_heads, spec.num_kv_heads or spec.num_heads)
        ):
            raise ValueError(f"--model {self.model}: its heads do not split {WORLD} ways for TP")

    @property
    def microbatches(self) -> int:
        return self.global_batch // self.microbatch

    @property
    def split_layer(self) -> int:
        return model_spec(self.model).num_layers // 2 if self.split is None else self.split

    def train_config(self) -> TrainConfig:
        steps = self.repeats * (self.warmup_steps + self.steps)
        return TrainConfig(
            steps=steps,
            global_batch_size=self.global_batch,
            microbatch_size=self.microbatch,
            learning_rate=self.learning_rate,
            seed=self.seed,
        )


QUICK = BenchConfig(model="gpt-tiny", global_batch=4, microbatch=1, steps=2, repeats=1)


# -- ours: WorkerGroup on the local Ray cluster ------------------------------------------------


def our_layout(kind: str, config: BenchConfig) -> Layout:
    spec = model_spec(config.model)
    if kind == "dp":
        share = config.microbatches // WORLD
        workers = tuple(
            WorkerSpec(stage=0, replica=i, place=PLACE, microbatches=share) for i in range(WORLD)
        )
        layers, warmup = ((0, spec.num_layers),), (0,)
    elif kind == "tp":
        # one replica whose stage is 2 workers; both run every microbatch of the step
        workers = tuple(
            WorkerSpec(
                stage=0,
                replica=0,
                place=PLACE,
                microbatches=config.microbatches,
                tp=WORLD,
                tp_rank=t,
            )
            for t in range(WORLD)
        )
        layers, warmup = ((0, spec.num_layers),), (0,)
    else:
        workers = tuple(
            WorkerSpec(stage=s, replica=0, place=PLACE, microbatches=config.microbatches)
            for s in range(WORLD)
        )
        layers = ((0, config.split_layer), (config.split_layer, spec.num_layers))
        warmup = (1, 0)  # standard 1F1B: P - s - 1
    return Layout(
        model=config.model,
        layers=layers,
        workers=workers,
        microbatch_size=config.microbatch,
        warmup=warmup,
        allreduce=config.allreduce,
    )


class OurSide:
    def __init__(self, kind: str, config: BenchConfig) -> None:
        from runtime.group import WorkerGroup

        self.config = config
        self.group = WorkerGroup.start(
            our_layout(kind, config), config.train_config(), corpus_bytes=CORPUS_BYTES
        )

    def turn(self, first_step: int) -> Turn:
        losses = {}
        for step in range(first_step, first_step + self.config.warmup_steps):
            losses[step] = self.group.step(step)
        timed = first_step + self.config.warmup_steps
        start = time.perf_counter()
        for step in range(timed, timed + self.config.steps):
            losses[step] = self.group.step(step)
        return Turn(elapsed_s=time.perf_counter() - start, losses=losses)

    def phases_s(self) -> list[dict[str, float]]:
        """Each rank's seconds per phase in its last step (compute, waits, sync, optimizer)."""
        return [c["last_step_phases_s"] for c in self.group.counters()]

    def close(self) -> None:
        self.group.shutdown()


# -- the comparison ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Comparison:
    name: str
    ours_samples_per_s: float  # median over repeats
    torch_samples_per_s: float
    ratio: float  # ours / torch, of the medians
    paired_ratio: float  # median over repeats of (ours / torch) in the same repeat
    ours_repeats_samples_per_s: list[float]
    torch_repeats_samples_per_s: list[float]
    ours_final_loss: float
    torch_final_loss: float
    max_loss_relative_difference: float  # over every step both sides trained
    ours_last_step_phases_s: list[dict[str, float]]


NAMES = {
    "dp": "DP, 2 replicas vs DDP (gloo)",
    "pp": "PP, 2-stage 1F1B vs Schedule1F1B",
    "tp": "TP, 1 stage x TP 2 vs parallelize_module (gloo)",
}


def compare(kind: str, config: BenchConfig) -> Comparison:
    ours, theirs = OurSide(kind, config), None
    try:
        theirs = TorchSide(kind, config)
        ours_turns, torch_turns = _take_turns(ours, theirs, config)
        phases = ours.phases_s()
    finally:
        ours.close()
        if theirs is not None:
            theirs.close()
    return _summarise(kind, config, ours_turns, torch_turns, phases)


def _take_turns(ours: OurSide, theirs: TorchSide, config: BenchConfig):
    """Turns alternate who goes first (A B, B A, ...), so a drift in the machine's speed within a
    repeat does not always favour the same side."""
    ours_turns, torch_turns = [], []
    per_turn = config.warmup_steps + config.steps
    for repeat in range(config.repeats):
        first_step = repeat * per_turn
        order = [(ours, ours_turns), (theirs, torch_turns)]
        for side, turns in order if repeat % 2 == 0 else order[::-1]:
            turns.append(side.turn(first_step))
    return ours_turns, torch_turns


def _summarise(kind, config, ours_turns, torch_turns, phases) -> Comparison:
    samples = config.steps * config.global_batch
    ours_rates = [samples / t.elapsed_s for t in ours_turns]
    torch_rates = [samples / t.elapsed_s for t in torch_turns]
    ours_losses = {k: v for t in ours_turns for k, v in t.losses.items()}
    torch_losses = {k: v for t in torch_turns for k, v in t.losses.items()}
    last = max(ours_losses)
    return Comparison(
        name=NAMES[kind],
        ours_samples_per_s=statistics.median(ours_rates),
        torch_samples_per_s=statistics.median(torch_rates),
        ratio=statistics.median(ours_rates) / statistics.median(torch_rates),
        paired_ratio=statistics.median(a / b for a, b in zip(ours_rates, torch_rates, strict=True)),
        ours_repeats_samples_per_s=ours_rates,
        torch_repeats_samples_per_s=torch_rates,
        ours_final_loss=ours_losses[last],
        torch_final_loss=torch_losses[last],
        max_loss_relative_difference=max(
            abs(ours_losses[k] - torch_losses[k]) / abs(torch_losses[k]) for k in ours_losses
        ),
        ours_last_step_phases_s=phases,
    )


def start_ray() -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # one CPU slot per worker, in the one place both workers share
    ray.init(
        address="local",  # a cluster of its own, never one another process started
        num_cpus=WORLD,
        resources={f"infra:{PLACE}": WORLD},
        include_dashboard=False,
        log_to_driver=False,
    )


def report(config: BenchConfig, comparisons: list[Comparison]) -> str:
    lines = [
        f"runtime vs torch: {config.model}, global batch {config.global_batch}, microbatch "
        f"{config.microbatch}, {config.steps} timed steps (+{config.warmup_steps} warm-up) x "
        f"{config.repeats} interleaved repeats, 2 processes x 1 thread; PP split at layer "
        f"{config.split_layer}; TP degree {WORLD}; our DP sync: {config.allreduce}"
    ]
    for c in comparisons:
        verdict = "meets" if c.ratio >= TARGET_RATIO else "BELOW"
        lines += [
            f"{c.name}: ours {c.ours_samples_per_s:.2f} samples/s, torch "
            f"{c.torch_samples_per_s:.2f} samples/s, ratio {c.ratio:.3f} (paired "
            f"{c.paired_ratio:.3f}; target >= {TARGET_RATIO}: {verdict})",
            f"  final loss: ours {c.ours_final_loss:.6f}, torch {c.torch_final_loss:.6f}; largest "
            f"relative difference over all steps {c.max_loss_relative_difference:.1e}",
            "  our last step, seconds per phase: "
            + "; ".join(
                f"rank {r}: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(p.items()))
                for r, p in enumerate(c.ours_last_step_phases_s)
            ),
        ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> tuple[BenchConfig, bool]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = BenchConfig()
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--global-batch", type=int, default=defaults.global_batch)
    parser.add_argument("--microbatch", type=int, default=defaults.microbatch)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--split", type=int, default=None, help="first layer of stage 1")
    parser.add_argument("--allreduce", choices=("flat", "hierarchical"), default=defaults.allreduce)
    parser.add_argument(
        "--comparisons",
        default=",".join(defaults.comparisons),
        help="which to run, comma-separated: dp, pp, tp",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"a seconds-long check: {QUICK.model}, tiny batch"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    chosen = {
        "model": args.model,
        "global_batch": args.global_batch,
        "microbatch": args.microbatch,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "repeats": args.repeats,
        "split": args.split,
        "allreduce": args.allreduce,
        "comparisons": tuple(c.strip() for c in args.comparisons.split(",") if c.strip()),
    }
    # --quick replaces the sizes the user left at their defaults
    base = QUICK if args.quick else defaults
    overrides = {k: v for k, v in chosen.items() if v != getattr(defaults, k)}
    try:
        return replace(base, **overrides), args.json
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> int:
    config, as_json = parse_args(argv)
    start_ray()
    try:
        comparisons = [compare(kind, config) for kind in config.comparisons]
    finally:
        import ray

        ray.shutdown()
    if as_json:
        document = {
            "config": asdict(config),
            "target_ratio": TARGET_RATIO,
            "comparisons": [asdict(c) for c in comparisons],
        }
        print(json.dumps(document, indent=2))
    else:
        print(report(config, comparisons))
    return 0


if __name__ == "__main__":
    sys.exit(main())
