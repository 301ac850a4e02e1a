"""The controller's side of the overlay: its WireGuard interface, the join service and the tokens.

Run on the controller VM as a daemon (``python -m provisioners.overlay.service``). Two doors:

- the **join service**, HTTP on the controller's *overlay* address only (never its public one):
  ``POST /join`` from a token's address registers the node's own public key; ``GET /peers`` gives a
  joined node the others; ``GET /alive`` answers any node (the dead-man switch asks it). WireGuard
  authenticates every packet by key and pins each key to one overlay address, so a request's
  source address says which node sent it;
- the **admin socket**, a Unix socket only its owner may use in the controller's state folder, for the
  driver on the same VM: ``mint`` a token for a node about to launch, ``remove`` a node that left,
  list ``nodes``. One JSON request per line, one JSON reply per line.

A minted token's ephemeral peer is removed at the token's expiry unless the node joined by then.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import socketserver
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from provisioners.overlay import wg
from provisioners.overlay.token import JoinToken

log = logging.getLogger(__name__)

DEFAULT_CIDR = "100.64.0.0/16"
WG_PORT = 51820
SERVICE_PORT = 51821  # TCP, inside the tunnel only
REPLY_RECEIVED_S = 10.0  # how long a join's reply may take to reach the node
TOKEN_TTL_S = 600.0
MAX_BODY_BYTES = 4096
INFO_FILE = "overlay.json"  # what nodes' tokens and the driver need, written when ready
ADMIN_SOCKET = "admin.sock"


@dataclass(frozen=True)
class Member:
    node: str
    ip: str
    public_key: str  # the ephemeral key's until the node joined, then the node's own
    endpoint: str | None
    joined: bool
    expires_at_s: float


class Overlay:
    """The controller's book of members, applied to its WireGuard interface."""

    def __init__(
        self,
        *,
        job: str,
        interface: wg.Interface,
        network: str,
        public_endpoint: str,
        public_key: str,
        service_port: int = SERVICE_PORT,
    ) -> None:
        self.job, self.interface = job, interface
        self.network = ipaddress.ip_network(network)
        hosts = self.network.hosts()
        self.controller_ip = str(next(hosts))
        self._free = hosts  # handed out in order; an address is never reused within a job
        self.public_endpoint, self.public_key = public_endpoint, public_key
        self.service_port = service_port
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()

    def mint(self, node: str, *, ttl_s: float = TOKEN_TTL_S) -> JoinToken:
        """A token for ``node`` (a new address, a fresh ephemeral key; any earlier entry of that
        node removed)."""
        self.remove(node)
        with tempfile.TemporaryDirectory(prefix="geo-overlay-") as scratch:  # mode 0700
            private_file = Path(scratch) / "ephemeral.key"
            ephemeral_public = wg.generate_key(private_file)
            ephemeral_private = private_file.read_text().strip()
        with self._lock:
            ip = str(next(self._free))
            expires = time.time() + ttl_s
            self.interface.set_peer(wg.Peer(public_key=ephemeral_public, allowed_ip=ip))
            self._members[node] = Member(node, ip, ephemeral_public, None, False, expires)
        return JoinToken(
            job=self.job,
            node=node,
            controller_endpoint=self.public_endpoint,
            controller_public_key=self.public_key,
            controller_ip=self.controller_ip,
            service_port=self.service_port,
            node_ip=ip,
            prefix=self.network.prefixlen,
            ephemeral_private_key=ephemeral_private,
            expires_at_s=expires,
        )

    def member_at(self, ip: str) -> Member | None:
        with self._lock:
            return next((m for m in self._members.values() if m.ip == ip), None)

    def admit(self, member: Member, public_key: str, endpoint: str | None) -> None:
        """Swap a pending member's ephemeral key for its own (called after the reply is sent)."""
        with self._lock:
            seen = {p.public_key: p.endpoint for p in self.interface.peers()}
            endpoint = seen.get(member.public_key) or endpoint
            self.interface.remove_peer(member.public_key)
            self.interface.set_peer(
                wg.Peer(public_key=public_key, allowed_ip=member.ip, endpoint=endpoint)
            )
            self._members[member.node] = replace(
                member, public_key=public_key, endpoint=endpoint, joined=True
            )
        log.info("overlay: %s joined as %s from %s", member.node, member.ip, endpoint)

    def peers_for(self, ip: str) -> list[dict]:
        with self._lock:
            return [
                {"node": m.node, "ip": m.ip, "public_key": m.public_key, "endpoint": m.endpoint}
                for m in self._members.values()
                if m.joined and m.ip != ip
            ]

    def remove(self, node: str) -> bool:
        with self._lock:
            member = self._members.pop(node, None)
            if member is not None:
                self.interface.remove_peer(member.public_key)
        return member is not None

    def expire(self, *, now_s: float | None = None) -> list[str]:
        """Remove the members whose token expired before they joined; their names."""
        now = time.time() if now_s is None else now_s
        with self._lock:
            stale = [m for m in self._members.values() if not m.joined and m.expires_at_s <= now]
        for member in stale:
            self.remove(member.node)
            log.info("overlay: the token of %s expired unused", member.node)
        return [m.node for m in stale]

    def nodes(self) -> list[dict]:
        with self._lock:
            return [asdict(m) for m in self._members.values()]


