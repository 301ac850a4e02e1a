"""What a person sees of a running job: its events as one line each when they happen (the plan,
the launch, a preemption notice, a lost node, a recovery, a re-plan), a progress line, and a copy
of the whole terminal output in the job's folder (``output.log``).

``Terminal`` owns the lines written to the terminal: on a terminal the progress line is rewritten
in place and an event line replaces it; elsewhere (a file, a pipe) every line is a plain line with
no escape codes. ``EventFollower`` reads the job's ``events.jsonl`` as the driver appends to it,
in a thread of its own. ``Tee`` copies what the program prints to the job's ``output.log``, the
progress line's rewrites reduced to the lines it kept.
"""

from __future__ import annotations

import datetime as dt
import io
import itertools
import os
import re
import sys
import threading
from pathlib import Path
from typing import TextIO

from orchestrator.cli.output import printable
from orchestrator.driver.events import LogTail

OUTPUT_LOG = "output.log"
POLL_S = 0.5  # how often a follower looks at the event log (a file: nothing to wait on)
HOSTED_EVERY = 10  # a job hosted in a cloud: its bucket is read every this many looks
CLEAR_LINE = "\r\033[K"  # back to the line's start and erase it (a terminal only)

# a Ray node id is 56 hex digits; its first 12 tell the job's nodes apart (--json keeps them whole)
_RAY_NODE_ID = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{44}\b")
_ESCAPE = re.compile(r"\033\[[0-9;?]*[A-Za-z]")


def short_ids(line: str) -> str:
    return _RAY_NODE_ID.sub(r"\1…", line)


def event_text(event: dict) -> str | None:
    """One event as one line for a person following the job, or None for routine ones (the
    periodic checkpoint): ``12:01:07  preemption notice  node 8743b00aa698… in local/sim-us/
    sim-us-a  -> checkpoint now, then move off the node before it goes``."""
    name = event["event"]
    if name == "checkpointed" and event.get("reason") == "its period":
        return None
    clock = dt.datetime.fromtimestamp(event["time_s"]).strftime("%H:%M:%S")
    parts = [f"{clock}  {name.replace('_', ' ')}"]
    if event.get("plan_after"):
        parts.append(event["plan_after"])
    reason = event.get("reason", "")
    details = event.get("details") or {}
    if "recovery_s" in details:
        reason = f"{reason}: {details['recovery_s']:.1f} s after the loss".strip(": ")
    if reason:
        parts.append(reason)
    line = "  ".join(parts)
    if event.get("decision"):
        line += f"  -> {event['decision']}"
    return short_ids(line)


