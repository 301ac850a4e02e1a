"""``submit --emulate`` with the job's controller in a VM of a standing emulated cloud, as a user
drives it from the command line. The controller is an EC2 instance launched through the AWS
adapter from its user-data, acting as its instance profile; the job's folder lives in S3 (moto's,
on the simulated internet), so this test reads the job's state as ``status`` does, from the
bucket. The same on Azure (a VM with a managed identity, the folder in a storage account's
container) with ``GEO_E2E_ALL=1``. The job the job survives a spot reclaim (the node's own watcher gives
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
from pathlib import Path

import pytest

from orchestrator.driver.hosts import BucketReader
from provisioners.local import netns, vms
from tests.integration.jobs import until

REASON = vms.unsupported_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=f"namespace VMs: {REASON}"),
]

JOB = "ctl-vm-job"
RECIPE = f"""\
name: {JOB}
provider: PROVIDER
model: {{name: gpt-tiny, profile: analytic}}
training:
  {{global_batch_size: 8, microbatch_sizes: [2, 4], steps: 400, precision: fp32, seed: 0,
   optimizer: {{name: adamw, lr: 1.0e-3, weight_decay: 0.01, grad_clip_norm: null}}}}
objective: {{goal: max_throughput}}
constraints:
  {{locations: [LOCATION], gpu_types: [T4], max_gpus: 2, min_locations: 2, pricing: spot}}
checkpointing: {{every_steps: 10, path: CHECKPOINTS, keep_last: 2}}
runtime: {{allreduce: hierarchical, link_emulation: false}}
"""
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 240.0  # for each stage of the job, on a loaded machine
# where each provider's job runs, and how its instances are named
WHERE = {"aws": ("aws/us-east-1", "i-"), "azure": ("azure/eastus", JOB)}


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


@pytest.mark.parametrize(
    "provider",
    [
        "aws",
        pytest.param(
            "azure",
            marks=pytest.mark.skipif(
                not os.environ.get("GEO_E2E_ALL"),
                reason="the same on Azure (60-90 s more than the suite's budget holds): "
                "GEO_E2E_ALL=1 runs it",
            ),
        ),
    ],
)
def test_the_job_outlives_its_controller_and_its_submitter(tmp_path, monkeypatch, provider):
    home, other = tmp_path / "home", tmp_path / "elsewhere"
    other.mkdir()
    # this process reads the job's bucket too (``refresh``), with the standing cloud's keys
    monkeypatch.setenv("GEO_ORCHESTRATOR_HOME", str(home))
    env = {**os.environ, "GEO_ORCHESTRATOR_HOME": str(home), "PYTHONPATH": str(ROOT)}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        env.pop(name, None)  # the emulation brings its own keys
    recipe = tmp_path / f"{JOB}.yaml"
    location, instance_prefix = WHERE[provider]
    text = RECIPE.replace("CHECKPOINTS", str(tmp_path / "checkpoints"))
    recipe.write_text(text.replace("PROVIDER", provider).replace("LOCATION", location))
    folder = home / "jobs" / JOB
    refresh = BucketReader(folder)  # as status and logs -f read it (one client for every poll)

    def state() -> dict:
        refresh()  # from the job's bucket
        try:
            return json.loads((folder / "state.json").read_text())["state"]
        except (OSError, ValueError, KeyError):
            return {}

    def events() -> list[dict]:
        refresh()
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
        until(
            "recovery", lambda: any(e["event"] == "recovered" for e in events()), timeout_s=WAIT_S
        )
        chaos = next(e for e in events() if e["event"] == "chaos")
        notice = next(e for e in events() if e["event"] == "preemption_notice")
        assert notice["reason"].startswith(f"node {chaos['details']['node']} ")
        assert chaos["details"]["node"].startswith(instance_prefix)  # an instance of the cloud

        # the controller VM shuts down: the driver checkpoints the step it committed last
        until("step 25", lambda: state().get("step", 0) >= 25, timeout_s=WAIT_S)
        _cli(env, "emulate", "kill-controller", provider, "--job", JOB)
        # (read from the events: the submitter may have relaunched the controller already)
        stops = until(
            "the stop", lambda: [e for e in events() if e["event"] == "stopped"], timeout_s=WAIT_S
        )
        stop = stops[-1]
        assert "its controller VM shuts down" in stop["reason"]
        before = [e for e in events() if e["time_s"] <= stop["time_s"]]
        committed = [e["details"]["step"] for e in before if e["event"] == "checkpointed"][-1]
        assert stop["details"]["step"] == committed  # the step it stopped at is checkpointed
        # the submitter boots a new controller VM, which resumes there: no committed step lost
        resumed = f"from step {committed} "
        until(
            "the resumed start",
            lambda: any(e["event"] == "started" and resumed in e["reason"] for e in events()),
            timeout_s=WAIT_S,
        )

        # the submitter is killed: the job goes on
        submit.send_signal(signal.SIGKILL)
        submit.wait()
        killed_at = state()["step"]
        until(
            "steps after the kill",
            lambda: state().get("step", 0) >= killed_at + 5,
            timeout_s=WAIT_S,
        )
        shown = json.loads(_cli(env, "status", JOB, "--json", cwd=other).stdout)["jobs"][0]
        assert shown["phase"] == "train" and int(shown["step"].split("/")[0]) > committed
        # a machine that never submitted it finds it in the cloud's job buckets
        elsewhere = [
            "--jobs-dir",
            str(tmp_path / "another-machine"),
            "--cloud",
            f"emulated-{provider}",
        ]
        found = _cli(env, "status", JOB, "--json", *elsewhere, cwd=other).stdout
        assert json.loads(found)["jobs"][0]["phase"] == "train"

        # priced at the emulated API's spot price: the catalog's published one for its type
        for request in state()["choice"]["requests"]:
            assert request["usd_per_node_hour"] == pytest.approx(
                _catalog_spot(location, request["instance_type"])
            )

        _cli(env, "stop", JOB, cwd=other)
        until("stopped", lambda: state().get("phase") == "stopped", timeout_s=WAIT_S)

        def left_running() -> list:
            fleet = json.loads(_cli(env, "status", "--all", "--json", cwd=other).stdout)
            assert f"emulated {provider}" not in fleet["clouds_not_asked"]
            return [v for v in fleet["vms"] if v["state"] in ("pending", "running")]

        # the controller powers its VM off once it has pushed its last state
        until("no VM left", lambda: left_running() == [], timeout_s=60.0)
    except AssertionError:
        _show_logs(tmp_path / "submit.err", home / "emulated" / provider / "daemon.log")
        raise
    finally:
        if submit.poll() is None:
            submit.kill()
        _cli(env, "emulate", "down", provider, check=False)
    assert [n for n in netns.namespaces() if f"emulated-{provider}" in n] == []


def _show_logs(*paths: Path, lines: int = 40) -> None:
    """The tails of the submitter's and the standing cloud's logs, for a failure's report."""
    for path in paths:
        text = path.read_text(errors="replace") if path.exists() else "(none)"
        tail = "\n".join(text.splitlines()[-lines:])
        print(f"--- {path.name} (last {lines} lines)\n{tail}", file=sys.stderr)


def _catalog_spot(location: str, instance_type: str) -> float:
    from orchestrator.catalog import default_catalog

    cloud, region = location.split("/")
    return min(
        o.spot_usd_per_hour
        for o in default_catalog().offers.offers
        if o.location.cloud == cloud
        and o.location.region == region
        and o.instance_type == instance_type
        and o.spot_usd_per_hour is not None
    )
