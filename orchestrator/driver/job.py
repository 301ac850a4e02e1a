"""Run one job of a recipe on the local simulated cloud: the driver (machine.py) with its real
collaborators (world.py), its folder (state, events, per-step metrics), and the seeded chaos of the
recipe's ``local_cloud`` section. Used by ``python -m orchestrator submit`` and the notebook API.

A job's folder, ``<jobs_dir>/<job>/``: ``state.json`` (state.py), ``events.jsonl`` (events.py),
``metrics.jsonl`` (one line per committed step: time, step, loss, samples/s over the step, dollars
spent, egress bytes, nodes held), ``profile-<model>.json`` (the model timed on this machine),
``stop.request`` while a stop is asked for, ``driver.lock`` (lock.py: held by the process that
runs the job), ``checkpoint.key`` (the random key that signs the job's checkpoint manifests,
readable by its owner only) and ``driver.log`` (the driver's log: whole errors and tracebacks).

The folder is always inside the jobs home: the job's name is a slug (orchestrator/names.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.driver.actor import NAMESPACE, DriverSpec, follow, start_driver
from orchestrator.driver.events import Event, EventLog
from orchestrator.driver.lock import JobLock
from orchestrator.driver.machine import Choice, Driver, DriverConfig, StepResult
from orchestrator.driver.state import JobState, StateStore
from orchestrator.errors import UserError
from orchestrator.names import default_job_name, job_name_problem
from orchestrator.recipe import load_recipe
from orchestrator.recipe.schema import Recipe

JOBS_DIR = Path(".orchestrator/jobs")
STOP_FILE = "stop.request"
KEY_FILE = "checkpoint.key"
LOG_FILE = "driver.log"
CAPACITY_WAIT_S = 300.0  # after a loss, how long to wait for the market to have room again
LOCATION_OUTAGE_S = 3600.0  # market seconds a location preempted as a whole offers nothing
METRICS_FILE = "metrics.jsonl"
# a move's pause on the local cloud until one is measured: a restart from a checkpoint took
# 4.6-6.9 s (median 5.1 s) in bench/recovery.py --path checkpoint
LOCAL_MIGRATION_S = 5.0


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
    # start the job again from step 0 even if it has state (its checkpoints are then unused)
    from_scratch: bool = False
    vms: str | None = None  # None: the recipe's local_cloud.vms


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
    if recipe.provider != "local":
        _check_credentials(recipe.provider, recipe_path)
        raise UserError(
            f"submit runs on the local simulated cloud in this version, not {recipe.provider}",
            file=str(recipe_path),
            field="provider",
            fix="write provider: local (plan and simulate work for every provider)",
        )
    folder = job_folder(recipe, recipe_path, options.jobs_dir)
    with JobLock.acquire(folder, job=folder.name):  # one running driver per job
        return _run_locked(recipe, recipe_path, folder, options)


def _run_locked(recipe: Recipe, recipe_path: Path, folder: Path, options: RunOptions) -> RunResult:
    recipe = _absolute_paths(_measured_here(recipe, folder))
    (folder / STOP_FILE).unlink(missing_ok=True)  # a stop asked of an earlier run
    signing_key(folder)  # made now, in the submitting user's folder, with its owner's rights
    if recipe.training.optimizer.grad_clip_norm is not None:
        print(
            "note: the runtime does not clip gradients yet: training runs without "
            f"grad_clip_norm {recipe.training.optimizer.grad_clip_norm} (write null to silence this)",
            file=sys.stderr,
        )
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
    from provisioners.local.provisioner import LocalProvisioner

    notice_s = options.notice_s if options.notice_s is not None else local.notice_s
    provisioner = LocalProvisioner(
        seed=recipe.training.seed,
        notice_s=notice_s,
        slow_nodes=local.slow_nodes,
        slowdown=local.slowdown,
        cluster=_local_vms(recipe, recipe_path, folder, options.vms or local.vms),
    )
    started = time.monotonic()
    try:
        final, choice = _run_on_local_cloud(provisioner, spec, folder.name, options)
    finally:
        provisioner.close()
    return RunResult(final, folder, time.monotonic() - started, choice)


def _local_vms(recipe: Recipe, recipe_path: Path, folder: Path, wanted: str):
    """The local cloud's VMs: network namespaces booted by the node bootstrap where this machine
    allows them (``auto``, ``namespaces``), else Ray nodes on this machine's network; says which."""
    from provisioners.local.cluster import LocalCluster

    if wanted != "processes":
        from provisioners.local import vms

        reason = vms.unsupported_reason()
        if reason is None and threading.current_thread() is not threading.main_thread():
            reason = "the job runs outside the main thread, which alone can enter a VM's network"
        if reason is None:
            print(
                "local cloud: each VM is a network namespace on a simulated internet, booted by "
                "the node bootstrap and joined over WireGuard",
                file=sys.stderr,
            )
            return vms.NamespaceCluster(
                job=folder.name, folder=folder / "vms", grace_s=recipe.recovery.controller_grace_s
            )
        if wanted == "namespaces":
            raise UserError(
                f"namespace VMs cannot run here: {reason}",
                file=str(recipe_path),
                field="local_cloud.vms",
                fix="run as root with the tools named, or write vms: processes",
            )
        print(f"local cloud: each VM is a process on this machine ({reason})", file=sys.stderr)
    else:
        print("local cloud: each VM is a process on this machine (vms: processes)", file=sys.stderr)
    return LocalCluster()


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


