"""The local cloud with namespace VMs (provisioners/local/vms.py): nodes boot by the node bootstrap
and join over WireGuard; a job trains, takes a preemption and recovers with the losses of a run
without faults while a capture on the simulated internet sees only WireGuard; a VM without a token
reaches no node; a broken wheel fails the boot with its log; a node without its controller shuts
itself down; nothing of the job is left after. Needs root, iproute2, nftables, wireguard-go,
wireguard-tools and tcpdump (``.ci/run`` installs them); skipped elsewhere with the reason."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioners.local import netns, vms
from provisioners.local.cluster import NodeSpec
from provisioners.overlay import wg
from provisioners.overlay.service import WG_PORT, admin_call

REASON = vms.unsupported_reason() or (None if shutil.which("tcpdump") else "tcpdump missing")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=f"namespace VMs: {REASON}"),
]
JOB = "netns-vm-test"
GRACE_S = 4.0


def _left(job: str) -> dict[str, list[str]]:
    """What ``job`` left on this machine: namespaces, wireguard-go sockets, host interfaces."""
    host_links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    sockets = Path("/var/run/wireguard")
    return {
        "namespaces": [n for n in netns.namespaces() if n.startswith(netns.prefix(job))],
        "sockets": [p.name for p in sockets.glob("gw*.sock")] if sockets.exists() else [],
        "host links": [line for line in host_links.splitlines() if "gw" in line.split(":")[1]],
    }


RECIPE = """\
name: netns-job
provider: local
model: {name: gpt-tiny, profile: analytic}
training:
  {global_batch_size: 8, microbatch_sizes: [2, 4], steps: 24, precision: fp32, seed: 0,
   optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01, grad_clip_norm: null}}
objective: {goal: max_throughput}
constraints:
  {locations: [local/sim-us/sim-us-a, local/sim-eu/sim-eu-a], gpu_types: [T4], max_gpus: 2,
   min_locations: 2, pricing: spot}
