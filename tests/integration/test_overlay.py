"""The overlay between namespace VMs: nodes join a controller with join tokens under keys they made
themselves, reach each other over WireGuard, and a capture on the simulated internet sees nothing
but WireGuard's UDP; an expired token, or none, reaches nothing. Needs root and wireguard-tools
(``.ci/run`` installs them); skipped elsewhere with the reason."""

from __future__ import annotations

import dataclasses
import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioners.local import netns
from provisioners.overlay.service import INFO_FILE, SERVICE_PORT, WG_PORT, admin_call
from provisioners.overlay.token import decode

REPO = Path(__file__).resolve().parents[2]
JOB = "overlay-test"
pytestmark = pytest.mark.skipif(
    netns.unsupported_reason() is not None
    or subprocess.run(["which", "tcpdump"], capture_output=True, check=False).returncode != 0,
    reason=f"namespace VMs: {netns.unsupported_reason() or 'tcpdump missing'}",
)


def _python(internet, vm, code_or_args, *, log, wait=True, timeout_s=60):
    argv = [sys.executable, *code_or_args]
    process = internet.popen(
        vm,
        argv,
        log_file=log,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    if wait:
        assert process.wait(timeout=timeout_s) == 0, log.read_text()[-2000:]
    return process


def _start_daemon(vm, args: list[str], *, log: Path, timeout_s: float = 30.0):
    """Start ``python args`` in ``vm``; return the process and the first line it prints, which
    it prints when ready (its stderr goes to ``log``)."""
    with open(log, "ab") as err:
        process = subprocess.Popen(
            ["ip", "netns", "exec", vm.netns, sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            start_new_session=True,
        )
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    line = process.stdout.readline() if ready else b""
    assert line, f"{args[:2]} not ready in {timeout_s} s: {log.read_text()[-2000:]}"
    return process, line.decode()


@pytest.fixture
def internet(tmp_path):
    world = netns.Internet(JOB)
    world.create()
    yield world
    world.close()
    assert not [n for n in netns.namespaces() if n.startswith(f"geo+{JOB}+")]


def _join(internet, vm, token: str, folder: Path, *, expect_ok=True):
    token_file = folder / f"{vm.name}.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    args = [
        "-m",
        "provisioners.overlay.node",
        "join",
        "--token-file",
        str(token_file),
        "--state-dir",
        str(folder / vm.name),
        "--timeout-s",
        "8",
    ]
    process = _python(internet, vm, args, log=folder / f"{vm.name}.log", wait=False)
    code = process.wait(timeout=30)
    assert (code == 0) == expect_ok, (folder / f"{vm.name}.log").read_text()[-2000:]


def _tcp_echo(internet, server, client, ip: str, folder: Path) -> bytes:
    code = (
        "import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
        f"s.bind(('{ip}',7000));s.listen();print('listening',flush=True);"
        "c,_=s.accept();c.sendall(c.recv(100).upper())"
    )
    server_process, _ = _start_daemon(server, ["-c", code], log=folder / "echo.log")
    out = folder / "reply"
    client_code = (
        f"import socket;s=socket.create_connection(('{ip}',7000),timeout=10);"
        f"s.sendall(b'secret payload');open('{out}','wb').write(s.recv(100))"
    )
    _python(internet, client, ["-c", client_code], log=folder / "client.log")
    server_process.wait(timeout=10)
    return out.read_bytes()


@pytest.mark.integration
def test_nodes_join_with_tokens_and_talk_only_through_wireguard(internet, tmp_path):
    controller, a, b, intruder = (internet.add_vm(n) for n in ("ctl", "a", "b", "x"))
    state = tmp_path / "ctl"
    args = ["-m", "provisioners.overlay.service", "--job", JOB, "--public-ip"]
    args += [controller.public_ip, "--interface", "gwtestctl", "--state-dir", str(state)]
    service, ready = _start_daemon(controller, args, log=tmp_path / "ctl.log")
    dump = None
    try:
        info = json.loads(ready)
        assert info == json.loads((state / INFO_FILE).read_text())
        assert (state / "admin.sock").stat().st_mode & 0o077 == 0  # the owner only
        capture = tmp_path / "bridge.pcap"
        dump = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                internet.netns,
                "tcpdump",
                "-i",
                netns.BRIDGE,
                "-w",
                str(capture),
                "-U",
                "ip",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        socket = Path(info["admin_socket"])
        for vm in (a, b):
            _join(
                internet, vm, admin_call(socket, {"op": "mint", "node": vm.name})["token"], tmp_path
            )
        # an expired token: its ephemeral peer is gone, the handshake never completes
        stale = admin_call(socket, {"op": "mint", "node": "x", "ttl_s": 0.5})["token"]
        deadline = time.monotonic() + 5
        while [n for n in admin_call(socket, {"op": "nodes"})["nodes"] if n["node"] == "x"]:
            assert time.monotonic() < deadline, "the expired token's peer was not removed"
            time.sleep(0.1)  # the controller sweeps expiries once a second
        # its holder moves the expiry on (the token is not signed): the controller still refuses,
        # since it removed the ephemeral key's peer; no handshake, no answer
        forged = dataclasses.replace(decode(stale), expires_at_s=time.time() + 600).encode()
        _join(internet, intruder, forged, tmp_path, expect_ok=False)
        assert "no answer from the controller" in (tmp_path / "x.log").read_text()
        nodes = {n["node"]: n for n in admin_call(socket, {"op": "nodes"})["nodes"]}
        assert sorted(nodes) == ["a", "b"] and all(n["joined"] for n in nodes.values())
        # b learns a from the controller's list (a joined first, so a must sync to learn b)
        sync = (
            "from pathlib import Path;from provisioners.overlay import node,wg;"
            f"j=node.load(Path('{tmp_path}/a'));"
            "node.apply_peers(wg.Interface(j.interface),node.peers(j),keep=set())"
        )
        _python(internet, a, ["-c", sync], log=tmp_path / "sync.log")
        assert _tcp_echo(internet, a, b, nodes["a"]["ip"], tmp_path) == b"SECRET PAYLOAD"
    finally:
        service.terminate()
        service.wait(timeout=10)
        if dump is not None:
            dump.terminate()
            dump.wait(timeout=10)
    packets = subprocess.run(
        ["tcpdump", "-nn", "-r", str(capture)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert packets, "nothing captured on the bridge"
    kinds = [p for p in packets if f".{WG_PORT}:" not in p and f".{WG_PORT} >" not in p]
    assert not [k for k in kinds if "UDP" in k or "Flags" in k], kinds[:5]  # only ARP besides
    raw = capture.read_bytes()
    assert b"secret payload" not in raw and b"SECRET PAYLOAD" not in raw
    assert str(SERVICE_PORT).encode() not in b"".join(p.encode() for p in packets)
    assert not (tmp_path / "a" / "ephemeral.key").exists()
    assert (tmp_path / "a" / "node.key").stat().st_mode & 0o777 == 0o600