def _run_on_local_cloud(provisioner, spec: DriverSpec, job: str, options: RunOptions):
    """Start the cluster, serve the cloud's API to the driver actor and follow the job."""
    import ray

    from provisioners.local.gateway import serve, start_gateway

    stop, server, actor = threading.Event(), None, None
    try:
        ray.init(address=provisioner.address, log_to_driver=False, namespace=NAMESPACE)
        controller = provisioner.launch_controller(name=f"{job}-controller")
        gateway = start_gateway(spec.gateway)
        server = threading.Thread(
            target=serve, args=(provisioner, gateway, stop), name="local-cloud-api", daemon=True
        )
        server.start()
        actor = start_driver(spec, job=job, node=controller.node_id)
        return follow(actor, options.on_step)
    finally:
        if actor is not None:
            ray.kill(actor, no_restart=True)
        stop.set()
        if server is not None:
            server.join(timeout=10)
        if ray.is_initialized():
            ray.shutdown()


def _absolute_paths(recipe: Recipe) -> Recipe:
    """The driver actor runs in another process and folder: its paths must not be relative."""
    from orchestrator.driver.world import checkpoint_url

    checkpointing = dataclasses.replace(recipe.checkpointing, path=checkpoint_url(recipe))
    return dataclasses.replace(recipe, checkpointing=checkpointing)


def _measured_here(recipe: Recipe, folder: Path) -> Recipe:
    """On the local cloud a worker is a CPU slot standing in for a T4: with ``profile: auto``,
    time the model on this machine once (runtime/profiler.py; kept in the job's folder) so the
    plan's predictions are about this machine rather than a real T4."""
    from runtime.models.specs import model_spec

    spec = model_spec(recipe.model.name)
    if recipe.model.profile != "auto" or spec.family != "gpt":
        return recipe
    path = (folder / f"profile-{spec.name}.json").resolve()
    if not path.exists():
        from orchestrator.cli.profile_cmd import measured_profile
        from orchestrator.profiles.profile import profile_to_json
        from runtime.profiler import ProfilerConfig, profile_gpt

        config = ProfilerConfig(
            microbatch_sizes=recipe.training.microbatch_sizes,
            optimizer=recipe.training.optimizer.name,
            seed=recipe.training.seed,
        )
        measured = measured_profile(
            profile_gpt(spec, config), gpu="T4", precision=recipe.training.precision
        )
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile_to_json(measured, "T4"), indent=1))
        print(f"profiled {spec.name} on this machine: {path}", file=sys.stderr)
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, profile=str(path)))


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
                    phase="recover", failure=None, attempts=0, attempts_since_s=None
                )
            return loaded.state
    run_id = f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    return JobState(job=job, recipe_path=str(recipe_path), phase="plan", run_id=run_id)


