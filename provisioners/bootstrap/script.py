"""Render a node's bootstrap script, and wrap it the way each provider delivers boot scripts.

The script is one file for every provider: a header of shell assignments (each value quoted here,
so a value can never become code) followed by the body ``node.sh``, the same everywhere. What
differs between providers is data in ``NodeBoot`` (how to install, which interface is public,
where preemption notices come from, how the node shuts itself down) and the wrapping:

- AWS: ``UserData`` of ``run_instances`` (cloud-init runs a script that starts with ``#!``);
  at most 16 KiB before base64 (boto3 encodes it);
- GCP: the ``startup-script`` metadata item (256 KiB);
- Azure: ``customData``, base64 (87380 characters: 64 KiB decoded);
- SkyPilot: a task's ``run``, which gives node ``$SKYPILOT_NODE_RANK`` its own script.
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal, TypeVar

from provisioners.base import CloudCallError

T = TypeVar("T")

TAIL_LINES = 20  # log lines a failed bootstrap shows
AWS_USER_DATA_MAX_BYTES = 16 * 1024
GCP_METADATA_MAX_BYTES = 256 * 1024
AZURE_CUSTOM_DATA_MAX_BYTES = 87380  # characters of base64 (ARM's rule: 64 KiB decoded)
# the shutdown a real VM runs (each adapter launches with "delete/terminate on shutdown")
VM_SHUTDOWN = "shutdown -h now"
CLOUD_LOG_FILE = "/var/log/geo-orchestrator-bootstrap.log"


def firewall_rules(public_iface: str, wg_port: int) -> str:
    """nftables rules for a node's public interface: WireGuard in, replies to what the node
    opened, nothing else (Ray's GCS and raylets listen on every address)."""
    return f"""table inet geo_orchestrator {{
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "{public_iface}" udp dport {wg_port} accept
    iifname "{public_iface}" ct state established,related accept
    iifname "{public_iface}" drop
  }}
}}
"""


class ScriptTooLarge(ValueError):
    """A rendered script exceeds what the provider's boot-script field takes."""


@dataclass(frozen=True, kw_only=True)
class Install:
    """How the node gets the controller's code and versions (never "latest")."""

    mode: Literal["local", "pip"]
    wheel: str  # a path on the node (local) or a URL pip can fetch (pip)
    package_version: str
    ray_version: str
    torch_version: str
    python: str = "python3"  # the interpreter that makes the node's venv
    controller_site: tuple[str, ...] = ()  # local: the controller's site-packages, shared
    torch_index_url: str = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True, kw_only=True)
class NodeBoot:
    """Everything one node's script needs; ``join_token`` is a one-use secret (repr hides it)."""

    job: str
    node: str
    install: Install
    join_token: str = field(repr=False)
    ray_address: str  # the head's GCS, on the controller's overlay address
    node_dir: str  # the node's own folder (its venv, keys, log)
    labels: dict[str, str]
    resources: dict[str, float]
    num_cpus: int
    num_gpus: int
    object_store_bytes: int
    grace_s: float  # the dead-man switch: shut down when the controller is gone this long
    public_iface: str = "eth0"  # "": the interface of the VM's default route, found at boot
    wg_port: int = 51820
    notice_source: Literal["none", "aws", "gcp", "azure"] = "none"
    shutdown_command: str = VM_SHUTDOWN
    log_file: str = CLOUD_LOG_FILE
    console: str = ""  # a second copy of the log (a VM's serial console), if any
    ray_env: dict[str, str] = field(default_factory=dict)
    join_timeout_s: float = 60.0
    # Ray's session files and sockets (short: a Unix socket path holds at most 107 bytes). A VM's
    # own /tmp/ray by default; nodes that share a filesystem (emulated VMs) need one each, or two
    # starting at once clash over the same session folder
    ray_temp_dir: str = "/tmp/ray"


@dataclass(frozen=True, kw_only=True)
class ControllerBoot:
    """A job's controller VM: install as a node does, then run the controller program with
    ``args`` (no secret among them: the program reads the job from its bucket with the VM's own
    identity) and power off when it ends."""

    job: str
    install: Install
    args: tuple[str, ...]  # ``python -m orchestrator.driver.controller`` ARGS
    vm_dir: str = "/var/lib/geo-orchestrator"  # the VM's own folder: venv, log, jobs
    env: dict[str, str] = field(default_factory=dict)  # e.g. an emulated API's endpoint
    shutdown_command: str = VM_SHUTDOWN
    log_file: str = CLOUD_LOG_FILE
    console: str = ""


def body(part: str = "node") -> str:
    """``common.sh`` (log, packages, install) followed by the ``part``'s own steps."""
    files = resources.files("provisioners.bootstrap")
    return files.joinpath("common.sh").read_text() + files.joinpath(f"{part}.sh").read_text()


def _install_values(install: Install) -> dict[str, str]:
    return {
        "INSTALL_MODE": install.mode,
        "PYTHON": install.python,
        "CONTROLLER_SITE": ":".join(install.controller_site),
        "PACKAGE_WHEEL": install.wheel,
        "PACKAGE_VERSION": install.package_version,
        "RAY_VERSION": install.ray_version,
        "TORCH_VERSION": install.torch_version,
        "TORCH_INDEX_URL": install.torch_index_url,
    }


