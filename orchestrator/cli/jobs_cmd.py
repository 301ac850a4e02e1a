"""``status``, ``logs`` and ``stop``: the jobs ``submit`` runs, read from their folders.

- ``status [JOB]``: per job its phase, step, last loss, measured samples/s, dollars spent (compute
  + egress), recoveries and nodes held (table or ``--json``). A job whose state cannot be read is
  listed as unreadable, with its file and the problem, beside the others (``status JOB`` of such
  a job is an error, exit 2).
- ``logs JOB``: its event log (or ``--json``: the events as one JSON list).
- ``stop JOB``: asks the job's driver to stop: it checkpoints after the current step, releases
  every node and records ``stopped``; submitting the recipe again resumes it.

JOB must be a job name (orchestrator/names.py): no path is built from anything else. What the
files hold is printed with control characters escaped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.output import format_table, help_text, print_json, printable
from orchestrator.cli.watch import Terminal, follow_job, short_ids
from orchestrator.driver.events import read_events
from orchestrator.driver.hosts import ask_stop, refresh
from orchestrator.driver.job import JOBS_DIR, STOP_FILE, ask_to_stop
from orchestrator.driver.state import FINAL_PHASES, JobState, StateCorrupt, StateStore
from orchestrator.driver.status import iso_time, status_row
from orchestrator.errors import UserError
from orchestrator.names import job_name_problem
from orchestrator.yamlsrc import file_problem


def add_jobs(commands: argparse._SubParsersAction, formatter: type) -> None:
    status = commands.add_parser(
        "status",
        help="the state of submitted jobs",
        formatter_class=formatter,
        description=help_text(__doc__),
        epilog="examples:\n  python -m orchestrator status\n  python -m orchestrator status quickstart --json",
    )
    status.add_argument("job", nargs="?", help="one job (default: all in --jobs-dir)")
    status.add_argument(
        "--all",
        action="store_true",
        help="the project's VMs on every cloud with credentials, by their geo-job label "
        "(leaks included), instead of the jobs in --jobs-dir",
    )
    logs = commands.add_parser(
        "logs",
        help="a job's event log",
        formatter_class=formatter,
        description="A job's events, oldest first: time, event, decision, reason, details; with "
        "-f, then each new one as it comes, its steps and its workers' output until it ends.",
        epilog="examples:\n  python -m orchestrator logs quickstart\n"
        "  python -m orchestrator logs -f quickstart",
    )
    logs.add_argument("job")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="go on printing its events, a line per 10th step and its workers' output until the "
        "job ends (Ctrl-C stops following, not the job)",
    )
    stop = commands.add_parser(
        "stop",
        help="stop a running job",
        formatter_class=formatter,
        description="Ask a job's driver to checkpoint after its current step and free its nodes.",
        epilog="example:\n  python -m orchestrator stop quickstart",
    )
    stop.add_argument("job")
    for parser, run in ((status, run_status), (logs, run_logs), (stop, run_stop)):
        parser.add_argument("--jobs-dir", type=Path, default=JOBS_DIR, help="where job state lives")
        parser.add_argument(
            "--cloud",
            choices=CLOUDS,
            help="a job this machine did not submit: find it in this cloud's job buckets "
            "(with this machine's credentials; emulated-*: a standing emulated cloud)",
        )
        if parser is not stop:
            parser.add_argument("--json", action="store_true", help="one JSON document")
        parser.set_defaults(run=run)


def run_status(args: argparse.Namespace, catalog: Catalog) -> int:
    if args.all:
        from orchestrator.cli.fleet_cmd import run_fleet_status

        if args.job:
            raise UserError("status --all lists every job's VMs", fix="drop the JOB or --all")
        return run_fleet_status(args)
    if args.job:
        states, broken = [_load(_folder(args, args.job))], []
    else:
        states, broken = _load_all(args.jobs_dir)
    if args.json:
        print_json(
            {
                "jobs": [status_row(s) for s in states],
                "unreadable": [_broken_json(name, e) for name, e in broken],
            }
        )
        return 0
    if not states and not broken:
        print(f"no jobs in {args.jobs_dir} (python -m orchestrator submit RECIPE starts one)")
        return 0
    rows = [tuple(printable(status_row(s)[k]) for k in _KEYS) for s in states]
    rows += [(printable(name), "unreadable") + (None,) * (len(_KEYS) - 2) for name, _ in broken]
    print(format_table(_KEYS, rows))
    for name, error in broken:
        print(f"\n{printable(name)}: {printable(error.render())}")
    return 0


_KEYS = ("job", "phase", "step", "loss", "samples_per_s", "usd_spent", "recoveries", "nodes")


def _load_all(jobs_dir: Path) -> tuple[list[JobState], list[tuple[str, UserError]]]:
    """Every job under ``jobs_dir``, and those that cannot be read with why: one broken job's
    folder hides none of the others."""
    states, broken = [], []
    for folder in sorted(p for p in jobs_dir.glob("*") if p.is_dir()):
        try:
            if not StateStore(folder).exists():
                continue  # not a job's folder
        except OSError as exc:  # a folder this user may not look into
            broken.append((folder.name, UserError(exc.strerror or str(exc), file=str(folder))))
            continue
        problem = job_name_problem(folder.name)
        if problem is not None:
            broken.append((folder.name, UserError(problem, file=str(folder))))
            continue
        refresh(folder)
        try:
            states.append(StateStore(folder).load().state)
        except StateCorrupt as error:
            broken.append((folder.name, error))
    return states, broken


def _broken_json(name: str, error: UserError) -> dict:
    return {"job": name, "file": error.file, "problem": error.message, "fix": error.fix}


def run_logs(args: argparse.Namespace, catalog: Catalog) -> int:
    folder = _folder(args, args.job)
    path = folder / "events.jsonl"
    if not StateStore(folder).exists() and not path.exists():
        raise _no_job(folder)
    problem = file_problem(path)
    if problem is not None and path.exists():
        raise UserError(
            f"the event log {problem}",
            file=str(path),
            fix="move it away: the job's driver writes a new log there",
        )
    if args.follow:
        return _follow(args.job, folder, as_json=args.json)
    events = list(read_events(path))
    if args.json:
        print_json({"job": args.job, "events": events})
        return 0
    for event in events:
        parts = [iso_time(event["time_s"]), event["event"]]
        parts += [event[k] for k in ("decision", "reason") if event.get(k)]
        details = event.get("details")
        if details:
            parts.append(", ".join(f"{k}={v}" for k, v in details.items()))
        print(printable(short_ids("  ".join(str(p) for p in parts))))
    return 0


def _follow(job: str, folder: Path, *, as_json: bool) -> int:
    if as_json:
        raise UserError("logs --follow prints lines as they come", fix="drop --json or --follow")
    try:
        end = follow_job(folder, Terminal(sys.stdout))
    except KeyboardInterrupt:
        print(f"\nstopped following job {job}; it goes on (python -m orchestrator stop {job})")
        return 0
    print(f"job {job}: {printable(end)}")
    return 0 if end == "done" else 1


def run_stop(args: argparse.Namespace, catalog: Catalog) -> int:
    folder = _folder(args, args.job)
    state = _load(folder)
    if state.phase in FINAL_PHASES:
        print(f"job {args.job} is not running ({printable(state.phase)})")
        return 0
    try:
        ask_to_stop(folder)
        ask_stop(folder)
    except OSError as exc:
        raise UserError(
            f"cannot ask the job to stop: {exc.strerror or exc}",
            file=str(folder / STOP_FILE),
            fix="check that the job's folder is writable and holds no folder of that name",
        ) from None
    print(
        f"asked job {args.job} to stop: it checkpoints after its current step and frees its nodes"
    )
    return 0


def _folder(args: argparse.Namespace, job: str) -> Path:
    """The folder of the job named ``job``; no path is built from a name that is not a job's."""
    problem = job_name_problem(job)
    if problem is not None:
        raise UserError(
            problem,
            field="JOB",
            fix="give a job's name as python -m orchestrator status lists them",
        )
    folder = args.jobs_dir / job
    if getattr(args, "cloud", None) and not StateStore(folder).exists():
        _fetch(args.cloud, job, folder)
    refresh(folder)  # a job whose controller runs in a cloud: its state from its bucket
    return folder


