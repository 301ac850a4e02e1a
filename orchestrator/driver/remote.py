"""The submitting side of a job whose controller runs in a VM: launch it, follow it, relaunch it.

``submit`` readies the job's folder (job.py ``prepare``: state, key, profile) while it holds the
job's lock, writes the controller's launch (``controller.json``: the recipe, the chaos asked for,
how to reach the cloud), lets the lock go and starts the controller VM (controller.py), which
runs the job:

the folder is pushed to the job's bucket and the controller is an instance launched through the
provider's adapter (hosts.py ``CloudHost``: AWS, GCP, Azure, real or their standing emulations,
standing.py, started when none stands); this process pulls the job's state back from the bucket.

From then on this process only follows, reading the job's state every ``FOLLOW_S``:

- each newly committed step is shown;
- the controller VM gone while the job is not over (killed, lost, shut down): a new one is booted
  and resumes the job from its state (at most ``MAX_RELAUNCHES`` times in a row without
  progress);
- Ctrl-C or a killed submit leaves the job running: ``status``, ``logs`` and ``stop`` reach it from
  any shell, and submitting the recipe again follows it (or relaunches its controller).

A standing cloud this process started is taken down once it has followed the job to its end; one
it found standing is left as it was.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from orchestrator.driver.job import RunOptions, RunResult, prepare
from orchestrator.driver.lock import JobLock
from orchestrator.driver.machine import Choice, StepResult
from orchestrator.driver.state import FINAL_PHASES, JobState, StateStore
from orchestrator.errors import UserError
from orchestrator.recipe.schema import Recipe

FOLLOW_S = 1.0  # how often the job's state is read (a bucket is polled, not pushed)
MAX_RELAUNCHES = 3  # controller VMs lost in a row with no step committed between them


def run_with_controller(
    recipe: Recipe, recipe_path: Path, folder: Path, options: RunOptions
) -> RunResult:
    from orchestrator.driver import standing
    from orchestrator.driver.cloud import check_emulation
    from orchestrator.driver.job import HOSTED

    registration, started = None, False
    if options.emulate:
        check_emulation(recipe.provider, recipe_path=recipe_path)
        registration, started = standing.ensure(recipe.provider, refusals=options.emulated_refusals)
    if started:
        print(
            f"emulated {recipe.provider}: started (its API at {registration.endpoint} on a "
            "simulated internet; every instance boots as a namespace VM from its boot script)",
            file=sys.stderr,
        )
    begun = time.monotonic()
    host = None
    try:
        from orchestrator.driver.hosts import CloudHost, host_region

        assert recipe.provider in HOSTED, "job.py refuses the others"
        host = CloudHost(
            recipe.provider, host_region(recipe, recipe.provider), registration=registration
        )
        final = _hosted(host, recipe, recipe_path, folder, options)
    except KeyboardInterrupt:
        print(
            f"\njob {folder.name} goes on in its controller VM: "
            f"`python -m orchestrator status {folder.name}` follows it, "
            f"`python -m orchestrator stop {folder.name}` ends it",
            file=sys.stderr,
        )
        started = False  # the job runs on there
        raise
    finally:
        if host is not None:
            host.close()
        if started and (host is None or not host.running(folder.name)):
            standing.stop(recipe.provider)
    return RunResult(final, folder, time.monotonic() - begun, _plan(folder))


def _hosted(host, recipe, recipe_path, folder: Path, options: RunOptions) -> JobState:
    """Launch (or find) the job's controller instance and follow its state in the bucket."""
    from orchestrator.driver.bucket import BucketRecord
    from provisioners.base import ProvisionerError

    try:
        record = BucketRecord.load(folder)
        if record is None or not host.running(folder.name):
            record = host.record(folder.name)
            _launch_hosted(host, record, recipe, recipe_path, folder, options, first=True)
            following = False
        else:
            following = True
    except ProvisionerError as error:  # one clear line: which cloud, which call, what to do
        raise UserError(
            f"{error.cloud}: {error.call}: {error.message} (nothing of the job runs)",
            file=str(recipe_path),
            fix=error.fix,
        ) from None
    if following:
        print(
            f"job {folder.name} runs on its controller VM ({host.describe()}): following it",
            file=sys.stderr,
        )
    bucket = host.bucket(record)
    return _watch(
        folder,
        options,
        running=lambda: host.running(folder.name),
        sync=lambda: host.follow(folder, record, bucket),
        relaunch=lambda: _launch_hosted(
            host, record, recipe, recipe_path, folder, options, first=False
        ),
        log_hint=f"the controller's console in the {host.describe()} console",
    )


