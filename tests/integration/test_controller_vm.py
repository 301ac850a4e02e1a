"""``submit --emulate`` with the job's controller in a VM of a standing emulated cloud, as a user
drives it from the command line. The controller is an EC2 instance launched through the AWS
adapter from its user-data, acting as its instance profile; the job's folder lives in S3 (moto's,
on the simulated internet), so this test reads the job's state as ``status`` does, from the
bucket. The job the job survives a spot reclaim (the node's own watcher gives
the notice), its controller VM's shutdown (the next controller resumes with no committed step
lost) and the submitting process's ``kill -9`` (the job goes on); ``status`` from another folder
shows it, ``stop`` ends it, and ``status --all`` then finds no VM left on the emulated cloud.
Needs root, iproute2, nftables, wireguard-go and moto's server; skipped elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.driver.hosts import refresh
from provisioners.local import netns, vms

REASON = vms.unsupported_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=f"namespace VMs: {REASON}"),
]

JOB = "ctl-vm-job"
RECIPE = f"""\
name: {JOB}
provider: aws
model: {{name: gpt-tiny, profile: analytic}}
training:
  {{global_batch_size: 8, microbatch_sizes: [2, 4], steps: 400, precision: fp32, seed: 0,
   optimizer: {{name: adamw, lr: 1.0e-3, weight_decay: 0.01, grad_clip_norm: null}}}}
objective: {{goal: max_throughput}}
constraints:
  {{locations: [aws/us-east-1], gpu_types: [T4], max_gpus: 2, min_locations: 2, pricing: spot}}
checkpointing: {{every_steps: 10, path: CHECKPOINTS, keep_last: 2}}
runtime: {{allreduce: hierarchical, link_emulation: false}}
"""
ROOT = Path(__file__).resolve().parents[2]


def _cli(env, *args, cwd=ROOT, check=True):
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert not check or done.returncode == 0, done.stderr
    return done


def _until(what, predicate, timeout_s: float = 240.0):
    """``predicate()``'s first truthy value, looked at every half second."""
    pause, deadline = threading.Event(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        pause.wait(0.5)
    raise AssertionError(f"no {what} within {timeout_s:g} s")


def test_the_job_outlives_its_controller_and_its_submitter(tmp_path):
    home, other = tmp_path / "home", tmp_path / "elsewhere"
    other.mkdir()
    env = {**os.environ, "GEO_ORCHESTRATOR_HOME": str(home), "PYTHONPATH": str(ROOT)}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        env.pop(name, None)  # the emulation brings its own keys
    recipe = tmp_path / f"{JOB}.yaml"
    recipe.write_text(RECIPE.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    folder = home / "jobs" / JOB

    def state() -> dict:
        refresh(folder)  # from the job's bucket, as status does
        try:
            return json.loads((folder / "state.json").read_text())["state"]
        except (OSError, ValueError, KeyError):
            return {}

    def events() -> list[dict]:
        refresh(folder)
        path = folder / "events.jsonl"
        return [json.loads(line) for line in path.open()] if path.exists() else []

    submit = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "submit", str(recipe), "--emulate"]
        + ["--preempt-at", "8", "--notice-s", "8"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "submit.err", "w"),
    )
    try:
        # a spot reclaim: the node's watcher hears it from its metadata, the job moves off
        _until("recovery", lambda: any(e["event"] == "recovered" for e in events()))
        chaos = next(e for e in events() if e["event"] == "chaos")
        notice = next(e for e in events() if e["event"] == "preemption_notice")
        assert notice["reason"].startswith(f"node {chaos['details']['node']} ")
        assert chaos["details"]["node"].startswith("i-")  # an EC2 instance of the emulation

        # the controller VM shuts down: the driver checkpoints the step it committed last
        _until("step 25", lambda: state().get("step", 0) >= 25)
        _cli(env, "emulate", "kill-controller", "aws", "--job", JOB)
        left = state()
        assert left["phase"] == "stopped" and left["checkpoint_step"] == left["step"]
        assert "its controller VM shuts down" in events()[-1]["reason"]
        # the submitter boots a new controller VM, which resumes there: no committed step lost
        resumed = f"from step {left['step']} "
        _until(
            "the resumed start",
            lambda: any(e["event"] == "started" and resumed in e["reason"] for e in events()),
        )

        # the submitter is killed: the job goes on
        submit.send_signal(signal.SIGKILL)
        submit.wait()
        killed_at = state()["step"]
        _until("steps after the kill", lambda: state().get("step", 0) >= killed_at + 5)
        shown = json.loads(_cli(env, "status", JOB, "--json", cwd=other).stdout)["jobs"][0]
        assert shown["phase"] == "train" and int(shown["step"].split("/")[0]) > left["step"]
        # a machine that never submitted it finds it in the cloud's job buckets
        elsewhere = ["--jobs-dir", str(tmp_path / "another-machine"), "--cloud", "emulated-aws"]
        found = _cli(env, "status", JOB, "--json", *elsewhere, cwd=other).stdout
        assert json.loads(found)["jobs"][0]["phase"] == "train"

        # priced at the emulated API's spot price: the catalog's published one for its type
        for request in state()["choice"]["requests"]:
            assert request["usd_per_node_hour"] == pytest.approx(
                _catalog_spot("us-east-1", request["instance_type"])
            )

        _cli(env, "stop", JOB, cwd=other)
        _until("stopped", lambda: state().get("phase") == "stopped")

        def left_running() -> list:
            fleet = json.loads(_cli(env, "status", "--all", "--json", cwd=other).stdout)
            assert "emulated aws" not in fleet["clouds_not_asked"]
            return [v for v in fleet["vms"] if v["state"] in ("pending", "running")]

        # the controller powers its VM off once it has pushed its last state
        _until("no VM left", lambda: left_running() == [], timeout_s=60.0)
    finally:
        if submit.poll() is None:
            submit.kill()
        _cli(env, "emulate", "down", "aws", check=False)
    assert [n for n in netns.namespaces() if "emulated-aws" in n] == []


def _catalog_spot(region: str, instance_type: str) -> float:
    from orchestrator.catalog import default_catalog

    return min(
        o.spot_usd_per_hour
        for o in default_catalog().offers.offers
        if o.location.cloud == "aws"
        and o.location.region == region
        and o.instance_type == instance_type
        and o.spot_usd_per_hour is not None
    )
