"""The node bootstrap's rendering and its provider wrappings (provisioners/bootstrap/script.py)."""

from __future__ import annotations

import base64
import dataclasses
import subprocess

import pytest

from provisioners.bootstrap import script
from provisioners.bootstrap.script import Install, NodeBoot


def _boot(**changes) -> NodeBoot:
    values = dict(
        job="job-1",
        node="gang-0",
        install=Install(
            mode="pip",
            wheel="https://example.invalid/geo_orchestrator-0.1.0-py3-none-any.whl",
            package_version="0.1.0",
            ray_version="2.60.0",
            torch_version="2.13.0",
        ),
        join_token="gj1.secret-token",
        ray_address="100.64.0.1:6379",
        node_dir="/var/lib/geo",
        labels={"geo-zone": "us-east-1a", "geo-gpu": "A100"},
        resources={"gpu:A100": 8.0, "infra:aws/us-east-1/us-east-1a": 8.0},
        num_cpus=96,
        num_gpus=8,
        object_store_bytes=10**9,
        grace_s=300.0,
    )
    values.update(changes)
    return NodeBoot(**values)


def _header_values(text: str, names: list[str]) -> list[str]:
    """Run the script's header (not its body) in bash and echo the named variables."""
    assert "# ---- the body" in text, "the header's end is marked (else the whole script runs)"
    header = text.split("# ---- the body")[0]
    shown = "".join(f'printf "%s\\0" "${name}";' for name in names)
    done = subprocess.run(["bash", "-c", header + shown], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


def test_the_script_is_valid_bash_and_values_stay_data():
    hostile = "x'; touch /tmp/owned; echo '$(id)`id`"
    text = script.render(_boot(node_dir=hostile, job="job-1"))
    assert text.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=text.encode(), check=True)
    assert _header_values(text, ["NODE_DIR", "RAY_ADDRESS", "LABELS", "RESOURCES_JSON"]) == [
        hostile,
        "100.64.0.1:6379",
        "geo-gpu=A100,geo-zone=us-east-1a",
        '{"gpu:A100": 8.0, "infra:aws/us-east-1/us-east-1a": 8.0}',
    ]


def test_it_pins_the_controllers_versions_and_never_latest():
    text = script.render(_boot())
    assert _header_values(text, ["RAY_VERSION", "TORCH_VERSION", "PACKAGE_VERSION"]) == [
        "2.60.0",
        "2.13.0",
        "0.1.0",
    ]
    assert '"ray[default]==$RAY_VERSION"' in text and '"torch==$TORCH_VERSION"' in text


def test_the_firewall_lets_only_wireguard_in_on_the_public_interface():
    text = script.render(_boot(public_iface="ens5", wg_port=51999))
    [rules] = _header_values(text, ["FIREWALL_RULES"])
    assert 'iifname "ens5" udp dport 51999 accept' in rules
    assert rules.rstrip().splitlines()[-3].strip() == 'iifname "ens5" drop'  # the last rule


def test_the_token_is_not_in_the_boot_description():
    assert "secret-token" not in repr(_boot())


@pytest.mark.parametrize("label", [{"bad key": "x"}, {"k": "a,b"}, {"k": "a=b"}, {"": "x"}])
def test_labels_that_would_break_ray_start_are_refused(label):
    with pytest.raises(ValueError, match="label"):
        script.render(_boot(labels=label))


def test_each_provider_gets_the_same_script_in_its_own_field():
    text = script.render(_boot())
    assert script.aws_user_data(text) == text
    assert script.gcp_metadata(text) == {"items": [{"key": "startup-script", "value": text}]}
    assert base64.b64decode(script.azure_custom_data(text)).decode() == text
    run = script.skypilot_run([text, text])
    assert subprocess.run(["bash", "-n", "-c", run], check=False).returncode == 0


def test_each_skypilot_rank_runs_its_own_script(tmp_path):
    out = tmp_path / "ran"
    run = script.skypilot_run([f"echo zero >{out}", f"echo 'o'\"n\"e >{out}"])
    for rank, expected in (("0", "zero"), ("1", "one")):
        env = {"PATH": "/usr/bin:/bin", "SKYPILOT_NODE_RANK": rank}
        subprocess.run(["bash", "-c", run], env=env, check=True)
        assert out.read_text().strip() == expected
    env = {"PATH": "/usr/bin:/bin", "SKYPILOT_NODE_RANK": "2"}
    assert subprocess.run(["bash", "-c", run], env=env, check=False).returncode == 1


def test_a_script_over_a_providers_limit_is_refused_with_the_limit_named():
    big = script.render(_boot(labels={f"k{i}": "v" * 200 for i in range(100)}))
    with pytest.raises(script.ScriptTooLarge, match="16384"):
        script.aws_user_data(big)
    assert script.gcp_metadata(big)  # 256 KiB is room enough


def test_a_controller_vm_installs_then_runs_the_controller_and_powers_off():
    boot = script.ControllerBoot(
        job="job-1",
        install=_boot().install,
        args=("--bucket", "s3://geo-orchestrator-1-us-east-1/jobs/job-1", "--region", "us-east-1"),
    )
    text = script.render_controller(boot)
    subprocess.run(["bash", "-n"], input=text.encode(), check=True)
    assert _header_values(text, ["CONTROLLER_ARGS", "JOBS_DIR", "SHUTDOWN_COMMAND"]) == [
        "--bucket s3://geo-orchestrator-1-us-east-1/jobs/job-1 --region us-east-1",
        "/var/lib/geo-orchestrator/jobs",
        "shutdown -h now",
    ]
    body = text.split("step=controller")[1]
    # SIGTERM (the VM's shutdown) is handed to the program; the VM powers off after it
    assert 'kill -TERM "$program"' in body and body.index("wait") < body.index("SHUTDOWN_COMMAND")
    with pytest.raises(ValueError, match="no blanks"):
        script.render_controller(dataclasses.replace(boot, args=("--bucket", "a b")))