def build_driver(
    spec: DriverSpec,
    *,
    own_node: str | None,
    on_step: Callable[[JobState, StepResult], None] | None = None,
) -> Driver:
    """The job's driver from its folder's state, talking to the local cloud through its gateway
    (called in the driver actor, on every start)."""
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.world import (
        MarketPlans,
        ProvisionerCloud,
        RuntimeTrainer,
        checkpoint_url,
    )
    from orchestrator.simulator import views_for
    from provisioners.local.gateway import RemoteProvisioner

    recipe, catalog = spec.recipe, default_catalog()
    store = StateStore(job_folder(recipe, Path(spec.recipe_path), Path(spec.jobs_dir)))
    state = store.load().state
    provisioner = RemoteProvisioner(spec.gateway)
    network = None
    if recipe.runtime.link_emulation:
        network = views_for(catalog, catalog.market("local"))[0]
    trainer = RuntimeTrainer(
        recipe=recipe,
        catalog=catalog,
        job=state.run_id or state.job,
        checkpoint_url=checkpoint_url(recipe),
        network=network,
        signing_key=signing_key(store.folder),
    )
    chaos = _ChaosSchedule(
        provisioner,
        nodes=set(spec.preempt_at),
        locations=set(spec.preempt_location_at),
        drivers=set(spec.preempt_driver_at),
        losses=set(spec.lose_at),
        own_node=own_node,
        done_steps=state.step,
        events=EventLog(store.folder / "events.jsonl"),
    )
    metrics = _Metrics(store.folder / METRICS_FILE, recipe.training.global_batch_size)
    gauges = DashboardMetrics(state.job)

    def stepped(current: JobState, result: StepResult) -> None:
        row = metrics.record(current, result)
        gauges.update(
            row, usd_per_hour=sum(r.usd_per_node_hour for r in driver.session.nodes.values())
        )
        if on_step is not None:
            on_step(current, result)
        chaos.after(current)

    driver = Driver(
        store=store,
        events=EventLog(store.folder / "events.jsonl"),
        plans=MarketPlans(
            recipe,
            catalog,
            provisioner,
            progress=lambda: (driver.state.step, time.time() - driver.state.started_at_s),
        ),
        cloud=ProvisionerCloud(provisioner),
        trainer=trainer,
        config=DriverConfig(
            steps=recipe.training.steps,
            checkpoint_every_steps=recipe.checkpointing.every_steps,
            budget_usd=recipe.objective.budget_usd,
            # look for a better plan at each periodic checkpoint (a move then loses nothing)
            replan_every_steps=recipe.checkpointing.every_steps,
            samples_per_step=recipe.training.global_batch_size,
            goal=recipe.objective.goal,
            capacity_wait_s=CAPACITY_WAIT_S,
            max_attempts=recipe.recovery.max_attempts,
            max_attempts_s=recipe.recovery.max_seconds,
            backoff_s=recipe.recovery.backoff_s,
            max_backoff_s=recipe.recovery.max_backoff_s,
            migration_s=LOCAL_MIGRATION_S,
            deadline_s=recipe.objective.deadline_h * 3600 if recipe.objective.deadline_h else None,
        ),
        state=state,
        on_step=stepped,
        stop_requested=(store.folder / STOP_FILE).exists,
        own_node=own_node,
    )
    return driver


class _ChaosSchedule:
    """The seeded chaos of the local cloud: after the listed steps the market takes back the
    first node of the job (by id) with notice or without, every node the job holds in that node's
    location, or the node the driver runs on; each is logged as a ``chaos`` event (its time is
    the moment the market acted). Steps already done when a (restarted) driver starts are not
    repeated."""

    def __init__(
        self,
        provisioner,
        *,
        nodes: set[int],
        locations: set[int],
        drivers: set[int] = frozenset(),
        losses: set[int] = frozenset(),
        own_node: str | None = None,
        done_steps: int = 0,
        events: EventLog | None = None,
    ) -> None:
        self.provisioner, self.own_node, self.events = provisioner, own_node, events
        listed = [(s, "node") for s in nodes] + [(s, "location") for s in locations]
        listed += [(s, "driver") for s in drivers] + [(s, "lose") for s in losses]
        self.pending = sorted(item for item in listed if item[0] > done_steps)

    def after(self, state: JobState) -> None:
        while self.pending and state.step >= self.pending[0][0]:
            _, what = self.pending.pop(0)
            cloud_nodes = {n.node_id: n for n in self.provisioner.nodes()}
            if what == "driver":
                if self.own_node in cloud_nodes:  # not when Ray restarted it on the head
                    self._log(what, self.own_node, state.step)
                    self.provisioner.preempt_now(self.own_node)
                continue
            held = {n: node for n, node in cloud_nodes.items() if n in state.nodes}
            if not held:
                continue
            first = held[min(held)]
            self._log(what, first.node_id, state.step)
            if what == "location":  # and the market has none there for a while
                self.provisioner.preempt_location(first.infra, outage_s=LOCATION_OUTAGE_S)
            elif what == "lose":
                self.provisioner.lose_now(first.node_id)
            else:
                self.provisioner.preempt_now(first.node_id)

    def _log(self, what: str, node: str, step: int) -> None:
        if self.events is not None:
            self.events.append(
                Event(
                    event="chaos",
                    decision="",
                    reason=f"the market takes {what}: node {node}",
                    details={"kind": what, "node": node, "step": step},
                )
            )


