"""``status``, ``logs`` and ``stop``: the jobs ``submit`` runs, read from their folders.

- ``status [JOB]``: per job its phase, step, last loss, measured samples/s, dollars spent (compute
  + egress), recoveries and nodes held (table or ``--json``).
- ``logs JOB``: its event log (or ``--json``: the events as one JSON list).
- ``stop JOB``: asks the job's driver to stop: it checkpoints after the current step, releases
  every node and records ``stopped``; submitting the recipe again resumes it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.output import format_table, print_json
from orchestrator.driver.events import read_events
from orchestrator.driver.job import JOBS_DIR, STOP_FILE, iso_time, status_row
from orchestrator.driver.state import JobState, StateStore
from orchestrator.errors import UserError


def add_jobs(commands: argparse._SubParsersAction, formatter: type) -> None:
    status = commands.add_parser(
        "status",
        help="the state of submitted jobs",
        formatter_class=formatter,
        description=__doc__,
        epilog="examples:\n  python -m orchestrator status\n  python -m orchestrator status quickstart --json",
    )
    status.add_argument("job", nargs="?", help="one job (default: all in --jobs-dir)")
    logs = commands.add_parser(
        "logs",
        help="a job's event log",
        formatter_class=formatter,
        description="A job's events, oldest first: time, event, decision, reason, details.",
        epilog="example:\n  python -m orchestrator logs quickstart",
    )
    logs.add_argument("job")
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
        if parser is not stop:
            parser.add_argument("--json", action="store_true", help="one JSON document")
        parser.set_defaults(run=run)


def run_status(args: argparse.Namespace, catalog: Catalog) -> int:
    folders = [args.jobs_dir / args.job] if args.job else sorted(args.jobs_dir.glob("*/"))
    states = [_load(folder) for folder in folders if StateStore(folder).exists() or args.job]
    if args.json:
        print_json({"jobs": [status_row(s) for s in states]})
        return 0
    if not states:
        print(f"no jobs in {args.jobs_dir} (python -m orchestrator submit RECIPE starts one)")
        return 0
    header = ("job", "phase", "step", "loss", "samples_per_s", "usd_spent", "recoveries", "nodes")
    rows = [tuple(status_row(s)[k] for k in _KEYS) for s in states]
    print(format_table(header, rows))
    return 0


_KEYS = ("job", "phase", "step", "loss", "samples_per_s", "usd_spent", "recoveries", "nodes")


def run_logs(args: argparse.Namespace, catalog: Catalog) -> int:
    folder = args.jobs_dir / args.job
    _load(folder)  # a clear error for a job that does not exist
    events = list(read_events(folder / "events.jsonl"))
    if args.json:
        print_json({"job": args.job, "events": events})
        return 0
    for event in events:
        parts = [iso_time(event["time_s"]), event["event"]]
        parts += [event[k] for k in ("decision", "reason") if event.get(k)]
        details = event.get("details")
        if details:
            parts.append(", ".join(f"{k}={v}" for k, v in details.items()))
        print("  ".join(str(p) for p in parts))
    return 0


def run_stop(args: argparse.Namespace, catalog: Catalog) -> int:
    folder = args.jobs_dir / args.job
    state = _load(folder)
    if state.phase in ("done", "failed", "stopped"):
        print(f"job {args.job} is not running ({state.phase})")
        return 0
    (folder / STOP_FILE).write_text("stop\n")
    print(
        f"asked job {args.job} to stop: it checkpoints after its current step and frees its nodes"
    )
    return 0


def _load(folder: Path) -> JobState:
    store = StateStore(folder)
    if not store.exists():
        raise UserError(
            f"no job {folder.name!r} in {folder.parent}",
            fix="python -m orchestrator status lists the jobs; --jobs-dir says where to look",
        )
    return store.load().state
