"""runtime.checkpoint: atomic, checksummed, asynchronous checkpoints in a local folder or S3 (moto),
and the key property: a run restored from a checkpoint continues the uninterrupted run's losses
bit for bit (tiny GPT, 2 stages x 2 replicas, on a local Ray cluster)."""

from __future__ import annotations

import threading

import pytest

from tests.integration.conftest import FAKE_AWS

torch = pytest.importorskip("torch")

from runtime.checkpoint import (  # noqa: E402
    CheckpointCorruptError,
    Checkpointer,
    CheckpointError,
    commit,
    latest_complete,
    load,
    object_key,
    steps,
)
from runtime.models.gpt import build_layers  # noqa: E402
from runtime.models.specs import model_spec  # noqa: E402
from runtime.optim import OptimizerSettings, StageOptimizer  # noqa: E402
from runtime.reference import TrainConfig  # noqa: E402
from runtime.storage import LocalStore, StoreError, open_store  # noqa: E402

JOB = "job-1"
WAIT_S = 30.0


class Worker:
    """The first two layers of the tiny GPT with AdamW after one step: the same kinds of objects as
    StageRunner.state_dict() (module and optimizer state, RNG ByteTensor, layer range)."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.module = torch.nn.Sequential(*build_layers(model_spec("gpt-tiny"), seed=0)[:2])
        self.optimizer = StageOptimizer(
            self.module.parameters(), OptimizerSettings(kind="adamw", lr=1e-3, weight_decay=0.0)
        )
        tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
        self.module(tokens).square().mean().backward()
        self.optimizer.step()

    def state_dict(self) -> dict:
        return {
            "stage": 0,
            "replica": 1,
            "layers": (0, 2),
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.random.get_rng_state(),
        }


def assert_same(got: object, want: object) -> None:
    """Equal structure, equal values, tensors bit for bit."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        assert torch.equal(got, want)
    elif isinstance(want, dict):
        assert set(got) == set(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    else:
        assert got == want


def save_and_commit(store, step: int, worker: Worker, *, keep_last: int = 3) -> dict:
    checkpointer = Checkpointer(store, JOB, stage=0, replica=1)
    state = worker.state_dict()
    checkpointer.save(step, state)
    entries = checkpointer.wait(WAIT_S)
    checkpointer.close()
    commit(store, JOB, step, entries, keep_last=keep_last)
    return state


class GatedStore(LocalStore):
    """A local store whose puts wait for the test to open the gate (so a test decides when the
    background write happens), or fail when told to."""

    def __init__(self, root, *, fail: bool = False) -> None:
        super().__init__(root)
        self.gate, self.fail = threading.Event(), fail

    def put(self, key: str, data: bytes) -> None:
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        if self.fail:
            raise StoreError(f"{self.url}: disk full writing {key!r}")
        super().put(key, data)


# --- one worker, local folder and S3 ---------------------------------------------------------


@pytest.fixture(scope="module")
def s3_bucket(s3_endpoint):
    """A bucket on the shared moto server: (endpoint URL, bucket)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in FAKE_AWS.items():
            patch.setenv(key, value)
        import boto3

        boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="checkpoints")
    return s3_endpoint, "checkpoints"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch):
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    for key, value in FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    # one prefix per test (its temporary folder's unique name): tests share the bucket only
    return open_store(f"s3://{bucket}/{tmp_path.name}", endpoint_url=endpoint)


def test_round_trip_gives_back_the_same_state(store):
    worker = Worker()
    state = save_and_commit(store, 7, worker)
    assert latest_complete(store, JOB) == 7
    assert sorted(store.keys(f"{JOB}/")) == [
        f"{JOB}/step-00000007/manifest.json",
        f"{JOB}/step-00000007/stage-0-replica-1.pt",
    ]
    restored = load(store, JOB, 7, stage=0, replica=1)  # weights_only=True load
    assert_same(restored, state)
    assert restored["optimizer"]["state"][0]["step"].item() == 1.0  # Adam's step counter kept
    with pytest.raises(CheckpointError, match="stage 1 replica 0"):
        load(store, JOB, 7, stage=1, replica=0)


def test_a_flipped_byte_is_detected_and_named(store):
    save_and_commit(store, 3, Worker())
    key = object_key(JOB, 3, 0, 1)
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0x01
    store.put(key, bytes(data))
    with pytest.raises(CheckpointCorruptError, match="stage-0-replica-1.pt.*corrupt.*earlier"):
        load(store, JOB, 3, stage=0, replica=1)


def test_a_step_without_manifest_is_ignored(store):
    worker = Worker()
    save_and_commit(store, 1, worker)
    checkpointer = Checkpointer(store, JOB, stage=0, replica=1)
    checkpointer.save(2, worker.state_dict())  # written, never committed: as a crash would leave
    checkpointer.wait(WAIT_S)
    assert steps(store, JOB) == {1: True, 2: False}
    assert latest_complete(store, JOB) == 1
    with pytest.raises(CheckpointError, match="step 2 .* not a complete checkpoint.*\\(1\\)"):
        load(store, JOB, 2, stage=0, replica=1)


def test_keep_last_deletes_older_steps_and_abandoned_ones(tmp_path):
    store = open_store(str(tmp_path))
    worker = Worker()
    checkpointer = Checkpointer(store, JOB, stage=0, replica=1)
    checkpointer.save(0, worker.state_dict())  # abandoned: older than every kept step
    checkpointer.save(9, worker.state_dict())  # newer than all, still "being written": stays
    checkpointer.wait(WAIT_S)
    for step in (1, 2, 3, 4):
        save_and_commit(store, step, worker, keep_last=2)
    assert steps(store, JOB) == {3: True, 4: True, 9: False}


def test_the_snapshot_does_not_alias_live_tensors(tmp_path):
    store = GatedStore(tmp_path)
    worker = Worker()
    before = {k: v.clone() for k, v in worker.module.state_dict().items()}
    moment = worker.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    checkpointer = Checkpointer(store, JOB, stage=0, replica=1)
    checkpointer.save(5, worker.state_dict())
    with torch.no_grad():  # training goes on while the write has not even started
        for parameter in worker.module.parameters():
            parameter.add_(1.0)
    worker.optimizer.state[worker.optimizer.params[0]]["exp_avg"].add_(1.0)
    store.gate.set()
    commit(store, JOB, 5, checkpointer.wait(WAIT_S))
    written = load(store, JOB, 5, stage=0, replica=1)
    assert_same(written["module"], before)
    assert torch.equal(written["optimizer"]["state"][0]["exp_avg"], moment)
    assert not torch.equal(written["module"]["0.tokens.weight"], worker.module[0].tokens.weight)


def test_a_failed_write_is_raised_by_wait_and_the_writer_goes_on(tmp_path):
    store = GatedStore(tmp_path, fail=True)
    checkpointer = Checkpointer(store, JOB, stage=0, replica=1)
    checkpointer.save(1, Worker().state_dict())
    with pytest.raises(CheckpointError, match="still running after 0.05 s"):
        checkpointer.wait(0.05)  # the put is held at the gate
    store.gate.set()
    with pytest.raises(CheckpointError, match="step-00000001/stage-0-replica-1.pt.*disk full"):
        checkpointer.wait(WAIT_S)
    store.fail = False
    checkpointer.save(2, Worker().state_dict())
    assert [e.key for e in checkpointer.wait(WAIT_S)] == [object_key(JOB, 2, 0, 1)]
    checkpointer.close()


def test_commit_refuses_a_state_that_is_not_in_the_store(tmp_path):
    store = open_store(str(tmp_path))
    checkpointer = Checkpointer(store, JOB, stage=0, replica=1)
    checkpointer.save(1, Worker().state_dict())
    (entry,) = checkpointer.wait(WAIT_S)
    store.delete(entry.key)
    with pytest.raises(CheckpointError, match="wait for every worker"):
        commit(store, JOB, 1, [entry])
    assert latest_complete(store, JOB) is None


def test_a_job_name_that_is_not_a_folder_name_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="job name '../escape'.*letters, digits"):
        Checkpointer(open_store(str(tmp_path)), "../escape", stage=0, replica=0)


# --- the runtime: resuming continues the uninterrupted run exactly ---------------------------

A1, A2 = "local/sim-us/sim-us-a", "local/sim-us/sim-us-b"
CONFIG = TrainConfig(steps=6, global_batch_size=8, microbatch_size=2, learning_rate=3e-3, seed=4)
CORPUS_BYTES = 2**18


@pytest.fixture(scope="module")
def workers(shared_workers):
    """Each _train takes the last group's workers: the runtime modules' shared pool."""
    return shared_workers


def _layout(layers=((0, 3), (3, 6)), places=(A1, A2)):
    from orchestrator.layout import layout_from_plan
    from orchestrator.plan import Plan, Replica, check_plan

    layers = list(layers)
    plan = Plan.from_pipelines(
        global_batch_size=CONFIG.global_batch_size,
        microbatch_size=CONFIG.microbatch_size,
        layers=layers,
        pipelines=[(1, [Replica(gpu="T4", infra=place) for _ in layers]) for place in places],
        allreduce="flat",
    )
    check_plan(plan)
    return layout_from_plan(plan, model="gpt-tiny")


def _train(
    workers, first: int, last: int, *, restore_from: str | None = None, pause=None, layout=None
) -> list[float]:
    """Steps ``first..last`` on a new group, made of the last one's workers (restored from
    ``restore_from`` when given); ``pause`` is called with the group after each step."""
    group = workers.start(layout or _layout(), CONFIG, corpus_bytes=CORPUS_BYTES)
    if restore_from is not None:
        assert group.restore(restore_from, JOB) == first - 1
    losses = []
    for step in range(first, last + 1):
        losses.append(group.step(step))
        if pause is not None:
            pause(group, step)
    return losses


@pytest.fixture(scope="module")
def uninterrupted(workers) -> list[float]:
    """Steps 0..5 of the default layout without a pause: the losses every resume must continue."""
    return _train(workers, 0, 5)


@pytest.fixture(scope="module")
def checkpoint_at_step_2(workers, tmp_path_factory) -> str:
    """A folder with the default layout's checkpoint after step 2 (restores only read it)."""
    folder = str(tmp_path_factory.mktemp("layouts") / "checkpoints")

    def checkpoint_after_step_2(group, step: int) -> None:
        if step == 2:
            group.checkpoint(folder, JOB, step)

    _train(workers, 0, 2, pause=checkpoint_after_step_2)
    return folder


