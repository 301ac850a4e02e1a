"""``profile: auto`` on a real cloud: the model timed on the job's first node of a GPU type.

Three parts: ``NodeProfiles`` (which GPU types are still to measure, what was measured: the
planner lays it over the estimate; world.py's MarketPlans holds one), ``Profiling`` (the driver's
step before its workers start: machine.py) and ``measure_on_node`` (the Ray task).

No formula gives a GPU's times as well as the GPU does (BENCHMARKS.md: on an H100 the analytic
estimate is 127-151% off where a measured profile lands within 2%). So before the workers start
on a GPU type the job has not measured, the driver runs the profiler (runtime/profiler.py) as a
Ray task on one of its nodes of that type, on the node's GPU (its CPU slot where the node has
none), and plans again with those times laid over the estimate (machine.py). The task takes the
resources a worker would (``gpu:<type>`` and ``infra:<place>``), before the workers do.
"""

from __future__ import annotations

from orchestrator.driver.contract import Choice, WorkersLost
from orchestrator.plan import Plan
from orchestrator.profiles.measured import measured_profile
from orchestrator.profiles.profile import ModelProfile, overlaid
from orchestrator.recipe.models import model_label, model_source, spec_of
from orchestrator.recipe.schema import Recipe

MEASURE_TIMEOUT_S = 900.0  # a model's import and build on a fresh node, then the timing


def measures_on_nodes(recipe: Recipe) -> bool:
    """Whether the driver measures the model on its first node of each GPU type it rents:
    ``profile: auto`` on a real cloud (the local and emulated clouds' CPU slots are measured on
    the submitting machine: job.py), for a model the profiler times as it trains (fp32; a
    user's module model names a measured profile there)."""
    return (
        recipe.model.profile == "auto"
        and recipe.provider != "local"
        and recipe.training.precision == "fp32"
        and spec_of(recipe.model).family in ("gpt", "custom")
    )


class NodeProfiles:
    """The GPU types a job has measured on its own nodes, and what they measured."""

    def __init__(self, recipe: Recipe) -> None:
        self.measuring = measures_on_nodes(recipe)
        self.measured: ModelProfile | None = None  # laid over the estimate by the planner
        self._tried: set[str] = set()

    def unmeasured(self, plan: Plan) -> tuple[str, ...]:
        """The GPU types of ``plan`` to measure on the job's nodes before training on them."""
        if not self.measuring:
            return ()
        return tuple(sorted({r.gpu for s in plan.stages for r in s.replicas} - self._tried))

    def learn(self, gpu: str, profile: ModelProfile | None) -> None:
        """``gpu``'s measured profile (None: its measurement failed; the estimate stays)."""
        self._tried.add(gpu)
        if profile is not None:
            self.measured = profile if self.measured is None else overlaid(self.measured, profile)


class Profiling:
    """A mixin of ``Driver`` (machine.py): the step between launching a plan's nodes and
    starting its workers, when some GPU type of the plan is still to be measured."""

    def _measure(self, choice: Choice):
        """Time the model on one node of each GPU type the plan has not measured, so that the
        driver plans again on those times (the nodes that fit the new plan are kept, the rest
        let go: ``_launch``); None, or the phase a lost node leads to."""
        for gpu in self.plans.unmeasured(choice.plan):
            infra = next(r.infra for r in self.session.nodes.values() if r.gpu == gpu)
            try:
                profile = self.trainer.measure(gpu, infra)
            except WorkersLost as lost:
                return self._lost(str(lost))
            except Exception as error:  # noqa: BLE001 - any failure: plan on the estimate
                self.plans.learn(gpu, None)
                self._log(
                    "profile_failed",
                    "plan on the estimate",
                    f"measuring {gpu} in {infra} failed: {type(error).__name__}: {error}",
                )
                continue
            self.plans.learn(gpu, profile)
            self._log("profiled", "plan again on the measured times", f"{gpu} in {infra}")
        return None


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
