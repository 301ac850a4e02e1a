"""The overlay's join tokens and the controller's book of members, with a hand-written fake of the
WireGuard interface (no root, no wg): who may join from where, what expires, who sees whom."""

from __future__ import annotations

import dataclasses
import time

import pytest

from provisioners.overlay import service, wg
from provisioners.overlay.token import TokenError, decode


class FakeInterface:
    """Peers by public key, as ``wg set``/``wg show dump`` would hold them."""

    name = "gwfake"

    def __init__(self) -> None:
        self.peer_table: dict[str, wg.Peer] = {}

    def set_peer(self, peer: wg.Peer) -> None:
        taken = [k for k, p in self.peer_table.items() if p.allowed_ip == peer.allowed_ip]
        for key in taken:  # WireGuard moves an allowed IP to the peer set last
            if key != peer.public_key:
                del self.peer_table[key]
        self.peer_table[peer.public_key] = peer

    def remove_peer(self, public_key: str) -> None:
        self.peer_table.pop(public_key, None)

    def peers(self) -> list[wg.PeerStatus]:
        return [
            wg.PeerStatus(k, p.endpoint or "198.51.100.7:51820", (f"{p.allowed_ip}/32",), 0, 0, 0)
            for k, p in self.peer_table.items()
        ]


@pytest.fixture
def book(monkeypatch):
    keys = iter(range(1000))

    def fake_key(path):
        n = next(keys)
        path.write_text(f"private-{n}\n")
        return f"{n:043d}="  # 44 characters, as a base64 Curve25519 key

    monkeypatch.setattr(wg, "generate_key", fake_key)
    return service.Overlay(
        job="j",
        interface=FakeInterface(),
        network="100.64.0.0/24",
        public_endpoint="198.51.100.1:51820",
        public_key="C" * 43 + "=",
    )


def test_a_token_round_trips_and_hides_its_key(book):
    token = book.mint("a")
    text = token.encode()
    assert decode(text) == token and text.startswith("gj1.")
    assert token.ephemeral_private_key not in repr(token) and "private" not in str(token)
    assert token.controller_ip == "100.64.0.1" and token.node_ip == "100.64.0.2"


@pytest.mark.parametrize(
    ("text", "says"),
    [("hello", "not a join token"), ("gj1.!!!", "damaged"), ("gj1.e30", "damaged")],
)
def test_a_damaged_token_is_named_without_echoing_it(text, says):
    with pytest.raises(TokenError, match=says) as error:
        decode(text)
    assert text not in str(error.value) or text == "hello"


def test_a_token_with_a_bad_address_is_refused(book):
    token = dataclasses.replace(book.mint("a"), node_ip="not-an-ip")
    with pytest.raises(TokenError, match="node_ip"):
        decode(token.encode())


def test_admission_swaps_the_ephemeral_key_and_peers_see_each_other(book):
    a, b = book.mint("a"), book.mint("b")
    assert book.member_at(a.node_ip).joined is False
    book.admit(book.member_at(a.node_ip), "A" * 43 + "=", None)
    book.admit(book.member_at(b.node_ip), "B" * 43 + "=", "198.51.100.3:51820")
    keys = set(book.interface.peer_table)
    assert keys == {"A" * 43 + "=", "B" * 43 + "="}  # no ephemeral key is left
    assert [p["node"] for p in book.peers_for(a.node_ip)] == ["b"]
    assert [p["node"] for p in book.peers_for(b.node_ip)] == ["a"]


def test_an_unused_token_expires_and_its_address_is_not_reused(book):
    stale = book.mint("x", ttl_s=1.0)
    assert book.expire(now_s=time.time()) == []
    assert book.expire(now_s=time.time() + 2) == ["x"]
    assert book.member_at(stale.node_ip) is None and not book.interface.peer_table
    assert book.mint("y").node_ip != stale.node_ip


def test_a_joined_member_never_expires_and_remove_drops_it(book):
    token = book.mint("a", ttl_s=1.0)
    book.admit(book.member_at(token.node_ip), "A" * 43 + "=", None)
    assert book.expire(now_s=time.time() + 10) == []
    assert book.remove("a") and not book.interface.peer_table and not book.remove("a")


def test_names_are_unique_per_job_and_node_and_fit_linux():
    names = {wg.interface_name(job, node) for job in ("a", "b") for node in ("x", "y")}
    assert len(names) == 4 and all(len(n) <= 15 and n.startswith("gw") for n in names)
