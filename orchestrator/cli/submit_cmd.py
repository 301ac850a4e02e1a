"""``python -m orchestrator submit RECIPE``: run a recipe end to end on the local simulated cloud.

The driver (orchestrator/driver/machine.py) polls the market, plans, launches the plan's nodes,
trains on them with the runtime, checkpoints, and on a lost node re-plans and resumes from the
newest checkpoint. Its state and event log live in ``--jobs-dir/<job>/``; submitting a recipe whose
job did not finish picks it up where its state says. A progress line shows step, loss, samples/s
and $ spent; a summary ends the run.

``--preempt-at STEP`` (repeatable; added to the recipe's ``local_cloud.preempt_at_steps``) makes the
market take one of the job's nodes back when that step is committed: a preemption notice, then the
node's death ``--notice-s`` market seconds later.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.jobs_cmd import JOBS_DIR, STOP_FILE
from orchestrator.driver.events import EventLog, read_events
from orchestrator.driver.machine import Driver, DriverConfig, StepResult
from orchestrator.driver.state import JobState, StateStore
from orchestrator.errors import UserError
from orchestrator.recipe import load_recipe
from orchestrator.recipe.schema import Recipe


def add_submit(commands: argparse._SubParsersAction, formatter: type) -> None:
    p = commands.add_parser(
        "submit",
        help="run a recipe end to end on the local simulated cloud",
        formatter_class=formatter,
        description=__doc__,
        epilog="example:\n  python -m orchestrator submit recipes/quickstart.yaml --preempt-at 60",
    )
    p.add_argument("recipe", type=Path, help="the recipe (YAML)")
    p.add_argument("--jobs-dir", type=Path, default=JOBS_DIR, help="where job state lives")
    p.add_argument("--preempt-at", type=int, action="append", default=[], metavar="STEP")
    p.add_argument(
        "--notice-s",
        type=float,
        default=None,
        help="market seconds of notice [the recipe's local_cloud.notice_s]",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=run_submit)


def run_submit(args: argparse.Namespace, catalog: Catalog) -> int:
    recipe = load_recipe(args.recipe, catalog=catalog)
    if recipe.provider != "local":
        raise UserError(
            f"submit runs on the local simulated cloud in this version, not {recipe.provider}",
            file=str(args.recipe),
            field="provider",
            fix="write provider: local (plan and simulate work for every provider)",
        )
    job = recipe.name or args.recipe.stem
    folder = args.jobs_dir / job
    recipe = _measured_here(recipe, folder)
    (folder / STOP_FILE).unlink(missing_ok=True)  # a stop asked of an earlier run
    if recipe.training.optimizer.grad_clip_norm is not None:
        print(
            "note: the runtime does not clip gradients yet: training runs without "
            f"grad_clip_norm {recipe.training.optimizer.grad_clip_norm} (write null to silence this)",
            file=sys.stderr,
        )
    store, events = StateStore(folder), EventLog(folder / "events.jsonl")
    state = _state(store, job, args.recipe).evolve(
        steps_total=recipe.training.steps, global_batch_size=recipe.training.global_batch_size
    )
    from orchestrator.simulator import views_for
    from provisioners.local.provisioner import LocalProvisioner

    notice_s = args.notice_s if args.notice_s is not None else recipe.local_cloud.notice_s
    provisioner = LocalProvisioner(seed=recipe.training.seed, notice_s=notice_s)
    try:
        import ray

        ray.init(address=provisioner.address, log_to_driver=False)
        driver = _driver(args, recipe, catalog, provisioner, store, events, state, views_for)
        started = time.monotonic()
        final = driver.run()
        elapsed = time.monotonic() - started
    finally:
        _shutdown(provisioner)
    _summary(final, folder, elapsed, driver, recipe.training.global_batch_size)
    return 0 if final.phase == "done" else 1


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


def _state(store: StateStore, job: str, recipe_path: Path) -> JobState:
    if store.exists():
        loaded = store.load()
        for problem in loaded.problems:
            print(f"note: job state {problem}; using {loaded.source.name}", file=sys.stderr)
        if loaded.state.phase not in ("done", "failed"):
            print(f"resuming job {job} from its newest checkpoint", file=sys.stderr)
            if loaded.state.phase == "stopped":  # resume: plan again, restore the checkpoint
                return loaded.state.evolve(phase="recover")
            return loaded.state
    run_id = f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    return JobState(job=job, recipe_path=str(recipe_path), phase="plan", run_id=run_id)


def _driver(args, recipe, catalog, provisioner, store, events, state, views_for) -> Driver:
    from orchestrator.driver.world import (
        MarketPlans,
        ProvisionerCloud,
        RuntimeTrainer,
        checkpoint_url,
    )

    network = None
    if recipe.runtime.link_emulation:
        network = views_for(catalog, catalog.market("local"))[0]
    trainer = RuntimeTrainer(
        recipe=recipe,
        catalog=catalog,
        job=state.run_id or state.job,
        checkpoint_url=checkpoint_url(recipe),
        network=network,
    )
    progress = _Progress(recipe.training.steps, quiet=args.quiet)
    schedule = sorted({*args.preempt_at, *recipe.local_cloud.preempt_at_steps})

    def on_step(current: JobState, result: StepResult) -> None:
        progress.show(current, result)
        if schedule and current.step >= schedule[0]:
            schedule.pop(0)
            nodes = sorted(current.nodes)
            if nodes:  # the seeded chaos: always the first node of the current gang
                provisioner.preempt_now(nodes[0])

    return Driver(
        store=store,
        events=events,
        plans=MarketPlans(recipe, catalog, provisioner),
        cloud=ProvisionerCloud(provisioner),
        trainer=trainer,
        config=DriverConfig(
            steps=recipe.training.steps,
            checkpoint_every_steps=recipe.checkpointing.every_steps,
            budget_usd=recipe.objective.budget_usd,
        ),
        state=state,
        on_step=on_step,
        stop_requested=(store.folder / STOP_FILE).exists,
    )


class _Progress:
    """One line, rewritten in place on a terminal; every 10th step otherwise."""

    def __init__(self, steps: int, *, quiet: bool) -> None:
        self.steps, self.quiet = steps, quiet
        self.tty = sys.stderr.isatty()
        self.marks: list[tuple[float, int]] = []

    def show(self, state: JobState, result: StepResult) -> None:
        now = time.monotonic()
        self.marks = [*self.marks[-19:], (now, state.step)]
        (t0, s0), rate = self.marks[0], 0.0
        if now > t0 and state.step > s0:
            rate = (state.step - s0) / (now - t0)
        if self.quiet or (not self.tty and state.step % 10):
            return
        eta = (self.steps - state.step) / rate if rate else float("nan")
        spent = state.compute_usd + state.egress_usd
        line = (
            f"step {state.step}/{self.steps}  loss {result.loss:.4f}  {rate:.2f} steps/s  "
            f"${spent:.5f} spent  ETA {eta:.0f} s"
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr)


def _summary(state: JobState, folder: Path, elapsed_s: float, driver: Driver, batch: int) -> None:
    events = list(read_events(folder / "events.jsonl"))
    choice = driver.session.choice
    print(file=sys.stderr)
    print(f"job {state.job}: {state.phase} after {state.step} steps in {elapsed_s:.1f} s")
    if state.losses:
        print(f"final loss {state.losses[-1]:.4f}")
    if choice is not None:
        print(f"plan: {choice.summary}")
        measured = state.trained_steps * batch / state.train_s if state.train_s else 0.0
        print(
            f"samples/s: measured {measured:.3g}, predicted {choice.samples_per_s:.3g}; "
            f"GPUs ${choice.usd_per_hour:.3g}/h"
        )
    print(
        f"spent ${state.compute_usd + state.egress_usd:.5f} "
        f"(compute ${state.compute_usd:.5f} + egress ${state.egress_usd:.5f} for "
        f"{state.egress_bytes / 1e6:.1f} MB)"
    )
    cores = os.cpu_count() or 1
    if choice is not None and sum(r.count for r in choice.requests) > cores:
        print(
            f"note: the local cloud's workers share this machine's {cores} cores (a plan's "
            "prediction assumes a device per worker): measured rates are shared-core rates"
        )
    recoveries = [e for e in events if e["event"] == "recovered"]
    for event in recoveries:
        print(f"recovered in {event['details']['recovery_s']:.1f} s")
    print(f"events: {folder / 'events.jsonl'}")


def _shutdown(provisioner) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    provisioner.close()
