"""Join tokens: what a new node needs to enter a job's overlay, valid once and for minutes.

A token carries the controller's public endpoint, public key and overlay address, the port of its
join service, the overlay address given to the node, an expiry, and a one-use *ephemeral* private
key. The controller adds the ephemeral key's public half as a peer allowed only the node's address,
so the holder of the token, and nobody else, can reach the join service from that address. There
the node registers the public key of a key pair it made itself (its private key never leaves it);
the controller swaps the ephemeral peer for the node's own key and the ephemeral key is worthless.
An unused token's peer is removed at its expiry: an expired token cannot even complete a WireGuard
handshake.

Encoded as ``gj1.`` and base64url JSON: one opaque string that fits a cloud's user-data. It is a
secret until used or expired: ``repr`` hides the key, and it is written to files of mode 0600 only.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import time
from dataclasses import asdict, dataclass

PREFIX = "gj1."


class TokenError(ValueError):
    """A token that cannot be read or has expired."""


@dataclass(frozen=True)
class JoinToken:
    job: str
    node: str
    controller_endpoint: str  # "public ip:port" of the controller's WireGuard interface
    controller_public_key: str
    controller_ip: str  # the controller's overlay address (join service, Ray head)
    service_port: int
    node_ip: str  # the overlay address this node gets
    prefix: int  # the overlay's prefix length
    ephemeral_private_key: str
    expires_at_s: float

    def __repr__(self) -> str:  # the ephemeral key is a credential until used
        return f"JoinToken(job={self.job!r}, node={self.node!r}, node_ip={self.node_ip})"

    __str__ = __repr__

    def expired(self, *, now_s: float | None = None) -> bool:
        return (time.time() if now_s is None else now_s) >= self.expires_at_s

    def encode(self) -> str:
        raw = json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()
        return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(text: str) -> JoinToken:
    """The token in ``text``; TokenError saying what is wrong (never echoing the text)."""
    text = text.strip()
    if not text.startswith(PREFIX):
        raise TokenError("not a join token (it must start with 'gj1.')")
    body = text[len(PREFIX) :]
    try:
        fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        token = JoinToken(**fields)
    except (binascii.Error, ValueError, TypeError):
        raise TokenError("join token damaged (cut or altered in transit?)") from None
    for field in ("controller_ip", "node_ip"):
        try:
            ipaddress.ip_address(getattr(token, field))
        except ValueError:
            raise TokenError(f"join token field {field} is not an IP address") from None
    if not isinstance(token.expires_at_s, (int, float)) or not isinstance(token.service_port, int):
        raise TokenError("join token has a malformed expiry or port")
    return token