class Terminal:
    """The lines of one command on ``stream`` (stderr by default), safe from several threads."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self.tty = _isatty(self.stream)
        self._lock = threading.Lock()
        self._shown = False  # a progress line is on the terminal, not ended

    @property
    def stream(self) -> TextIO:
        """The stream given, else stderr as it is now (an ``OutputCopy`` may have wrapped it)."""
        return self._stream or sys.stderr

    def line(self, text: str) -> None:
        with self._lock:
            start = CLEAR_LINE if self.tty and self._shown else ""
            self.stream.write(f"{start}{text}\n")
            self.stream.flush()
            self._shown = False

    def progress(self, text: str, *, keep: bool) -> None:
        """A progress line: on a terminal rewritten in place until one is kept (ended with a
        newline); elsewhere only the kept ones are written."""
        with self._lock:
            if self.tty:
                self.stream.write(CLEAR_LINE + text + ("\n" if keep else ""))
                self._shown = not keep
            elif keep:
                self.stream.write(text + "\n")
            self.stream.flush()

    def end_progress(self) -> None:
        """End a progress line left open, so what comes next starts on a line of its own."""
        with self._lock:
            if self._shown:
                self.stream.write("\n")
                self.stream.flush()
            self._shown = False


class EventFollower:
    """Prints the events the driver appends to ``path`` (from its end now) on ``terminal`` as
    they come, until ``close()``, which prints the last ones."""

    def __init__(self, path: Path, terminal: Terminal) -> None:
        self.tail, self.terminal = LogTail(path), terminal
        self._stop, self._reading = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._run, name="event-follower", daemon=True)

    def start(self) -> EventFollower:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.flush()

    def flush(self) -> None:
        """Print what was appended since the last look (from any thread)."""
        with self._reading:
            for event in self.tail.read():
                text = event_text(event)
                if text is not None:
                    self.terminal.line(printable(text))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.flush()


class Tee(io.TextIOBase):
    """A text stream that writes to ``stream`` and copies each finished line to ``log``: what a
    line shows last after its carriage returns (a progress line's final state), without escape
    codes."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream, self.log = stream, log
        self._pending = ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            kept = _ESCAPE.sub("", line.rsplit("\r", 1)[-1])
            if kept:
                self.log.write(kept + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return _isatty(self.stream)

    def fileno(self) -> int:
        return self.stream.fileno()


class OutputCopy:
    """While open, stdout and stderr are copied to the job's ``output.log`` (appended: each
    submit of the job adds its own run's output)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / OUTPUT_LOG
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._log = os.fdopen(descriptor, "a", encoding="utf-8")
        stamp = dt.datetime.now().astimezone().isoformat(timespec="seconds")
        self._log.write(f"--- {stamp}: {' '.join(sys.argv)}\n")
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Tee(sys.stdout, self._log), Tee(sys.stderr, self._log)

    def close(self) -> None:
        if sys.stdout is not self._saved[0]:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = self._saved
        self._log.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or bare stream
        return False


class WorkerOutput:
    """What the job's Ray workers print (their ``worker-*.out`` and ``.err`` in the job's
    ``ray-logs``), line by line as it is written, each line tagged with the worker's actor
    (Ray's own ``:job_id:`` / ``:actor_name:`` markers are read, not shown)."""

    def __init__(self, folder: Path, *, from_start: bool = True) -> None:
        self.logs = folder / "ray-logs"
        self.from_start = from_start
        self._tails: dict[Path, tuple[LogTail, list[str]]] = {}

    def read(self) -> list[str]:
        lines = []
        for path in sorted(self.logs.glob("worker-*.[oe][ur][tr]")) if self.logs.is_dir() else ():
            if path not in self._tails:
                tail = LogTail(path, from_start=self.from_start, parse=_text_line)
                self._tails[path] = (tail, ["worker"])
            tail, name = self._tails[path]
            for record in tail.read():
                text = record["text"]
                if text.startswith(":actor_name:") or text.startswith(":task_name:"):
                    name[0] = text.split(":", 2)[2] or name[0]
                elif text and not text.startswith(":job_id:"):
                    lines.append(f"[{name[0]}] {text}")
        self.from_start = True  # a file that appears later is read whole
        return lines


def _text_line(line: bytes) -> dict:
    return {"text": line.decode("utf-8", "replace").rstrip()}


def follow_job(folder: Path, terminal: Terminal, *, stop: threading.Event | None = None) -> str:
    """Print a job's events (those so far, then each as it comes), a line per 10th step and its
    workers' output until it ends; its final phase, or why following stopped."""
    from orchestrator.driver.bucket import RECORD_FILE
    from orchestrator.driver.hosts import BucketReader
    from orchestrator.driver.lock import holder
    from orchestrator.driver.metrics import METRICS_FILE, parse_row
    from orchestrator.driver.state import FINAL_PHASES, StateCorrupt, StateStore

    events = LogTail(folder / "events.jsonl", from_start=True)
    steps = LogTail(folder / METRICS_FILE, parse=parse_row)
    workers = WorkerOutput(folder, from_start=False)
    stop = stop or threading.Event()
    kept, hosted = -1, (folder / RECORD_FILE).exists()  # hosted: its controller runs in a cloud
    pull = BucketReader(folder)
    for cycle in itertools.count():
        if hosted and cycle % HOSTED_EVERY == 0:
            pull()  # its files, from its bucket
        for event in events.read():
            text = event_text(event)
            if text is not None:
                terminal.line(printable(text))
        for row in steps.read():
            if row["step"] // 10 > kept // 10:
                kept = row["step"]
                terminal.line(_step_text(row))
        for text in workers.read():
            terminal.line(printable(text))
        try:
            state = StateStore(folder).load().state
        except StateCorrupt as error:
            return f"its state cannot be read: {error.message}"
        held = holder(folder) is not None  # a final phase while held: its process cleans up
        if state.phase in FINAL_PHASES and not held:
            return state.phase
        if not held and not hosted:
            return f"no process runs it (its state says {state.phase})"
        if stop.wait(POLL_S):
            return "interrupted"
    raise AssertionError("unreachable")


def _step_text(row: dict) -> str:
    clock = dt.datetime.fromtimestamp(row["time_s"]).strftime("%H:%M:%S")
    parts = [f"{clock}  step {row['step']}"]
    if row.get("loss") is not None:
        loss = row["loss"]
        parts.append(f"loss {loss:.4f}" if loss == 0 or abs(loss) >= 1e-3 else f"loss {loss:.3e}")
    if row.get("samples_per_s"):
        parts.append(f"{row['samples_per_s']:,.0f} samples/s")
    if row.get("usd_spent") is not None:
        parts.append(f"${row['usd_spent']:.5f} spent")
    return "  ".join(parts)
