"""The wheel the local cloud's VMs install is built once per state of the checkout and kept in the
user's cache: a second job copies it, a changed source file builds it again, and two versions are
never left side by side."""

from __future__ import annotations

import subprocess
import time

import pytest

from provisioners.local import vms


@pytest.fixture
def builds(tmp_path, monkeypatch) -> list[list[str]]:
    """pip's wheel builds, each faked by writing a wheel named for the count so far; returns the
    command lines."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(vms, "_newest_source_ns", lambda: time.time_ns() - 10**9)
    seen: list[list[str]] = []

    def fake_run(command, **kwargs):
        seen.append(command)
        out = command[command.index("-w") + 1]
        (tmp_path / out / f"geo_orchestrator-0.{len(seen)}-py3-none-any.whl").write_bytes(b"PK")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(vms.subprocess, "run", fake_run)
    return seen


def test_a_second_job_copies_the_cached_wheel_and_a_changed_source_builds_again(
    tmp_path, builds, monkeypatch
):
    first = vms.build_wheel(tmp_path / "job-a" / "wheel")
    second = vms.build_wheel(tmp_path / "job-b" / "wheel")
    assert len(builds) == 1 and first.name == second.name == "geo_orchestrator-0.1-py3-none-any.whl"
    assert second.parent == tmp_path / "job-b" / "wheel" and second.read_bytes() == b"PK"
    cache = vms.wheel_cache()
    assert cache.is_relative_to(tmp_path / "cache") and (cache.stat().st_mode & 0o077) == 0
    assert [p.name for p in cache.iterdir()] == [first.name]  # no build folder left behind

    # a source file changed after the wheel was built: the next job builds, the old one goes
    monkeypatch.setattr(vms, "_newest_source_ns", lambda: time.time_ns() + 10**9)
    third = vms.build_wheel(tmp_path / "job-c" / "wheel")
    assert len(builds) == 2 and third.name == "geo_orchestrator-0.2-py3-none-any.whl"
    assert [p.name for p in cache.iterdir()] == [third.name]


def test_a_failed_build_says_so_and_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(
        vms.subprocess,
        "run",
        lambda command, **kwargs: subprocess.CompletedProcess(command, 1, "", "no setuptools"),
    )
    with pytest.raises(RuntimeError, match="building the nodes' wheel failed: no setuptools"):
        vms.build_wheel(tmp_path / "job" / "wheel")
    assert list(vms.wheel_cache().iterdir()) == []
