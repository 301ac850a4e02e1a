"""What failed, and can a retry fix it: the driver's verdict on an error from its runtime.

Three kinds of failure reach the driver, and each wants its own answer:

- a node or a worker process gone, or the links between workers broken (``WorkersLost``):
  recover on the nodes left or new ones; bounded by the recipe's ``recovery`` budget;
- the job's input or state broken (``JobBroken``): a corrupt checkpoint store, a full disk, a
  store it may not write, bad data, a value the code rejects, a bug in the user's or our code,
  memory the plan did not foresee. A retry would fail the same way, while billing: stop, keep
  the last good checkpoint, say what failed and what to do;
- a cloud refusing capacity or quota (``CapacityRefused``, world.py): fail over to another place.

``classify`` looks at the error a worker raised (Ray wraps it: a ``RayTaskError`` is also an
instance of the worker's exception class, and ``cause`` holds it) by its type, never by Ray's
multi-line text; what it cannot place is treated as a loss, so the retry budget bounds it.
``one_line`` turns any message into one line without colour codes or control characters, for the
event log and the terminal; the whole traceback goes to the job's ``driver.log``.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from orchestrator.driver.contract import JobBroken

# the causes a stopped job names (status, the event log, the summary)
CAUSES = (
    "checkpoint",  # no readable checkpoint, or a corrupt one where it was needed
    "disk_full",  # the checkpoint store (or the job's folder) has no space left
    "store",  # the checkpoint store refuses reads or writes (permissions, a missing bucket)
    "data",  # the training data is corrupt or unreadable
    "bad_value",  # a value the training code rejects (e.g. a NaN learning rate)
    "code_error",  # a bug: the user's code, or ours
    "out_of_memory",  # a worker ran out of memory: the plan's estimate was too low
    "diverged",  # the loss or the gradients went NaN or infinite
    "gave_up",  # the retry budget ran out without progress
    "capacity",  # every place a plan could use refused the launch (no capacity, no quota)
    "cloud",  # the cloud refused a call a retry cannot fix (credentials rejected, unsupported)
)

_ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
_COMM_WORDS = re.compile(
    r"gloo|nccl|connection|connect\(|closed by peer|reset by peer|broken pipe|timed out|"
    r"timeout|socket|unreachable|no route|address already in use",
    re.IGNORECASE,
)
# Ray's errors that mean a worker, its node or the cluster's view of them is gone
_RAY_LOST = {
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "ActorPlacementGroupRemoved",
    "NodeDiedError",
    "LocalRayletDiedError",
    "WorkerCrashedError",
    "ObjectLostError",
    "ObjectFetchTimedOutError",
    "ObjectReconstructionFailedError",
    "OwnerDiedError",
    "GetTimeoutError",
    "RaySystemError",
    "RpcError",
    "TaskCancelledError",
    "TaskPlacementGroupRemoved",
    "TaskUnschedulableError",
    "PendingCallsLimitExceeded",
}
_COMM_TYPES = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
_CODE_TYPES = (
    AttributeError,
    ImportError,
    KeyError,
    IndexError,
    NameError,
    NotImplementedError,
    AssertionError,
    TypeError,
    RecursionError,
)


@dataclass(frozen=True)
class Verdict:
    """``retry``: a loss (recover); else the job stops with ``cause``."""

    retry: bool
    cause: str  # "lost" when retry, else one of CAUSES
    message: str  # one line
    fix: str = ""


def one_line(text: object, *, limit: int = 300) -> str:
    """``text`` as one line: colour codes and control characters out, runs of space as one, cut
    at ``limit`` characters."""
    flat = _CONTROL.sub(" ", _ANSI.sub("", str(text)))
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def describe(error: BaseException) -> str:
    """``ValueError: Invalid learning rate: nan`` for the worker's own error, whatever wraps it."""
    own = inner(error)
    text = _message(own)
    return one_line(f"{type(own).__name__}: {text}" if text else type(own).__name__)


def classify(error: BaseException, *, doing: str, store: str = "") -> Verdict:
    """The verdict on ``error``, raised while ``doing`` (e.g. "step 12", "restoring step 40",
    "checkpoint of step 50"); ``store``: the checkpoint store's URL, named in the fixes."""
    own = inner(error)
    what = f"{doing}: {describe(error)}"
    if _is_lost(error, own):
        return Verdict(True, "lost", what)
    for link in _chain(own):
        verdict = _by_type(link, what, store)
        if verdict is not None:
            return verdict
    # a worker's own exception that none of the above names: most likely our code or the
    # user's; a retry would raise it again
    return Verdict(
        False,
        "code_error",
        what,
        "this is a bug (in the model's code or the orchestrator's): the traceback is in the "
        "job's driver.log; fix it, then submit the recipe again to resume from the last checkpoint",
    )


