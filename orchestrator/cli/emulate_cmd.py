"""``emulate up|down|list``: the standing emulated clouds (orchestrator/driver/standing.py).

- ``emulate up PROVIDER``: start the provider's emulation (its API on a simulated internet, each
  instance it starts booted as a namespace VM), detached from the terminal, unless one stands.
- ``emulate down PROVIDER``: take it down, every VM on it with it.
- ``emulate list``: the ones standing, their API's endpoint and their folder.
- ``emulate kill-controller PROVIDER --job JOB``: shut a job's controller VM down as a
  terminated VM is (SIGTERM to its program, off after ``--grace-s``: the driver checkpoints and
  frees its nodes first), or with ``--now`` take it at once, as a host failure does. A ``submit``
  that follows the job boots a new controller, which resumes the job from its state.

``submit --emulate`` starts the provider's emulation itself when none stands (and takes it down
after following its job to the end); ``status --all`` and ``down JOB`` ask the standing ones as
they ask a real cloud. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse

from orchestrator.cli.output import format_table, help_text, print_json
from orchestrator.errors import UserError

SHUTDOWN_GRACE_S = 90.0  # systemd's default stop timeout (TimeoutStopSec)


def add_emulate(commands: argparse._SubParsersAction, formatter: type) -> None:
    p = commands.add_parser(
        "emulate",
        help="start, stop or list the standing emulated clouds (aws, gcp, azure)",
        formatter_class=formatter,
        description=help_text(__doc__),
        epilog="examples:\n  python -m orchestrator emulate up aws\n"
        "  python -m orchestrator status --all\n  python -m orchestrator emulate down aws",
    )
    p.add_argument("action", choices=["up", "down", "list", "kill-controller"])
    p.add_argument("provider", nargs="?", choices=["aws", "gcp", "azure"])
    p.add_argument("--job", help="kill-controller: the job whose controller VM goes")
    p.add_argument(
        "--grace-s",
        type=float,
        default=SHUTDOWN_GRACE_S,
        help="kill-controller: how long the program may take to leave before the VM is off",
    )
    p.add_argument("--now", action="store_true", help="kill-controller: off at once, no grace")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(run=run_emulate)


def run_emulate(args: argparse.Namespace, catalog) -> int:
    from orchestrator.driver import standing

    if args.action == "list":
        rows = [
            {"provider": r.provider, "endpoint": r.endpoint, "pid": r.pid, "folder": r.folder}
            for r in filter(None, (standing.find(p) for p in standing.PROVIDERS))
        ]
        if args.json:
            print_json({"emulated_clouds": rows})
        elif rows:
            keys = ("provider", "endpoint", "pid", "folder")
            print(format_table(keys, [tuple(r[k] for k in keys) for r in rows]))
        else:
            print("no emulated cloud stands (python -m orchestrator emulate up aws starts one)")
        return 0
    if args.provider is None:
        raise UserError(f"emulate {args.action} needs a provider", fix="add aws, gcp or azure")
    if args.action == "up":
        from orchestrator.driver.cloud import check_emulation

        check_emulation(None)
        registration, started = standing.ensure(args.provider)
        verb = "started" if started else "already stands"
        print(f"emulated {args.provider} {verb}: its API at {registration.endpoint}")
        return 0
    if args.action == "kill-controller":
        return _kill_controller(args)
    if standing.stop(args.provider):
        print(f"emulated {args.provider} is down, every VM on it with it")
    else:
        print(f"no emulated {args.provider} stands")
    return 0


def _kill_controller(args: argparse.Namespace) -> int:
    from orchestrator.driver import standing
    from orchestrator.names import job_name_problem

    problem = job_name_problem(args.job or "")
    if problem is not None:
        raise UserError(problem, field="--job", fix="name the job as status lists it")
    registration = standing.find(args.provider)
    if registration is None:
        raise UserError(
            f"no emulated {args.provider} stands",
            fix="python -m orchestrator emulate list shows those that do",
        )
    if args.now:
        standing.call(registration, "kill_controller", job=args.job)
    else:
        timeout_s = args.grace_s + 30
        standing.call(
            registration,
            "shutdown_controller",
            job=args.job,
            grace_s=args.grace_s,
            timeout_s=timeout_s,
        )
    print(f"job {args.job}: its controller VM is off")
    return 0