def _plain(kind: str, pairs: dict[str, str]) -> None:
    """Values the script word-splits: no blanks, commas, quotes or '='."""
    for name, text in pairs.items():
        if not name or any(c in f"{name}{text}" for c in " \t\n,=\"'\\"):
            raise ValueError(f"{kind} {name}={text!r}: no blanks, commas, quotes or '='")


def _script(title: str, values: dict[str, str], part: str) -> str:
    header = "\n".join(f"{name}={shlex.quote(value)}" for name, value in values.items())
    return f"#!/bin/bash\n# geo-orchestrator {title}\n{header}\n{body(part)}"


def render_controller(boot: ControllerBoot) -> str:
    """The controller VM's whole script."""
    _plain("environment variable", boot.env)
    _plain("argument", {f"args[{i}]": a for i, a in enumerate(boot.args)})
    values = {
        "JOB": boot.job,
        "NODE": "controller",
        "NODE_DIR": boot.vm_dir,
        "VENV": f"{boot.vm_dir}/venv",
        "JOBS_DIR": f"{boot.vm_dir}/jobs",
        "LOG_FILE": boot.log_file,
        "CONSOLE": boot.console,
        "TAIL_LINES": str(TAIL_LINES),
        **_install_values(boot.install),
        "SHUTDOWN_COMMAND": boot.shutdown_command,
        "CONTROLLER_ARGS": " ".join(boot.args),
        "CONTROLLER_ENV": " ".join(f"{k}={v}" for k, v in sorted(boot.env.items())),
    }
    return _script(f"controller bootstrap: job {boot.job}", values, "controller")


def render(boot: NodeBoot) -> str:
    """The whole script: ``#!/bin/bash``, the header, the body."""
    _plain("label", boot.labels)
    _plain("environment variable", boot.ray_env)
    values = {
        "JOB": boot.job,
        "NODE": boot.node,
        "NODE_DIR": boot.node_dir,
        "VENV": f"{boot.node_dir}/venv",
        "LOG_FILE": boot.log_file,
        "CONSOLE": boot.console,
        "TAIL_LINES": str(TAIL_LINES),
        **_install_values(boot.install),
        "PUBLIC_IFACE": boot.public_iface,
        "WG_PORT": str(boot.wg_port),
        "FIREWALL_RULES": firewall_rules(boot.public_iface or "@PUBLIC_IFACE@", boot.wg_port),
        "JOIN_TOKEN": boot.join_token,
        "JOIN_TIMEOUT_S": f"{boot.join_timeout_s:g}",
        "RAY_ADDRESS": boot.ray_address,
        "NUM_CPUS": str(boot.num_cpus),
        "NUM_GPUS": str(boot.num_gpus),
        "RESOURCES_JSON": json.dumps(boot.resources, sort_keys=True),
        "LABELS": ",".join(f"{k}={v}" for k, v in sorted(boot.labels.items())),
        "OBJECT_STORE_BYTES": str(boot.object_store_bytes),
        "RAY_TEMP_DIR": boot.ray_temp_dir,
        "GRACE_S": f"{boot.grace_s:g}",
        "NOTICE_SOURCE": boot.notice_source,
        "SHUTDOWN_COMMAND": boot.shutdown_command,
        "RAY_ENV": " ".join(f"{k}={v}" for k, v in sorted(boot.ray_env.items())),
    }
    return _script(f"node bootstrap: job {boot.job}, node {boot.node}", values, "node")


def aws_user_data(script: str) -> str:
    """``UserData`` for ``run_instances`` (boto3 base64-encodes it)."""
    _fits(script.encode(), AWS_USER_DATA_MAX_BYTES, "AWS user-data")
    return script


def gcp_metadata(script: str) -> dict:
    """The instance's ``metadata`` with the ``startup-script`` item."""
    _fits(script.encode(), GCP_METADATA_MAX_BYTES, "GCP startup-script")
    return {"items": [{"key": "startup-script", "value": script}]}


def azure_custom_data(script: str) -> str:
    """``os_profile.custom_data``: the script in base64 (cloud-init runs it)."""
    encoded = base64.b64encode(script.encode()).decode("ascii")
    _fits(encoded.encode(), AZURE_CUSTOM_DATA_MAX_BYTES, "Azure customData")
    return encoded


def skypilot_run(scripts: Sequence[str]) -> str:
    """A SkyPilot task's ``run`` for a gang: node ``$SKYPILOT_NODE_RANK`` runs script number
    rank (its own join token), which installs, joins and then stays in the foreground as the
    node's watcher, as SkyPilot expects of ``run``; the task's ``setup`` is empty."""
    cases = "\n".join(
        f"  {rank}) exec bash -c {shlex.quote(text)} ;;" for rank, text in enumerate(scripts)
    )
    return (
        f'case "${{SKYPILOT_NODE_RANK:-0}}" in\n{cases}\n'
        '  *) echo "no boot script for node rank $SKYPILOT_NODE_RANK" >&2; exit 1 ;;\nesac\n'
    )


def boot_data(encode: Callable[[str], T], script: str, *, cloud: str, call: str) -> T:
    """``encode(script)`` (one of the wrappers above); a script too long for the cloud's field is
    the contract's ``CloudCallError``, raised before anything is launched."""
    try:
        return encode(script)
    except ScriptTooLarge as error:
        raise CloudCallError(
            str(error),
            cloud=cloud,
            call=call,
            fix="launch fewer nodes per gang, or shorten the labels and environment the boot "
            "script carries",
        ) from None


def _fits(data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise ScriptTooLarge(f"{what} is {len(data)} bytes, the limit is {limit}")
