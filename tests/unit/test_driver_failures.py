"""Failures a retry cannot fix stop the job at once with their cause; failures a retry may fix are
retried within a budget, with backoff; a diverged step is never committed; whatever happens, every
node is released. Against the hand-written fakes of tests/unit/test_driver_machine.py."""

from __future__ import annotations

import errno
import math

import pytest

from orchestrator.driver.events import read_events
from orchestrator.driver.failures import classify, describe, one_line
from orchestrator.driver.machine import JobBroken, StepResult, WorkersLost
from orchestrator.driver.state import StateStore
from tests.unit.test_driver_machine import EU, US, FakeCloud, FakeTrainer, make_driver


def events(tmp_path) -> list[dict]:
    return list(read_events(tmp_path / "job" / "events.jsonl"))


class FlakyTrainer(FakeTrainer):
    """Every step from ``from_step`` on fails as a lost worker would, ``times`` times in all."""

    def __init__(self, cloud, *, from_step: int, times: int) -> None:
        super().__init__(cloud)
        self.from_step, self.left = from_step, times

    def step(self, step: int) -> StepResult:
        if step >= self.from_step and self.left:
            self.left -= 1
            raise WorkersLost(f"\x1b[31mstep {step}: RayTaskError\x1b[0m\nTraceback (most recent")
        return super().step(step)


