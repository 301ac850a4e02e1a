"""Hypothesis strategies for the jobs folder that ``status`` and ``logs`` read: job state files
(``state.json``, ``state.prev.json``) and event logs (``events.jsonl``), valid or hostile.

A state is written as the driver writes it (format, sha256 of the state, the state) so that wrong
types and values under a valid checksum reach the reader's field checks; others are torn, garbage,
not UTF-8, folders, FIFOs or devices. Event logs mix good events with torn lines, bytes that are
not UTF-8, JSON that is no event, times no calendar holds, deep nesting and very long lines.
"""

from __future__ import annotations

import hashlib
import json

from hypothesis import strategies as st

from tests.fuzz.strategies import DEVICE, FIFO, FOLDER, STATE_FORMAT, Case, unheld

GOOD_STATE = {
    "job": "alpha",
    "recipe_path": "r.yaml",
    "phase": "train",
    "step": 12,
    "steps_total": 40,
    "global_batch_size": 8,
    "losses": [2.5, 2.25],
    "compute_usd": 0.01,
    "egress_usd": 0.002,
    "trained_steps": 12,
    "train_s": 3.0,
    "nodes": ["n1", "n2"],
    "recoveries": 1,
    "started_at_s": 1.7e9,
    "updated_at_s": 1.7e9,
    "checkpoint_step": None,
    "plan": None,
    "choice": None,
    "node_kinds": {},
    "failure": None,  # a failed job's {"cause", "message", "fix", "step"}
}
_JSON_VALUES = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            "",
            "text",
            "\x1b[31mred",
            "a\nb",
            {"cause": [1], "message": {"a": None}, "fix": 3},
            {"cause": "\x1b[2J", "message": "m", "fix": "f", "step": 3},
            [],
            {},
            [1, "x"],
            {"a": [1]},
            -1,
            0,
            10**30,
            10**400,
            -(10**30),
            1e300,
            -1e300,
            float("nan"),
            float("inf"),
            1.5,
            2**63,
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=10),
)
_NAMES = st.sampled_from(["alpha", "beta", "job-2", "q.1", "x" * 64])
_HOSTILE_NAMES = st.sampled_from(
    ["a\nb", "\x1b[31mred", "..x", "x" * 65, "sp ace", "\u202eevil", "_x", "é", "a/b", ""]
)


def state_document(state: object) -> str:
    """A state file as ``StateStore.save`` writes it, its checksum right whatever the state."""
    body = json.dumps(state, sort_keys=True)
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return json.dumps({"format": STATE_FORMAT, "sha256": digest, "state": state})


@st.composite
@unheld
def state_file(draw, job: str) -> str | bytes:
    kind = draw(st.sampled_from(["good", "field", "field", "field", "shape", "damaged", "special"]))
    state = dict(GOOD_STATE, job=job)
    if kind == "good":
        return state_document(state)
    if kind == "field":  # a field of the wrong type or value, or missing, or unknown
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from([*sorted(state), "unknown_field"]))
            if draw(st.integers(0, 5)) == 0:
                state.pop(key, None)
            else:
                state[key] = draw(_JSON_VALUES)
        return state_document(state)
    if kind == "shape":
        value = draw(st.sampled_from([[1, 2], "text", None, 3, [[[]]]]))
        return state_document(value)
    if kind == "damaged":
        text = state_document(state).encode()
        damage = draw(st.sampled_from(["torn", "bytes", "checksum", "format", "deep", "empty"]))
        if damage == "torn":
            return text[: draw(st.integers(0, len(text) - 1))]
        if damage == "bytes":
            at = draw(st.integers(0, len(text)))
            return text[:at] + b"\xff\xfe\x00" + text[at:]
        if damage == "checksum":
            return text.replace(b'"sha256": "', b'"sha256": "0')
        if damage == "format":
            return text.replace(STATE_FORMAT.encode(), b"other-format")
        if damage == "deep":
            return b"[" * 100_000 + b"]" * 100_000
        return b""
    return draw(st.sampled_from([FOLDER, FIFO, DEVICE]))


def _event(**fields) -> str:
    return json.dumps({"event": "planned", "time_s": 1.7e9, **fields})


@st.composite
@unheld
def event_line(draw) -> bytes:
    kind = draw(st.integers(0, 11))
    if kind <= 2:
        return _event(decision="launch its nodes", details={"recovery_s": 6.5}).encode()
    if kind == 3:  # a field of the wrong type or value
        key = draw(
            st.sampled_from(["event", "time_s", "details", "decision", "reason", "plan_after"])
        )
        return _event(**{key: draw(_JSON_VALUES)}).encode()
    if kind == 4:
        return _event(details={"k": draw(_JSON_VALUES), "\x1b[2J": "x"}).encode()
    if kind == 5:  # torn
        line = _event().encode()
        return line[: draw(st.integers(0, len(line) - 1))]
    if kind == 6:
        return draw(st.sampled_from([b"\xff\xfe", b"\x00", b'{"event": "\xc3"}', b"\x1b[2J"]))
    if kind == 7:
        return draw(st.sampled_from([b"[1, 2]", b"1", b"null", b'"text"', b"{}", b"NaN"]))
    if kind == 8:
        return b'{"event": "x", "time_s": ' + b"9" * draw(st.sampled_from([20, 5000])) + b"}"
    if kind == 9:
        return b"[" * draw(st.sampled_from([1000, 100_000]))
    if kind == 10:
        return b'{"event": "x", "time_s": 1, "reason": "' + b"r" * 1_100_000 + b'"}'
    return b""


@st.composite
@unheld
def events_file(draw) -> bytes | str:
    if draw(st.integers(0, 14)) == 0:
        return draw(st.sampled_from([FOLDER, FIFO, DEVICE]))
    lines = draw(st.lists(event_line(), min_size=0, max_size=8))
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    return ending.join(lines) + draw(st.sampled_from([ending, b""]))


@st.composite
def job_folder(draw, name: str) -> dict[str, bytes | str]:
    """The files of one job's folder, under ``jobs/<name>/``."""
    files: dict[str, bytes | str] = {}
    if draw(st.integers(0, 9)):
        files[f"jobs/{name}/state.json"] = draw(state_file(name))
    if draw(st.booleans()):
        files[f"jobs/{name}/state.prev.json"] = draw(state_file(name))
    if draw(st.integers(0, 4)):
        files[f"jobs/{name}/events.jsonl"] = draw(events_file())
    return files


@st.composite
def jobs_cases(draw, target: str) -> Case:
    """``status`` (every job), ``status JOB`` or ``logs JOB`` over a fuzzed jobs folder."""
    names = draw(st.lists(_NAMES, min_size=1, max_size=3, unique=True))
    if target == "status" and draw(st.integers(0, 3)) == 0:
        names.append(draw(_HOSTILE_NAMES.filter(lambda n: "/" not in n and n not in ("", ".."))))
    files: dict[str, bytes | str] = {}
    for name in names:
        files.update(draw(job_folder(name)))
    files["jobs/not-a-job.txt"] = "x"
    options = ["--jobs-dir", "{root}/jobs"] + (["--json"] if draw(st.booleans()) else [])
    if target == "status":
        return Case("status", f"{len(names)} job folders", ["status", *options], files)
    job = draw(st.one_of(st.sampled_from(names), _HOSTILE_NAMES))
    command = "status" if target == "status JOB" else "logs"
    return Case(target, f"job {job!r}"[:80], [command, job, *options], files)
