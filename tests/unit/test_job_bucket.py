"""A job's folder mirrored through its bucket (orchestrator/driver/bucket.py), on a local store."""

from __future__ import annotations

from orchestrator.driver.bucket import ASKED, FOLLOWED, BucketRecord, JobBucket
from runtime.storage import LocalStore


def test_the_folder_travels_and_the_state_comes_back(tmp_path):
    laptop, vm = tmp_path / "laptop", tmp_path / "vm"
    laptop.mkdir()
    (laptop / "state.json").write_text("{}")
    (laptop / "recipe.yaml").write_text("name: j\n")
    (laptop / "driver.lock").write_text("held")
    (laptop / "wheel").mkdir()
    store = LocalStore(tmp_path / "bucket")
    up = JobBucket(store)
    assert up.push(laptop) == 2  # not the lock, not a folder
    assert up.push(laptop) == 0  # nothing changed

    down = JobBucket(store)
    assert down.pull(vm) == 2 and (vm / "recipe.yaml").read_text() == "name: j\n"
    assert (vm / "state.json").stat().st_mode & 0o077 == 0  # owner-only
    (vm / "state.json").write_text('{"step": 3}')
    (vm / "controller.leaving").write_text("going\n")
    down.push(vm, FOLLOWED)

    up.pull(laptop, FOLLOWED)
    assert (laptop / "state.json").read_text() == '{"step": 3}'
    assert (laptop / "controller.leaving").exists()
    store.delete("controller.leaving")  # a new controller cleared it
    up.pull(laptop, FOLLOWED)
    assert not (laptop / "controller.leaving").exists()


def test_a_followed_file_the_folder_dropped_leaves_the_bucket(tmp_path):
    vm = tmp_path / "vm"
    vm.mkdir()
    store = LocalStore(tmp_path / "bucket")
    mirror = JobBucket(store)
    (vm / "controller.leaving").write_text("going\n")
    mirror.push(vm, FOLLOWED)
    assert store.exists("controller.leaving")
    (vm / "controller.leaving").unlink()
    mirror.push(vm, FOLLOWED)
    assert not store.exists("controller.leaving")  # a follower would take it for a leave


def test_a_stop_reaches_the_vm_and_a_relaunch_clears_it(tmp_path):
    vm = tmp_path / "vm"
    bucket = JobBucket(LocalStore(tmp_path / "bucket"))
    bucket.put(ASKED[0], b"stop\n")
    bucket.pull(vm, ASKED)
    assert (vm / "stop.request").exists()
    bucket.delete(ASKED[0])
    bucket.pull(vm, ASKED)
    assert not (vm / "stop.request").exists()


def test_the_record_names_no_secret_and_reads_back(tmp_path):
    record = BucketRecord(url="s3://b/jobs/j", provider="aws", region="us-east-1")
    record.save(tmp_path)
    assert BucketRecord.load(tmp_path) == record
    assert BucketRecord.load(tmp_path / "none") is None


def test_a_namespace_that_is_gone_is_an_os_error_not_a_crash():
    """An emulated cloud taken down leaves records naming its API's namespace: entering it is
    an OSError the callers turn into a note (status shows the last state it had)."""
    import pytest

    from provisioners.local import netns

    with pytest.raises(FileNotFoundError):
        netns.in_namespace("geo+no-such-namespace", lambda: 1)


def test_a_hosted_jobs_state_stays_when_its_emulated_cloud_is_down(tmp_path, capsys):
    from orchestrator.driver.hosts import refresh

    (tmp_path / "state.json").write_text("{}")
    BucketRecord(
        url="s3://b/jobs/j", provider="aws", region="us-east-1", api_netns="geo+gone"
    ).save(tmp_path)
    refresh(tmp_path)
    assert (tmp_path / "state.json").read_text() == "{}"
    assert "the emulated aws that holds its bucket is down" in capsys.readouterr().err


def test_a_reader_opens_the_bucket_once_and_afresh_after_a_failure_or_a_new_record(
    tmp_path, monkeypatch, capsys
):
    """``logs -f`` reads a hosted job's bucket every few seconds: one SDK client for all the
    reads, a new one after a read that failed (keys or cloud may have changed) or for a record
    that names another bucket."""
    from orchestrator.driver.hosts import BucketReader
    from runtime.storage import StoreError

    laptop = tmp_path / "laptop"
    laptop.mkdir()
    first, second = LocalStore(tmp_path / "first"), LocalStore(tmp_path / "second")
    first.put("state.json", b'{"step": 1}')
    BucketRecord(url=str(tmp_path / "first"), provider="aws", region="r").save(laptop)
    opened, failing = [], []
    real_open, real_pull = JobBucket.open.__func__, JobBucket.pull

    def counting_open(cls, record, **auth):
        opened.append(record.url)
        return real_open(cls, record, **auth)

    def pull(self, folder, names=None):
        if failing:
            raise StoreError(failing.pop())
        return real_pull(self, folder, names)

    monkeypatch.setattr(JobBucket, "open", classmethod(counting_open))
    monkeypatch.setattr(JobBucket, "pull", pull)
    read = BucketReader(laptop)
    read()
    first.put("state.json", b'{"step": 2}')
    read()
    assert (laptop / "state.json").read_text() == '{"step": 2}'
    assert opened == [str(tmp_path / "first")]

    failing.append("s3 get_object of 'state.json' failed (ExpiredToken)")
    first.put("state.json", b'{"step": 3}')
    read()  # noted; the copy stays as it was
    assert "its bucket did not answer" in capsys.readouterr().err
    assert (laptop / "state.json").read_text() == '{"step": 2}'
    read()
    assert (laptop / "state.json").read_text() == '{"step": 3}'
    assert len(opened) == 2  # opened afresh after the failure

    second.put("state.json", b'{"step": 9}')
    BucketRecord(url=str(tmp_path / "second"), provider="aws", region="r").save(laptop)
    read()
    assert (laptop / "state.json").read_text() == '{"step": 9}'
    assert opened[-1] == str(tmp_path / "second") and len(opened) == 3
