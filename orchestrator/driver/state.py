"""The driver's persisted state: what a restarted driver needs to pick its job up.

``JobState`` holds the recipe's path, the phase of the driver's state machine, the plan it runs, the
last committed step and checkpoint, money spent (compute and egress, measured), the nodes it holds
and its recoveries. ``StateStore`` writes it as ``state.json`` in the job's folder: the document
and its sha256 go to a temporary file that is fsynced and renamed over the old one, after the old
one is kept as ``state.prev.json``. A driver killed mid-write leaves either file whole; ``load``
checks the checksum and falls back to the previous state when the newest is torn or corrupt,
saying so.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import types
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from orchestrator.driver.events import EARLIEST_S, LATEST_S
from orchestrator.errors import UserError
from orchestrator.yamlsrc import file_problem

FORMAT = "geo-orchestrator/job-state-v1"
MAX_STATE_BYTES = 64 * 1024 * 1024  # a state holds a loss per step: 10 million steps fit
FINAL_PHASES = ("done", "failed", "stopped")  # a job in one of these runs no more


@dataclass(frozen=True, kw_only=True)
class JobState:
    job: str
    recipe_path: str
    phase: str
    run_id: str = ""  # names this submission's checkpoints (a job submitted again starts afresh)
    # the phase it ended in when it was submitted again to go on ("stopped", "failed"); its
    # driver then logs a resume, not a restart (cleared once logged)
    resumed_from: str = ""
    step: int = 0  # steps committed: the next step to train
    steps_total: int = 0  # the recipe's steps
    global_batch_size: int = 0  # samples per step
    plan: dict | None = None  # the plan format (orchestrator/plan.py: Plan.to_dict)
    checkpoint_step: int | None = None  # the newest complete checkpoint, if any
    compute_usd: float = 0.0
    egress_usd: float = 0.0
    egress_bytes: float = 0.0
    nodes: tuple[str, ...] = ()
    # what a restarted driver needs to take over the running job without a restart: the plan's
    # choice (machine.Choice as a dict), what each held node was launched as (machine.Request as
    # a dict), the running workers' group name (runtime/group.py) and the driver's restarts
    choice: dict | None = None
    node_kinds: dict = field(default_factory=dict)
    workers: str | None = None
    driver_restarts: int = 0
    recoveries: int = 0
    # the retry budget (machine.py): recoveries in a row without new progress, since when (Unix
    # s), and the furthest step ever committed (passing it is progress)
    attempts: int = 0
    attempts_since_s: float | None = None
    high_water_step: int = 0
    # why a failed job stopped: {"cause", "message", "fix", "step"} (failures.py), or None
    failure: dict | None = None
    losses: tuple[float, ...] = ()  # per committed step
    trained_steps: int = 0  # steps trained, replays after a recovery included
    train_s: float = 0.0  # seconds spent in those steps (not launching, starting, recovering)
    started_at_s: float = field(default_factory=time.time)
    updated_at_s: float = field(default_factory=time.time)
    version: int = 0  # one more at every save

    def evolve(self, **changes) -> JobState:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        document = asdict(self)
        document["nodes"] = list(self.nodes)
        document["losses"] = list(self.losses)
        return document

    @classmethod
    def from_dict(cls, document: dict) -> JobState:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in document.items() if k in known}
        values["nodes"] = tuple(values.get("nodes", ()))
        values["losses"] = tuple(values.get("losses", ()))
        return cls(**values)


class StateCorrupt(UserError):
    """Neither the newest state nor the previous one can be read."""


@dataclass(frozen=True)
class Loaded:
    state: JobState
    source: Path
    problems: tuple[str, ...]  # what was wrong with newer files that were skipped


class StateText:
    """A state's JSON text, as ``json.dumps(state.to_dict(), sort_keys=True)`` writes it, with the
    losses' part extended as steps commit rather than encoded anew: a state is saved at every
    step, and encoding all of 100,000 losses each time took ~120 ms of the driver's step."""

    def __init__(self) -> None:
        self._losses: tuple[float, ...] = ()  # the losses ``_joined`` encodes
        self._joined = ""

    def __call__(self, state: JobState) -> str:
        losses, known = state.losses, len(self._losses)
        if losses[:known] != self._losses:  # rolled back (a recovery: rare): encode anew
            known, self._joined = 0, ""
        new = ", ".join(json.dumps(loss) for loss in losses[known:])
        if new:
            self._joined += (", " if known else "") + new
        self._losses = losses
        values = {f.name: getattr(state, f.name) for f in fields(state) if f.name != "losses"}
        parts = {name: json.dumps(value, sort_keys=True) for name, value in values.items()}
        parts["losses"] = f"[{self._joined}]"
        return "{" + ", ".join(f"{json.dumps(k)}: {parts[k]}" for k in sorted(parts)) + "}"


