"""``status --all`` and ``down JOB``: the project's VMs on every cloud, found by their labels.

Every VM a job launches carries the labels (tags) ``geo-job`` (the job's name) and ``geo-expires``
(the end of its lease, Unix seconds; provisioners/bootstrap/joined.py). These commands ask every
cloud whose SDK and credentials are present for the VMs with a ``geo-job`` label, whatever
process launched them, so a VM a crashed ``submit`` or controller left behind is seen:

- ``status --all``: one row per VM: cloud place, id, type, state, job, lease end, and ``expired``
  where the lease has passed (nothing renews it: a leak).
- ``down JOB``: asks the job's driver to stop (when this folder runs it) and terminates every VM
  labelled with the job on every cloud, saying what it ended and which clouds it could not ask.

A cloud without its SDK or credentials is named with what is missing and skipped; the others are
still asked.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.cli.output import format_table, help_text, print_json
from orchestrator.driver.hosts import ask_stop, refresh
from orchestrator.driver.job import JOBS_DIR, ask_to_stop
from orchestrator.driver.state import FINAL_PHASES, StateStore
from orchestrator.errors import UserError
from orchestrator.names import job_name_problem
from provisioners.bootstrap.joined import of_job

CLOUDS = ("aws", "gcp", "azure")  # SkyPilot's VMs are on these clouds and carry the same labels
JOB_LABEL, EXPIRES_LABEL = "geo-job", "geo-expires"


@dataclass(frozen=True)
class Asked:
    """One cloud's answer: its VMs, or why it could not be asked."""

    cloud: str
    vms: list
    skipped: str | None = None  # what is missing, with its fix
    adapter: object | None = None


def ask_clouds(clouds=CLOUDS, *, create=None) -> list[Asked]:
    """Every cloud's VMs with a ``geo-job`` label; ``create``: the adapter factory (tests)."""
    from provisioners.base import CredentialsMissing, ProvisionerError, SdkMissing, Unsupported

    real = create is None
    if create is None:
        from provisioners.registry import create
    answers = []
    for cloud in clouds:
        try:
            adapter = create(cloud)
            adapter.check_credentials()
            answers.append(Asked(cloud, adapter.labelled(JOB_LABEL), adapter=adapter))
        except (CredentialsMissing, SdkMissing, Unsupported) as error:
            # the first sentence and the first way to fix it: a line per cloud
            what = error.message.split(". ")[0].split(" It looked")[0]
            answers.append(Asked(cloud, [], skipped=f"{what}; fix: {error.fix.split(', or ')[0]}"))
        except ProvisionerError as error:  # the cloud answered with an error: say which call
            answers.append(Asked(cloud, [], skipped=f"{error.call}: {error.message}"))
    return answers + (_ask_emulated() if real else [])


def _ask_emulated() -> list[Asked]:
    """The standing emulated clouds (``emulate up``), asked as their providers are."""
    from orchestrator.driver import standing
    from orchestrator.driver.cloud import standing_adapter
    from provisioners.base import ProvisionerError

    answers = []
    for provider in standing.PROVIDERS:
        registration = standing.find(provider)
        if registration is None:
            continue
        name = f"emulated {provider}"
        try:
            adapter = standing_adapter(registration)
            answers.append(Asked(name, adapter.labelled(JOB_LABEL), adapter=adapter))
        except ProvisionerError as error:
            answers.append(Asked(name, [], skipped=f"{error.call}: {error.message}"))
    return answers


def fleet_rows(answers: list[Asked], *, now_s: float) -> list[dict]:
    rows = []
    for answer in answers:
        for vm in answer.vms:
            expires = vm.labels.get(EXPIRES_LABEL, "")
            try:
                expires_s = float(expires)
            except ValueError:
                expires_s = None
            rows.append(
                {
                    "place": vm.infra,
                    "vm": vm.node_id,
                    "type": vm.instance_type,
                    "state": vm.state.value,
                    "job": vm.labels.get(JOB_LABEL, ""),
                    "lease_ends": _iso(expires_s) if expires_s is not None else "",
                    "expired": expires_s is not None and expires_s < now_s,
                }
            )
    return rows