checkpointing: {every_steps: 5, path: CHECKPOINTS, keep_last: 2}
runtime: {allreduce: hierarchical, link_emulation: false}
local_cloud: {preempt_at_steps: [8], notice_s: 2.0}
"""


def test_a_job_trains_and_recovers_on_namespace_vms_seen_only_as_wireguard(tmp_path, capsys):
    """The controller and every node a namespace VM; one preemption; the losses of a run without
    faults; a capture on the simulated internet from the first step to the end holds nothing but
    WireGuard's UDP (and ARP); nothing of the job left after."""
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.job import RunOptions, run_job
    from tests.integration.jobs import assert_fault_free_losses

    recipe = tmp_path / "netns-job.yaml"
    recipe.write_text(RECIPE.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    capture, dump = tmp_path / "bridge.pcap", []

    def first_step(state, result) -> None:
        if not dump:  # the internet exists from the job's start: listen from its first step on
            inet = f"{netns.prefix('netns-job')}inet"
            dump.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", inet, "tcpdump", "-i", netns.BRIDGE, "-U", "-w"]
                    + [str(capture), "ip"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    options = RunOptions(jobs_dir=tmp_path / "jobs", on_step=first_step, vms="namespaces")
    try:
        result = run_job(recipe, default_catalog(), options)
    finally:
        for process in dump:
            process.kill()
            process.wait(timeout=10)
    assert "each VM is a network namespace" in capsys.readouterr().err
    assert _left("netns-job") == {"namespaces": [], "sockets": [], "host links": []}
    state = json.loads((result.folder / "state.json").read_text())["state"]
    assert state["phase"] == "done" and state["recoveries"] == 1
    events = [json.loads(line) for line in (result.folder / "events.jsonl").open()]
    (notice,) = [e for e in events if e["event"] == "preemption_notice"]
    assert_fault_free_losses(state, RECIPE, tmp_path, first_fault=notice["details"]["step"])

    packets = subprocess.run(
        ["tcpdump", "-nn", "-r", str(capture)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(packets) > 100, packets
    wireguard = [p for p in packets if f".{WG_PORT} >" in p and f".{WG_PORT}: UDP" in p]
    # a VM whose WireGuard was just killed answers the packets still coming with ICMP errors
    # (they quote the head of an encrypted packet)
    dying = [p for p in packets if f"ICMP {p.split()[2]} udp port {WG_PORT} unreachable" in p]
    other = set(packets) - set(wireguard) - set(dying)
    assert not other, sorted(other)[:5]
    assert len(dying) < len(packets) / 10
    raw = capture.read_bytes()
    # what the job's traffic would carry in clear: Ray's labels and RPC names, the job's name, and
    # torch's process-group store keys (its workers' rendezvous). Each 7 bytes or more: random
    # ciphertext holds a given 4-byte string once in ~4 GB, and a capture is ~12 MB (b"gloo"
    # matched encrypted bytes once, a ~0.3% chance a run)
    for clear in (b"geo-gang", b"ray.rpc", b"netns-job", b"default_pg"):
        assert clear not in raw, clear


def _spec(name: str, zone: str = "sim-us-a") -> NodeSpec:
    return NodeSpec(
        name=name, cloud="local", region="sim-us", zone=zone, gpu="T4", gpus=1, vcpus=1, gang=name
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vms")
    made = vms.NamespaceCluster(job=JOB, folder=folder, grace_s=GRACE_S)
    try:
        assert made.address  # starts the controller VM and the head
        yield made
    finally:
        made.shutdown()
    assert _left(JOB) == {"namespaces": [], "sockets": [], "host links": []}


def test_a_broken_wheel_fails_the_boot_with_its_log_and_leaves_no_vm(cluster, tmp_path):
    good = cluster.install
    broken = tmp_path / Path(good.wheel).name
    broken.write_bytes(b"not a zip archive")
    cluster.install = dataclasses.replace(good, wheel=str(broken))
    try:
        with pytest.raises(vms.BootstrapFailed) as raised:
            cluster.add(_spec("broken"), timeout_s=60)
    finally:
        cluster.install = good
    message = str(raised.value)
    assert "GEO-BOOTSTRAP-FAILED node=broken step=install" in message
    assert broken.name in message  # pip's complaint about the file, from the log's last lines
    assert not [n for n in netns.namespaces() if n.endswith("+broken")]
    nodes = admin_call(cluster.admin_socket, {"op": "nodes"})
    assert "broken" not in {n["node"] for n in nodes["nodes"]}


def test_a_vm_without_a_token_reaches_no_node(cluster):
    worker = cluster.add(_spec("worker"), timeout_s=90)
    internet = cluster.internet
    rogue = internet.add_vm("rogue")
    try:
        controller, node = internet.vms["controller"], internet.vms["worker"]
        gcs_port = int(cluster.address.rsplit(":", 1)[1])
        raylet_port = _node_manager_port(cluster.address, worker)
        targets = [
            (controller.public_ip, gcs_port),
            (node.public_ip, raylet_port),
            ("100.64.0.1", gcs_port),  # the overlay: no route from outside it
            ("100.64.0.2", raylet_port),
        ]
        assert _connects(rogue, targets) == [False] * 4
        # the same ports answer inside the overlay: what the rogue missed is really there
        assert _connects(node, [("100.64.0.1", gcs_port)]) == [True]
    finally:
        internet.kill_vm("rogue")


def test_a_node_without_its_controller_shuts_itself_down(cluster):
    assert [n for n in cluster.alive() if cluster.vm_of(n) == "worker"]
    log = cluster.folder / "worker" / "bootstrap.log"
    # the controller leaves the overlay (its interface gone): to the node it has vanished
    controller = cluster.internet.vms["controller"]
    interface = wg.interface_name(JOB, "controller")
    subprocess.run(["ip", "-n", controller.netns, "link", "del", interface], check=True)
    gone_by = time.monotonic() + GRACE_S + 20
    while any(n.endswith("+worker") for n in netns.namespaces()):
        assert time.monotonic() < gone_by, log.read_text()[-2000:]
        time.sleep(0.2)  # polling: the VM is not our child to wait on
    said = [line for line in log.read_text().splitlines() if "GEO-NODE-SHUTDOWN" in line]
    assert len(said) == 1 and "controller unreachable for" in said[0], said
    assert f"(grace {GRACE_S:g} s)" in said[0]


def _node_manager_port(address: str, node_id: str) -> int:
    import ray._raylet

    client = ray._raylet.GcsClient(address=address)
    for found, info in client.get_all_node_info(timeout=10).items():
        if found.hex() == node_id:
            return info.node_manager_port
    raise AssertionError(f"{node_id} not in the GCS")


def _connects(vm, targets: list[tuple[str, int]]) -> list[bool]:
    """Whether a TCP connection from ``vm`` to each target succeeds (2 s each)."""
    code = (
        "import json,socket,sys\n"
        "out=[]\n"
        f"for ip,port in {targets!r}:\n"
        "    try:\n"
        "        socket.create_connection((ip,port),timeout=2).close(); out.append(True)\n"
        "    except OSError:\n"
        "        out.append(False)\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        ["ip", "netns", "exec", vm.netns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)
