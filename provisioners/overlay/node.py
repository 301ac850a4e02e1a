"""A node's side of the overlay: join with a token under a key made here, then follow the peers.

``join`` brings the node's WireGuard interface up under the token's ephemeral key with the
controller as its one peer, makes the node's own key pair, registers the public half with the join
service through the tunnel, and then changes to its own key: from then on the ephemeral key is
worth nothing. ``sync`` makes the interface's peers those the controller lists (nodes come and go).
``python -m provisioners.overlay.node join --token-file F --state-dir D`` is what the bootstrap
script runs; the token file is deleted once read.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from provisioners.overlay import wg
from provisioners.overlay.service import WG_PORT
from provisioners.overlay.token import JoinToken, TokenError, decode

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 3.0  # one try; a lost first handshake packet is retried by WireGuard in 5 s
CONTROLLER_KEEPALIVE_S = 15  # keeps a NAT's mapping (and the controller's view of us) alive
NODE_FILE = "node.json"


class JoinRefused(RuntimeError):
    """The controller answered and said no (token used, expired or for another node)."""


@dataclass(frozen=True)
class Joined:
    job: str
    node: str
    ip: str
    controller_ip: str
    service_port: int
    interface: str
    controller_public_key: str = ""  # the one peer a sync never removes


def join(
    token: JoinToken,
    *,
    state_dir: Path,
    timeout_s: float = JOIN_TIMEOUT_S,
    listen_port: int = WG_PORT,
) -> Joined:
    if token.expired():
        raise JoinRefused(f"the join token of {token.node} expired; ask the controller for another")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    interface = wg.Interface(wg.interface_name(token.job, token.node))
    ephemeral = state_dir / "ephemeral.key"
    wg.write_secret(ephemeral, token.ephemeral_private_key)
    interface.create()
    try:
        interface.configure(private_key_file=ephemeral, listen_port=listen_port)
        controller = wg.Peer(
            public_key=token.controller_public_key,
            allowed_ip=token.controller_ip,
            endpoint=token.controller_endpoint,
            keepalive_s=CONTROLLER_KEEPALIVE_S,
        )
        interface.set_peer(controller)
        interface.address(token.node_ip, token.prefix)
        own_public = wg.generate_key(state_dir / "node.key")
        reply = _register(token, own_public, deadline=time.monotonic() + timeout_s)
        interface.configure(private_key_file=state_dir / "node.key")
    except BaseException:
        interface.delete()
        raise
    finally:
        ephemeral.unlink(missing_ok=True)
    joined = Joined(
        token.job,
        token.node,
        token.node_ip,
        token.controller_ip,
        token.service_port,
        interface.name,
        token.controller_public_key,
    )
    (state_dir / NODE_FILE).write_text(json.dumps(joined.__dict__) + "\n")
    apply_peers(interface, reply.get("peers", []), keep={token.controller_public_key})
    return joined


def _register(token: JoinToken, public_key: str, *, deadline: float) -> dict:
    body = json.dumps({"node": token.node, "public_key": public_key}).encode()
    url = f"http://{token.controller_ip}:{token.service_port}/join"
    last = "no answer"
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise JoinRefused(f"the controller refused the join: {error.read()[:200]!r}") from None
        except (urllib.error.URLError, OSError) as error:  # no handshake yet: WireGuard retries
            last = str(getattr(error, "reason", error))
    raise TimeoutError(
        f"no answer from the controller's join service at {token.controller_ip} through "
        f"{token.controller_endpoint} ({last}); is UDP {token.controller_endpoint} reachable?"
    )


def peers(joined: Joined, *, timeout_s: float = REQUEST_TIMEOUT_S) -> list[dict]:
    """The other members, as the controller lists them (raises OSError when it does not answer)."""
    url = f"http://{joined.controller_ip}:{joined.service_port}/peers"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())["peers"]


def alive(joined: Joined, *, timeout_s: float = REQUEST_TIMEOUT_S) -> bool:
    """True when the controller's join service answers through the overlay."""
    url = f"http://{joined.controller_ip}:{joined.service_port}/alive"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def apply_peers(interface: wg.Interface, listed: list[dict], *, keep: set[str]) -> None:
    """Make the interface's peers ``listed`` plus those in ``keep`` (the controller)."""
    wanted = {p["public_key"]: p for p in listed}
    have = {}
    for status in interface.peers():
        if status.public_key not in wanted and status.public_key not in keep:
            interface.remove_peer(status.public_key)
        have[status.public_key] = status
    for key, peer in wanted.items():
        known = have.get(key)
        if known is not None and f"{peer['ip']}/32" in known.allowed_ips:
            continue  # set already (its endpoint follows the packets it sends)
        interface.set_peer(
            wg.Peer(public_key=key, allowed_ip=peer["ip"], endpoint=peer["endpoint"])
        )


def load(state_dir: Path) -> Joined:
    return Joined(**json.loads((state_dir / NODE_FILE).read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Join a job's overlay with a join token.")
    parser.add_argument("command", choices=["join"])
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--timeout-s", type=float, default=JOIN_TIMEOUT_S)
    args = parser.parse_args(argv)
    token_file = Path(args.token_file)
    try:
        token = decode(token_file.read_text())
        token_file.unlink()  # read once; the token is a secret until used
        joined = join(token, state_dir=Path(args.state_dir), timeout_s=args.timeout_s)
    except (OSError, TokenError, JoinRefused, TimeoutError, wg.OverlayError) as error:
        print(f"overlay join failed: {error}", file=sys.stderr)
        return 1
    print(joined.ip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
