"""The driver's real trainer (orchestrator/driver/world.py) on a local Ray cluster sorts the
runtime's failures: a value the workers reject or a full disk stops the job (``JobBroken``), a
worker killed mid-step is a loss (``WorkersLost``); checkpoints are read only when their signed
manifest verifies, a damaged newest one falls back to an older one, none readable stops; a step
whose gradients overflow reports them as not finite."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from orchestrator.driver.machine import JobBroken, WorkersLost  # noqa: E402
from orchestrator.driver.world import RuntimeTrainer  # noqa: E402
from orchestrator.plan import Plan, Replica  # noqa: E402
from orchestrator.recipe import parse_recipe  # noqa: E402
from tests.integration.conftest import local_ray  # noqa: E402

A1 = "local/sim-us/sim-us-a"
KEY = b"k" * 32
RECIPE = f"""\
name: failures
provider: local
model: {{name: gpt-tiny, profile: analytic}}
training:
  global_batch_size: 4
  microbatch_sizes: [2]
  steps: 10
  optimizer: {{name: adamw, lr: 3.0e-3, grad_clip_norm: null}}
constraints: {{locations: [{A1}], gpu_types: [T4]}}
checkpointing: {{every_steps: 2, keep_last: 3}}
runtime: {{link_emulation: false}}
"""


@pytest.fixture(scope="module")
def ray_cluster():
    with local_ray(num_cpus=3, resources={f"infra:{A1}": 3}) as ray:
        yield ray


def _plan(stages: int = 1, replicas: int = 1) -> Plan:
    layers = [(0, 3), (3, 6)] if stages == 2 else [(0, 6)]
    return Plan.from_pipelines(
        global_batch_size=4,
        microbatch_size=2,
        layers=layers,
        pipelines=[(replicas, [Replica(gpu="T4", infra=A1) for _ in layers])],
    )


def _trainer(tmp_path: Path, *, lr: float | None = None, url: str | None = None) -> RuntimeTrainer:
    recipe = parse_recipe(RECIPE, file="failures.yaml", folder=tmp_path)
    if lr is not None:  # past the recipe's checks, as a bug elsewhere could pass it on
        optimizer = dataclasses.replace(recipe.training.optimizer, lr=lr)
        recipe = dataclasses.replace(
            recipe, training=dataclasses.replace(recipe.training, optimizer=optimizer)
        )
    return RuntimeTrainer(
        recipe=recipe,
        catalog=None,
        job="failures-run",
        checkpoint_url=url or str(tmp_path / "checkpoints"),
        signing_key=KEY,
    )


@pytest.mark.integration
def test_a_value_the_workers_reject_stops_and_says_which(ray_cluster, tmp_path):
    trainer = _trainer(tmp_path, lr=float("nan"))
    with pytest.raises(JobBroken) as caught:
        trainer.start(_plan(), restore_step=None)
    assert caught.value.cause == "bad_value"
    assert "Invalid learning rate: nan" in caught.value.message
    assert "\n" not in caught.value.message and "Traceback" not in caught.value.message
    assert not ray_cluster.util.list_named_actors(all_namespaces=True)  # nothing left running


@pytest.mark.integration
def test_overflowing_gradients_are_reported_not_finite(ray_cluster, tmp_path):
    trainer = _trainer(tmp_path, lr=1e30)
    trainer.start(_plan(), restore_step=None)
    try:
        results = [trainer.step(k) for k in range(3)]
    finally:
        trainer.stop()
    assert not all(r.grads_finite and r.loss == r.loss for r in results)


@pytest.mark.integration
def test_a_worker_killed_mid_run_is_a_loss(ray_cluster, tmp_path):
    trainer = _trainer(tmp_path)
    trainer.start(_plan(stages=2), restore_step=None)
    try:
        trainer.step(0)
        ray_cluster.kill(trainer.group.actors[1])
        with pytest.raises(WorkersLost):
            trainer.step(1)
    finally:
        trainer.stop()


def _manifest(tmp_path: Path, trained: int) -> Path:
    return tmp_path / "checkpoints" / "failures-run" / f"step-{trained:08d}" / "manifest.json"


@pytest.mark.integration
def test_damaged_checkpoints_fall_back_to_an_older_one_and_none_readable_stops(
    ray_cluster, tmp_path
):
    trainer = _trainer(tmp_path)
    trainer.start(_plan(), restore_step=None)
    try:
        for k in range(6):
            trainer.step(k)
            if (k + 1) % 2 == 0:
                trainer.checkpoint(k + 1)  # the state after 2, 4 and 6 steps
    finally:
        trainer.stop()
    # the newest: garbled bytes; the one before: an object rewritten with its checksum updated in
    # the manifest by someone without the job's key
    _manifest(tmp_path, 5).write_bytes(b"\xff\xfe garbage")
    manifest = json.loads(_manifest(tmp_path, 3).read_text())
    target = tmp_path / "checkpoints" / manifest["files"][0]["key"]
    older = (
        tmp_path / "checkpoints" / json.loads(_manifest(tmp_path, 1).read_text())["files"][0]["key"]
    )
    target.write_bytes(older.read_bytes())
    import hashlib

    manifest["files"][0]["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
    _manifest(tmp_path, 3).write_text(json.dumps(manifest))

    again = _trainer(tmp_path)
    try:
        assert again.start(_plan(), restore_step=6) == 2  # only the oldest verifies
    finally:
        again.stop()
    problems = again.unreadable()
    assert len(problems) == 2 and "not UTF-8" in problems[0] and "signature" in problems[1]

    _manifest(tmp_path, 1).unlink()
    last = _trainer(tmp_path)
    with pytest.raises(JobBroken) as caught:
        last.start(_plan(), restore_step=6)
    last.stop()
    assert caught.value.cause == "checkpoint" and "--from-scratch" in caught.value.fix


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs (root only): a disk that fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(disk: Path, *, leave_bytes: int) -> None:
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with (disk / "filler").open("wb") as handle:
        handle.truncate(0)
        handle.write(b"\0" * max(0, free - leave_bytes))


@pytest.mark.integration
def test_a_full_disk_is_named_before_training_and_when_a_write_fails(
    ray_cluster, tmp_path, small_disk
):
    # a worker's checkpoints, 3 kept and one being written: ~10.6 MB, more than is left
    _fill(small_disk, leave_bytes=8 * 2**20)
    trainer = _trainer(tmp_path, url=str(small_disk / "checkpoints"))
    with pytest.raises(JobBroken) as caught:
        trainer.start(_plan(), restore_step=None)
    assert caught.value.cause == "disk_full" and "MB free" in caught.value.message

    (small_disk / "filler").unlink()  # room to start; the disk fills while training
    trainer = _trainer(tmp_path, url=str(small_disk / "checkpoints"))
    trainer.start(_plan(), restore_step=None)
    try:
        trainer.step(0)
        _fill(small_disk, leave_bytes=2**20)
        with pytest.raises(JobBroken) as caught:
            trainer.checkpoint(1)  # ~2.6 MB per worker
        assert caught.value.cause == "disk_full"
        assert "No space left on device" in caught.value.message
    finally:
        trainer.stop()
