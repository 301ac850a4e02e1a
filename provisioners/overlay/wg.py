"""One WireGuard interface, driven through ``ip`` and ``wg`` (wireguard-tools).

The kernel module is used where ``ip link add ... type wireguard`` works; elsewhere the
interface is a TUN device served by ``wireguard-go`` (userspace; Debian's ``wireguard-go``). Both
speak the same configuration protocol, so ``wg set``/``wg show`` work on either. ``wireguard-go``
keeps a control socket in ``/var/run/wireguard/<name>.sock`` that is global to the machine, not
to a network namespace: interface names must be unique on the machine (``interface_name``), and
the socket is removed with the interface (a killed ``wireguard-go`` leaves it behind).

Private keys are written to files readable by their owner only and passed to ``wg`` by path; they
never appear on a command line, in an environment variable or in a log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from provisioners.commands import CommandError, run_command

log = logging.getLogger(__name__)

UAPI_DIR = Path("/var/run/wireguard")
MAX_NAME = 15  # Linux interface names


class OverlayError(CommandError):
    """A WireGuard command failed; the message names the command and says what to do."""


@dataclass(frozen=True)
class Peer:
    public_key: str
    allowed_ip: str  # one overlay address: every peer is one node
    endpoint: str | None = None  # "ip:port" where its UDP packets go (None: it calls us)
    keepalive_s: int = 0

    def args(self) -> list[str]:
        out = ["peer", self.public_key, "allowed-ips", f"{self.allowed_ip}/32"]
        if self.endpoint:
            out += ["endpoint", self.endpoint]
        if self.keepalive_s:
            out += ["persistent-keepalive", str(self.keepalive_s)]
        return out


@dataclass(frozen=True)
class PeerStatus:
    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    latest_handshake_s: int  # Unix seconds; 0 = never
    rx_bytes: int
    tx_bytes: int


def interface_name(job: str, node: str) -> str:
    """A machine-unique interface name for a job's node: ``gw`` and 13 hex digits of a hash."""
    digest = hashlib.sha256(f"{job}/{node}".encode()).hexdigest()
    return ("gw" + digest)[:MAX_NAME]


def run(args: list[str], *, input_text: str | None = None) -> str:
    """Run one command; OverlayError with its stderr when it fails."""
    return run_command(
        args,
        error=OverlayError,
        input_text=input_text,
        install_hint="install wireguard-tools, wireguard-go and iproute2",
    )


def generate_key(path: Path) -> str:
    """Make a private key in ``path`` (mode 0600) and return its public key."""
    private = run(["wg", "genkey"]).strip()
    write_secret(path, private)
    return public_key(private)


def write_secret(path: Path, text: str) -> None:
    """``text`` into ``path``, a file of mode 0600 from the moment it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")


def public_key(private: str) -> str:
    return run(["wg", "pubkey"], input_text=private + "\n").strip()


class Interface:
    """A WireGuard interface in the current network namespace."""

    def __init__(self, name: str) -> None:
        assert 0 < len(name) <= MAX_NAME, name
        self.name = name
        self.userspace = False

    def create(self) -> None:
        try:
            run(["ip", "link", "add", self.name, "type", "wireguard"])
        except OverlayError:
            # no kernel module: the userspace implementation makes a TUN device of that name
            if shutil.which("wireguard-go") is None:
                raise OverlayError(
                    "no WireGuard kernel module and no wireguard-go; install wireguard-go"
                ) from None
            env = {**os.environ, "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}
            run_command(["wireguard-go", self.name], error=OverlayError, env=env)
            self.userspace = True

    def configure(self, *, private_key_file: Path, listen_port: int | None = None) -> None:
        args = ["wg", "set", self.name, "private-key", str(private_key_file)]
        if listen_port is not None:
            args += ["listen-port", str(listen_port)]
        run(args)

    def address(self, overlay_ip: str, prefix: int) -> None:
        run(["ip", "address", "add", f"{overlay_ip}/{prefix}", "dev", self.name])
        run(["ip", "link", "set", self.name, "up"])

    def set_peer(self, peer: Peer) -> None:
        run(["wg", "set", self.name, *peer.args()])

    def remove_peer(self, public_key: str) -> None:
        run(["wg", "set", self.name, "peer", public_key, "remove"])

    def peers(self) -> list[PeerStatus]:
        """The peers as ``wg show <name> dump`` lists them (its first line is the interface)."""
        out = []
        for line in run(["wg", "show", self.name, "dump"]).splitlines()[1:]:
            key, _psk, endpoint, allowed, handshake, rx, tx, _keepalive = line.split("\t")
            out.append(
                PeerStatus(
                    public_key=key,
                    endpoint=None if endpoint == "(none)" else endpoint,
                    allowed_ips=tuple(a for a in allowed.split(",") if a and a != "(none)"),
                    latest_handshake_s=int(handshake),
                    rx_bytes=int(rx),
                    tx_bytes=int(tx),
                )
            )
        return out

    def delete(self) -> None:
        """Remove the interface (idempotent) and a userspace daemon's control socket."""
        try:
            run(["ip", "link", "delete", self.name])
        except OverlayError as error:
            if "Cannot find device" not in str(error):
                raise
        remove_control_socket(self.name)


def remove_control_socket(name: str) -> None:
    """The socket a killed ``wireguard-go`` left behind (a new daemon of that name refuses to
    start while it exists)."""
    try:
        (UAPI_DIR / f"{name}.sock").unlink()
    except FileNotFoundError:
        pass