def test_a_failure_that_keeps_coming_back_stops_within_the_budget_with_backoff(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer = FlakyTrainer(cloud, from_step=7, times=10**6)
    driver = make_driver(tmp_path, cloud, trainer, max_attempts=4, backoff_s=1.0, max_backoff_s=3)
    state = driver.run()
    assert state.phase == "failed" and state.failure["cause"] == "gave_up"
    assert state.recoveries == 5 and trainer.steps_run == 7 + 4 * 2  # steps 5, 6 again each time
    assert cloud.alive_nodes == {} and not cloud.workers  # nothing held once it stopped
    log = events(tmp_path)
    waits = [e["details"]["wait_s"] for e in log if e["event"] == "backing_off"]
    assert waits == [1.0, 2.0, 3.0]  # doubling from the second attempt, capped
    (failed,) = [e for e in log if e["event"] == "failed"]
    assert "4 recoveries in a row" in failed["reason"] and "step 7" in failed["reason"]
    # reasons are one line without colour codes, whatever the runtime's error text held
    for event in log:
        for text in (event.get("reason", ""), event.get("decision", "")):
            assert "\x1b" not in text and "\n" not in text
    assert log[-1]["event"] == "failed"


def test_progress_between_losses_resets_the_budget(tmp_path):
    cloud = FakeCloud({US: 8, EU: 8})
    losses = {k: (lambda t: cloud.kill(t.nodes[0])) for k in range(3, 40, 3)}  # 13 losses
    trainer = FakeTrainer(cloud, losses)
    state = make_driver(tmp_path, cloud, trainer, steps=40, every=2, max_attempts=2).run()
    assert state.phase == "done" and state.recoveries == 13 and state.attempts == 0


def test_a_broken_job_stops_at_once_and_keeps_its_last_checkpoint(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    class DiskFull(FakeTrainer):
        def checkpoint(self, step: int) -> None:
            if step == 10:
                raise JobBroken(
                    "disk_full",
                    "checkpoint of step 10: StoreFullError: [Errno 28] No space left on device",
                    fix="free space",
                )
            super().checkpoint(step)

    trainer = DiskFull(cloud)
    state = make_driver(tmp_path, cloud, trainer).run()
    assert state.phase == "failed" and state.recoveries == 0
    assert state.failure["cause"] == "disk_full" and state.checkpoint_step == 5
    assert trainer.steps_run == 10  # no step trained past the failed checkpoint
    assert cloud.alive_nodes == {} and trainer.checkpoints == [5]
    (failed,) = [e for e in events(tmp_path) if e["event"] == "failed"]
    assert "No space left on device" in failed["reason"]
    assert (
        "kept the checkpoint of step 5" in failed["decision"] and "free space" in failed["decision"]
    )
    assert StateStore(tmp_path / "job").load().state.failure["cause"] == "disk_full"


def test_a_broken_error_while_a_node_died_is_a_loss_not_a_stop(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    class OddError(FakeTrainer):
        def step(self, step: int) -> StepResult:
            if step == 12 and not cloud.terminated:
                cloud.kill(self.nodes[0])
                cloud.events.clear()  # the cloud has not said so yet
                raise JobBroken("code_error", "a survivor's odd error", fix="-")
            return super().step(step)

    state = make_driver(tmp_path, cloud, OddError(cloud)).run()
    assert state.phase == "done" and state.recoveries == 1


@pytest.mark.parametrize(
    ("result", "words"),
    [
        (StepResult(loss=math.nan), "the loss is nan"),
        (StepResult(loss=math.inf), "the loss is inf"),
        (StepResult(loss=2.5, grads_finite=False), "the gradients are not finite"),
    ],
)
def test_a_diverged_step_is_not_committed_and_stops_the_job(tmp_path, result, words):
    cloud = FakeCloud({US: 2, EU: 2})

    class Diverges(FakeTrainer):
        def step(self, step: int) -> StepResult:
            return result if step == 12 else super().step(step)

    trainer = Diverges(cloud)
    state = make_driver(tmp_path, cloud, trainer).run()
    assert state.phase == "failed" and state.failure["cause"] == "diverged"
    assert state.step == 12 and len(state.losses) == 12 and all(map(math.isfinite, state.losses))
    assert trainer.checkpoints == [5, 10]  # nothing written after the bad step
    assert cloud.alive_nodes == {}
    (failed,) = [e for e in events(tmp_path) if e["event"] == "failed"]
    assert words in failed["reason"] and "step 13" in failed["reason"]
    assert "last good checkpoint is step 10" in failed["reason"]
    assert "resumes from step 10" in failed["decision"]


def test_no_readable_checkpoint_stops_instead_of_starting_again_from_zero(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    def corrupt_all_and_kill(trainer):
        trainer.corrupt.update({5, 10})
        cloud.kill(trainer.nodes[0])

    trainer = FakeTrainer(cloud, {12: corrupt_all_and_kill})
    state = make_driver(tmp_path, cloud, trainer).run()
    assert state.phase == "failed" and state.failure["cause"] == "checkpoint"
    # found before the re-plan rented anything: no replacement launched, no worker started
    assert trainer.starts == [None] and cloud.launched == 2 and cloud.alive_nodes == {}


def test_an_unexpected_error_releases_the_nodes_before_it_is_reported(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    class Bug(FakeTrainer):
        def step(self, step: int) -> StepResult:
            if step == 3:
                raise AttributeError("'NoneType' object has no attribute 'x'")
            return super().step(step)

    with pytest.raises(AttributeError):
        make_driver(tmp_path, cloud, Bug(cloud)).run()
    assert cloud.alive_nodes == {} and not cloud.workers


def test_a_loss_without_a_surviving_replica_says_how_many_steps_it_rolled_back(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer = FakeTrainer(cloud, {13: lambda t: cloud.kill(t.nodes[1])})
    make_driver(tmp_path, cloud, trainer).run()
    (rolled,) = [e for e in events(tmp_path) if e["event"] == "rolled_back"]
    assert rolled["details"] == {"from_step": 13, "to_step": 10, "steps": 3}


# -- the verdict on an error ------------------------------------------------------------------


class RayTaskError(Exception):
    """Stands for Ray's wrapper: its ``cause`` is the worker's own exception."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("ray::StageWorker.step() (pid=1)\nTraceback ...")
        self.cause = cause


class ActorDiedError(Exception):
    pass


class StoreFullError(OSError):
    pass


class CheckpointError(RuntimeError):
    pass


class CheckpointCorruptError(CheckpointError):
    pass


@pytest.mark.parametrize(
    ("error", "retry", "cause"),
    [
        (ActorDiedError("the actor died"), True, "lost"),
        (RayTaskError(RuntimeError("[gloo] Connection closed by peer [1.2.3.4]:5")), True, "lost"),
        (RayTaskError(ConnectionResetError("reset")), True, "lost"),
        (RayTaskError(ValueError("Invalid learning rate: nan")), False, "bad_value"),
        (RayTaskError(OSError(errno.ENOSPC, "No space left on device")), False, "disk_full"),
        (
            RayTaskError(StoreFullError("writing failed: No space left on device")),
            False,
            "disk_full",
        ),
        (RayTaskError(OSError(errno.EACCES, "Permission denied")), False, "store"),
        (RayTaskError(CheckpointCorruptError("sha256 mismatch")), False, "checkpoint"),
        (RayTaskError(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")), False, "bad_value"),
        (RayTaskError(AttributeError("no attribute")), False, "code_error"),
        (RayTaskError(MemoryError()), False, "out_of_memory"),
        (RayTaskError(RuntimeError("something odd")), False, "code_error"),
    ],
)
def test_classify_by_the_workers_own_error(error, retry, cause):
    verdict = classify(error, doing="step 3", store="/ckpt")
    assert (verdict.retry, verdict.cause) == (retry, cause)
    assert verdict.message.startswith("step 3: ") and "\n" not in verdict.message
    assert retry or verdict.fix


def test_one_line_strips_colour_codes_control_characters_and_length():
    text = "\x1b[1m\x1b[31mboom\x1b[0m\n  Traceback\r\n\x07 end " + "x" * 500
    flat = one_line(text, limit=40)
    assert flat.startswith("boom Traceback end") and len(flat) == 40 and "\x1b" not in flat
    assert describe(RayTaskError(ValueError("bad\nvalue"))) == "ValueError: bad value"
