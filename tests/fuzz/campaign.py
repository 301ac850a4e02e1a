"""The fuzz campaign: hostile inputs through the real CLI entry point, in this process.

    python -m tests.fuzz.campaign --examples 2000 --seed 16

Each generated input (tests/fuzz/strategies.py, job_files.py) is laid out in a fresh temporary
folder and run as ``orchestrator.cli.main([...])`` with stdout and stderr captured as UTF-8 (as a
terminal's would be). The properties, for every run: no exception escapes ``main``; nothing printed
looks like a traceback; the exit code is 0 or 2; an exit 2 comes from a UserError that names a
field or a file (``where()``); the run takes under ``RUN_LIMIT_S`` (a timer in the main thread
interrupts it, so a hang fails instead of hanging CI). The campaign runs in its own process so that
its peak RSS measures the fuzzing alone; it prints one JSON report on stdout (inputs per target,
exit codes, the slowest run, peak RSS, every property broken) and a summary on stderr.

Hypothesis draws the inputs from a fixed seed with no example database: the same command runs the
same inputs, and nothing is written to the working tree.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.errors import UserError
from tests.fuzz.job_files import jobs_cases
from tests.fuzz.strategies import (
    DEVICE,
    FIFO,
    FOLDER,
    Case,
    plan_cases,
    plan_market_cases,
    simulate_cases,
    validate_cases,
)

RUN_LIMIT_S = 10.0  # CPU seconds one run may take (a timer on the process's CPU time)
# and seconds of wall time: a run that blocks (reading a FIFO) uses no CPU; the slack is for a
# machine shared with other work, where a run's wall time stretches with the load
RUN_WALL_LIMIT_S = 30.0
MEMORY_GUARD_BYTES = 3 * 1024**3  # the address space the campaign may take before MemoryError
# share of the inputs per target; planning costs the most, so it gets the fewest
TARGETS: dict[str, tuple[float, Callable[[], st.SearchStrategy[Case]]]] = {
    "validate": (0.40, validate_cases),
    "plan": (0.05, plan_cases),
    "plan --market": (0.05, plan_market_cases),
    "simulate --plan": (0.16, simulate_cases),
    "status": (0.10, lambda: jobs_cases("status")),
    "status JOB": (0.10, lambda: jobs_cases("status JOB")),
    "logs JOB": (0.14, lambda: jobs_cases("logs JOB")),
}
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*File \".*\", line \d+", re.M)


class RunTimedOut(BaseException):
    """Raised in the main thread by a run timer; a BaseException, so that no ``except
    Exception`` in the code under test swallows it."""


_TIMERS = ((signal.ITIMER_PROF, RUN_LIMIT_S), (signal.ITIMER_REAL, RUN_WALL_LIMIT_S))


def _peak_kib() -> int:
    """This process's peak resident set, KiB: the kernel's VmHWM, which a new program starts
    afresh. (``ru_maxrss`` keeps the peak of the process before ``exec``: run from a test worker
    that had grown to 1 GiB, the campaign read 1.2 GiB though it never held more than 0.25.)"""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no /proc: the closest figure


@dataclass
class Report:
    runs: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)  # per target, in main
    exits: dict[str, Counter] = field(default_factory=dict)
    labels: dict[str, Counter] = field(default_factory=dict)
    slowest: dict = field(default_factory=lambda: {"cpu_seconds": 0.0})  # by CPU time
    slowest_wall_s: float = 0.0
    violations: list[dict] = field(default_factory=list)
    violation_count: int = 0
    peak_step: dict = field(default_factory=lambda: {"mib": 0.0})  # the run that raised the
    # peak RSS most

    def note_peak(self, case: Case, before_kib: int) -> None:
        rise = (_peak_kib() - before_kib) / 1024
        if rise > self.peak_step["mib"]:
            self.peak_step = {"mib": round(rise, 1), "target": case.target, "input": case.label}

    def add_violation(self, case: Case, kind: str, detail: str) -> None:
        self.violation_count += 1
        if len(self.violations) < 50:
            self.violations.append(
                {
                    "target": case.target,
                    "input": case.label,
                    "args": case.args,
                    "kind": kind,
                    "detail": detail[-2000:],
                }
            )


class _Where:
    """The ``where()`` of each UserError the CLI renders, to check that exit 2 names a place."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._render = UserError.render

    def install(self) -> None:
        where, render = self, self._render

        def recording_render(error: UserError) -> str:
            where.seen.append(error.where())
            return render(error)

        UserError.render = recording_render


def lay_out(case: Case, root: Path) -> None:
    for relative, content in case.files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == FOLDER:
            path.mkdir()
        elif content == FIFO:
            os.mkfifo(path)
        elif content == DEVICE:
            path.symlink_to("/dev/zero")
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_bytes(content.encode("utf-8", "surrogatepass"))


def _on_timer(signum: int, frame: object) -> None:
    raise RunTimedOut()


