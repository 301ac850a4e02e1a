"""A checkpoint step's manifest: what makes the step complete, checked before anything is loaded.

The manifest lists every worker's object (its key, sha256 and size), and is signed:

- with the job's checkpoint key (``signature.kind: hmac-sha256``): the driver keeps a random key
  per job (in the job's folder, readable by its owner only) and signs each manifest it commits.
  Objects rewritten together with their manifest's checksums by anyone without the key (a stray
  process, a bucket shared by mistake) no longer verify, and are not loaded;
- without a key (``sha256``): a checksum of the manifest itself, which catches a torn or garbled
  manifest but not a consistent rewrite (tests and benchmarks that use the runtime alone).

``decode`` parses and validates one manifest: UTF-8 JSON, this job and step, one entry per
(stage, replica), keys inside this step's folder, well-formed checksums and sizes, every stage
from 0 up present, and the signature. Anything else is a ``CheckpointCorruptError`` naming the
manifest and what is wrong, so the caller can fall back to an older step.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re

FORMAT = 2  # 1: no signature (read when no key is given)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_OBJECT = re.compile(r"^stage-\d+-replica-\d+(-tp-\d+)?\.pt$")


class ManifestError(ValueError):
    """What is wrong with a manifest (checkpoint.py turns it into a CheckpointCorruptError)."""


def encode(job: str, step: int, files: list[dict], *, key: bytes | None) -> bytes:
    """The manifest of ``step``: its body and the body's signature (HMAC with ``key``, else
    its sha256)."""
    body = {"format": FORMAT, "job": job, "step": step, "files": files}
    document = {**body, "signature": _sign(body, key)}
    return json.dumps(document, indent=1, sort_keys=True).encode()


def decode(data: bytes, *, job: str, step: int, prefix: str, key: bytes | None) -> dict:
    """The validated manifest of ``step`` from its bytes; raise ManifestError saying what is
    wrong. ``prefix``: the step's folder, which every listed object must be in."""
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError("is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ManifestError(f"is not JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(document, dict):
        raise ManifestError("is not a JSON object")
    if document.get("format") not in (1, FORMAT):
        raise ManifestError(f"has format {document.get('format')!r}, expected {FORMAT}")
    if document.get("job") != job or document.get("step") != step:
        raise ManifestError(
            f"names job {document.get('job')!r} step {document.get('step')!r}, not {job!r} {step}"
        )
    _check_files(document.get("files"), prefix)
    _check_signature(document, key)
    return document


def _check_files(files: object, prefix: str) -> None:
    if not isinstance(files, list) or not files:
        raise ManifestError("lists no files")
    seen: set[tuple[int, int, int]] = set()
    for index, entry in enumerate(files):
        where = f"files[{index}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where} is not an object")
        stage, replica, tp_rank = entry.get("stage"), entry.get("replica"), entry.get("tp_rank", 0)
        if not all(_whole(v) for v in (stage, replica, tp_rank, entry.get("size_bytes"))):
            raise ManifestError(
                f"{where}: stage, replica, tp_rank and size_bytes must be whole numbers >= 0"
            )
        key = entry.get("key")
        if not isinstance(key, str) or not key.startswith(prefix):
            raise ManifestError(f"{where}: key {key!r} is not in {prefix}")
        if not _OBJECT.match(key[len(prefix) :]):
            raise ManifestError(f"{where}: key {key!r} is not stage-S-replica-R.pt")
        if not isinstance(entry.get("sha256"), str) or not _HEX64.match(entry["sha256"]):
            raise ManifestError(f"{where}: sha256 is not 64 hex digits")
        if (stage, replica, tp_rank) in seen:
            raise ManifestError(
                f"{where}: stage {stage} replica {replica} tp rank {tp_rank} is listed twice"
            )
        seen.add((stage, replica, tp_rank))
    stages = {stage for stage, _, _ in seen}
    if stages != set(range(len(stages))):
        raise ManifestError(f"stages {sorted(stages)} are not 0 to {len(stages) - 1}")


def _check_signature(document: dict, key: bytes | None) -> None:
    body = {name: document.get(name) for name in ("format", "job", "step", "files")}
    signature = document.get("signature")
    if document["format"] == 1:
        if key is not None:
            raise ManifestError("is not signed (an old format): it cannot be verified")
        return
    if not isinstance(signature, dict):
        raise ManifestError("has no signature")
    kind, value = signature.get("kind"), signature.get("value")
    if key is not None and kind != "hmac-sha256":
        raise ManifestError("is not signed with the job's key: written by something else")
    if kind == "hmac-sha256" and key is None:
        return  # the caller holds no key: the objects' checksums are still checked
    want = _sign(body, key)["value"]
    if not isinstance(value, str) or not hmac.compare_digest(value, want):
        raise ManifestError(
            "has a signature that does not match its content: changed after it was written"
        )


def _sign(body: dict, key: bytes | None) -> dict:
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if key is None:
        return {"kind": "sha256", "value": hashlib.sha256(text).hexdigest()}
    return {"kind": "hmac-sha256", "value": hmac.new(key, text, hashlib.sha256).hexdigest()}


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
