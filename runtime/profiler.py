"""Measure a built-in GPT's layers on the local device: the figures a model profile is made of.

Times are taken in place: each timed run is one forward of the whole model (as one autograd graph,
the way a training stage runs its layers) with a stamp after every layer, then one backward from
the next-token loss with a stamp as each layer's output gradient is ready (a tensor hook). Layer
``i``'s backward is the time between the gradient reaching its output and reaching its input.
Timing each layer on its own instead reads ~10% more backward time than the same layers take
chained (one autograd call per layer, a gradient made up for the output), which the simulator
would then predict for every stage. Per layer and microbatch size we record the mean of
``repeats`` timed runs after ``warmup`` untimed ones (the mean, not the median: training pays the
slow runs too, and throughput is a mean; on a shared CPU the median read ~1.6% under the mean) of:

- forward: the layer's forward with autograd recording;
- backward: the layer's part of the backward (the head's includes the next-token loss);
- update: one optimizer step over the parameters the layer owns (microbatch-independent, so it is
  measured once per layer, on a copy).

Where the whole model's activations do not fit the device (CUDA out of memory), each layer is
timed on its own instead, on inputs of the shape it sees in training (``method`` says which).

Memory per layer: bytes of the tensors autograd saves for backward (``saved_tensors_hooks``,
counted once per storage, parameters excluded since they are counted as parameters) and elements
of the output handed to the next layer. A parameter shared with an earlier layer (tied embeddings)
belongs to the earlier layer, as in ``GptSpec.layer_parameters``.

Tensor parallelism: given a process group (``tp_group``), every member runs this same measurement
in step, its layers split by the model's plan (runtime/tensor_parallel.py) as a stage's workers
hold them, so each time includes the layer's all-reduces over that group; sizes are one worker's
shards.

Times on CUDA come from CUDA events recorded on the stream; on CPU from ``time.perf_counter``. The
result is plain data; the orchestrator turns it into a model profile (orchestrator/profiles/measured.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from runtime.memory import keep_freed_memory
from runtime.models.gpt import build_layers, next_token_loss, tp_plan
from runtime.models.protocol import ModelParts, ModelSource, TokenInputs, owned_parameters
from runtime.models.specs import GptSpec
from runtime.optim import OptimizerSettings, StageOptimizer
from runtime.tensor_parallel import local, shard_stage

OPTIMIZERS = ("adam", "adamw", "sgd")


@dataclass(frozen=True, kw_only=True)
class ProfilerConfig:
    """What to measure and how often."""

    microbatch_sizes: tuple[int, ...]
    repeats: int = 5  # timed runs per figure; their mean is kept
    warmup: int = 2  # untimed runs first (allocator, lazy optimizer state, kernel selection)
    optimizer: str = "adamw"
    device: str = "cpu"  # "cpu" or "cuda"
    threads: int | None = 1  # torch CPU threads while measuring; None leaves torch's setting
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.microbatch_sizes or any(m < 1 for m in self.microbatch_sizes):
            raise ValueError(
                f"microbatch sizes must be positive whole numbers, got {self.microbatch_sizes}"
            )
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(
                f"repeats must be >= 1 and warmup >= 0, got {self.repeats}, {self.warmup}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer}"
            )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device}")


@dataclass(frozen=True)
class LayerTiming:
    """One layer at one microbatch size: seconds per microbatch and memory of the whole microbatch."""

    forward_s: float
    backward_s: float
    update_s: float
    kept_bytes: int  # saved for backward by this layer's forward, whole microbatch
    out_elements: int  # elements handed to the next layer, whole microbatch (0 for the last)


@dataclass(frozen=True)
class ModelMeasurement:
    """Everything measured: per microbatch size, one ``LayerTiming`` per layer."""

    model: str
    device_name: str  # "cpu" or the CUDA device's name
    threads: int
    torch_version: str
    optimizer: str
    repeats: int
    params: tuple[int, ...]  # parameters each layer owns
    layers: Mapping[int, tuple[LayerTiming, ...]]  # microbatch size -> per layer
    elapsed_s: float  # wall time of the whole measurement
    method: str = "in-graph"  # "in-graph", or "per-layer" where the whole model did not fit
    tp: int = 1  # the tensor-parallel degree the layers were split by (figures: one worker's)


class _Clock:
    """Times one call on the measuring device."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def stamp(self) -> object:
        """A point in time on the device (a recorded CUDA event, or ``perf_counter``)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def between(self, start: object, end: object) -> float:
        """Seconds from ``start`` to ``end`` (stamps; call after the work is done)."""
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start

    def seconds(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin


def profile_gpt(spec: GptSpec, config: ProfilerConfig) -> ModelMeasurement:
    """Measure every layer of the built-in GPT shaped as ``spec``."""
    layers = build_layers(spec, seed=config.seed)
    inputs = TokenInputs(seq_len=spec.seq_len, vocab_size=spec.vocab_size)
    parts = ModelParts(layers=layers, loss=next_token_loss, inputs=inputs, tp_plan=tp_plan)
    return profile_model(spec.name, parts, config)


def profile_tensor_parallel(
    label: str, source: ModelSource, config: ProfilerConfig, *, degree: int, timeout_s: float = 900
) -> ModelMeasurement:
    """``profile_model`` split ``degree`` ways on this machine: ``degree`` processes (gloo on
    the CPU; NCCL on CUDA, one GPU each where there are enough), each building the model from ``source`` and
    measuring its shards in step with the others, as the workers of a tensor-parallel group
    train; the first one's figures.
    The members are fresh interpreters (``python -m runtime.profiler``), not forks: the caller
    may be a Ray worker, whose process must not be copied."""
    import os
    import pickle
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from runtime.comm import loopback_port

    port = loopback_port()
    # the group meets on this machine's loopback: an interface pinned for another group (a
    # worker's overlay, runtime/actor.py) is not for it
    env = {
        k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    }
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = "lo"
    with tempfile.TemporaryDirectory(prefix="geo-tp-profile-") as folder:
        request = Path(folder) / "request.pkl"
        request.write_bytes(pickle.dumps((label, source, config, degree, port)))
        members = [
            subprocess.Popen(
                [sys.executable, "-m", "runtime.profiler", str(request), str(rank)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
            )
            for rank in range(degree)
        ]
        errors = []
        for member in members:
            try:
                _, err = member.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                member.kill()
                _, err = member.communicate()
                errors.append(f"no result within {timeout_s:g} s")
            if member.returncode:
                errors.append(err.decode(errors="replace").strip().splitlines()[-1:])
        result = Path(folder) / "result.pkl"
        if errors or not result.exists():
            raise RuntimeError(
                f"profiling {label} at tensor-parallel degree {degree} failed: {errors}"
            )
        return pickle.loads(result.read_bytes())


def _tp_member(request: str, rank: int) -> None:
    """One process of ``profile_tensor_parallel``: rank 0 writes the measurement beside the
    request."""
    import pickle
    from pathlib import Path

    import torch.distributed as dist

    from runtime.models.protocol import build_model

    label, source, config, degree, port = pickle.loads(Path(request).read_bytes())
    backend = "gloo"
    if config.device == "cuda":
        # one GPU per member, NCCL between them, as a stage's workers; where there are fewer
        # GPUs than members, each member is an NCCL host of its own, as workers sharing a GPU
        # are (runtime/devices.py)
        from runtime.devices import own_nccl_host

        count = torch.cuda.device_count()
        torch.cuda.set_device(rank % count)
        backend = "nccl"
        if degree > count:
            own_nccl_host(rank)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=degree
    )
    try:
        parts = build_model(source, seed=config.seed)
        measurement = profile_model(label, parts, config, tp_group=dist.group.WORLD)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        (Path(request).parent / "result.pkl").write_bytes(pickle.dumps(measurement))


def profile_model(
    label: str, parts: ModelParts, config: ProfilerConfig, *, tp_group=None
) -> ModelMeasurement:
    """Measure every layer of ``parts`` (any model of the protocol, models/protocol.py) at each
    of ``config.microbatch_sizes``, on inputs of the shape its first layer reads; with
    ``tp_group`` (a torch.distributed group this process is a member of, every member calling
    alike), split by the model's tensor-parallel plan over that group."""
    started = time.perf_counter()
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda asked for, but torch sees no CUDA device")
    if device.type == "cpu":
        keep_freed_memory()  # as a CPU worker trains (runtime/memory.py)
    threads_before = torch.get_num_threads()
    if config.threads is not None:
        # A local worker is one CPU slot standing in for one GPU (runtime/actor.py): measure alike.
        torch.set_num_threads(config.threads)
    try:
        layers = [layer.to(device) for layer in parts.layers]
        degree = 1 if tp_group is None else tp_group.size()
        if degree > 1:
            shard_stage(
                nn.Sequential(*layers),
                parts.tp_plan,
                group=tp_group,
                device_type=device.type,
                model=label,
            )
        owned = owned_parameters(layers)
        clock = _Clock(device)
        updates = _update_seconds(owned, config, clock)
        by_size, methods = {}, set()
        for mbs in sorted(set(config.microbatch_sizes)):
            by_size[mbs], method = _measure_size(parts, layers, updates, mbs, config, clock)
            methods.add(method)
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads_before)
    return ModelMeasurement(
        model=label,
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        threads=threads,
        torch_version=torch.__version__,
        optimizer=config.optimizer,
        repeats=config.repeats,
        params=tuple(sum(local(p).numel() for p in params) for params in owned),
        layers=by_size,
        elapsed_s=time.perf_counter() - started,
        method="per-layer" if "per-layer" in methods else "in-graph",
        tp=degree,
    )