def _launch_hosted(host, record, recipe, recipe_path, folder, options, *, first: bool) -> None:
    from orchestrator.driver.controller import LEAVE_FILE
    from provisioners.local import vms

    wheel = vms.build_wheel(folder / "wheel")
    _write_launch(
        recipe,
        recipe_path,
        folder,
        options,
        cloud=host.registration,
        first=first,
        portable=True,
        extra={
            "node_identity": host.node_identity(record),
            **({} if host.registration else {"wheel_url": f"{record.url}/wheel/{wheel.name}"}),
        },
    )
    record.save(folder)
    (folder / LEAVE_FILE).unlink(missing_ok=True)
    print(
        f"job {folder.name}: launching its controller VM on {host.describe()} "
        f"(its state in {record.url})",
        file=sys.stderr,
    )
    vm = host.launch(folder, record, wheel=wheel)
    print(
        f"job {folder.name}: controller VM {vm} runs; the job goes on there if this process goes",
        file=sys.stderr,
    )


def _write_launch(
    recipe, recipe_path, folder, options, *, cloud, first, portable, extra=None
) -> None:
    """Ready the job's folder under its lock and write the controller's launch. ``portable``:
    the folder travels to another disk (the bucket): the recipe goes in it, paths are its own."""
    from dataclasses import asdict

    from orchestrator.driver.controller import LAUNCH_FILE, PLAN_FILE, RECIPE_FILE

    with JobLock.acquire(folder, job=folder.name):
        (folder / PLAN_FILE).unlink(missing_ok=True)  # an earlier controller's
        ready, spec = prepare(recipe, recipe_path, folder, options if first else _again(options))
        profile = ready.model.profile
        launch = {
            "recipe_path": spec.recipe_path,
            "profile": profile,
            "checkpoint_path": ready.checkpointing.path,
            "preempt_at": list(spec.preempt_at),
            "preempt_location_at": list(spec.preempt_location_at),
            "lose_at": list(spec.lose_at),
            "notice_s": options.notice_s,
            "cloud": None if cloud is None else asdict(cloud),
            **(extra or {}),
        }
        if portable:
            from orchestrator.driver.shipped import carry_profile, pack_code

            (folder / RECIPE_FILE).write_bytes(Path(spec.recipe_path).read_bytes())
            launch["recipe_path"] = RECIPE_FILE
            launch["profile"] = carry_profile(profile, folder) or profile
            launch["code"] = pack_code(ready.model, folder)  # a module model's package
        path = folder / LAUNCH_FILE
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(launch, handle)


def _again(options: RunOptions) -> RunOptions:
    """A relaunch resumes: it never starts from scratch again."""
    import dataclasses

    return dataclasses.replace(options, from_scratch=False)


def _watch(folder: Path, options: RunOptions, *, running, sync, relaunch, log_hint) -> JobState:
    """Show each committed step; relaunch a controller gone before the job's end."""
    from orchestrator.driver.controller import LEAVE_FILE

    store, pause = StateStore(folder), threading.Event()
    shown, lost_in_a_row, last_step = -1, 0, -1
    # the state's version when a controller was relaunched: a final phase saved before then is
    # the last controller's (a leave whose mark the relaunch cleared), not the job's end
    relaunched_at: int | None = None

    def synced() -> None:
        try:
            sync()
        except OSError as error:  # the bucket did not answer this time: the next look retries
            print(
                f"note: job {folder.name}: its state could not be read ({error})", file=sys.stderr
            )

    while True:
        synced()
        state = _saved(store)
        if state is not None and options.on_step is not None and state.step > shown:
            if state.losses:
                options.on_step(state, StepResult(loss=state.losses[-1]))
        shown = max(shown, -1 if state is None else state.step)
        if not running():
            synced()
            state = _saved(store)  # its last word
            step = -1 if state is None else state.step  # None: it ended before its first save
            saved_since = relaunched_at is None or (
                state is not None and state.version > relaunched_at
            )
            final = state is not None and state.phase in FINAL_PHASES
            if final and saved_since and not (folder / LEAVE_FILE).exists():
                return state
            lost_in_a_row = lost_in_a_row + 1 if step <= last_step else 1
            last_step = step
            if lost_in_a_row > MAX_RELAUNCHES:
                raise UserError(
                    f"job {folder.name}: {MAX_RELAUNCHES} controller VMs in a row ended with no "
                    "step committed",
                    file=str(folder / "driver.log"),
                    fix=f"read {log_hint} and the job's driver.log",
                )
            where = "before its first save" if state is None else f"at step {step} ({state.phase})"
            print(
                f"\njob {folder.name}: its controller VM is gone {where}; booting a new one, "
                "which resumes the job from its state",
                file=sys.stderr,
            )
            relaunch()
            relaunched_at = 0 if state is None else state.version
        pause.wait(FOLLOW_S)


def _saved(store: StateStore) -> JobState | None:
    """The job's state as its controller last pushed it; None while it has saved none (a
    controller VM still booting on a busy host: its first save comes after "runs")."""
    if not store.path.exists() and not store.previous.exists():
        return None
    return store.load().state


def _plan(folder: Path) -> Choice | None:
    from orchestrator.driver.controller import PLAN_FILE

    try:
        return Choice.from_dict(json.loads((folder / PLAN_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