class StateStore:
    """``state.json`` (and ``state.prev.json``) in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "state.json"
        self.previous = folder / "state.prev.json"
        self._text = StateText()

    def exists(self) -> bool:
        return self.path.exists() or self.previous.exists()

    def save(self, state: JobState, *, durable: bool = True) -> JobState:
        """Write ``state`` (its version and time updated) atomically; return what was written.

        ``durable``: fsync the file and the folder, so that the state outlives a crash of the
        machine too. A step's commit (one save per step) skips that: the rename alone survives a
        crash of the driver, and after the machine's crash an older state only trains a few
        steps again from the checkpoint, which is saved durably."""
        state = state.evolve(version=state.version + 1, updated_at_s=time.time())
        body = self._text(state)
        # the document with its keys sorted ("state" last), the state's text encoded once
        head = json.dumps({"format": FORMAT, "sha256": _digest(body)}, sort_keys=True)
        document = f'{head[:-1]}, "state": {body}}}'
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.folder / f".state.{os.getpid()}.tmp"
        with temporary.open("w", encoding="utf-8") as handle:
            handle.write(document)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if self.path.exists():
            os.replace(self.path, self.previous)
        os.replace(temporary, self.path)
        if durable:
            _fsync_folder(self.folder)
        return state

    def load(self) -> Loaded:
        """The newest readable state; raise StateCorrupt if there is none."""
        problems = []
        for path in (self.path, self.previous):
            try:
                return Loaded(_read(path), path, tuple(problems))
            except FileNotFoundError:
                problems.append(f"{path.name}: missing")
            except ValueError as exc:
                problems.append(f"{path.name}: {exc}")
        raise StateCorrupt(
            "no readable job state: " + "; ".join(problems),
            file=str(self.path),
            fix="the job cannot be resumed from its state; submit the recipe again (its "
            "checkpoints are kept and are found by their manifests)",
        )


def _read(path: Path) -> JobState:
    """The state in ``path``; FileNotFoundError when there is none, ValueError saying what is
    wrong when it cannot be trusted (a folder, a FIFO, not JSON, a bad checksum, wrong types)."""
    problem = file_problem(path)
    if problem == "file not found":
        raise FileNotFoundError(path)
    if problem is not None:
        raise ValueError(problem)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_STATE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_STATE_BYTES:
        raise ValueError(f"larger than {MAX_STATE_BYTES:,} bytes, not a state this code wrote")
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also an integer of 5,000 digits
        raise ValueError(f"not JSON ({exc.__class__.__name__}), torn or corrupt") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} document")
    body = json.dumps(document.get("state"), sort_keys=True)
    if _digest(body) != document.get("sha256"):
        raise ValueError("checksum mismatch")
    state = document["state"]
    if not isinstance(state, dict):
        raise ValueError("the state is not a mapping of fields")
    _check_fields(state)
    try:
        return JobState.from_dict(state)
    except TypeError as exc:
        raise ValueError(f"fields do not match ({exc})") from None


def _check_fields(state: dict) -> None:
    """Raise ValueError naming the first field whose value is not of its type (a float must be
    finite, a time one a calendar can show), so nothing that reads the state fails later."""
    hints = typing.get_type_hints(JobState)
    for name, value in state.items():
        if name in hints and not _fits(value, hints[name]):
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:40] + "..."
            raise ValueError(f"field {name} is {shown}, not {_type_name(hints[name])}")
        if name.endswith("_at_s") and not EARLIEST_S <= value <= LATEST_S:
            raise ValueError(f"field {name} is {value}, not a time")


def _fits(value: object, hint: object, *, finite: bool = True) -> bool:
    """Whether ``value`` (from JSON) is a ``hint``; the items of a list (losses) may be NaN or
    infinite, as a diverged run's losses are, the other numbers may not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is tuple:  # written as a JSON list
        return isinstance(value, list) and all(_fits(v, args[0], finite=False) for v in value)
    if hint is type(None):
        return value is None
    if hint is float:
        if isinstance(value, int) and not isinstance(value, bool):
            return abs(value) < 2**1023  # a float could hold it (math.isfinite would overflow)
        return isinstance(value, float) and (not finite or math.isfinite(value))
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_name(hint: object) -> str:
    return getattr(hint, "__name__", None) or str(hint)


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def _fsync_folder(folder: Path) -> None:
    """Make the renames durable (POSIX: fsync the directory)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
