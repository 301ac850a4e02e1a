"""Run one job of a recipe: its folder, its lock, its state, then its world (local.py: the local
simulated cloud) with the driver (assembly.py, machine.py) on it. Used by ``python -m
orchestrator submit`` and the notebook API.

A job's folder, ``<jobs_dir>/<job>/`` (``jobs_home()``: ``~/.orchestrator/jobs`` by default): ``state.json`` (state.py), ``events.jsonl`` (events.py),
``metrics.jsonl`` (one line per committed step: time, step, loss, samples/s over the step, dollars
spent, egress bytes, nodes held), ``profile-<model>.json`` (the model timed on this machine),
``stop.request`` while a stop is asked for, ``driver.lock`` (lock.py: held by the process that
runs the job), ``checkpoint.key`` (the random key that signs the job's checkpoint manifests,
readable by its owner only) and ``driver.log`` (the driver's log: whole errors and tracebacks).

The folder is always inside the jobs home: the job's name is a slug (orchestrator/names.py).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.driver.actor import DriverSpec
from orchestrator.driver.lock import JobLock
from orchestrator.driver.machine import Choice, StepResult
from orchestrator.driver.state import JobState, StateStore
from orchestrator.errors import UserError
from orchestrator.names import default_job_name, job_name_problem
from orchestrator.recipe import load_recipe
from orchestrator.recipe.schema import Recipe

# the first one set names the home; the short name is what users try first
HOME_VARIABLES = ("GEO_ORCHESTRATOR_HOME", "ORCHESTRATOR_HOME")


def ask_to_stop(folder: Path) -> None:
    """Ask the job's driver to checkpoint after its current step and free its nodes (it reads
    the request at each step: assembly.py)."""
    (folder / STOP_FILE).write_text("stop\n")


def jobs_home() -> Path:
    """Where jobs live unless ``--jobs-dir`` says otherwise: ``$GEO_ORCHESTRATOR_HOME/jobs`` (or
    ``$ORCHESTRATOR_HOME/jobs``), else ``~/.orchestrator/jobs``: one place per user, so
    ``status``, ``logs``, ``stop`` and ``down`` find a job from any folder and any shell."""
    home = next((os.environ[name] for name in HOME_VARIABLES if os.environ.get(name)), None)
    return (Path(home) if home else Path.home() / ".orchestrator") / "jobs"


JOBS_DIR = jobs_home()
STOP_FILE = "stop.request"
HOSTED = ("aws", "gcp", "azure")  # providers whose own VMs host a job's controller (hosts.py)
KEY_FILE = "checkpoint.key"
LOG_FILE = "driver.log"


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    jobs_dir: Path = JOBS_DIR
    preempt_at: tuple[int, ...] = ()  # added to the recipe's local_cloud.preempt_at_steps
    # added to the recipe's local_cloud.preempt_location_at_steps
    preempt_location_at: tuple[int, ...] = ()
    # added to the recipe's local_cloud.preempt_driver_at_steps
    preempt_driver_at: tuple[int, ...] = ()
    lose_at: tuple[int, ...] = ()  # steps after which the market takes a node without notice
    notice_s: float | None = None  # None: the recipe's local_cloud.notice_s
    on_step: Callable[[JobState, StepResult], None] | None = None
    # called with the job's folder once it is known, before anything is written there (the CLI
    # follows its event log and copies its output there)
    on_folder: Callable[[Path], None] | None = None
    # start the job again from step 0 even if it has state (its checkpoints are then unused)
    from_scratch: bool = False
    vms: str | None = None  # None: the recipe's local_cloud.vms
    # the local cloud's head runs Ray's dashboard (its HTTP API: ray list actors); False: a head
    # without it, a couple of CPU seconds quicker to start and nothing bound to port 8265
    dashboard: bool = True
    # a cloud provider's recipe on its emulation (driver/cloud.py): moto's server for AWS, its
    # instances booted as namespace VMs
    emulate: bool = False
    # the emulated cloud's refusals: (zone or region, EC2 error code), e.g. no capacity there
    emulated_refusals: tuple[tuple[str, str], ...] = ()
    # the plan to run (submit --plan FILE) instead of the planner's first choice
    plan_file: Path | None = None
    # shown the first plan and the steps left before anything is rented: go on (True) or not
    confirm: Callable[[Choice, int], bool] | None = None
    # emulate: the job's controller (Ray head, driver) in a VM of the standing emulated cloud
    # (standing.py, controller.py), which goes on when this process goes; False: in this process
    controller_vm: bool = False


@dataclass(frozen=True)
class RunResult:
    state: JobState
    folder: Path
    elapsed_s: float
    choice: Choice | None  # the plan it ended on


def job_folder(recipe: Recipe, recipe_path: Path, jobs_dir: Path) -> Path:
    """``<jobs_dir>/<name>``, always inside ``jobs_dir`` (UserError otherwise)."""
    name = recipe.name or default_job_name(recipe_path)
    problem = job_name_problem(name)
    home = Path(jobs_dir).resolve()
    if problem is None and (home / name).resolve().parent != home:
        problem = f"{home / name} is a link out of the jobs folder {home}"
    if problem is not None:
        raise UserError(
            problem,
            file=str(recipe_path),
            field="name",
            fix="name the job with letters, digits, '.', '_' or '-' (at most 64)",
        )
    return home / name


def signing_key(folder: Path) -> bytes:
    """The job's checkpoint key (made at its first submit; its owner alone may read it)."""
    path = folder / KEY_FILE
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return bytes.fromhex(path.read_text(encoding="ascii").strip())
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return bytes.fromhex(path.read_text(encoding="ascii").strip())


