"""What the driver (machine.py) talks to and in: its collaborators' protocols, the plan choice
and node requests it holds, the result of a step, its typed errors and its configuration.

The collaborators are implemented for real in world.py and by hand-written fakes in
tests/unit/test_driver_machine.py; the machine runs the same against either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Protocol

from orchestrator.plan import Plan, plan_from_dict


class WorkersLost(Exception):
    """A training step failed because workers (or their nodes) are gone, or their links broke:
    a retry on the nodes left (or new ones) may succeed."""


class JobBroken(Exception):
    """The job's input or state is broken (a corrupt checkpoint store, a full disk, a bad value,
    a bug, a diverged loss): a retry would fail the same way, so the driver stops with the cause.

    ``cause`` is one word for tables (failures.py: ``CAUSES``); ``message`` one line for people;
    ``fix`` what to do; ``step`` the committed step it happened after, where known."""

    def __init__(self, cause: str, message: str, *, fix: str, step: int | None = None) -> None:
        super().__init__(message)
        self.cause, self.message, self.fix, self.step = cause, message, fix, step

    def __reduce__(self):
        # sent between processes (the driver actor reports it to the submitter) with its fields
        return (_rebuild_broken, (self.cause, self.message, self.fix, self.step))


def _rebuild_broken(cause: str, message: str, fix: str, step: int | None) -> JobBroken:
    return JobBroken(cause, message, fix=fix, step=step)


class CapacityRefused(Exception):
    """A place could not give the nodes asked for (the provisioner's CapacityError or QuotaError)."""

    def __init__(self, infra: str, message: str, *, fix: str = "") -> None:
        super().__init__(message)
        self.infra, self.fix = infra, fix


@dataclass(frozen=True, kw_only=True)
class Request:
    """Nodes to launch in one place for a plan, with their price."""

    infra: str
    gpu: str
    count: int
    spot: bool
    usd_per_node_hour: float
    instance_type: str = ""  # the offer's; empty where the cloud picks
    gpus_per_node: int = 1  # the offer's


@dataclass(frozen=True, kw_only=True)
class Choice:
    plan: Plan
    summary: str  # e.g. "2 stages x 2 replicas: T4 in local/sim-us/sim-us-a (2), ..."
    requests: tuple[Request, ...]
    samples_per_s: float  # predicted
    usd_per_hour: float  # predicted, compute
    egress_usd_per_step: float = 0.0  # predicted
    note: str = ""  # how the choice departs from the recipe (e.g. a spread the market cannot give)

    @classmethod
    def from_dict(cls, document: dict) -> Choice:
        """The inverse of ``to_dict`` (the driver persists its choice so)."""
        return cls(
            **{
                **document,
                "plan": plan_from_dict(document["plan"]),
                "requests": tuple(Request(**r) for r in document["requests"]),
            }
        )

    def to_dict(self) -> dict:
        """JSON-ready: the plan in its own format."""
        document = {f.name: getattr(self, f.name) for f in fields(self)}
        document["plan"] = self.plan.to_dict()
        document["requests"] = [asdict(r) for r in self.requests]
        return document


@dataclass(frozen=True, kw_only=True)
class StepResult:
    loss: float
    egress_bytes: float = 0.0
    egress_usd: float = 0.0
    # per pipeline: its slowest stage's compute seconds per microbatch this step, and the
    # microbatches it runs per step (straggler.py); None / () where not measured
    pipeline_s: tuple[float, ...] | None = None
    pipeline_microbatches: tuple[int, ...] = ()
    grads_finite: bool = True  # False: some worker's summed gradient held a NaN or an inf
    # the data set's sample ids the step read, pipeline after pipeline (data.log_samples)
    sample_ids: tuple[int, ...] | None = None


class PlanSource(Protocol):
    def choose(
        self, *, excluded: frozenset[str], held: dict[str, int], held_only: bool = False
    ) -> Choice:
        """The best plan now; ``held``: nodes this job already holds per place (free to it);
        ``held_only``: on those nodes alone (no launch)."""

    def unmeasured(self, plan: Plan) -> tuple[str, ...]:
        """GPU types of ``plan`` whose times are to be measured on the job's nodes first."""

    def learn(self, gpu: str, profile) -> None:
        """``gpu``'s measured profile (None: the measurement failed; plan on the estimate)."""


class Cloud(Protocol):
    def launch(self, request: Request, *, gang: str) -> list[str]: ...
    def terminate(self, node_ids: Sequence[str]) -> None: ...
    def alive(self, node_ids: Sequence[str]) -> set[str]: ...
    def poll_events(self, *, timeout_s: float = 0.0) -> list: ...


class Trainer(Protocol):
    def start(self, plan: Plan, *, restore_step: int | None, same_nodes: bool = False) -> int:
        """Start on ``plan`` from the checkpoint at ``restore_step`` (None: from scratch);
        return the step training resumes at (older than asked when that checkpoint is bad;
        ``unreadable`` then says why). Raises JobBroken when no checkpoint at or before
        ``restore_step`` can be read: the job never silently starts again from step 0.
        ``same_nodes``: each rank on the node it ran on last time (a re-balance)."""

    def check_restorable(self, restore_step: int | None) -> None:
        """JobBroken when no checkpoint at or before ``restore_step`` can be read: checked
        before anything is rented or started."""

    def unreadable(self) -> tuple[str, ...]:
        """Why the checkpoints newer than the last start's were skipped, one line each."""

    def step(self, step: int) -> StepResult: ...
    def checkpoint(self, step: int) -> None: ...
    def stop(self, *, restart: bool = False) -> None:
        """Stop training and free the workers; ``restart``: a start follows (a recovery, a plan
        switch, a re-balance), which may reuse those still healthy (``stop()`` frees them)."""

    def workers_name(self) -> str | None:
        """The running workers' name, by which a restarted driver finds them (None: none)."""

    def devices(self) -> str:
        """What the running workers compute on, one line ("" when not known)."""

    def attach(self, plan: Plan, *, workers: str) -> bool:
        """Take over the running workers ``workers`` of ``plan`` (a restarted driver); False, and
        what is left of them freed, when they are not all alive."""

    def sweep(self, *, keep: str | None) -> None:
        """Free every worker group of this job but ``keep`` (what an earlier driver left)."""

    def measure(self, gpu: str, infra: str):
        """The model's profile measured on a node of ``gpu`` in ``infra`` (before workers start
        there); raises when it cannot be."""

    def rescue(self, step: int) -> bool:
        """After a worker died: checkpoint the state after ``step`` committed steps from the
        workers still alive, when each stage has one holding it; False when some stage has none."""


@dataclass(frozen=True, kw_only=True)
class DriverConfig:
    steps: int
    checkpoint_every_steps: int
    budget_usd: float | None = None
    # recoveries in a row without new progress (a step beyond any committed before), and the
    # seconds since the first of them, before the job stops (the recipe's `recovery` section)
    max_attempts: int = 10
    max_attempts_s: float = 1800.0
    # the wait before the n-th attempt in a row (n >= 2): backoff_s * 2**(n-2), at most
    # max_backoff_s; the first retries at once (a preemption's recovery must not wait)
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    # plan switching: every this many steps, ask the market for the best plan now (None: never)
    replan_every_steps: int | None = None
    samples_per_step: int = 1  # the global batch
    goal: str = "max_throughput"  # what a switch must gain: time, or dollars with "min_cost"
    switch_margin: float = 2.0  # the gain must beat this many times the move's cost
    migration_s: float = 15.0  # a move's pause before one is measured (then: their median)
    # once training began, how long to wait for the market to offer a plan again (0: stop at once)
    capacity_wait_s: float = 0.0
    capacity_poll_s: float = 5.0  # each look waits this long for the provider's next event
    deadline_s: float | None = None  # the recipe's deadline, seconds after the job began
    # stragglers (straggler.py): the median of this many steps' speeds per pipeline decides
    # (None: never re-balance), when the best split's compute is this fraction shorter
    straggler_window_steps: int | None = 5
    straggler_min_gain: float = 0.1


def deadline_rate(*, samples_left: float, seconds_left: float) -> float:
    """Samples/s that finish ``samples_left`` in ``seconds_left``; past (or at) the deadline, what
    finishing in one more minute takes: as fast as the market allows."""
    return samples_left / max(seconds_left, 60.0)