def _measure_size(
    parts: ModelParts,
    layers: Sequence[nn.Module],
    updates: Sequence[float],
    mbs: int,
    config: ProfilerConfig,
    clock: _Clock,
) -> tuple[tuple[LayerTiming, ...], str]:
    """Every layer at microbatch size ``mbs``, and how the times were taken."""
    device = next(layers[0].parameters()).device
    inputs, targets = _random_samples(parts.inputs, mbs, seed=config.seed + mbs)
    inputs, targets = inputs.to(device), targets.to(device)
    loss = parts.loss
    try:
        times = _in_graph_seconds(layers, inputs, targets, loss, config, clock)
        method = "in-graph"
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        times, method = None, "per-layer"
    timings = []
    x = inputs
    for index, layer in enumerate(layers):
        last = index == len(layers) - 1
        run = _runner(layer, x, targets if last else None, loss)
        forward_s, backward_s = times[index] if times else _pass_seconds(run, config, clock)
        kept = _kept_bytes(run, layer)
        with torch.no_grad():
            out = layer(x)
        timings.append(
            LayerTiming(forward_s, backward_s, updates[index], kept, 0 if last else out.numel())
        )
        x = out.detach()
    for layer in layers:  # the timed runs accumulated gradients nobody reads
        layer.zero_grad(set_to_none=True)
    return tuple(timings), method