def run_job(recipe_path: Path, catalog: Catalog, options: RunOptions) -> RunResult:
    """Run (or resume) the job of ``recipe_path`` to its end; raise UserError for bad input.

    This process owns the local cloud (its market and Ray nodes) and serves its API; the driver
    runs as a Ray actor on a controller node of its own (driver/actor.py)."""
    recipe = load_recipe(recipe_path, catalog=catalog)
    if recipe.provider == "local" and options.emulate:
        raise UserError(
            "--emulate emulates a cloud provider; this recipe runs on the local simulated cloud",
            file=str(recipe_path),
            field="provider",
            fix="drop --emulate, or write provider: aws",
        )
    if recipe.provider != "local" and not options.emulate:
        if options.preempt_at or options.preempt_location_at or options.lose_at:
            raise UserError(
                "--preempt-at, --preempt-location-at and --lose-at are the emulated cloud's own "
                f"decisions: {recipe.provider} itself takes no such orders",
                file=str(recipe_path),
                fix="add --emulate, or drop them",
            )
        _check_credentials(recipe.provider, recipe_path)
        if recipe.provider not in HOSTED:
            raise UserError(
                f"submit runs a job's controller on {', '.join(HOSTED)} itself, not on "
                f"{recipe.provider} (its controller needs a bucket and an identity of one cloud)",
                file=str(recipe_path),
                field="provider",
                fix=f"write provider: {', '.join(HOSTED)} (the same GPUs through that cloud's own "
                f"API), or plan and simulate for {recipe.provider}",
            )
    if options.plan_file is not None and recipe.provider != "local":
        raise UserError(
            f"--plan runs a given plan on the local cloud; this recipe's provider is "
            f"{recipe.provider}",
            file=str(recipe_path),
            field="provider",
            fix="drop --plan (the driver plans on the provider's market), or write provider: local",
        )
    folder = job_folder(recipe, recipe_path, options.jobs_dir)
    if recipe.provider != "local" and (options.controller_vm or not options.emulate):
        from orchestrator.driver.remote import run_with_controller

        if options.on_folder is not None:
            options.on_folder(folder)
        _confirm_hosted(recipe, recipe_path, folder, options, catalog)
        return run_with_controller(recipe, recipe_path, folder, options)
    with JobLock.acquire(folder, job=folder.name):  # one running driver per job
        return _run_locked(recipe, recipe_path, folder, options, catalog)


