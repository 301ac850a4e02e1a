"""Checkpoints: each worker's StageRunner state, written atomically and in the background.

Layout in an ObjectStore (storage.py: a local folder or S3)::

    <job>/step-00000002/stage-0-replica-1.pt    torch.save of {identity, StageRunner.state_dict()}
    <job>/step-00000002/stage-1-replica-0-tp-1.pt  a tensor-parallel group's other workers' shards
    <job>/step-00000002/manifest.json           every worker's key, sha256 and size, signed: the
                                                commit (manifest.py)

``step`` is the last training step the state includes; training resumes at ``step + 1`` (the data
position is the step itself: sample ``k`` depends on the seed and ``k`` only, see data/text.py).

A worker's ``Checkpointer.save`` only copies its state (tensors cloned to CPU, so training can
change its parameters at once) and queues the copy; one writer thread serialises, hashes and puts
it, while the next steps train. ``wait`` returns what was written or re-raises the write's error.
Each object is written atomically (temporary file + rename locally, a single put on S3), but a
step is *complete* only once the driver has ``commit``-ted its manifest after every worker's write
finished. A crash before that leaves a step without a manifest, which ``latest_complete`` ignores
and a later commit deletes.

Reading trusts nothing: the manifest is validated and its signature checked (manifest.py) before
any object is read (``verified_manifest`` also checks every object is there with its size), each
object's sha256 is checked against it, and each state names the job, step, stage and replica it
was written for, checked on load (a state copied from another step or worker is refused). A write
that fails for lack of space raises ``StoreFullError``, so the driver can say so.
"""

from __future__ import annotations

import errno
import hashlib
import io
import queue
import re
import threading
import time
from dataclasses import asdict, dataclass

from runtime import manifest as manifests
from runtime.storage import ObjectStore

