"""The command line: ``python -m orchestrator COMMAND`` (also installed as ``orchestrator``).

Exit codes: 0 success; 2 a user error (bad recipe, bad argument, bad config row), printed without a
traceback; 1 a job that ended without finishing (``submit``: failed or stopped).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from orchestrator.catalog import Catalog, default_catalog
from orchestrator.cli import (
    catalog_cmd,
    emulate_cmd,
    fleet_cmd,
    jobs_cmd,
    plan_cmd,
    profile_cmd,
    recipe_cmd,
    simulate_cmd,
    submit_cmd,
)
from orchestrator.cli.output import printable
from orchestrator.errors import USER_ERROR_EXIT_CODE, UserError


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in epilogs as written."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator",
        description="Train one model on spot GPUs spread over zones, regions and clouds: validate recipes, "
        "query the catalog, simulate plans, plan, submit.",
        formatter_class=_Formatter,
        epilog="examples:\n  python -m orchestrator validate recipes/quickstart.yaml\n"
        "  python -m orchestrator catalog offers --gpu A100 --json\n"
        "  python -m orchestrator submit recipes/quickstart.yaml",
    )
    parser.add_argument(
        "--configs",
        type=Path,
        default=None,
        metavar="DIR",
        help="read the catalog from this folder instead of the packaged configs/",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    recipe_cmd.add_validate(commands, _Formatter)
    catalog_cmd.add_parser(commands, _Formatter)
    simulate_cmd.add_simulate(commands, _Formatter)
    plan_cmd.add_plan(commands, _Formatter)
    profile_cmd.add_profile(commands, _Formatter)
    submit_cmd.add_submit(commands, _Formatter)
    jobs_cmd.add_jobs(commands, _Formatter)
    fleet_cmd.add_down(commands, _Formatter)
    emulate_cmd.add_emulate(commands, _Formatter)
    return parser


# Built once per process: nothing in it changes after it is built (no custom actions; parsing
# writes only to the namespace it returns), and building it costs more than parsing. Tests and
# the fuzz campaign call ``main`` thousands of times. ``_parser.cache_clear()`` drops it.
_parser = functools.cache(build_parser)


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C is: a followed job is asked to stop cleanly first (local.py)."""

    signum = 15


def run() -> int:
    """The program's entry (``python -m orchestrator``, the ``orchestrator`` script): ``main``,
    with SIGTERM and Ctrl-C unwinding the command (its ``finally`` blocks remove what it made:
    the local cloud's VMs, an emulated cloud) and ending it with one line, no traceback. A job
    being followed takes the first one as a request to stop cleanly (driver/local.py)."""
    import signal

    def terminated(signum, frame):
        raise Terminated()  # unwinds like Ctrl-C, so cleanups run

    signal.signal(signal.SIGTERM, terminated)
    try:
        return main()
    except KeyboardInterrupt as interrupt:
        print("\ninterrupted", file=sys.stderr)
        return 128 + getattr(interrupt, "signum", signal.SIGINT)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code."""
    args = _parser().parse_args(argv)
    try:
        # the packaged catalog is read once per process (tests and the fuzz campaign call main
        # many times)
        catalog = default_catalog() if args.configs is None else Catalog(args.configs)
        return args.run(args, catalog)
    except UserError as exc:
        # what the user's file held is echoed escaped: no escape sequence reaches the terminal
        print(f"error: {printable(exc.render())}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except BrokenPipeError:  # e.g. `... | head`: the reader left; nothing to report
        return 0