def _random_samples(inputs, mbs: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A microbatch of the shape ``inputs`` describes (the values do not change the times)."""
    generator = torch.Generator().manual_seed(seed)
    if isinstance(inputs, TokenInputs):
        ids = torch.randint(0, inputs.vocab_size, (mbs, inputs.seq_len + 1), generator=generator)
        # clones: each its own storage, so the embedding keeps only its own ids for backward
        return ids[:, :-1].clone(), ids[:, 1:].clone()
    size = inputs.image_size
    images = torch.randn((mbs, 3, size, size), generator=generator)
    return images, torch.randint(0, inputs.num_classes, (mbs,), generator=generator)


def _in_graph_seconds(
    layers: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss: Callable,
    config: ProfilerConfig,
    clock: _Clock,
) -> list[tuple[float, float]]:
    """Per layer, the mean (forward, backward) seconds of whole-model passes."""
    runs = [
        _chained_pass(layers, inputs, targets, loss, clock)
        for _ in range(config.warmup + config.repeats)
    ]
    timed = runs[config.warmup :]
    return [
        (
            statistics.fmean(run[i][0] for run in timed),
            statistics.fmean(run[i][1] for run in timed),
        )
        for i in range(len(layers))
    ]


def _chained_pass(
    layers: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss: Callable,
    clock: _Clock,
) -> list[tuple[float, float]]:
    """One forward and backward of the layers as one graph: per layer (forward_s, backward_s)."""
    last = len(layers) - 1
    ready: list[object] = [None] * last  # stamp when layer i's output gradient is complete
    clock.sync()
    forward = [clock.stamp()]
    x = inputs
    for index, layer in enumerate(layers):
        x = layer(x)
        if index < last:
            x.register_hook(lambda grad, i=index: ready.__setitem__(i, clock.stamp()))
        else:
            x = loss(x, targets)
        forward.append(clock.stamp())
    x.backward()
    done = clock.stamp()
    # layer i's backward runs from its output's gradient (the loss for the last) to its input's
    starts = ready + [forward[-1]]
    ends = [done] + ready
    return [
        (clock.between(forward[i], forward[i + 1]), clock.between(starts[i], ends[i]))
        for i in range(len(layers))
    ]


def _runner(
    layer: nn.Module, x: torch.Tensor, targets: torch.Tensor | None, loss: Callable
) -> Callable[[], tuple[torch.Tensor, torch.Tensor | None]]:
    """A forward of ``layer`` as in training: returns (output, gradient to start backward from)."""
    if x.is_floating_point():
        x = x.detach().requires_grad_(True)  # a received activation: its gradient is sent back

    def run() -> tuple[torch.Tensor, torch.Tensor | None]:
        out = layer(x)
        if targets is not None:
            return loss(out, targets), None
        return out, torch.ones_like(out)

    return run


def _pass_seconds(
    run: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
    config: ProfilerConfig,
    clock: _Clock,
) -> tuple[float, float]:
    """Mean (forward, backward) seconds after the warm-up runs."""
    timed = [_one_pass(run, clock) for _ in range(config.warmup + config.repeats)]
    forwards, backwards = zip(*timed[config.warmup :], strict=True)
    return statistics.fmean(forwards), statistics.fmean(backwards)


def _one_pass(
    run: Callable[[], tuple[torch.Tensor, torch.Tensor | None]], clock: _Clock
) -> tuple[float, float]:
    holder: list = []
    forward_s = clock.seconds(lambda: holder.append(run()))
    out, grad = holder[0]
    backward_s = clock.seconds(lambda: torch.autograd.backward(out, grad))
    return forward_s, backward_s


def _kept_bytes(run: Callable[[], tuple], layer: nn.Module) -> int:
    """Bytes autograd saves for backward during one forward, each storage once, weights excluded."""
    weights = {local(p).untyped_storage().data_ptr() for p in layer.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = local(tensor).untyped_storage()  # a DTensor's: its shard's
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        held = run()  # kept alive until counted so no storage address is reused meanwhile
    total = sum(storages.values())
    del held
    return total


def _make_optimizer(params: list[nn.Parameter], name: str) -> StageOptimizer:
    """The update a stage's optimizer runs (runtime/optim.py), with torch's default rates."""
    momentum = 0.9 if name == "sgd" else 0.0
    weight_decay = 1e-2 if name == "adamw" else 0.0
    return StageOptimizer(
        params, OptimizerSettings(kind=name, lr=1e-3, weight_decay=weight_decay, momentum=momentum)
    )


def _update_seconds(
    owned: Sequence[list[nn.Parameter]], config: ProfilerConfig, clock: _Clock
) -> list[float]:
    """Per layer, the mean seconds of one optimizer step over its parameters (copies, so the
    model is untouched). Each timed round steps every layer in order, as a stage's optimizer
    walks its parameters: a layer's state is then out of cache as it is in training (timing one
    layer's step over and over reads it warm, ~30% faster for gpt-mini on this machine)."""
    optimizers = []
    for params in owned:
        # the worker's shards, as plain tensors: what the runtime's optimizer steps
        copies = [nn.Parameter(local(p).detach().clone()) for p in params]
        for copy in copies:
            copy.grad = torch.randn_like(copy) * 1e-3
        optimizers.append(_make_optimizer(copies, config.optimizer) if copies else None)
    rounds = []
    for _ in range(config.warmup + config.repeats):
        rounds.append([clock.seconds(o.step) if o is not None else 0.0 for o in optimizers])
    timed = rounds[config.warmup :]
    return [statistics.fmean(r[i] for r in timed) for i in range(len(owned))]


if __name__ == "__main__":  # a member of profile_tensor_parallel's group
    import sys

    # through the module's own name, so what it pickles names runtime.profiler, not __main__
    from runtime.profiler import _tp_member as member

    member(sys.argv[1], int(sys.argv[2]))
