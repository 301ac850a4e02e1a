"""``emulate``: a machine that cannot boot namespace VMs gets one line and exit 2; a command that
needs a provider or a job says which; with nothing standing, ``list`` and ``down`` say so."""

from __future__ import annotations

import pytest

from orchestrator.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GEO_ORCHESTRATOR_HOME", str(tmp_path))  # its emulated/ folder: empty
    return tmp_path


def test_up_without_namespace_support_is_one_line(home, monkeypatch, capsys):
    from provisioners.local import vms

    monkeypatch.setattr(vms, "unsupported_reason", lambda: "not running as root")
    assert main(["emulate", "up", "aws"]) == 2
    err = capsys.readouterr().err
    assert "not running as root" in err and "run as root" in err and "Traceback" not in err


def test_a_provider_and_a_job_are_asked_for(home, capsys):
    assert main(["emulate", "up"]) == 2
    assert "needs a provider" in capsys.readouterr().err
    assert main(["emulate", "kill-controller", "aws"]) == 2
    assert "--job" in capsys.readouterr().err


def test_with_nothing_standing_list_and_down_say_so(home, capsys):
    assert main(["emulate", "list"]) == 0
    assert "no emulated cloud stands" in capsys.readouterr().out
    assert main(["emulate", "down", "gcp"]) == 0
    assert "no emulated gcp stands" in capsys.readouterr().out
    assert main(["emulate", "kill-controller", "azure", "--job", "j"]) == 2
    assert "no emulated azure stands" in capsys.readouterr().err


def test_a_cloud_another_home_stands_is_not_swept_by_a_second_one(home, monkeypatch, capsys):
    """One emulated internet per provider and machine: a second home's ``up`` refuses (its
    start would sweep the namespaces the first one's VMs and API run in)."""
    from provisioners.local import netns, reaper, vms

    monkeypatch.setattr(vms, "unsupported_reason", lambda: None)
    taken = ["geo+emulated-aws+inet", "geo+emulated-aws+aws-api"]
    monkeypatch.setattr(netns, "namespaces", lambda: ["geo+other-job+inet", *taken])
    monkeypatch.setattr(reaper, "namespace_pids", lambda name: {4242} if name in taken else set())
    assert main(["emulate", "up", "aws"]) == 2
    err = capsys.readouterr().err
    assert "another home already runs" in err and "emulate down aws" in err
    assert not (home / "emulated" / "aws").exists()  # nothing started