class JoinHandler(BaseHTTPRequestHandler):
    """The join service; ``self.server.overlay`` is the Overlay."""

    server_version = "geo-overlay"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        log.debug("join service: " + format, *args)

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        overlay: Overlay = self.server.overlay
        member = overlay.member_at(self.client_address[0])
        if member is None or not member.joined:
            self._reply(403, {"error": "not a member of this overlay"})
        elif self.path == "/alive":
            self._reply(200, {"job": overlay.job})
        elif self.path == "/peers":
            self._reply(200, {"peers": overlay.peers_for(member.ip)})
        else:
            self._reply(404, {"error": f"no {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        overlay: Overlay = self.server.overlay
        if self.path != "/join":
            self._reply(404, {"error": f"no {self.path}"})
            return
        member = overlay.member_at(self.client_address[0])
        if member is None or member.joined:
            self._reply(403, {"error": "no pending token for this address"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            self._reply(400, {"error": "body missing or too long"})
            return
        try:
            body = json.loads(self.rfile.read(length))
            public_key, endpoint = str(body["public_key"]), body.get("endpoint")
        except (ValueError, KeyError, TypeError):
            self._reply(400, {"error": "body must be JSON with public_key"})
            return
        if body.get("node") != member.node or len(public_key) != 44:
            self._reply(400, {"error": "node or public_key does not match the token"})
            return
        self._reply(200, {"ip": member.ip, "peers": overlay.peers_for(member.ip)})
        self._until_received()
        overlay.admit(member, public_key, endpoint)  # after the reply: it travelled the old key

    def _until_received(self) -> None:
        """Wait (up to ``REPLY_RECEIVED_S``) until the node has read the whole reply and closed
        its end. The swap to the node's own key must not come before: wireguard-go encrypts
        queued packets on its own threads, so a reply still queued, or a segment the node has
        not acknowledged, would go out under the new key, which the node does not use until it
        has the reply; it never arrives and the node's join times out (seen with three nodes
        joining at once on a loaded machine)."""
        import socket

        try:
            self.connection.shutdown(socket.SHUT_WR)  # our FIN follows the reply's last byte
            self.connection.settimeout(REPLY_RECEIVED_S)
            while self.connection.recv(4096):  # the node's FIN: it got everything before it
                pass
        except OSError as error:  # timed out or reset: swap anyway, as before
            log.info("join service: %s: no close from the node (%s)", self.client_address, error)


class AdminHandler(socketserver.StreamRequestHandler):
    """One JSON request per line on the admin socket."""

    def handle(self) -> None:
        overlay: Overlay = self.server.overlay
        for line in self.rfile:
            try:
                request = json.loads(line)
                op = request["op"]
                if op == "mint":
                    ttl = float(request.get("ttl_s", TOKEN_TTL_S))
                    reply = {"token": overlay.mint(str(request["node"]), ttl_s=ttl).encode()}
                elif op == "remove":
                    reply = {"removed": overlay.remove(str(request["node"]))}
                elif op == "nodes":
                    reply = {"nodes": overlay.nodes()}
                else:
                    reply = {"error": f"unknown op {op!r}"}
            except (ValueError, KeyError, TypeError, wg.OverlayError) as error:
                reply = {"error": str(error)}
            self.wfile.write((json.dumps(reply) + "\n").encode())


class AdminServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def admin_call(socket_path: Path, request: dict, *, timeout_s: float = 30.0) -> dict:
    """One request to a controller's admin socket (from the driver on the same VM)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        sock.sendall((json.dumps(request) + "\n").encode())
        reply = sock.makefile("rb").readline()
    out = json.loads(reply)
    if "error" in out:
        raise wg.OverlayError(f"overlay admin {request.get('op')}: {out['error']}")
    return out


def serve(args: argparse.Namespace) -> int:
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    interface = wg.Interface(args.interface)
    interface.create()
    public = wg.generate_key(state / "controller.key")
    interface.configure(private_key_file=state / "controller.key", listen_port=args.port)
    overlay = Overlay(
        job=args.job,
        interface=interface,
        network=args.cidr,
        public_endpoint=f"{args.public_ip}:{args.port}",
        public_key=public,
    )
    interface.address(overlay.controller_ip, overlay.network.prefixlen)
    http = ThreadingHTTPServer((overlay.controller_ip, SERVICE_PORT), JoinHandler)
    http.daemon_threads = True
    http.overlay = overlay
    # a Unix socket's path has at most 107 bytes: a deep state folder gives one elsewhere
    admin_path = Path(args.admin_socket) if args.admin_socket else state / ADMIN_SOCKET
    admin_path.unlink(missing_ok=True)
    old_umask = os.umask(0o077)  # the socket is made owner-only from the start
    try:
        admin = AdminServer(str(admin_path), AdminHandler)
    finally:
        os.umask(old_umask)
    admin.overlay = overlay
    for server in (http, admin):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    info = {
        "job": args.job,
        "controller_ip": overlay.controller_ip,
        "interface": interface.name,
        "public_endpoint": overlay.public_endpoint,
        "public_key": public,
        "admin_socket": str(admin_path),
        "pid": os.getpid(),
    }
    (state / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info), flush=True)  # one line on stdout: ready (the bootstrap waits on it)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a VM's shutdown: leave no interface
    try:
        while not stop.wait(1.0):  # the expiry sweep's period, not a synchronisation
            overlay.expire()
    finally:
        http.shutdown()
        admin.shutdown()
        interface.delete()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True)
    parser.add_argument("--public-ip", required=True)
    parser.add_argument("--port", type=int, default=WG_PORT)
    parser.add_argument("--cidr", default=DEFAULT_CIDR)
    parser.add_argument("--interface", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--admin-socket", help="default: admin.sock in the state folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        return serve(args)
    except wg.OverlayError as error:
        print(f"overlay: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
