"""orchestrator/driver/remote.py: the submitting side of a job whose controller runs in a VM
follows the job's state, boots a new controller VM when the old one is gone before the job is
over (also after an orderly shutdown, which leaves ``stopped`` beside ``controller.leaving``), gives
up after controllers that end in a row with no progress, and ends on a final state."""

from __future__ import annotations

import pytest

from orchestrator.driver import remote
from orchestrator.driver.controller import LEAVE_FILE
from orchestrator.driver.job import RunOptions
from orchestrator.driver.state import JobState, StateStore
from orchestrator.errors import UserError


class _Cloud:
    """The cloud's answers about the job's controller VM, one per look; each look may first
    change the job's state (what the controller did meanwhile)."""

    def __init__(self, store: StateStore, script: list, on_launch=None) -> None:
        self.store, self.script, self.launches = store, list(script), 0
        self.on_launch = on_launch

    def running(self) -> bool:
        answer, change = self.script.pop(0)
        if change is not None:
            self.store.save(self.store.load().state.evolve(**change))
        return answer == "running"

    def launch(self) -> None:
        self.launches += 1
        if self.on_launch is not None:
            self.on_launch(self)


@pytest.fixture
def follow(tmp_path, monkeypatch):
    folder = tmp_path / "job"
    folder.mkdir()
    store = StateStore(folder)
    store.save(JobState(job="job", recipe_path="r.yaml", phase="train", steps_total=50))
    monkeypatch.setattr(remote, "FOLLOW_S", 0.0)

    def run(script, *, shown=None, on_launch=None):
        cloud = _Cloud(store, script, on_launch)
        seen = []
        options = RunOptions(on_step=lambda state, result: seen.append(state.step))
        final = remote._watch(
            folder,
            options,
            running=cloud.running,
            sync=lambda: None,
            relaunch=cloud.launch,
            log_hint="its console",
        )
        if shown is not None:
            shown.extend(seen)
        return final, cloud.launches

    return run, folder


def test_a_job_followed_to_its_end_boots_no_second_controller(follow):
    run, _ = follow
    steps: list[int] = []
    final, launches = run(
        [
            ("running", {"step": 10, "losses": (3.0,) * 10}),
            ("running", {"step": 20, "losses": (2.9,) * 20}),
            ("off", {"phase": "done", "step": 50, "losses": (2.5,) * 50}),
        ],
        shown=steps,
    )
    assert final.phase == "done" and launches == 0
    assert steps == [10, 20]


def test_a_controller_gone_mid_job_is_replaced_and_the_job_resumes(follow):
    run, _ = follow
    final, launches = run(
        [
            ("running", {"step": 12, "losses": (3.0,) * 12}),
            ("off", None),  # lost at once: the state is as it was
            ("running", {"step": 30, "losses": (2.8,) * 30}),
            ("off", {"phase": "done", "step": 50}),
        ]
    )
    assert launches == 1 and final.phase == "done"


def test_an_orderly_shutdown_is_resumed_and_a_user_stop_is_not(follow):
    run, folder = follow
    (folder / LEAVE_FILE).write_text("the controller VM shuts down\n")

    def resumed(cloud):  # the new controller takes the marker away, then the user stops it
        (folder / LEAVE_FILE).unlink()
        cloud.script.append(("off", {"phase": "stopped", "step": 20}))

    final, launches = run([("off", {"phase": "stopped", "step": 12})], on_launch=resumed)
    assert launches == 1 and final.phase == "stopped" and final.step == 20


def test_controllers_that_end_in_a_row_without_progress_are_not_booted_forever(follow):
    run, _ = follow
    with pytest.raises(UserError, match="controller VMs in a row ended with no step committed"):
        run([("off", None)] * (remote.MAX_RELAUNCHES + 1))


def test_a_leave_is_not_the_end_until_the_relaunched_controller_has_saved(follow):
    """The relaunch clears the leave mark; the new controller may end (or not be listed yet)
    before it saved anything: the old controller's ``stopped`` is still no end of the job."""
    run, folder = follow
    (folder / LEAVE_FILE).write_text("the controller VM shuts down\n")

    def relaunched(cloud):
        (folder / LEAVE_FILE).unlink(missing_ok=True)  # what the launch does in the bucket
        if cloud.launches == 1:  # the first new controller ends before its first save
            cloud.script.append(("off", None))
        else:  # the second one resumes and the job ends
            cloud.script.append(("off", {"phase": "done", "step": 50}))

    final, launches = run([("off", {"phase": "stopped", "step": 12})], on_launch=relaunched)
    assert launches == 2 and final.phase == "done"


def test_a_controller_that_has_not_saved_yet_is_waited_for_then_followed(tmp_path, monkeypatch):
    """On a busy host the controller VM runs well before its driver's first save reaches the
    bucket: no state yet is not a broken state. One that ends before saving is booted again."""
    folder = tmp_path / "job"
    folder.mkdir()
    store = StateStore(folder)
    monkeypatch.setattr(remote, "FOLLOW_S", 0.0)
    first = JobState(job="job", recipe_path="r.yaml", phase="train", steps_total=50)
    looks = iter(
        [
            ("running", None),  # booting: nothing saved
            ("off", None),  # gone before its first save
            ("running", None),
            ("running", lambda: store.save(first.evolve(step=5, losses=(3.0,) * 5))),
            ("off", lambda: store.save(store.load().state.evolve(phase="done", step=50))),
        ]
    )
    launches = []

    def running() -> bool:
        answer, change = next(looks)
        if change is not None:
            change()
        return answer == "running"

    final = remote._watch(
        folder,
        RunOptions(),
        running=running,
        sync=lambda: None,
        relaunch=lambda: launches.append(1),
        log_hint="its console",
    )
    assert final.phase == "done" and launches == [1]