def run_fleet_status(args: argparse.Namespace) -> int:
    answers = ask_clouds()
    rows = fleet_rows(answers, now_s=time.time())
    if args.json:
        print_json({"vms": rows, "clouds_not_asked": _not_asked(answers)})
        return 0
    asked = _say_not_asked(answers)
    if not rows:
        print(f"no VM labelled {JOB_LABEL} on {asked}")
        return 0
    keys = ("place", "vm", "type", "state", "job", "lease_ends", "expired")
    print(format_table(keys, [tuple(r[k] for k in keys) for r in rows]))
    leaked = [r for r in rows if r["expired"]]
    if leaked:
        print(
            f"\n{len(leaked)} VM(s) past their lease: end them with python -m orchestrator down JOB"
        )
    return 0


def add_down(commands: argparse._SubParsersAction, formatter: type) -> None:
    down = commands.add_parser(
        "down",
        help="terminate every VM of a job on every cloud",
        formatter_class=formatter,
        description=help_text(__doc__),
        epilog="example:\n  python -m orchestrator down quickstart-aws",
    )
    down.add_argument("job")
    down.add_argument("--jobs-dir", type=Path, default=JOBS_DIR, help="where job state lives")
    down.add_argument("--json", action="store_true", help="one JSON document")
    down.set_defaults(run=run_down)


def run_down(args: argparse.Namespace, catalog) -> int:
    problem = job_name_problem(args.job)
    if problem is not None:
        raise UserError(problem, field="JOB", fix="name the job as status lists it")
    folder = args.jobs_dir / args.job
    refresh(folder)  # a job whose controller runs in a cloud: its state from its bucket
    if StateStore(folder).exists() and StateStore(folder).load().state.phase not in FINAL_PHASES:
        ask_to_stop(folder)  # its driver frees what it tracks, too
        ask_stop(folder)
        print(f"asked job {args.job}'s driver to stop", file=sys.stderr)
    answers = ask_clouds()
    ended: list[dict] = []
    for answer in answers:
        mine = [vm for vm in answer.vms if of_job(vm.labels, args.job)]
        if mine:
            answer.adapter.terminate_labelled(mine)
            ended += fleet_rows([Asked(answer.cloud, mine)], now_s=time.time())
    dropped, kept = _drop_firewalls(answers, args.job)
    if args.json:
        print_json(
            {
                "terminated": ended,
                "firewalls_deleted": dropped,
                "firewalls_in_use": kept,
                "clouds_not_asked": _not_asked(answers),
            }
        )
        return 0
    asked = _say_not_asked(answers)
    for row in ended:
        print(f"terminated {row['vm']} ({row['type']}) in {row['place']}")
    for name in dropped:
        print(f"deleted firewall {name}")
    if kept:
        print(
            f"kept {', '.join(kept)} while the job's VMs shut down: run "
            f"`python -m orchestrator down {args.job}` again once they are gone"
        )
    if not ended and not dropped and not kept:
        print(f"no VM or firewall of job {args.job} on {asked}")
    return 0


def _drop_firewalls(answers: list[Asked], job: str) -> tuple[list[str], list[str]]:
    """The job's firewalls on every cloud asked: (deleted, kept while VMs still use them)."""
    from provisioners.base import ProvisionerError, Unsupported

    dropped, kept = [], []
    for answer in answers:
        if answer.adapter is None or answer.skipped:
            continue
        try:
            done, in_use = answer.adapter.drop_firewalls(job)
        except Unsupported:
            continue  # this cloud makes none
        except ProvisionerError as error:
            print(f"{answer.cloud}: firewalls not deleted: {error.call}: {error.message}")
            continue
        dropped += [f"{answer.cloud} {name}" for name in done]
        kept += [f"{answer.cloud} {name}" for name in in_use]
    return dropped, kept


def _not_asked(answers: list[Asked]) -> dict[str, str]:
    return {a.cloud: a.skipped for a in answers if a.skipped}


def _say_not_asked(answers: list[Asked]) -> str:
    """A line per cloud not asked (stderr); the clouds asked, for the summary line."""
    for cloud, why in _not_asked(answers).items():
        print(f"{cloud}: not asked: {why}", file=sys.stderr)
    return ", ".join(a.cloud for a in answers if not a.skipped) or "any cloud asked"


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