def _by_type(link: BaseException, what: str, store: str) -> Verdict | None:
    names = {cls.__name__ for cls in type(link).__mro__}
    code = getattr(link, "errno", None)
    if code in _FULL or "StoreFullError" in names or _says_full(link):
        return Verdict(
            False,
            "disk_full",
            what,
            f"free space in the checkpoint store{_at(store)}, or point checkpointing.path at a "
            "larger disk or s3://...; then submit the recipe again to resume from the last "
            "checkpoint",
        )
    if code in _DENIED:
        return Verdict(
            False,
            "store",
            what,
            f"let this user write the checkpoint store{_at(store)}, or point checkpointing.path "
            "elsewhere; then submit the recipe again",
        )
    if "ShardError" in names:
        return Verdict(False, "data", what, "rewrite or remove the shard it names, then submit")
    if names & {"CheckpointError", "StoreError"}:
        return Verdict(
            False,
            "checkpoint" if "Corrupt" in type(link).__name__ else "store",
            what,
            f"check the checkpoint store{_at(store)}: the message names the object; restore it "
            "or delete that step's folder, then submit the recipe again",
        )
    if "OutOfMemoryError" in names or isinstance(link, MemoryError):
        return Verdict(
            False,
            "out_of_memory",
            what,
            "give the planner less room: smaller training.microbatch_sizes, or more stages "
            "(parallelism.max_pipeline_stages); then submit the recipe again",
        )
    if isinstance(link, (UnicodeDecodeError, ValueError, OverflowError, ZeroDivisionError)):
        return Verdict(
            False,
            "bad_value",
            what,
            "a value the training code rejects: check the recipe's training section (and the "
            "model's arguments), then submit the recipe again",
        )
    if isinstance(link, _CODE_TYPES):
        return Verdict(
            False,
            "code_error",
            what,
            "this is a bug (in the model's code or the orchestrator's): the traceback is in the "
            "job's driver.log",
        )
    return None


def _is_lost(error: BaseException, own: BaseException) -> bool:
    """A worker, node or link gone: Ray says so, or the worker's error is a broken connection."""
    outer = {cls.__name__ for cls in type(error).__mro__}
    if outer & _RAY_LOST and "RayTaskError" not in outer:
        return True
    for link in _chain(own):
        names = {cls.__name__ for cls in type(link).__mro__}
        if names & _RAY_LOST or names & _COMM_TYPES:
            return True
        if isinstance(link, (ConnectionError, TimeoutError)):
            return True
        if type(link) is RuntimeError and _COMM_WORDS.search(_message(link)):
            return True  # gloo and NCCL report a dead peer as a RuntimeError naming the link
    return False


def inner(error: BaseException) -> BaseException:
    """The worker's own exception inside Ray's wrappers (``RayTaskError.cause``, an actor's
    ``ActorDiedError.cause`` when its creation task raised)."""
    for _ in range(4):  # wrappers nest a few deep at most
        cause = getattr(error, "cause", None)
        if not isinstance(cause, BaseException) or cause is error:
            break
        error = cause
    return error


def _chain(error: BaseException) -> list[BaseException]:
    seen, links = set(), []
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        links.append(link)
        link = link.__cause__ or link.__context__
    return links


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails is still an exception
        return ""


def _says_full(error: BaseException) -> bool:
    # an OSError pickled across processes keeps its text but may lose its errno
    text = _message(error)
    return "No space left on device" in text or "Disk quota exceeded" in text


def _at(store: str) -> str:
    return f" ({store})" if store else ""


# a cloud's error code in its message: EC2's and Azure's CamelCase (InsufficientInstanceCapacity,
# SkuNotAvailable), GCE's UPPER_SNAKE (ZONE_RESOURCE_POOL_EXHAUSTED)
_ERROR_CODE = re.compile(r"\b(?:[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b")


def refused_everywhere(refusals: dict[str, tuple[str, str]]) -> JobBroken:
    """The job cannot start: every place a plan could use refused its launch. One line naming
    the cloud's call, its answer and the places (``refusals``: place -> (``call: Code: text``,
    fix)), and what to do (the cloud's own fix, e.g. the quota to ask for, then the recipe's)."""
    answers: dict[str, list[str]] = {}
    for infra, (message, _) in sorted(refusals.items()):
        call, _, rest = message.partition(": ")
        code = _ERROR_CODE.search(rest)
        said = code.group(0) if code else one_line(rest, limit=80)
        answers.setdefault(f"{call} answered {said}", []).append(infra)
    said = "; ".join(f"{answer} in {', '.join(places)}" for answer, places in answers.items())
    fixes = list(dict.fromkeys(fix for _, fix in refusals.values() if fix))
    fix = "; ".join(
        [*fixes, "or allow more locations or GPU types (constraints.locations, gpu_types)"]
    )
    return JobBroken(
        "capacity",
        f"every place a plan could use refused the launch ({len(refusals)}): {said}",
        fix=fix,
    )
