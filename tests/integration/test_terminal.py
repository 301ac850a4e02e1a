"""``submit`` in a terminal, as a person runs it: in a pseudo-terminal, where Ctrl-C is the
terminal's interrupt character and reaches every process of the foreground group. Once: the job
stops cleanly (the driver checkpoints the step it committed and lets its nodes go; ``status`` says
stopped at that step, no node held) and no process of its Ray session is left. Twice: it leaves at
once, and the job still reads as stopped, resumable from its checkpoint. Never a traceback.
Detached, the job outlives the terminal; ``status`` and ``logs -f`` follow it from another folder
to its end, and its Ray dashboard, state API and Prometheus metrics answer while it runs."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from provisioners.local import reaper
from tests.integration.jobs import until
from tests.integration.test_orphans import RECIPE, _ray_session, _wait_gone

REPO = Path(__file__).resolve().parents[2]
CTRL_C = b"\x03"
# the detached job outlives the checks made while it runs: ~25 s at its slow node's pace (~0.1 s
# a step: test_orphans.RECIPE), as 1,000 steps at full speed took
DETACHED_STEPS = 250

pytestmark = pytest.mark.skipif(not reaper.supported(), reason="the reaper needs Linux pidfds")


class Terminal:
    """A command in a pseudo-terminal of its own (its session leader, the terminal its
    controlling one); what it prints is read back as text."""

    def __init__(self, argv: list[str], *, cwd: Path) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes the command (pty.fork made the terminal its own)
            os.chdir(cwd)
            # as a person's shell starts it: Ctrl-C interrupts (pytest started in the background
            # of a script, as `cmd &` does, would hand down an ignored SIGINT)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(argv[0], argv)
        self.text = ""

    def read_until(self, wanted: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while wanted not in self.text:
            left = deadline - time.monotonic()
            assert left > 0, f"no {wanted!r} in {timeout_s} s; printed:\n{self.text[-3000:]}"
            if not self._read(left):
                raise AssertionError(f"ended before {wanted!r}; printed:\n{self.text[-3000:]}")
        return self.text

    def wait(self, timeout_s: float) -> int:
        """Read to the end and return the exit code."""
        deadline = time.monotonic() + timeout_s
        while self._read(max(0.0, deadline - time.monotonic())):
            assert time.monotonic() < deadline, f"still running; printed:\n{self.text[-3000:]}"
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)

    def press(self, key: bytes) -> None:
        os.write(self.fd, key)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _read(self, timeout_s: float) -> bool:
        """Read what is there within ``timeout_s``; False at the end of the output."""
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the other side closed
            return False
        self.text += chunk.decode(errors="replace").replace("\r\n", "\n")
        return bool(chunk)


def _job_processes(pid: int) -> dict[int, int]:
    """pid -> start time of the job's processes: the command's and its Ray session's."""
    table = reaper.process_table()
    found = reaper.with_descendants(table, [pid])
    session = _ray_session(table, found)
    if session:
        found |= reaper.with_descendants(table, reaper.session_processes(table, session))
    return {p: table[p].start_ticks for p in found if p != pid and table[p].state != "Z"}


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_the_job_cleanly_and_twice_leaves_at_once(tmp_path, presses):
    name = f"terminal-{presses}"
    recipe = tmp_path / f"{name}.yaml"
    text = RECIPE.replace("NAME", name).replace("STEPS", "100000")
    recipe.write_text(text.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    jobs = tmp_path / "jobs"
    argv = [sys.executable, "-m", "orchestrator", "submit", str(recipe), "--jobs-dir", str(jobs)]
    terminal = Terminal([*argv, "--vms", "processes"], cwd=REPO)
    try:
        # the plan and its price first; a person at the terminal is asked before renting
        terminal.read_until("and train? [Y/n]", timeout_s=120)
        assert "predicted" in terminal.text and "/h for the GPUs" in terminal.text
        terminal.press(b"y\r")
        terminal.read_until("step 10/", timeout_s=120)
        processes = _job_processes(terminal.pid)
        assert processes, "no process of the job's Ray session found"
        terminal.press(CTRL_C)
        terminal.read_until("Ctrl-C again leaves at once", timeout_s=30)
        if presses == 2:
            terminal.press(CTRL_C)
        code = terminal.wait(timeout_s=120)
    finally:
        terminal.kill()
    out = terminal.text
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    state = json.loads((jobs / name / "state.json").read_text())["state"]
    assert state["phase"] == "stopped" and state["nodes"] == [], state["phase"]
    assert not _wait_gone(processes, timeout_s=10.0)  # nothing of the job runs on
    last = json.loads((jobs / name / "events.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "stopped"
    if presses == 1:  # stopped by its driver: the step it committed is checkpointed
        assert state["checkpoint_step"] == state["step"] >= 10
        assert f"stopped after {state['step']} steps" in out and code == 1
    else:  # left at once: resumable from the newest checkpoint
        assert code == 130 and "interrupted" in out
        assert "submit again resumes" in last["reason"]


def test_a_detached_job_outlives_its_terminal_and_is_followed_from_another_folder(
    tmp_path, monkeypatch
):
    name = "detached"
    recipe = tmp_path / f"{name}.yaml"
    text = RECIPE.replace("NAME", name).replace("STEPS", str(DETACHED_STEPS))
    recipe.write_text(text.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    monkeypatch.setenv("GEO_ORCHESTRATOR_HOME", str(tmp_path / "home"))  # the default jobs home
    argv = [sys.executable, "-m", "orchestrator", "submit", str(recipe), "--detach", "-y"]
    terminal = Terminal([*argv, "--vms", "processes"], cwd=tmp_path)
    try:
        code = terminal.wait(timeout_s=180)
    finally:
        terminal.kill()
    assert code == 0 and "runs in the background" in terminal.text, terminal.text[-3000:]
    folder = tmp_path / "home" / "jobs" / name
    holder = json.loads((folder / "driver.lock").read_text())["pid"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    endpoints = until(
        "endpoints.json", lambda: _read_json(folder / "endpoints.json"), timeout_s=120
    )
    actors = until(
        "actors of the job", lambda: _job_actors(endpoints["dashboard"], name), timeout_s=120
    )
    assert f"driver-{name}" in actors and any(":stage0-dp0@local/" in a for a in actors), actors
    listed = _orchestrator(["status", name, "--json"], cwd=elsewhere)  # a shell anywhere
    assert json.loads(listed.stdout)["jobs"][0]["phase"] not in ("done", "failed")
    metrics = until("metric of the job", lambda: _metric(endpoints["metrics"], name), timeout_s=120)
    assert 'job="detached"' in metrics

    followed = _orchestrator(["logs", "-f", name], cwd=elsewhere, timeout_s=300)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]
    assert "finished" in followed.stdout and f"job {name}: done" in followed.stdout
    status = json.loads(_orchestrator(["status", name, "--json"], cwd=elsewhere).stdout)
    assert (
        status["jobs"][0]["phase"] == "done"
        and status["jobs"][0]["step"] == f"{DETACHED_STEPS}/{DETACHED_STEPS}"
    )
    until(
        "end of its process", lambda: not os.path.exists(f"/proc/{holder}"), timeout_s=30
    )  # its process ended
    log = (folder / "output.log").read_text()
    assert f"job detached: done after {DETACHED_STEPS} steps" in log and "\033[" not in log


def _orchestrator(args: list[str], *, cwd: Path, timeout_s: float = 60.0):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _job_actors(dashboard: str, job: str) -> list[str] | None:
    """The job's live actors' names, from the dashboard's state API (what ray list actors
    reads), once its workers are up."""
    try:
        with urllib.request.urlopen(f"{dashboard}/api/v0/actors?limit=1000", timeout=10) as answer:
            listed = json.load(answer)["data"]["result"]["result"]
    except (OSError, ValueError, KeyError):
        return None
    names = [a["name"] for a in listed if a["state"] == "ALIVE" and a.get("name")]
    return names if any(":stage0-" in n for n in names) else None


def _metric(url: str, job: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    lines = [line for line in text.splitlines() if "geo_orchestrator_samples_per_s" in line]
    return "\n".join(lines) if any(f'job="{job}"' in line for line in lines) else None