CLOUDS = ("aws", "gcp", "azure", "emulated-aws", "emulated-gcp", "emulated-azure")


def _fetch(cloud: str, job: str, folder: Path) -> None:
    """Find ``job`` in ``cloud``'s job buckets and keep where it is in ``folder``."""
    from orchestrator.driver.hosts import find_job
    from provisioners.base import ProvisionerError

    provider, registration = cloud.removeprefix("emulated-"), None
    if cloud.startswith("emulated-"):
        from orchestrator.driver.standing import find

        registration = find(provider)
        if registration is None:
            raise UserError(
                f"no emulated {provider} stands", fix="python -m orchestrator emulate list"
            )
    try:
        record = find_job(job, provider, registration=registration)
    except ProvisionerError as error:
        raise UserError(
            f"{error.cloud}: {error.call}: {error.message}", field="--cloud", fix=error.fix
        ) from None
    if record is None:
        raise UserError(
            f"no job {job!r} in the job buckets of {cloud}",
            field="JOB",
            fix="check the job's name and the account or project your credentials name",
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    record.save(folder)


def _load(folder: Path) -> JobState:
    store = StateStore(folder)
    if not store.exists():
        raise _no_job(folder)
    return store.load().state


def _no_job(folder: Path) -> UserError:
    return UserError(
        f"no job {folder.name!r} in {folder.parent}",
        field="JOB",
        fix="python -m orchestrator status lists the jobs; --jobs-dir says where to look",
    )
