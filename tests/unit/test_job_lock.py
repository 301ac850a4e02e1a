"""One running driver per job: a second submit of a running job is refused and names the process
that runs it; the lock goes with its process, however it ends (kill -9 included)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.driver.lock import JobLock, JobRunning, holder

HOLD = """\
import sys
from pathlib import Path
from orchestrator.driver.lock import JobLock
lock = JobLock.acquire(Path(sys.argv[1]), job="quick")
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
"""


@pytest.fixture
def held(tmp_path):
    """A process that holds the lock of job ``quick`` in ``tmp_path/jobs/quick``."""
    folder = tmp_path / "jobs" / "quick"
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.stdout.readline().strip() == "held"
    yield folder, process
    process.kill()
    process.wait(timeout=10)


def test_a_second_lock_names_the_holder_and_a_killed_holder_frees_it(held):
    folder, process = held
    with pytest.raises(JobRunning) as caught:
        JobLock.acquire(folder, job="quick")
    assert f"pid {process.pid}" in caught.value.message and "stop quick" in caught.value.fix
    assert holder(folder)["pid"] == process.pid
    process.send_signal(signal.SIGKILL)  # a crashed submit leaves no stale lock
    process.wait(timeout=10)
    assert holder(folder) is None
    with JobLock.acquire(folder, job="quick"):
        assert holder(folder) is None or holder(folder)["pid"] != process.pid


def test_submit_of_a_running_job_exits_2_before_renting_anything(held, tmp_path, capsys):
    folder, process = held
    recipe = tmp_path / "quick.yaml"
    recipe.write_text(
        "name: quick\nprovider: local\nmodel: {name: gpt-tiny, profile: analytic}\n"
        "training: {global_batch_size: 4, microbatch_sizes: [2], steps: 5}\n"
    )
    code = main(["submit", str(recipe), "--jobs-dir", str(tmp_path / "jobs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "already running" in err and f"pid {process.pid}" in err
    assert "Traceback" not in err
    assert not (folder / "state.json").exists()  # the running job's files are untouched


def test_the_lock_file_says_who_holds_it(tmp_path):
    with JobLock.acquire(tmp_path, job="j") as lock:
        record = json.loads(lock.path.read_text())
        assert set(record) == {"pid", "host", "since_s", "command"}
    assert holder(tmp_path) is None