def _run_locked(
    recipe: Recipe, recipe_path: Path, folder: Path, options: RunOptions, catalog: Catalog
) -> RunResult:
    if options.on_folder is not None:
        options.on_folder(folder)
    given = None
    if not options.emulate:  # the local cloud: its plan and price before anything is rented
        from orchestrator.driver.local import first_choice

        recipe = profiled(recipe, recipe_path, folder)  # prepare finds it profiled
        choice = first_choice(recipe, recipe_path, catalog, plan_file=options.plan_file)
        steps_left = recipe.training.steps - _resumed_step(folder, options.from_scratch)
        if options.confirm is not None and not options.confirm(choice, steps_left):
            raise NotConfirmed(choice, folder)
        given = choice.plan.to_dict()
    archive_ended_run(folder, from_scratch=options.from_scratch)
    recipe, spec = prepare(recipe, recipe_path, folder, options)
    spec = dataclasses.replace(spec, given_plan=given)
    started = time.monotonic()
    world = {
        "folder": folder,
        "recipe_path": recipe_path,
        "notice_s": options.notice_s,
        "on_step": options.on_step,
    }
    if options.emulate:
        from orchestrator.driver.cloud import run_on_emulated_cloud

        final, choice = run_on_emulated_cloud(
            spec, **world, refusals=dict(options.emulated_refusals)
        )
    else:
        from orchestrator.driver.local import run_on_local_cloud

        final, choice = run_on_local_cloud(
            spec, **world, vms=options.vms, dashboard=options.dashboard
        )
    return RunResult(final, folder, time.monotonic() - started, choice)


def prepare(
    recipe: Recipe, recipe_path: Path, folder: Path, options: RunOptions
) -> tuple[Recipe, DriverSpec]:
    """Ready the job's folder for a driver (with the job's lock held): its profile, its signing
    key, its state (new, resumed, or planned again after a stop); the recipe as the driver
    reads it and the driver's spec."""
    if recipe.provider == "local" or options.emulate:
        recipe = profiled(recipe, recipe_path, folder)
    recipe = absolute_paths(recipe)
    (folder / STOP_FILE).unlink(missing_ok=True)  # a stop asked of an earlier run
    signing_key(folder)  # made now, in the submitting user's folder, with its owner's rights
    store = StateStore(folder)
    store.save(
        _state(store, folder.name, recipe_path, from_scratch=options.from_scratch).evolve(
            steps_total=recipe.training.steps, global_batch_size=recipe.training.global_batch_size
        )
    )
    local = recipe.local_cloud
    spec = DriverSpec(
        recipe=recipe,
        recipe_path=str(Path(recipe_path).resolve()),
        jobs_dir=str(folder.parent),
        gateway=f"local-cloud-{folder.name}",
        preempt_at=(*options.preempt_at, *local.preempt_at_steps),
        preempt_location_at=(*options.preempt_location_at, *local.preempt_location_at_steps),
        preempt_driver_at=(*options.preempt_driver_at, *local.preempt_driver_at_steps),
        lose_at=options.lose_at,
    )
    return recipe, spec


RUN_FILES = ("events.jsonl", "metrics.jsonl", "output.log", "driver.log", "ray-logs")


def archive_ended_run(folder: Path, *, from_scratch: bool) -> Path | None:
    """Before a new run of a job that finished (or one started again ``from_scratch``): its
    earlier run's logs move to ``runs/<run id>/``, so the new run's event log, metrics and
    output are its own. Returns where they went (None: no new run, or nothing to move)."""
    store = StateStore(folder)
    if not store.exists():
        return None
    try:
        state = store.load().state
    except UserError:
        return None  # an unreadable state: _state says so
    if state.phase != "done" and not from_scratch:
        return None  # resumed: the same run goes on in the same logs
    run = state.run_id or f"{state.job}-{int(state.started_at_s)}"
    target = folder / "runs" / run
    moved = [name for name in RUN_FILES if (folder / name).exists() or (folder / name).is_symlink()]
    if not moved:
        return None
    target.mkdir(parents=True, exist_ok=True)
    for name in moved:
        (folder / name).rename(target / name)
    print(
        f"job {state.job}: its run {run} ended {state.phase} at step {state.step}; this submit "
        f"starts a new run (the earlier one's logs: {target})",
        file=sys.stderr,
    )
    return target