@pytest.mark.integration
def test_resume_continues_the_uninterrupted_losses_bit_for_bit(workers, uninterrupted, tmp_path):
    folder, reports, pending = str(tmp_path / "checkpoints"), [], []

    def checkpoint_after_step_2(group, step: int) -> None:
        if step == 2:  # copy now; the write runs while step 3 trains
            pending.append(group.start_checkpoint(folder, JOB, step))
        elif step == 3:
            reports.append(group.finish_checkpoint(pending[0]))

    # the interrupted run goes one step past its checkpoint, which must not leak into it
    before = _train(workers, 0, 3, pause=checkpoint_after_step_2)
    resumed = _train(workers, 3, 5, restore_from=folder)

    (report,) = reports
    print(
        f"\ncheckpoint of gpt-tiny, 2 stages x 2 replicas: training waited {report.snapshot_s:.4f} s"
        f" (copy), write {report.write_s:.4f} s in the background, {report.size_bytes} bytes"
    )
    assert report.step == 2 and report.size_bytes > 0
    assert before == uninterrupted[:4]
    assert resumed == uninterrupted[3:], (resumed, uninterrupted)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("layers", "places"),
    [
        (((0, 2), (2, 6)), (A1,)),  # the pipeline cut elsewhere, one replica
        (((0, 6),), (A2,)),  # one worker holds everything (the tied weight once)
        (((0, 4), (4, 6)), (A2, A1)),  # another cut, the replicas swapped between places
    ],
)
def test_resume_into_another_layout_continues_the_losses(
    workers, uninterrupted, checkpoint_at_step_2, layers, places
):
    """After losing nodes the driver may re-plan to another split and replica count: each new
    stage takes its layers' weights and Adam state from the stages that held them."""
    resumed = _train(
        workers, 3, 5, restore_from=checkpoint_at_step_2, layout=_layout(layers, places)
    )
    # the same math in another summation order (microbatches over other replicas and stages)
    assert resumed == pytest.approx(uninterrupted[3:], rel=1e-5)