class _Metrics:
    """Appends one JSON line per committed step to the job's metrics.jsonl."""

    def __init__(self, path: Path, batch: int) -> None:
        self.path, self.batch = path, batch
        self.last: tuple[float, float] | None = None  # (time, train_s) at the previous step

    def record(self, state: JobState, result: StepResult) -> dict:
        now = time.time()
        took = state.train_s - self.last[1] if self.last else 0.0
        self.last = (now, state.train_s)
        line = {
            "time_s": now,
            "step": state.step,
            "loss": _finite(result.loss),
            "samples_per_s": _finite(self.batch / took) if took > 0 else None,
            "usd_spent": _finite(state.compute_usd + state.egress_usd),
            "egress_bytes": _finite(state.egress_bytes),
            "nodes": len(state.nodes),
            "recoveries": state.recoveries,
        }
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, allow_nan=False) + "\n")  # strict JSON: no NaN token
        return line


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class DashboardMetrics:
    """The job's figures as Ray metrics (``ray.util.metrics``), so they show on the Ray dashboard
    and its Prometheus endpoint, tagged with the job's name. ``gauge`` makes one gauge (Ray's by
    default; tests give a fake)."""

    NAMES = {
        "samples_per_s": "samples per second over the last step",
        "loss": "training loss of the last step",
        "usd_spent": "dollars spent: compute + egress",
        "usd_per_hour": "dollars per hour of the nodes held",
        "egress_gb": "gigabytes sent across zone, region or cloud boundaries",
        "recoveries": "recoveries from lost nodes",
        "nodes": "nodes held",
    }

    def __init__(self, job: str, *, gauge: Callable | None = None) -> None:
        if gauge is None:
            from ray.util.metrics import Gauge as gauge
        self.tags = {"job": job}
        self.gauges = {
            name: gauge(f"geo_orchestrator_{name}", description=text, tag_keys=("job",))
            for name, text in self.NAMES.items()
        }

    def update(self, row: dict, *, usd_per_hour: float) -> None:
        values = {
            **{
                k: row.get(k) for k in ("samples_per_s", "loss", "usd_spent", "recoveries", "nodes")
            },
            "usd_per_hour": usd_per_hour,
            "egress_gb": row["egress_bytes"] / 1e9,
        }
        for name, value in values.items():
            if value is not None:
                self.gauges[name].set(value, tags=self.tags)


def status_row(state: JobState) -> dict:
    """A job's state as people and tables read it (``status``, the notebook handle)."""
    rate = state.trained_steps * state.global_batch_size / state.train_s if state.train_s else None
    return {
        "job": state.job,
        "phase": state.phase,
        "step": f"{state.step}/{state.steps_total}" if state.steps_total else str(state.step),
        "loss": round(state.losses[-1], 4) if state.losses else None,
        "samples_per_s": round(rate, 2) if rate else None,
        "usd_spent": round(state.compute_usd + state.egress_usd, 6),
        "compute_usd": state.compute_usd,
        "egress_usd": state.egress_usd,
        "egress_bytes": state.egress_bytes,
        "recoveries": state.recoveries,
        "nodes": len(state.nodes),
        "checkpoint_step": state.checkpoint_step,
        "updated_at": iso_time(state.updated_at_s),
        # why a failed job stopped, and what to do (None otherwise)
        "failure": (
            f"{state.failure.get('cause')}: {state.failure.get('message')}"
            if state.failure
            else None
        ),
        "fix": state.failure.get("fix") if state.failure else None,
    }


def iso_time(seconds: float) -> str:
    """Unix seconds as ``2026-11-22T12:00:00Z``."""
    stamp = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