def profiled(recipe: Recipe, recipe_path: Path, folder: Path) -> Recipe:
    """The recipe with its profile measured on this machine (``profile: auto``; kept in the job's
    folder): a local or emulated cloud's worker is a CPU slot standing in for a GPU, or this
    machine's GPU, so this machine's times are its own (a real cloud's GPUs are not this
    machine's: the recipe's profile mode holds there)."""
    from orchestrator.driver.local import host_gpus, measured_here

    local_gpu = recipe.provider == "local" and host_gpus(recipe.local_cloud.devices) > 0
    device = "cuda" if local_gpu else "cpu"
    return measured_here(recipe, folder, recipe_path.parent, device=device)


HOSTED_NOTE = (
    "at the catalog's published prices; the controller plans again on the live market before it "
    "rents"
)


def _confirm_hosted(
    recipe: Recipe, recipe_path: Path, folder: Path, options: RunOptions, catalog: Catalog
) -> None:
    """A job whose controller runs in a VM of the provider: its plan and price before that VM
    boots (NotConfirmed: nothing started). The planner's best on the catalog's market of the
    provider (its published prices; the controller's own plan, on the live market, may differ
    and the note says so). A job that runs there already is followed, not asked about again."""
    from orchestrator.driver.market_plans import MarketPlans
    from orchestrator.driver.state import FINAL_PHASES

    if options.confirm is None:
        return
    store = StateStore(folder)
    if store.exists() and not options.from_scratch:
        try:
            phase = store.load().state.phase
        except UserError:
            phase = None  # prepare says what is wrong with it
        if phase is not None and phase not in FINAL_PHASES:
            return  # running (or launching) in its controller VM: submit follows it
    market = catalog.market(recipe.provider, recipe.market_file())
    choice = MarketPlans(recipe, catalog, None).choose_on(market)
    choice = dataclasses.replace(choice, note="; ".join(filter(None, (choice.note, HOSTED_NOTE))))
    steps_left = recipe.training.steps - _resumed_step(folder, options.from_scratch)
    if not options.confirm(choice, steps_left):
        raise NotConfirmed(choice, folder)


def _resumed_step(folder: Path, from_scratch: bool) -> int:
    """The step a submit goes on from: the saved state's, when it resumes the job."""
    store = StateStore(folder)
    if from_scratch or not store.exists():
        return 0
    try:
        state = store.load().state
    except UserError:
        return 0  # prepare says what is wrong with it
    return 0 if state.phase == "done" else state.step


class NotConfirmed(Exception):
    """The plan shown before renting was not confirmed (``--dry-run``, or a "no"): nothing was
    rented and the job's state is as it was."""

    def __init__(self, choice: Choice, folder: Path) -> None:
        super().__init__("not confirmed")
        self.choice, self.folder = choice, folder


def _check_credentials(provider: str, recipe_path: Path) -> None:
    """A provider without credentials is named first (its SDK's chain, what it looked for)."""
    from provisioners.base import CredentialsMissing, SdkMissing
    from provisioners.registry import create

    try:
        create(provider).check_credentials()
    except (CredentialsMissing, SdkMissing) as error:
        raise UserError(
            f"{provider}: {error.message}", file=str(recipe_path), field="provider", fix=error.fix
        ) from None


def absolute_paths(recipe: Recipe) -> Recipe:
    """The driver actor runs in another process and folder: its paths must not be relative."""
    from orchestrator.driver.world import checkpoint_url

    checkpointing = dataclasses.replace(recipe.checkpointing, path=checkpoint_url(recipe))
    return dataclasses.replace(recipe, checkpointing=checkpointing)


def _state(store: StateStore, job: str, recipe_path: Path, *, from_scratch: bool) -> JobState:
    if store.exists() and from_scratch:
        print(f"starting job {job} again from step 0 (--from-scratch)", file=sys.stderr)
    elif store.exists():
        loaded = store.load()
        for problem in loaded.problems:
            print(f"note: job state {problem}; using {loaded.source.name}", file=sys.stderr)
        if loaded.state.phase != "done":
            print(f"resuming job {job} from its newest checkpoint", file=sys.stderr)
            if loaded.state.phase in ("stopped", "failed"):
                # plan again and restore the newest checkpoint, with a fresh retry budget
                return loaded.state.evolve(
                    phase="recover",
                    failure=None,
                    attempts=0,
                    attempts_since_s=None,
                    resumed_from=loaded.state.phase,
                )
            return loaded.state
    run_id = f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    return JobState(job=job, recipe_path=str(recipe_path), phase="plan", run_id=run_id)
