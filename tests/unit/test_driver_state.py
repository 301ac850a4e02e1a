"""The driver's persisted state and event log survive a driver killed mid-write."""

from __future__ import annotations

import json

import pytest

from orchestrator.driver.events import Event, EventLog, read_events
from orchestrator.driver.state import JobState, StateCorrupt, StateStore, StateText


def test_state_round_trips_and_counts_versions(tmp_path):
    store = StateStore(tmp_path)
    first = store.save(JobState(job="j", recipe_path="r.yaml", phase="plan", losses=(1.5,)))
    second = store.save(first.evolve(step=3, nodes=("a", "b")))
    loaded = store.load()
    assert loaded.state == second and second.version == first.version + 1 == 2
    assert loaded.source.name == "state.json" and loaded.problems == ()


def test_a_step_s_commit_is_saved_without_fsync_and_reads_back_alike(tmp_path, monkeypatch):
    import orchestrator.driver.state as state_module

    synced = []
    monkeypatch.setattr(state_module.os, "fsync", lambda fd: synced.append(fd))
    store = StateStore(tmp_path)
    losses = (float("nan"), float("inf"), 0.1 + 0.2, 1e-300)  # a diverged run's, and exact
    first = store.save(JobState(job="j", recipe_path="r.yaml", phase="train", losses=losses))
    assert len(synced) == 2  # the file and its folder: a phase, a checkpoint
    committed = store.save(first.evolve(step=1), durable=False)  # a step
    assert len(synced) == 2
    document = json.loads(store.path.read_text())
    assert list(document) == ["format", "sha256", "state"]
    loaded = store.load()
    assert loaded.source.name == "state.json" and loaded.state.step == 1
    assert repr(loaded.state.losses) == repr(committed.losses)  # NaN and all, to the last bit


def test_the_saved_text_is_json_s_own_through_commits_and_rollbacks():
    text = StateText()
    state = JobState(
        job="j", recipe_path="r.yaml", phase="train", nodes=("n1", "n2"),
        plan={"b": [1, (2, 3)], "a": {"z": 1.5, "y": None}}, failure={"message": "é\x00"},
    )  # fmt: skip
    odd = (0.1 + 0.2, float("nan"), float("inf"), -float("inf"), 1e-300, 3.0)
    checks = []
    for step in range(30):  # commits, one loss more each
        state = state.evolve(losses=(*state.losses, odd[step % len(odd)] * (step + 1)))
        checks.append(state)
    for cut in (20, 0, 5):  # rollbacks to a checkpoint, then a commit
        state = state.evolve(losses=state.losses[:cut])
        checks.append(state)
        state = state.evolve(losses=(*state.losses, 0.5))
        checks.append(state)
    checks.append(state.evolve(losses=(7.0,) + state.losses[1:]))  # another run's losses
    for checked in checks:
        assert text(checked) == json.dumps(checked.to_dict(), sort_keys=True)


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # torn: the driver died mid-write
        lambda text: text.replace('"step": 3', '"step": 4'),  # bytes changed under the checksum
        lambda text: "",
    ],
)
def test_a_damaged_state_falls_back_to_the_previous_one(tmp_path, damage):
    store = StateStore(tmp_path)
    good = store.save(JobState(job="j", recipe_path="r.yaml", phase="train", step=2))
    store.save(good.evolve(step=3))
    store.path.write_text(damage(store.path.read_text()))
    loaded = store.load()
    assert loaded.state == good and loaded.source.name == "state.prev.json"
    assert loaded.problems and loaded.problems[0].startswith("state.json")


def test_no_readable_state_is_a_clear_error(tmp_path):
    store = StateStore(tmp_path)
    store.save(JobState(job="j", recipe_path="r.yaml", phase="plan"))
    store.save(JobState(job="j", recipe_path="r.yaml", phase="train"))
    store.path.write_text("{")
    store.previous.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(StateCorrupt) as raised:
        store.load()
    assert "state.json" in raised.value.message and "state.prev.json" in raised.value.message
    assert "submit the recipe again" in raised.value.fix


def test_the_event_log_skips_a_torn_last_line(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.append(Event(event="planned", decision="launch", plan_after="2 x T4"))
    log.append(Event(event="node_lost", details={"step": 4}))
    with log.path.open("a") as handle:
        handle.write('{"event": "recov')  # killed mid-line
    events = list(read_events(log.path))
    assert [e["event"] for e in events] == ["planned", "node_lost"]
    assert events[0]["plan_after"] == "2 x T4" and events[1]["details"] == {"step": 4}
    assert "reason" not in events[0]  # empty fields are left out
