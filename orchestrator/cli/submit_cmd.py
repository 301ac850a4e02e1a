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
import os
import sys
import time
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.output import help_text
from orchestrator.driver.actor import DriverCrashed
from orchestrator.driver.events import read_events
from orchestrator.driver.job import JOBS_DIR, RunOptions, RunResult, run_job
from orchestrator.driver.machine import StepResult
from orchestrator.driver.state import JobState


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
        "--emulate",
        action="store_true",
        help="run a cloud provider's recipe (aws, gcp, azure) on its emulation (needs root): the "
        "provider's API (moto's server, the GCP and Azure fakes) stands in a process of its own "
        "(python -m orchestrator emulate), each instance boots as a namespace VM from its boot "
        "script, and the job's controller runs in a VM there: Ctrl-C leaves the job running",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=run_submit)


def run_submit(args: argparse.Namespace, catalog: Catalog) -> int:
    progress = _Progress(quiet=args.quiet)
    options = RunOptions(
        jobs_dir=args.jobs_dir,
        preempt_at=tuple(args.preempt_at),
        lose_at=tuple(args.lose_at),
        preempt_driver_at=tuple(args.preempt_driver_at),
        notice_s=args.notice_s,
        on_step=progress.show,
        from_scratch=args.from_scratch,
        vms=args.vms,
        emulate=args.emulate,
        controller_vm=args.emulate,
    )
    try:
        result = run_job(args.recipe, catalog, options)
    except DriverCrashed as crash:
        print(f"\nerror: the job's driver stopped: {crash}", file=sys.stderr)
        return 1
    _summary(result)
    return 0 if result.state.phase == "done" else 1


class _Progress:
    """One line, rewritten in place on a terminal; otherwise a line each time the job passes a
    10th step (a follower that reads the job's state now and then may not see every step)."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.marks: list[tuple[float, int]] = []
        self.printed = -1

    def show(self, state: JobState, result: StepResult) -> None:
        now = time.monotonic()
        self.marks = [*self.marks[-19:], (now, state.step)]
        (t0, s0), rate = self.marks[0], 0.0
        if now > t0 and state.step > s0:
            rate = (state.step - s0) / (now - t0)
        if self.quiet or (not self.tty and state.step // 10 <= self.printed // 10):
            return
        self.printed = state.step
        eta = (state.steps_total - state.step) / rate if rate else float("nan")
        spent = state.compute_usd + state.egress_usd
        samples_per_s = rate * state.global_batch_size
        line = (
            f"step {state.step}/{state.steps_total}  loss {result.loss:.4f}  "
            f"{samples_per_s:,.0f} samples/s  ${spent:.5f} spent  ETA {eta:.0f} s"
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr)


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


def _summary(result: RunResult) -> None:
    state, folder, choice = result.state, result.folder, result.choice
    batch = state.global_batch_size
    # this run's: a job started again from scratch keeps its earlier runs' events in the log
    events = [e for e in read_events(folder / "events.jsonl") if e["time_s"] >= state.started_at_s]
    print(file=sys.stderr)
    print(f"job {state.job}: {state.phase} after {state.step} steps in {result.elapsed_s:.1f} s")
    if state.phase == "failed":
        _why(state, events)
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
    cores = os.cpu_count() or 1
    if choice is not None and sum(r.count for r in choice.requests) > cores:
        print(
            f"note: the simulated VMs' workers share this machine's {cores} cores (a plan's "
            "prediction assumes a device per worker): measured rates are shared-core rates"
        )
    recoveries = [e for e in events if e["event"] == "recovered"]
    for event in recoveries:
        print(f"recovered in {event['details']['recovery_s']:.1f} s")
    print(f"events: {folder / 'events.jsonl'}")