def run_case(case: Case, report: Report, where: _Where) -> None:
    """Run one input through ``main`` and check every property; record what broke."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        lay_out(case, root)
        args = [a.replace("{root}", str(root)) for a in case.args]
        out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2))
        saved = sys.stdout, sys.stderr
        where.seen.clear()
        peak_before = _peak_kib()
        started, cpu_started = time.perf_counter(), time.process_time()
        code: int | str
        try:
            sys.stdout, sys.stderr = out, err
            for timer, limit in _TIMERS:
                signal.setitimer(timer, limit)
            code = main(args)
        except RunTimedOut:
            code = "timeout"
        except BaseException as exc:  # noqa: BLE001 - the property under test: nothing escapes
            code = f"escaped {type(exc).__name__}"
            report.add_violation(case, "exception escaped main", _describe(exc))
        finally:
            for timer, _ in _TIMERS:
                signal.setitimer(timer, 0)
            sys.stdout, sys.stderr = saved
        seconds = (time.perf_counter() - started, time.process_time() - cpu_started)
        report.note_peak(case, peak_before)
        _check(case, code, _text(out) + _text(err), seconds, report, where)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check(
    case: Case, code, output: str, times: tuple[float, float], report: Report, where: _Where
) -> None:
    seconds, cpu_seconds = times
    report.runs[case.target] += 1
    report.seconds[case.target] += seconds
    report.exits.setdefault(case.target, Counter())[str(code)] += 1
    report.labels.setdefault(case.target, Counter())[case.label.split(" of ")[0][:40]] += 1
    report.slowest_wall_s = max(report.slowest_wall_s, round(seconds, 3))
    if cpu_seconds > report.slowest["cpu_seconds"]:
        report.slowest = {
            "cpu_seconds": round(cpu_seconds, 3),
            "seconds": round(seconds, 3),
            "target": case.target,
            "input": case.label,
            "args": case.args,
        }
    if code == "timeout":
        limits = f"{RUN_LIMIT_S:g} CPU seconds or {RUN_WALL_LIMIT_S:g} s"
        report.add_violation(case, f"ran over {limits}", output[-500:])
    elif code not in (0, 2) and not str(code).startswith("escaped"):
        report.add_violation(case, f"exit code {code}", output[-500:])
    if _TRACEBACK.search(output):
        report.add_violation(case, "traceback in the output", output)
    if code == 2 and not (where.seen and where.seen[0]):
        report.add_violation(case, "exit 2 without naming a field or file", output[-500:])


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", "replace")


def _describe(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc))


def run_target(name: str, examples: int, campaign_seed: int, report: Report, where: _Where) -> None:
    make = TARGETS[name][1]

    @seed(campaign_seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=make())
    def fuzz(case: Case) -> None:
        run_case(case, report, where)

    fuzz()


def campaign(examples: int, campaign_seed: int, targets: list[str]) -> dict:
    _guard_memory()
    where = _Where()
    where.install()
    signal.signal(signal.SIGALRM, _on_timer)
    signal.signal(signal.SIGPROF, _on_timer)
    report, started, cpu_started = Report(), time.perf_counter(), time.process_time()
    weights = sum(TARGETS[t][0] for t in targets)
    for name in targets:
        share = max(1, round(examples * TARGETS[name][0] / weights))
        run_target(name, share, campaign_seed, report, where)
    return {
        "examples_asked": examples,
        "seed": campaign_seed,
        "inputs": sum(report.runs.values()),
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(time.process_time() - cpu_started, 2),
        "peak_rss_mib": round(_peak_kib() / 1024, 1),
        "runs": dict(report.runs),
        "seconds_in_main": {k: round(v, 2) for k, v in report.seconds.items()},
        "exits": {k: dict(v) for k, v in report.exits.items()},
        "inputs_by_kind": {k: dict(v) for k, v in report.labels.items()},
        "slowest": report.slowest,
        "slowest_wall_s": report.slowest_wall_s,
        "largest_peak_rss_rise": report.peak_step,
        "violation_count": report.violation_count,
        "violations": report.violations,
        "torch_imported": "torch" in sys.modules,
    }


def _guard_memory() -> None:
    """A run that allocates without bound fails with MemoryError instead of swapping CI."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_GUARD_BYTES if hard == resource.RLIM_INFINITY else min(hard, MEMORY_GUARD_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def summary(document: dict) -> str:
    slow, rise = document["slowest"], document["largest_peak_rss_rise"]
    lines = [
        f"fuzz: {document['inputs']:,} inputs in {document['wall_s']} s, peak RSS "
        f"{document['peak_rss_mib']} MiB, {document['violation_count']} properties broken",
        f"slowest: {slow['cpu_seconds']} CPU s ({slow.get('seconds')} s), {slow.get('target')}: "
        f"{slow.get('input')}; slowest by the clock {document['slowest_wall_s']} s",
        f"largest rise of the peak RSS: {rise['mib']} MiB, {rise.get('target')}: "
        f"{rise.get('input')}",
    ]
    for target, count in document["runs"].items():
        exits = ", ".join(f"exit {k}: {v}" for k, v in sorted(document["exits"][target].items()))
        seconds = document["seconds_in_main"][target]
        lines.append(f"  {target}: {count} in {seconds} s ({exits})")
    for violation in document["violations"][:10]:
        lines.append(f"BROKEN {violation['target']} [{violation['input']}]: {violation['kind']}")
        last = (violation["detail"].strip().splitlines() or ["(no output)"])[-1]
        lines.append(f"    {last[:300]}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="inputs in all (2000)")
    parser.add_argument("--seed", type=int, default=16, help="Hypothesis's seed (16)")
    parser.add_argument(
        "--target", action="append", choices=sorted(TARGETS), help="only these targets"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse_args()
    result = campaign(options.examples, options.seed, options.target or list(TARGETS))
    print(json.dumps(result, indent=2), flush=True)
    print(summary(result), file=sys.stderr)
