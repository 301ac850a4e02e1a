"""``python -m orchestrator submit RECIPE``: run a recipe end to end on the local simulated cloud.

The driver (orchestrator/driver/machine.py) polls the market, plans, launches the plan's nodes,
trains on them with the runtime, checkpoints, and on a lost node re-plans and resumes from the
newest checkpoint. Its state and event log live in ``--jobs-dir/<job>/``; submitting a recipe whose
job did not finish picks it up where its state says. A progress line shows step, loss, samples/s
and $ spent; a summary ends the run.

A job runs in one process at a time (a second submit of a running job names the process that
runs it). A job that failed or was stopped resumes from its newest checkpoint when submitted
again; when none of its checkpoints can be read it stops and says so, and only ``--from-scratch``
starts it again from step 0. Exit codes: 0 done, 1 the job failed or stopped, 2 bad input.

``--preempt-at STEP`` (repeatable; added to the recipe's ``local_cloud.preempt_at_steps``) makes the
market take one of the job's nodes back when that step is committed: a preemption notice, then the
node's death ``--notice-s`` market seconds later. ``--lose-at STEP`` takes one without notice;
``--preempt-driver-at STEP`` takes the node the driver runs on (Ray restarts the driver).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.output import help_text
from orchestrator.cli.watch import OUTPUT_LOG, EventFollower, OutputCopy, Terminal
from orchestrator.driver.actor import DriverCrashed
from orchestrator.driver.events import read_events
from orchestrator.driver.job import JOBS_DIR, NotConfirmed, RunOptions, RunResult, run_job
from orchestrator.driver.machine import Choice, StepResult
from orchestrator.driver.state import FINAL_PHASES, JobState, StateStore
from orchestrator.errors import UserError


def add_submit(commands: argparse._SubParsersAction, formatter: type) -> None:
    p = commands.add_parser(
        "submit",
        help="run a recipe end to end on the local simulated cloud",
        formatter_class=formatter,
        description=help_text(__doc__),
        epilog="example:\n  python -m orchestrator submit recipes/quickstart.yaml --preempt-at 60",
    )
    p.add_argument("recipe", type=Path, help="the recipe (YAML)")
    p.add_argument("--jobs-dir", type=Path, default=JOBS_DIR, help="where job state lives")
    p.add_argument("--preempt-at", type=int, action="append", default=[], metavar="STEP")
    p.add_argument(
        "--lose-at",
        type=int,
        action="append",
        default=[],
        metavar="STEP",
        help="after STEP the market takes one of the job's nodes without notice",
    )
    p.add_argument(
        "--preempt-driver-at",
        type=int,
        action="append",
        default=[],
        metavar="STEP",
        help="after STEP the market takes back the node the driver runs on",
    )
    p.add_argument(
        "--notice-s",
        type=float,
        default=None,
        help="market seconds of notice [the recipe's local_cloud.notice_s]",
    )
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="start the job again from step 0, ignoring its state and checkpoints",
    )
    p.add_argument(
        "--vms",
        choices=["auto", "namespaces", "processes"],
        default=None,
        help="what a local cloud VM is [the recipe's local_cloud.vms]",
    )
    p.add_argument(
        "--no-dashboard",
        dest="dashboard",
        action="store_false",
        help="start the local cloud's head without Ray's dashboard (nothing bound to port 8265, "
        "no `ray list actors`; the job's Prometheus metrics stay)",
    )
    p.add_argument(
        "--emulate",
        action="store_true",
        help="run a cloud provider's recipe (aws, gcp, azure) on its emulation (needs root): the "
        "provider's API (moto's server, the GCP and Azure fakes) stands in a process of its own "
        "(python -m orchestrator emulate), each instance boots as a namespace VM from its boot "
        "script, and the job's controller runs in a VM there: Ctrl-C leaves the job running",
    )
    p.add_argument(
        "--plan",
        type=Path,
        metavar="PLAN",
        help="run this plan (plan -o writes one) rather than the planner's choice; the driver keeps "
        "to it while the market can hold it, then re-plans",
    )
    p.add_argument(
        "-y", "--yes", action="store_true", help="start without asking (the plan is still shown)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show the plan and its predicted rate and price, then stop: nothing is rented",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="once the plan is confirmed, run the job in a process of its own that outlives this "
        "terminal, and return; follow it with logs -f JOB, stop it with stop JOB",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=run_submit)


def run_submit(args: argparse.Namespace, catalog: Catalog) -> int:
    if args.detach and args.emulate:
        raise UserError(
            "--emulate already leaves the job running in its controller VM",
            field="--detach",
            fix="drop --detach",
        )
    terminal = Terminal()
    progress = _Progress(terminal, quiet=args.quiet)
    watch = _Watch(terminal)
    answer = {"go": False}

    def confirm(choice: Choice, steps: int) -> bool:
        answer["go"] = _confirm(choice, steps, args, terminal)
        return answer["go"] and not args.detach  # a detached job runs in a process of its own

    options = RunOptions(
        jobs_dir=args.jobs_dir,
        preempt_at=tuple(args.preempt_at),
        lose_at=tuple(args.lose_at),
        preempt_driver_at=tuple(args.preempt_driver_at),
        notice_s=args.notice_s,
        on_step=lambda state, result: (watch.flush(), progress.show(state, result)),
        on_folder=watch.open,
        plan_file=args.plan,
        confirm=confirm,
        from_scratch=args.from_scratch,
        vms=args.vms,
        dashboard=args.dashboard,
        emulate=args.emulate,
        controller_vm=args.emulate,
    )
    try:
        try:
            result = run_job(args.recipe, catalog, options)
        finally:
            watch.stop_following()
        try:
            _summary(result)
        finally:
            watch.close()
    except NotConfirmed as declined:
        watch.close()
        if args.detach and answer["go"]:
            return _detach(args, declined.folder)
        print("dry run: nothing rented" if args.dry_run else "not started: nothing rented")
        return 0 if args.dry_run else 1
    except DriverCrashed as crash:
        print(f"\nerror: the job's driver stopped: {crash}", file=sys.stderr)
        return 1
    return 0 if result.state.phase == "done" else 1


def _confirm(choice: Choice, steps: int, args: argparse.Namespace, terminal: Terminal) -> bool:
    """Show the plan the job starts on, its predicted rate and price; ask before renting where a
    person is at the terminal (not with -y or --dry-run)."""
    nodes = sum(r.count for r in choice.requests)
    batch = choice.plan.global_batch_size
    seconds = steps * batch / choice.samples_per_s if choice.samples_per_s else float("inf")
    usd = seconds * choice.usd_per_hour / 3600 + steps * choice.egress_usd_per_step
    print(f"plan: {choice.summary}")
    print(
        f"  {nodes} node{'s' if nodes != 1 else ''}; predicted {choice.samples_per_s:,.3g} "
        f"samples/s; {_usd(choice.usd_per_hour)}/h for the GPUs + "
        f"{_usd(choice.egress_usd_per_step)} egress per step"
    )
    print(f"  {steps} steps: about {_duration(seconds)} and {_usd(usd)}, as predicted")
    if choice.note:
        print(f"  note: {choice.note}")
    sys.stdout.flush()
    if args.dry_run:
        return False
    if args.yes or not (sys.stdin.isatty() and terminal.tty):
        return True  # no one to ask (a script, a file): going on is what was asked for
    try:
        answer = input(f"Launch {nodes} node{'s' if nodes != 1 else ''} and train? [Y/n] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("", "y", "yes")


def loss_text(loss: float) -> str:
    """A loss to four decimals, or in e-notation when that would show only zeros."""
    return f"{loss:.4f}" if loss == 0 or abs(loss) >= 1e-3 else f"{loss:.3e}"


def _usd(amount: float) -> str:
    """Dollars to a few significant digits, never in e-notation ($0.0000433)."""
    digits = 2 if amount >= 0.1 or amount <= 0 else 2 - math.floor(math.log10(amount))
    return f"${amount:.{min(digits, 8)}f}"


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "forever"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


DETACH_START_S = 120.0  # a detached job's process takes its job's lock within this long


def _detach(args: argparse.Namespace, folder: Path) -> int:
    """Run the confirmed job in a process of its own, in a session of its own (a closed terminal
    does not end it), and return once it holds the job's lock (it runs the job)."""
    child = subprocess.Popen(
        _child_command(args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # it copies what it prints to the job's output.log
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + DETACH_START_S
    while not _running(folder, child.pid):
        try:
            code = child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline:
                continue
            print(
                f"error: job {folder.name}'s process (pid {child.pid}) has not started it after "
                f"{DETACH_START_S:.0f} s; see {folder / OUTPUT_LOG}",
                file=sys.stderr,
            )
            return 1
        print(
            f"error: job {folder.name}'s process ended at once (exit {code}); see "
            f"{folder / OUTPUT_LOG}",
            file=sys.stderr,
        )
        return 1
    job = folder.name
    print(
        f"job {job} runs in the background (pid {child.pid}); it goes on when this terminal closes"
    )
    print(f"  follow it: python -m orchestrator logs -f {job}")
    print(f"  its state: python -m orchestrator status {job}")
    print(f"  stop it:   python -m orchestrator stop {job}")
    return 0


def _running(folder: Path, pid: int) -> bool:
    """Whether process ``pid`` holds the job's lock and the job's state is its run's (not the
    phase an earlier run ended in)."""
    from orchestrator.driver.lock import holder

    if (holder(folder) or {}).get("pid") != pid:
        return False
    try:
        return StateStore(folder).load().state.phase not in FINAL_PHASES
    except UserError:
        return False


def _child_command(args: argparse.Namespace) -> list[str]:
    """The submit the detached process runs: this one's, confirmed, with absolute paths."""
    command = [sys.executable, "-m", "orchestrator"]
    if args.configs is not None:
        command += ["--configs", str(Path(args.configs).resolve())]
    command += ["submit", str(args.recipe.resolve()), "--yes", "--jobs-dir"]
    command.append(str(Path(args.jobs_dir).resolve()))
    for flag, steps in (
        ("--preempt-at", args.preempt_at),
        ("--lose-at", args.lose_at),
        ("--preempt-driver-at", args.preempt_driver_at),
    ):
        for step in steps:
            command += [flag, str(step)]
    if args.notice_s is not None:
        command += ["--notice-s", repr(args.notice_s)]
    if args.vms is not None:
        command += ["--vms", args.vms]
    if not args.dashboard:
        command.append("--no-dashboard")
    if args.plan is not None:
        command += ["--plan", str(args.plan.resolve())]
    if args.from_scratch:
        command.append("--from-scratch")
    return command


class _Watch:
    """Once the job's folder is known: its events printed as they come, and the output copied to
    its output.log (watch.py)."""

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal
        self.follower: EventFollower | None = None
        self.copy: OutputCopy | None = None
        self.folder: Path | None = None

    def open(self, folder: Path) -> None:
        self.folder = folder
        try:
            self.copy = OutputCopy(folder)
        except OSError as exc:  # the job's own writes name the folder's problem
            print(f"note: no copy of this output in {folder}: {exc.strerror}", file=sys.stderr)
        self.follower = EventFollower(folder / "events.jsonl", self.terminal).start()

    def flush(self) -> None:
        """The events so far, before a step's line (so the lines keep their order)."""
        if self.follower is not None:
            self.follower.flush()

    def stop_following(self) -> None:
        if self.follower is not None:
            self.follower.close()
        self.terminal.end_progress()

    def close(self) -> None:
        self.stop_following()
        if self.copy is not None:
            print(f"output: {self.copy.path}")
            self.copy.close()
            self.copy = None


class _Progress:
    """A line per 10th step, and on a terminal the latest step in between, rewritten in place (a
    follower that reads the job's state now and then may not see every step)."""

    def __init__(self, terminal: Terminal, *, quiet: bool) -> None:
        self.terminal, self.quiet = terminal, quiet
        self.marks: list[tuple[float, int]] = []
        self.kept = -1

    def show(self, state: JobState, result: StepResult) -> None:
        now = time.monotonic()
        self.marks = [*self.marks[-19:], (now, state.step)]
        (t0, s0), rate = self.marks[0], 0.0
        if now > t0 and state.step > s0:
            rate = (state.step - s0) / (now - t0)
        keep = state.step // 10 > self.kept // 10 or state.step == state.steps_total
        if self.quiet or (not self.terminal.tty and not keep):
            return
        if keep:
            self.kept = state.step
        spent = state.compute_usd + state.egress_usd
        line = (
            f"step {state.step}/{state.steps_total}  loss {loss_text(result.loss)}  "
            f"{rate * state.global_batch_size:,.0f} samples/s  ${spent:.5f} spent"
        )
        if rate:
            line += f"  ETA {(state.steps_total - state.step) / rate:.0f} s"
        self.terminal.progress(line, keep=keep)


def _why(state: JobState, events: list[dict]) -> None:
    """Why a failed job stopped, in a line, and what to do; the rest is in its log."""
    failure = state.failure
    if failure:
        kept = failure.get("checkpoint_step")
        print(f"why: {failure['cause']}: {failure['message']}")
        print(f"  To fix: {failure['fix']}")
        if kept:
            print(
                f"  kept: the checkpoint of step {kept}; submitting the recipe again resumes there"
            )
    elif events:
        last = events[-1]
        print(f"why: {last.get('reason', last['event'])}; {last.get('decision', '')}")


EXPLAIN_ABOVE = 0.25  # a measured rate this far from the prediction is explained


def _explain(measured: float, choice: Choice, state: JobState, events: list, folder: Path) -> None:
    """Why the measured rate is far from the predicted one, from what the job knows: workers
    sharing this machine's cores, a profile not timed here, a slow node, per-step overheads."""
    predicted = choice.samples_per_s
    if not predicted or abs(measured / predicted - 1) <= EXPLAIN_ABOVE:
        return
    reasons = []
    cores, workers = os.cpu_count() or 1, choice.plan.total_gpus
    if workers > cores:
        reasons.append(
            f"its {workers} workers share this machine's {cores} cores, where the prediction "
            "gives each a device of its own"
        )
    if not any(folder.glob("profile-*.json")):
        reasons.append("its profile was not timed here (profile: analytic, or published figures)")
    if any(e["event"] == "straggler" for e in events):
        reasons.append("a node ran slower than its peers (the straggler events)")
    batch = state.global_batch_size
    extra_ms = (batch / measured - batch / predicted) * 1000
    if extra_ms > 0:
        reasons.append(
            f"each step took {extra_ms:,.0f} ms more than predicted: the runtime's own work per "
            "step (Ray calls, loading data, the workers' coordination), which the profile does "
            "not time, weighs most on a small model"
        )
    else:
        reasons.append(f"each step took {-extra_ms:,.0f} ms less than predicted")
    print(
        f"why measured differs from predicted ({measured / predicted - 1:+.0%}): "
        + "; ".join(reasons)
    )


def _why_stopped(state: JobState, events: list[dict]) -> None:
    """Why a job stopped before its last step (its budget, a stop asked), and how to go on."""
    last = next((e for e in reversed(events) if e["event"] in ("budget_reached", "stopped")), None)
    if last is None:
        return
    again = "submitting the recipe again resumes there"
    if last["event"] == "budget_reached":
        print(f"stopped on the budget (objective.budget_usd): {last.get('reason', '')}")
        again = "raise objective.budget_usd and submit the recipe again to go on from there"
    else:
        print(f"why: {last.get('reason', 'asked to stop')}")
    print(f"  kept: the checkpoint of step {state.checkpoint_step}; {again}")


def _summary(result: RunResult) -> None:
    state, folder, choice = result.state, result.folder, result.choice
    batch = state.global_batch_size
    # this run's: a job started again from scratch keeps its earlier runs' events in the log
    events = [e for e in read_events(folder / "events.jsonl") if e["time_s"] >= state.started_at_s]
    print(file=sys.stderr)
    print(f"job {state.job}: {state.phase} after {state.step} steps in {result.elapsed_s:.1f} s")
    if state.phase == "failed":
        _why(state, events)
    elif state.phase == "stopped":
        _why_stopped(state, events)
    if state.losses:
        print(f"final loss {loss_text(state.losses[-1])}")
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
    if choice is not None and state.trained_steps:
        # the last plan's figures for the steps trained; measured compute also pays for nodes
        # while they start, wait and recover
        steps = state.trained_steps
        compute = steps * batch / choice.samples_per_s * choice.usd_per_hour / 3600
        egress = steps * choice.egress_usd_per_step
        print(
            f"predicted for {steps} steps: ${compute + egress:.5f} (compute ${compute:.5f} while "
            f"training + egress ${egress:.5f})"
        )
    if choice is not None and state.train_s:
        _explain(state.trained_steps * batch / state.train_s, choice, state, events, folder)
    recoveries = [e for e in events if e["event"] == "recovered"]
    for event in recoveries:
        print(f"recovered in {event['details']['recovery_s']:.1f} s")
    print(f"events: {folder / 'events.jsonl'}")