MANIFEST = "manifest.json"
STATE_FORMAT = "geo-orchestrator/worker-state-v1"
_STEP_FOLDER = re.compile(r"^step-(\d{8})/")
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, unreadable or could not be written; says what to do."""


class CheckpointCorruptError(CheckpointError):
    """A stored object's bytes do not match the checksum its manifest records, or a manifest or
    state is malformed, unsigned or not the one asked for."""


class StoreFullError(CheckpointError):
    """A write failed because the store has no space left (ENOSPC, EDQUOT)."""


@dataclass(frozen=True)
class CheckpointEntry:
    """One worker's written state, as its step's manifest lists it."""

    stage: int
    replica: int
    key: str
    sha256: str
    size_bytes: int
    write_s: float  # serialise + hash + put, on the writer thread (training did not wait for it)
    tp_rank: int = 0  # the worker's rank in its tensor-parallel group


@dataclass(frozen=True)
class PendingCheckpoint:
    """Every worker has copied its state after ``step``; their writes may still be running."""

    store_url: str
    job: str
    step: int
    endpoint_url: str | None
    snapshot_s: tuple[float, ...]  # per rank: how long that worker's training waited


@dataclass(frozen=True)
class CheckpointReport:
    """A committed step: where its manifest is and what it cost."""

    step: int
    manifest_key: str
    snapshot_s: float  # the slowest worker's copy: what a training step waited
    write_s: float  # the slowest worker's serialise + hash + put, overlapped with training
    size_bytes: int  # all workers together


def _check_job(job: str) -> None:
    if not _JOB_NAME.match(job):
        raise CheckpointError(
            f"job name {job!r} cannot name a checkpoint folder: use letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )


def step_prefix(job: str, step: int) -> str:
    _check_job(job)
    return f"{job}/step-{step:08d}/"


def object_key(job: str, step: int, stage: int, replica: int, tp_rank: int = 0) -> str:
    shard = f"-tp-{tp_rank}" if tp_rank else ""
    return f"{step_prefix(job, step)}stage-{stage}-replica-{replica}{shard}.pt"


def _identity(job: str, step: int, stage: int, replica: int, tp_rank: int) -> dict:
    identity = {"job": job, "step": step, "stage": stage, "replica": replica}
    return identity | ({"tp_rank": tp_rank} if tp_rank else {})  # as written before TP


def manifest_key(job: str, step: int) -> str:
    return step_prefix(job, step) + MANIFEST


def snapshot(state: object) -> object:
    """A deep copy of a state dict that shares no memory with the live one: every tensor cloned to
    CPU, every container rebuilt (the optimizer's state dict holds its live tensors and lists)."""
    import torch  # here, not at the top: the driver commits and reads manifests without torch

    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        copied = type(state)((key, snapshot(value)) for key, value in state.items())
        metadata = getattr(state, "_metadata", None)
        if (
            metadata is not None
        ):  # module state dicts carry per-module versions load_state_dict reads
            copied._metadata = snapshot(metadata)
        return copied
    if isinstance(state, (list, tuple)):
        return type(state)(snapshot(value) for value in state)
    return state  # int, float, str, bool, None: immutable


def serialize(state: object) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class _Job:
    step: int
    state: object


class Checkpointer:
    """One worker's checkpoint writer: ``save`` copies and queues, one thread writes, in order."""

    def __init__(
        self, store: ObjectStore, job: str, *, stage: int, replica: int, tp_rank: int = 0
    ) -> None:
        _check_job(job)
        self.store, self.job, self.stage, self.replica = store, job, stage, replica
        self.tp_rank = tp_rank
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._done = threading.Condition()
        self._pending = 0
        self._written: list[CheckpointEntry] = []
        self._errors: list[CheckpointError] = []
        # daemon: a worker killed mid-write must not hang on it; its step then has no manifest
        self._thread = threading.Thread(target=self._write_loop, name="checkpoint-writer")
        self._thread.daemon = True
        self._thread.start()

    def save(self, step: int, state: dict) -> float:
        """Copy ``state`` and queue its write; returns the seconds the copy took (what training
        waits for)."""
        start = time.perf_counter()
        copied = snapshot(state)
        elapsed_s = time.perf_counter() - start
        with self._done:
            self._pending += 1
        self._queue.put(_Job(step, copied))
        return elapsed_s

    def wait(self, timeout_s: float) -> list[CheckpointEntry]:
        """Block until every queued write finished; returns the entries written since the last
        ``wait``, or raises the first write error."""
        with self._done:
            if not self._done.wait_for(lambda: self._pending == 0, timeout=timeout_s):
                raise CheckpointError(
                    f"{self._pending} checkpoint write(s) to {self.store.url} still running after "
                    f"{timeout_s:g} s: the store is slow or unreachable; check it, or wait longer"
                )
            written, errors = self._written, self._errors
            self._written, self._errors = [], []
        if errors:
            raise errors[0]
        return written

    def close(self, timeout_s: float = 60.0) -> None:
        """Finish queued writes and stop the writer thread."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    def _write_loop(self) -> None:
        while (job := self._queue.get()) is not None:
            key = object_key(self.job, job.step, self.stage, self.replica, self.tp_rank)
            try:
                entry = self._write(job)
            # any failure (storage, pickling, torch.save) must reach wait(); uncaught, it would
            # end this thread and leave every later save waiting for its deadline
            except Exception as error:
                full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
                failure = (StoreFullError if full else CheckpointError)(
                    f"writing checkpoint {key!r} to {self.store.url} failed ({error}); the step "
                    "stays incomplete: free space or fix access to the store, then checkpoint again"
                )
                failure.__cause__ = error
                with self._done:
                    self._errors.append(failure)
            else:
                with self._done:
                    self._written.append(entry)
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

    def _write(self, job: _Job) -> CheckpointEntry:
        return write_entry(
            self.store,
            self.job,
            job.step,
            job.state,
            stage=self.stage,
            replica=self.replica,
            tp_rank=self.tp_rank,
        )


def write_entry(
    store: ObjectStore,
    job: str,
    step: int,
    state: object,
    *,
    stage: int,
    replica: int,
    tp_rank: int = 0,
) -> CheckpointEntry:
    """Serialise ``state`` with what it is (job, step, stage, replica, tensor-parallel rank) and
    put it at its key, now (the writer thread's work, and a survivor's rescue write)."""
    start = time.perf_counter()
    key = object_key(job, step, stage, replica, tp_rank)
    identity = _identity(job, step, stage, replica, tp_rank)
    data = serialize({"format": STATE_FORMAT, "identity": identity, "state": state})
    store.put(key, data)
    return CheckpointEntry(
        stage=stage,
        replica=replica,
        tp_rank=tp_rank,
        key=key,
        sha256=hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
        write_s=time.perf_counter() - start,
    )


def commit(
    store: ObjectStore,
    job: str,
    step: int,
    entries: list[CheckpointEntry],
    *,
    keep_last: int = 3,
    signing_key: bytes | None = None,
) -> str:
    """Make ``step`` complete: write its manifest (signed with ``signing_key``, the job's) once
    every worker's object is in the store, then keep the ``keep_last`` newest complete steps.
    Returns the manifest's key."""
    if keep_last < 1:
        raise CheckpointError(f"keep_last={keep_last}: keep at least 1 complete checkpoint")
    prefix = step_prefix(job, step)
    for entry in entries:
        if not entry.key.startswith(prefix) or not store.exists(entry.key):
            raise CheckpointError(
                f"cannot commit step {step} of {job!r}: {entry.key!r} is not in {store.url} "
                f"under {prefix}; wait for every worker's write before committing"
            )
    files = [asdict(e) for e in sorted(entries, key=lambda e: (e.stage, e.replica, e.tp_rank))]
    key = manifest_key(job, step)
    store.put(key, manifests.encode(job, step, files, key=signing_key))
    prune(store, job, keep_last=keep_last)
    return key


def steps(store: ObjectStore, job: str) -> dict[int, bool]:
    """Every step folder of ``job`` in the store: step → complete (has a manifest)."""
    _check_job(job)
    found: dict[int, bool] = {}
    for key in store.keys(f"{job}/step-"):
        match = _STEP_FOLDER.match(key[len(job) + 1 :])
        if match:
            step = int(match.group(1))
            found[step] = found.get(step, False) or key.endswith("/" + MANIFEST)
    return found


def latest_complete(store: ObjectStore, job: str) -> int | None:
    """The newest step with a manifest; steps whose write did not finish are ignored."""
    complete = [step for step, done in steps(store, job).items() if done]
    return max(complete, default=None)


def prune(store: ObjectStore, job: str, *, keep_last: int) -> list[int]:
    """Delete every step folder older than the ``keep_last`` newest complete steps (complete or
    abandoned); newer incomplete steps may still be being written and stay. Returns the deleted."""
    found = steps(store, job)
    complete = sorted((step for step, done in found.items() if done), reverse=True)
    if len(complete) <= keep_last:
        return []
    oldest_kept = complete[keep_last - 1]
    doomed = sorted(step for step in found if step < oldest_kept)
    for step in doomed:
        # the manifest first: a crash mid-way leaves an incomplete step, never a manifest that
        # points at deleted files
        store.delete(manifest_key(job, step))
        for key in list(store.keys(step_prefix(job, step))):
            store.delete(key)
    return doomed


def read_manifest(
    store: ObjectStore, job: str, step: int, *, signing_key: bytes | None = None
) -> dict:
    """The validated manifest of ``step`` (its signature checked with ``signing_key``); raise
    CheckpointError when the step is not complete, CheckpointCorruptError when the manifest is
    malformed, unsigned or altered."""
    key = manifest_key(job, step)
    if not store.exists(key):
        latest = latest_complete(store, job)
        raise CheckpointError(
            f"step {step} of job {job!r} in {store.url} is not a complete checkpoint (no "
            f"{MANIFEST}); restore the latest complete step instead ({latest})"
        )
    try:
        return manifests.decode(
            store.get(key), job=job, step=step, prefix=step_prefix(job, step), key=signing_key
        )
    except manifests.ManifestError as error:
        raise _corrupt(store, key, str(error), job, step) from None


def verified_manifest(
    store: ObjectStore, job: str, step: int, *, signing_key: bytes | None = None
) -> dict:
    """``read_manifest``, and every object it lists is in the store with its size: what the
    driver checks before it asks any worker to load a step."""
    document = read_manifest(store, job, step, signing_key=signing_key)
    for entry in document["files"]:
        size = store.size(entry["key"])
        if size != entry["size_bytes"]:
            found = (
                "missing"
                if size is None
                else f"{size} bytes, the manifest says {entry['size_bytes']}"
            )
            raise _corrupt(store, entry["key"], f"is {found}", job, step)
    return document


def load(
    store: ObjectStore,
    job: str,
    step: int,
    *,
    stage: int,
    replica: int,
    tp_rank: int = 0,
    manifest: dict | None = None,
) -> dict:
    """One worker's state at ``step``, its checksum and identity verified against the manifest
    (``manifest``: one the caller verified already, e.g. the driver's)."""
    manifest = manifest or read_manifest(store, job, step)
    entry = next((f for f in manifest["files"] if _worker(f) == (stage, replica, tp_rank)), None)
    if entry is None:
        raise CheckpointError(
            f"step {step} of job {job!r} has no state for stage {stage} replica {replica}: it was "
            "written by another layout (load_stages takes any layout's states)"
        )
    return _read_entry(store, job, step, entry)


def has_state(
    store: ObjectStore,
    job: str,
    step: int,
    *,
    stage: int,
    replica: int,
    tp_rank: int = 0,
    manifest: dict | None = None,
) -> bool:
    files = (manifest or read_manifest(store, job, step))["files"]
    return any(_worker(f) == (stage, replica, tp_rank) for f in files)


def _worker(entry: dict) -> tuple[int, int, int]:
    return entry["stage"], entry["replica"], entry.get("tp_rank", 0)


def load_stages(
    store: ObjectStore, job: str, step: int, *, manifest: dict | None = None
) -> list[dict]:
    """The states of one replica per stage of the layout that wrote ``step`` (its lowest: after a
    step the replicas of a stage hold the same weights and optimizer state), each worker's of a
    tensor-parallel group, for runtime/reshard.py."""
    files = (manifest or read_manifest(store, job, step))["files"]
    lowest: dict[int, int] = {}
    for entry in files:
        lowest[entry["stage"]] = min(lowest.get(entry["stage"], entry["replica"]), entry["replica"])
    chosen = sorted(
        (f for f in files if f["replica"] == lowest[f["stage"]]), key=lambda f: _worker(f)
    )
    return [_read_entry(store, job, step, entry) for entry in chosen]


def _read_entry(store: ObjectStore, job: str, step: int, entry: dict) -> dict:
    data = store.get(entry["key"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        problem = f"is corrupt (sha256 {digest[:12]}..., manifest says {entry['sha256'][:12]}...)"
        raise _corrupt(store, entry["key"], problem, job, step)
    # weights_only: the state holds only tensors (weights, Adam moments and step counters, the RNG
    # ByteTensor) and plain dicts, lists, tuples, numbers, strings and None, so no code runs on load
    import torch

    try:
        document = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many kinds for a bad file
        problem = f"cannot be loaded ({type(error).__name__})"
        raise _corrupt(store, entry["key"], problem, job, step) from None
    return _unwrap(document, store, job, step, entry)


def _unwrap(document: object, store: ObjectStore, job: str, step: int, entry: dict) -> dict:
    """The state inside a worker's object, once it is the one the manifest says it is."""
    if not (isinstance(document, dict) and document.get("format") == STATE_FORMAT):
        if isinstance(document, dict) and "module" in document:
            return document  # written before states named themselves
        raise CheckpointCorruptError(f"{store.url}: {entry['key']!r} is not a worker's state")
    want = _identity(job, step, *_worker(entry))
    if document.get("identity") != want:
        problem = (
            f"holds the state of {document.get('identity')}, not {want}: copied from elsewhere"
        )
        raise _corrupt(store, entry["key"], problem, job, step)
    return document["state"]


def _corrupt(store: ObjectStore, key: str, problem: str, job: str, step: int) -> Exception:
    return CheckpointCorruptError(
        f"{store.url}: {key!r} {problem}; delete {step_prefix(job, step)} and restore an earlier "
        "complete step"
    )
