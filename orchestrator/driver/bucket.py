"""A job's folder kept in its bucket: what the laptop, the controller VM and ``status`` share.

On a cloud the job's controller runs in a VM with a disk of its own, so the job's folder (job.py)
lives in the job's bucket (``s3://<the account's bucket>/jobs/<job>/``) and each side keeps a
copy it mirrors:

- ``submit`` readies the folder on the laptop and ``push``es it (``LAUNCH``: the recipe, the
  launch, the state, the checkpoint key, the profile);
- the controller VM ``pull``s it all when it starts, then ``push``es what changed (``FOLLOWED``:
  state, events, metrics, log, plan) every few seconds and once more when it ends, and pulls a
  ``stop.request`` (``ASKED``) that ``stop`` put there;
- ``submit`` following the job, and ``status``/``logs`` from any shell, ``pull`` ``FOLLOWED``.

Each object is written whole (an S3 put is atomic), so a reader sees an old or a new file, never
half of one. The lock, the controller's own files (its overlay keys) and the nodes' folders never
leave the VM.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

RECORD_FILE = "bucket.json"  # in the laptop's copy: where the job's bucket is
FOLLOWED = (
    "state.json",
    "state.prev.json",
    "events.jsonl",
    "metrics.jsonl",
    "driver.log",
    "plan.json",
    "controller.leaving",
)
ASKED = ("stop.request",)
KEPT_ON_THE_VM = ("driver.lock", RECORD_FILE, "stop.request")  # never pushed as a whole-folder
MIRROR_S = 2.0  # how often the controller pushes what changed


@dataclass(frozen=True, kw_only=True)
class BucketRecord:
    """Where a job's folder lives in the cloud (no secret: the cloud's credentials open it)."""

    url: str  # s3://bucket/jobs/<job>
    provider: str
    region: str
    endpoint_url: str | None = None  # an emulated cloud's API
    api_netns: str | None = None  # the namespace an emulated API is reached from

    def save(self, folder: Path) -> None:
        (folder / RECORD_FILE).write_text(json.dumps(self.__dict__))

    @classmethod
    def load(cls, folder: Path) -> BucketRecord | None:
        try:
            return cls(**json.loads((folder / RECORD_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


class JobBucket:
    """The job's folder in its bucket. ``call_in(fn)`` runs each call of the store (the
    namespace of an emulated API); identity by default."""

    def __init__(self, store: Any, *, call_in: Callable[[Callable[[], T]], T] | None = None):
        self.store = store
        self._in = call_in or (lambda make: make())
        self._pushed: dict[str, tuple[int, int]] = {}  # name -> (mtime_ns, size) pushed

    @classmethod
    def open(
        cls,
        record: BucketRecord,
        *,
        session: Any = None,
        credentials: Any = None,
        credential: Any = None,
    ):
        """``session``: the boto3 session to call S3 with, ``credentials``: google-auth's to
        call GCS with, ``credential``: azure-identity's to call Blob Storage with (None: the
        SDK's default chain)."""
        from runtime.storage import open_store

        call_in = None
        if record.api_netns:
            from provisioners.local import netns

            def call_in(make):
                return netns.in_namespace(record.api_netns, make)

        store = open_store(
            record.url,
            endpoint_url=record.endpoint_url,
            session=session,
            credentials=credentials,
            credential=credential,
        )
        return cls(store, call_in=call_in)

    def push(self, folder: Path, names: Iterable[str] | None = None) -> int:
        """Put the folder's files (top level; ``names`` only, if given) that changed since this
        object last pushed them, and delete those of ``names`` it pushed that the folder no
        longer holds; how many it put."""
        for name in [n for n in names or () if n in self._pushed]:
            if not (folder / name).exists():
                self._in(lambda name=name: self.store.delete(name))
                del self._pushed[name]
        put = 0
        for path in sorted(folder.iterdir()):
            name = path.name
            if not path.is_file() or (names is None and name in KEPT_ON_THE_VM):
                continue
            if names is not None and name not in names:
                continue
            seen = path.stat()
            mark = (seen.st_mtime_ns, seen.st_size)
            if self._pushed.get(name) == mark:
                continue
            data = path.read_bytes()
            self._in(lambda name=name, data=data: self.store.put(name, data))
            self._pushed[name] = mark
            put += 1
        return put

    def pull(self, folder: Path, names: Iterable[str] | None = None) -> int:
        """Copy the bucket's files (``names`` only, if given) into ``folder``, owner-only; a name
        asked for that the bucket does not hold is removed from the folder. How many it wrote."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        held = set(self._in(lambda: list(self.store.keys(""))))
        wanted = held if names is None else set(names)
        wrote = 0
        for name in sorted(wanted):
            if "/" in name:
                continue  # a node's checkpoint objects and the wheel are not the folder's
            path = folder / name
            if name not in held:
                path.unlink(missing_ok=True)
                continue
            data = self._in(lambda name=name: self.store.get(name))
            if path.exists() and path.read_bytes() == data:
                continue
            _write_private(path, data)
            wrote += 1
        return wrote

    def put(self, name: str, data: bytes) -> None:
        self._in(lambda: self.store.put(name, data))

    def delete(self, name: str) -> None:
        self._in(lambda: self.store.delete(name))

    def exists(self, name: str) -> bool:
        return self._in(lambda: self.store.exists(name))


def _write_private(path: Path, data: bytes) -> None:
    """Atomically, owner-only; a temporary name of its own (``status`` in another shell may pull
    the same file at the same time as ``submit``)."""
    import tempfile

    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as out:  # mkstemp: mode 0600
            out.write(data)
        os.replace(temporary, path)  # readers see the old file or the new one
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
