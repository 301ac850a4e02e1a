"""``profile: auto`` on a real cloud: the model timed on the job's first node of a GPU type.

No formula gives a GPU's times as well as the GPU does (BENCHMARKS.md: on an H100 the analytic
estimate is 127-151% off where a measured profile lands within 2%). So before the workers start
on a GPU type the job has not measured, the driver runs the profiler (runtime/profiler.py) as a
Ray task on one of its nodes of that type, on the node's GPU (its CPU slot where the node has
none), and plans again with those times laid over the estimate (machine.py). The task takes the
resources a worker would (``gpu:<type>`` and ``infra:<place>``), before the workers do.
"""

from __future__ import annotations

from orchestrator.profiles.measured import measured_profile
from orchestrator.profiles.profile import ModelProfile
from orchestrator.recipe.models import model_label, model_source, spec_of
from orchestrator.recipe.schema import Recipe

MEASURE_TIMEOUT_S = 900.0  # a model's import and build on a fresh node, then the timing


def measure_on_node(recipe: Recipe, *, gpu: str, infra: str, timeout_s: float) -> ModelProfile:
    """The recipe's model measured on a node of ``gpu`` in ``infra`` (Ray must be connected);
    raises what the task raised, or ``GetTimeoutError``."""
    import ray

    training = recipe.training
    on_gpu = ray.cluster_resources().get("GPU", 0) > 0
    task = ray.remote(_measure).options(
        num_cpus=1,
        num_gpus=1 if on_gpu else 0,
        resources={f"gpu:{gpu}": 1, f"infra:{infra}": 1},
        max_retries=0,
    )
    measurement = ray.get(
        task.remote(
            model_label(recipe.model),
            model_source(recipe.model),
            tuple(training.microbatch_sizes),
            training.optimizer.name,
            training.seed,
        ),
        timeout=timeout_s,
    )
    return measured_profile(
        measurement, gpu=gpu, precision=training.precision, spec=spec_of(recipe.model)
    )


def _measure(label, source, microbatch_sizes, optimizer, seed):
    """On the node: the profiler on its GPU (its CPU slot, one thread, where it has none)."""
    import torch

    from runtime.models.protocol import build_model
    from runtime.profiler import ProfilerConfig, profile_model

    cuda = torch.cuda.is_available()
    config = ProfilerConfig(
        microbatch_sizes=microbatch_sizes,
        optimizer=optimizer,
        seed=seed,
        device="cuda" if cuda else "cpu",
        threads=None if cuda else 1,
    )
    return profile_model(label, build_model(source, seed=seed), config)
