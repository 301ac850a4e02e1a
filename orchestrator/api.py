"""The notebook API: submit a recipe and follow its job as pandas DataFrames.

    import orchestrator
    job = orchestrator.submit("recipes/quickstart.yaml")        # wait=False: trains in a thread
    job.status()     # one row: phase, step, loss, samples/s, $ spent, recoveries, nodes
    job.events()     # the event log: time, event, decision, reason, details
    job.metrics()    # per committed step: time, step, loss, samples/s, $ spent, egress, nodes
    job.plot()       # throughput and spend over time, preemptions marked
    orchestrator.job("quickstart")   # a handle on a job submitted earlier (CLI or notebook)

Everything is read from the job's folder (orchestrator/driver/job.py), so a handle works while the
job runs, after it ended, and from another process.
"""

from __future__ import annotations

import threading
from pathlib import Path

from orchestrator.driver.events import read_events
from orchestrator.driver.job import JOBS_DIR, RunOptions, ask_to_stop, run_job
from orchestrator.driver.metrics import METRICS_FILE, read_rows
from orchestrator.driver.state import JobState, StateStore
from orchestrator.driver.status import status_row
from orchestrator.errors import UserError
from orchestrator.names import job_name_problem


class Job:
    """A handle on one job's folder."""

    def __init__(self, name: str, *, jobs_dir: Path = JOBS_DIR) -> None:
        self.name, self.folder = name, Path(jobs_dir) / name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        state = self.state()
        where = f"step {state.step}/{state.steps_total}" if state else "not started"
        return f"Job({self.name!r}: {state.phase if state else 'pending'}, {where})"

    def state(self) -> JobState | None:
        store = StateStore(self.folder)
        return store.load().state if store.exists() else None

    def status(self):
        import pandas as pd

        state = self.state()
        return pd.DataFrame([status_row(state)] if state else [])

    def events(self):
        import pandas as pd

        frame = pd.DataFrame(list(read_events(self.folder / "events.jsonl")))
        if not frame.empty:
            frame["time"] = pd.to_datetime(frame["time_s"], unit="s", utc=True)
        return frame

    def metrics(self):
        import pandas as pd

        frame = pd.DataFrame(read_rows(self.folder / METRICS_FILE))
        if not frame.empty:
            frame["time"] = pd.to_datetime(frame["time_s"], unit="s", utc=True)
        return frame

    def plot(self, path: str | Path | None = None):
        """Samples/s (measured, and the plan's prediction) and dollars spent over time, each
        preemption notice, lost node, recovery and plan switch marked and each recovery's pause
        shaded; saved to ``path`` if given. Returns the matplotlib figure."""
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from orchestrator.cli.job_plot import draw_job

        metrics, events = self.metrics(), self.events()
        figure, (rate, spend) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
        state = self.state()
        predicted = ((state.choice or {}) if state else {}).get("samples_per_s")
        draw_job((rate, spend), metrics, events, predicted_samples_per_s=predicted)
        rate.set_ylabel("samples/s")
        spend.set_ylabel("$ spent")
        spend.set_xlabel("seconds since the first step (shaded: training paused to recover)")
        rate.set_title(f"job {self.name}")
        figure.tight_layout()
        if path is not None:
            figure.savefig(path)
        return figure

    def stop(self) -> None:
        """Ask the driver to checkpoint after its current step and free its nodes."""
        self.folder.mkdir(parents=True, exist_ok=True)
        ask_to_stop(self.folder)

    def wait(self, timeout_s: float | None = None) -> JobState | None:
        """Wait for a job submitted with ``wait=False``; re-raise what stopped it."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._error is not None:
            raise self._error
        return self.state()


def submit(
    recipe: str | Path,
    *,
    jobs_dir: str | Path = JOBS_DIR,
    wait: bool = True,
    preempt_at: tuple[int, ...] = (),
    vms: str | None = None,
) -> Job:
    """Run ``recipe`` on the local simulated cloud (as ``python -m orchestrator submit``);
    ``vms``: what a simulated VM is (default: the recipe's ``local_cloud.vms``; a job started
    with ``wait=False`` runs in a thread, where VMs are processes)."""
    from orchestrator.catalog import default_catalog
    from orchestrator.recipe import load_recipe

    catalog, path = default_catalog(), Path(recipe)
    loaded = load_recipe(path, catalog=catalog)
    handle = Job(loaded.name, jobs_dir=Path(jobs_dir))  # always a valid name (checks.py)
    options = RunOptions(
        jobs_dir=Path(jobs_dir),
        preempt_at=tuple(preempt_at),
        vms=vms if wait else "processes",
    )
    if wait:
        run_job(path, catalog, options)
        return handle

    def run() -> None:
        try:
            run_job(path, catalog, options)
        except (UserError, RuntimeError, OSError) as error:  # kept for wait() to raise
            handle._error = error

    handle._thread = threading.Thread(target=run, name=f"job-{handle.name}", daemon=True)
    handle._thread.start()
    return handle


def job(name: str, *, jobs_dir: str | Path = JOBS_DIR) -> Job:
    """A handle on a job submitted earlier."""
    problem = job_name_problem(name)
    if problem is not None:  # before any path is built from it
        raise UserError(problem, field="name", fix="give the job's name as `status` lists it")
    handle = Job(name, jobs_dir=Path(jobs_dir))
    if not StateStore(handle.folder).exists():
        raise UserError(
            f"no job {name!r} in {jobs_dir}",
            fix="orchestrator.submit(recipe) starts one; python -m orchestrator status lists them",
        )
    return handle
