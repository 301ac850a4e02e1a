"""Checkpoint manifests are validated and their signature checked before anything is loaded, and
each worker's state names what it is: a torn, garbled, rewritten or swapped checkpoint is refused
with a message naming the object, never loaded."""

from __future__ import annotations

import errno
import hashlib
import json

import pytest

torch = pytest.importorskip("torch")

from runtime import checkpoint  # noqa: E402
from runtime.checkpoint import (  # noqa: E402
    CheckpointCorruptError,
    Checkpointer,
    CheckpointError,
    StoreFullError,
)
from runtime.storage import LocalStore  # noqa: E402

JOB, KEY = "job-1", b"s" * 32


def _state(value: float) -> dict:
    return {"stage": 0, "replica": 0, "layers": (0, 1), "module": {"w": torch.full((3,), value)}}


def _write(store, step: int, *, key=KEY, replicas=(0, 1)) -> None:
    entries = [
        checkpoint.write_entry(store, JOB, step, _state(step + r), stage=0, replica=r)
        for r in replicas
    ]
    checkpoint.commit(store, JOB, step, entries, signing_key=key)


def _manifest_path(store, step: int):
    return store.root / checkpoint.manifest_key(JOB, step)


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path)


def test_a_signed_checkpoint_reads_back(store):
    _write(store, 4)
    manifest = checkpoint.verified_manifest(store, JOB, 4, signing_key=KEY)
    state = checkpoint.load(store, JOB, 4, stage=0, replica=1, manifest=manifest)
    assert torch.equal(state["module"]["w"], torch.full((3,), 5.0))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda d: b"\xff\xfe\x00", "not UTF-8"),
        (lambda d: d[: len(d) // 2], "not JSON"),
        (lambda d: b"[1, 2]", "not a JSON object"),
        (lambda d: d.replace(b'"step": 4', b'"step": 5'), "names job"),
        (lambda d: d.replace(b'"format": 2', b'"format": 1'), "not signed"),
        (lambda d: d.replace(b'"size_bytes": ', b'"size_bytes": -'), "whole numbers"),
        (lambda d: d.replace(b"stage-0-replica-1.pt", b"../../etc/passwd"), "not stage-S"),
        (lambda d: d.replace(b'"stage": 0', b'"stage": 2'), "stages"),
    ],
)
def test_a_damaged_manifest_is_refused_and_named(store, damage, words):
    _write(store, 4)
    path = _manifest_path(store, 4)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointCorruptError, match=words):
        checkpoint.verified_manifest(store, JOB, 4, signing_key=KEY)


def test_an_object_rewritten_with_its_checksum_updated_fails_the_signature(store):
    _write(store, 2)
    _write(store, 4)
    ours = store.root / checkpoint.object_key(JOB, 4, 0, 0)
    ours.write_bytes((store.root / checkpoint.object_key(JOB, 2, 0, 0)).read_bytes())
    path = _manifest_path(store, 4)
    document = json.loads(path.read_text())
    document["files"][0]["sha256"] = hashlib.sha256(ours.read_bytes()).hexdigest()
    document["files"][0]["size_bytes"] = ours.stat().st_size
    path.write_text(json.dumps(document))
    with pytest.raises(CheckpointCorruptError, match="signature that does not match"):
        checkpoint.verified_manifest(store, JOB, 4, signing_key=KEY)
    with pytest.raises(CheckpointCorruptError, match="not signed with the job's key"):
        _write(store, 6, key=None)  # written without the key: a sha256 only
        checkpoint.verified_manifest(store, JOB, 6, signing_key=KEY)


def test_a_state_copied_from_another_step_is_refused_even_with_a_valid_manifest(store):
    # someone with the key (or no key in use): the manifest verifies, the state names itself
    _write(store, 2, key=None)
    _write(store, 4, key=None)
    ours = store.root / checkpoint.object_key(JOB, 4, 0, 0)
    ours.write_bytes((store.root / checkpoint.object_key(JOB, 2, 0, 0)).read_bytes())
    entries = json.loads(_manifest_path(store, 4).read_text())["files"]
    entries[0]["sha256"] = hashlib.sha256(ours.read_bytes()).hexdigest()
    entries[0]["size_bytes"] = ours.stat().st_size
    entries = [checkpoint.CheckpointEntry(**e) for e in entries]
    checkpoint.commit(store, JOB, 4, entries, keep_last=5)
    with pytest.raises(CheckpointCorruptError, match="copied from elsewhere"):
        checkpoint.load(store, JOB, 4, stage=0, replica=0)


def test_a_missing_object_or_a_wrong_size_is_found_before_any_worker_loads(store):
    _write(store, 4)
    (store.root / checkpoint.object_key(JOB, 4, 0, 1)).unlink()
    with pytest.raises(CheckpointCorruptError, match="replica-1.pt' is missing"):
        checkpoint.verified_manifest(store, JOB, 4, signing_key=KEY)


class FullStore(LocalStore):
    def put(self, key: str, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", key)


def test_a_write_into_a_full_store_raises_store_full(tmp_path):
    writer = Checkpointer(FullStore(tmp_path), JOB, stage=0, replica=0)
    writer.save(1, _state(1.0))
    with pytest.raises(StoreFullError, match="No space left on device"):
        writer.wait(30)
    writer.close()
    assert issubclass(StoreFullError, CheckpointError)
