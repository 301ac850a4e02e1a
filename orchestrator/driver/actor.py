"""The driver as a named, detached Ray actor that Ray restarts when it dies.

``python -m orchestrator submit`` starts the local cloud, then the job's driver as the actor
``driver-<job>`` (namespace ``geo-orchestrator``, ``max_restarts=-1``) on a controller node of its
own (resource ``controller``, which the head also carries: a restart lands there, never on a
training node), and follows it. The actor builds the driver (assembly.py) from the job's folder each time it starts:
when its node is preempted, Ray starts it again on another node, it loads the persisted state
(state.py) and takes the job over (machine.py: ``Driver._restarted``). The actor reaches the local
cloud through its gateway (provisioners/local/gateway.py), as a real deployment reaches a cloud's
API; its workers are detached Ray actors that outlive it (runtime/group.py).

``follow`` is the submitting side: it waits on the actor's ``progress`` (a condition the driver's
thread signals at every committed step; no polling by sleeps), shows each new step and returns the
final state. A ``progress`` call cut off by the actor's death is retried by Ray once the actor is
back (``max_task_retries=-1``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.driver.machine import Choice, StepResult
from orchestrator.driver.state import JobState
from orchestrator.errors import UserError
from orchestrator.recipe.schema import Recipe

NAMESPACE = "geo-orchestrator"
PROGRESS_WAIT_S = 30.0  # one progress call returns after this long even without a new step


class DriverCrashed(RuntimeError):
    """The driver stopped on an unexpected error (a bug, an unwritable job folder): one line
    saying what, and where the traceback is (the job's driver.log)."""


@dataclass(frozen=True, kw_only=True)
class DriverSpec:
    """What the actor needs to build its driver, on every start (Ray passes it again)."""

    recipe: Recipe  # with its profile measured on this machine (local.py)
    recipe_path: str
    jobs_dir: str
    gateway: str  # the local cloud's gateway actor
    preempt_at: tuple[int, ...] = ()
    preempt_location_at: tuple[int, ...] = ()
    preempt_driver_at: tuple[int, ...] = ()
    lose_at: tuple[int, ...] = ()  # nodes taken without notice
    migration_s: float = 15.0  # a move's pause on this world until one is measured
    launch_timeout_s: float = 600.0  # the provider's launch budget (Provisioner.launch_timeout_s)
    # a cloud provider's world (driver/cloud.py CloudSpec): the actor builds the provider's adapter
    # itself; None: the local cloud, reached through the gateway
    cloud: object | None = None
    # the plan to start on (its to_dict): the one shown before renting, or submit --plan's; the
    # driver keeps to it while the market can hold it (market_plans.py)
    given_plan: dict | None = None


class DriverActor:
    """Runs the driver in a thread; ``progress`` reports on it."""

    def __init__(self, spec: DriverSpec) -> None:
        import ray

        from orchestrator.driver.assembly import build_driver

        self._changed = threading.Condition()
        self._finished, self._error = False, None
        self._node = ray.get_runtime_context().get_node_id()
        self._log_path = _log_to_file(spec)
        self.driver = build_driver(spec, own_node=self._node, on_step=self._stepped)
        self._thread = threading.Thread(target=self._run, name="driver", daemon=True)
        self._thread.start()

    def _stepped(self, state: JobState, result: StepResult) -> None:
        with self._changed:
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            self.driver.run()
        except UserError as error:  # bad input: reported to the submitter, which exits 2
            self._error = error
        except Exception as error:  # a bug: one line to the submitter, the traceback to the log
            from orchestrator.driver.failures import describe

            logging.getLogger(__name__).error("the driver stopped", exc_info=error)
            self._error = DriverCrashed(f"{describe(error)} (traceback in {self._log_path})")
        finally:
            with self._changed:
                self._finished = True
                self._changed.notify_all()

    def progress(self, after_version: int, timeout_s: float = PROGRESS_WAIT_S) -> dict:
        """The job's state once it is newer than ``after_version`` (or the job ended, or
        ``timeout_s`` passed): its state, whether the driver finished, its error, its plan."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._finished or self.driver.state.version > after_version, timeout_s
            )
            choice, state = self.driver.session.choice, self.driver.state
            if not self._finished:
                # a follower shows the newest loss; the whole list (one per step) goes once, at
                # the end: sent with every step's report, it would cost O(steps) a step
                state = state.evolve(losses=state.losses[-1:])
            return {
                "state": state.to_dict(),
                "finished": self._finished,
                "error": self._error,
                "choice": None if choice is None else choice.to_dict(),
                "node": self._node,
            }


def _log_to_file(spec: DriverSpec) -> Path:
    """The driver's log (whole errors, the workers' tracebacks) in the job's folder."""
    from orchestrator.driver.job import LOG_FILE, job_folder

    path = job_folder(spec.recipe, Path(spec.recipe_path), Path(spec.jobs_dir)) / LOG_FILE
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("orchestrator", "runtime", "provisioners"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return path


def start_driver(
    spec: DriverSpec, *, job: str, node: str | None, env: dict[str, str] | None = None
):
    """The job's driver actor, on ``node`` while that node lives (soft affinity: a restart goes
    wherever Ray finds room); ``env``: its environment's additions (a cloud SDK's credentials
    on an emulated cloud)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node is not None:
        # a node just registered may not take work yet, and soft affinity would then go to
        # another node: wait until a task runs there
        ready = ray.remote(_ready).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        )
        ray.get(ready.remote(), timeout=60)
    strategy = None if node is None else NodeAffinitySchedulingStrategy(node_id=node, soft=True)
    remote = ray.remote(DriverActor).options(
        name=f"driver-{job}",
        namespace=NAMESPACE,
        lifetime="detached",
        max_restarts=-1,
        max_task_retries=-1,
        max_concurrency=4,  # progress calls beside the driver's own thread
        num_cpus=0,
        # controller nodes and the head carry it: a restart after the controller node's loss
        # lands on the head, never on a node that trains (whose loss would take both)
        resources={"controller": 0.001},
        scheduling_strategy=strategy,
        **({"runtime_env": {"env_vars": env}} if env else {}),
    )
    return remote.remote(spec)


def _ready() -> None:
    """Runs on a node to show it takes work."""


def follow(
    actor, on_step: Callable[[JobState, StepResult], None] | None
) -> tuple[JobState, Choice | None]:
    """Wait for the job to end, calling ``on_step`` for each newly committed step seen; the final
    state and plan. Raises the driver's UserError."""
    import ray

    version, step = -1, -1
    while True:
        try:
            report = ray.get(actor.progress.remote(version))
        except ray.exceptions.RayActorError as error:
            # Ray restarts a driver whose process died; this one cannot come back (its start
            # failed, e.g. on an unreadable job state): say why in one line
            from orchestrator.driver.failures import describe, inner

            if isinstance(inner(error), UserError):
                raise inner(error) from None
            raise DriverCrashed(f"the driver actor is gone: {describe(error)}") from None
        state = JobState.from_dict(report["state"])
        version = state.version
        if on_step is not None and state.step > step and state.losses:
            on_step(state, StepResult(loss=state.losses[-1]))
        step = max(step, state.step)
        if report["finished"]:
            if report["error"] is not None:
                raise report["error"]
            choice = report["choice"]
            return state, None if choice is None else Choice.from_dict(choice)
