"""The torch side of bench/runtime_vs_torch.py: two spawned ranks training the same model as our
runtime does with PyTorch's own parallelism (``DistributedDataParallel``, ``torch.distributed
.pipelining``'s ``Schedule1F1B``, ``parallelize_module``), turn by turn when the parent says so.
What "the same" means (model, data, loss scale, optimizer, allocator) is in that script's
docstring; ``config`` is its ``BenchConfig``.
"""

from __future__ import annotations

import queue
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass

from runtime.comm import loopback_port
from runtime.models.specs import model_spec

WORLD = 2  # ranks per side
CORPUS_BYTES = 2**20
TURN_TIMEOUT_S = 900.0  # one turn of one side; a hung rank fails the run instead of blocking it


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One side's turn: seconds of its timed steps, and every step's loss (global batch mean)."""

    elapsed_s: float
    losses: dict[int, float]


PORT_ATTEMPTS = 3


class TorchSide:
    """Two spawned processes, each one torch rank, that train a turn when told to."""

    def __init__(self, kind: str, config) -> None:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        self.config, self.processes = config, []
        # the port is free when chosen, not when rank 0 binds it (a test beside this one may
        # take it meanwhile): a start that lost it is made again on another
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start(kind, config, context, f"tcp://127.0.0.1:{loopback_port()}")
                return
            except RuntimeError as error:
                for process in self.processes:
                    process.kill()
                if attempt + 1 == PORT_ATTEMPTS or "EADDRINUSE" not in str(error):
                    raise

    def _start(self, kind: str, config, context, init_method: str) -> None:
        self.results = context.Queue()  # fresh: nothing of a failed start is read
        self.commands = [context.Queue() for _ in range(WORLD)]
        self.processes = [
            context.Process(
                target=_torch_rank,
                args=(kind, config, rank, init_method, self.commands[rank], self.results),
                daemon=True,
            )
            for rank in range(WORLD)
        ]
        for process in self.processes:
            process.start()
        # the ranks import torch and build their model: wait, so that no turn shares the CPU
        # with that start
        for _ in range(WORLD):
            self._reply("ready")

    def turn(self, first_step: int) -> Turn:
        for commands in self.commands:
            commands.put(first_step)
        replies = [self._reply("turn") for _ in range(WORLD)]
        # DP: each rank's share of the mean; PP: the last stage's, the first stage's are 0; TP:
        # rank 0's, rank 1's are 0
        losses = {step: sum(losses[step] for _, losses in replies) for step in replies[0][1]}
        return Turn(elapsed_s=max(elapsed_s for elapsed_s, _ in replies), losses=losses)

    def _reply(self, kind: str):
        """The next message of a rank: ("ready",), ("turn", seconds, losses) or ("error", text)."""
        try:
            reply = self.results.get(timeout=TURN_TIMEOUT_S)
        except queue.Empty:
            alive = [p.is_alive() for p in self.processes]
            raise RuntimeError(
                f"a torch rank gave no result within {TURN_TIMEOUT_S:.0f} s (alive: {alive}); "
                "run with smaller --global-batch/--steps, or check the machine's load"
            ) from None
        if reply[0] == "error":
            raise RuntimeError(f"a torch rank failed:\n{reply[1]}")
        assert reply[0] == kind, f"expected a {kind!r} message from a torch rank, got {reply[0]!r}"
        return reply[1:]

    def close(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for process in self.processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()


def _torch_rank(kind: str, config, rank: int, init_method: str, commands, results) -> None:
    """A rank's life: join the group, build its trainer, run turns until told to stop. An error
    travels to the parent as text (the parent raises it), so a failed rank never hangs the run."""
    import torch
    import torch.distributed as dist

    from runtime.memory import keep_freed_memory

    try:
        torch.set_num_threads(1)  # one CPU slot per rank, as each of our workers has
        keep_freed_memory()  # glibc kept as our CPU workers keep it: the runtimes are compared
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
        trainers = {"dp": _ddp_trainer, "pp": _pipeline_trainer, "tp": _tp_trainer}
        train_step = trainers[kind](config, rank)
        results.put(("ready",))
        while (first_step := commands.get()) is not None:
            results.put(("turn", *_torch_turn(train_step, config, first_step)))
        dist.destroy_process_group()
    except Exception:  # reported to the parent, which raises it with this traceback
        results.put(("error", f"rank {rank}: {traceback.format_exc()}"))


def _torch_turn(train_step, config, first_step: int) -> tuple[float, dict]:
    import torch.distributed as dist

    losses = {}
    for step in range(first_step, first_step + config.warmup_steps):
        losses[step] = train_step(step)
    dist.barrier()  # both ranks start the clock together, as our driver's step call starts both
    timed = first_step + config.warmup_steps
    start = time.perf_counter()
    for step in range(timed, timed + config.steps):
        losses[step] = train_step(step)
    dist.barrier()
    return time.perf_counter() - start, losses


def _ddp_trainer(config, rank: int):
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from runtime.data.text import ByteCorpus
    from runtime.models.gpt import build_layers, next_token_loss
    from runtime.reference import make_optimizer

    spec, train = model_spec(config.model), config.train_config()
    corpus = ByteCorpus.stdlib(max_bytes=CORPUS_BYTES)
    model = DistributedDataParallel(nn.Sequential(*build_layers(spec, seed=config.seed)))
    optimizer = make_optimizer(model.parameters(), train)
    share = config.microbatches // WORLD
    scale = config.microbatch / config.global_batch  # our per-microbatch loss scale

    def train_step(step: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        first = step * config.global_batch + rank * share * config.microbatch
        total = 0.0
        for j in range(share):
            inputs, targets = corpus.samples(
                first + j * config.microbatch,
                config.microbatch,
                seq_len=spec.seq_len,
                seed=config.seed,
            )
            # DDP all-reduces (in buckets, during the last backward) only after the last microbatch
            with model.no_sync() if j < share - 1 else nullcontext():
                loss = next_token_loss(model(inputs), targets) * scale
                (loss * WORLD).backward()  # DDP averages over its ranks; we sum: undo its 1/WORLD
            total += loss.item()
        optimizer.step()
        return total

    return train_step


def _pipeline_trainer(config, rank: int):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from runtime.data.text import ByteCorpus
    from runtime.models.gpt import build_layers, next_token_loss
    from runtime.reference import make_optimizer

    spec, train = model_spec(config.model), config.train_config()
    corpus = ByteCorpus.stdlib(max_bytes=CORPUS_BYTES)
    layers = build_layers(spec, seed=config.seed)
    span = (0, config.split_layer) if rank == 0 else (config.split_layer, spec.num_layers)
    module = nn.Sequential(*layers[span[0] : span[1]])
    stage = PipelineStage(module, rank, WORLD, torch.device("cpu"))
    scale = config.microbatch / config.global_batch

    def loss_fn(logits, targets):
        return next_token_loss(logits, targets) * scale

    schedule = Schedule1F1B(stage, config.microbatches, loss_fn=loss_fn, scale_grads=False)
    optimizer = make_optimizer(module.parameters(), train)
    # stage 0 holds the embedding, stage 1 the head; with tied embeddings both use one weight
    tied = layers[0].tokens.weight if spec.tied_embeddings else None

    def train_step(step: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        inputs, targets = corpus.samples(
            step * config.global_batch, config.global_batch, seq_len=spec.seq_len, seed=config.seed
        )
        losses: list = []
        if rank == 0:
            schedule.step(inputs, return_outputs=False)
        else:
            schedule.step(target=targets, losses=losses, return_outputs=False)
        if tied is not None:
            dist.all_reduce(tied.grad)
        optimizer.step()
        return sum(loss.item() for loss in losses)

    return train_step


def _tp_trainer(config, rank: int):
    """Torch's own tensor parallelism: our model's plan handed to ``parallelize_module``."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from runtime.data.text import ByteCorpus
    from runtime.models.gpt import build_layers, next_token_loss, tp_plan
    from runtime.reference import make_optimizer

    spec, train = model_spec(config.model), config.train_config()
    corpus = ByteCorpus.stdlib(max_bytes=CORPUS_BYTES)
    layers = build_layers(spec, seed=config.seed)
    mesh = init_device_mesh("cpu", (WORLD,))  # over the default (gloo) group: both ranks
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    # only the mapping comes from our model (which submodule splits which way); torch applies it
    for layer in layers:
        plan = {path: styles[style]() for path, style in tp_plan(layer).items()}
        if plan:
            parallelize_module(layer, mesh, plan)
    model = nn.Sequential(*layers)
    optimizer = make_optimizer(model.parameters(), train)
    scale = config.microbatch / config.global_batch

    def train_step(step: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(config.microbatches):
            inputs, targets = corpus.samples(
                step * config.global_batch + j * config.microbatch,
                config.microbatch,
                seq_len=spec.seq_len,
                seed=config.seed,
            )
            loss = next_token_loss(model(inputs), targets) * scale
            loss.backward()
            total += loss.item()
        optimizer.step()
        return total if rank == 0 else 0.0  # both ranks hold the same loss: count it once

    return train_step
