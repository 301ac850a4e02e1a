"""What real ARM refuses in what we send it, as the Azure fake (azure_api.py) checks it: security
rules, a VM's customData, its login (an ssh key, no password, no reserved user name)."""

from __future__ import annotations

import base64
import re


def invalid_rules(rules: list[dict]) -> str | None:
    """What ARM refuses in a security rule we send."""
    for rule in rules:
        props = rule.get("properties", {})
        if not 100 <= int(props.get("priority", 0)) <= 4096:
            return f"rule {rule.get('name')}: priority must be between 100 and 4096"
        if props.get("protocol") not in ("Tcp", "Udp", "Icmp", "*"):
            return f"rule {rule.get('name')}: protocol {props.get('protocol')!r}"
        if props.get("access") not in ("Allow", "Deny"):
            return f"rule {rule.get('name')}: access {props.get('access')!r}"
        if props.get("direction") not in ("Inbound", "Outbound"):
            return f"rule {rule.get('name')}: direction {props.get('direction')!r}"
        if not re.fullmatch(r"\d+(-\d+)?|\*", props.get("destinationPortRange", "")):
            return f"rule {rule.get('name')}: destinationPortRange"
        for prefix in props.get("sourceAddressPrefixes", []):
            if not re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", prefix):
                return f"rule {rule.get('name')}: source prefix {prefix!r}"
    return None


def invalid_custom_data(text: str | None) -> str | None:
    """ARM's rule for ``osProfile.customData``: base64, at most 87380 characters."""
    if text is None:
        return None
    try:
        base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        text = None
    if text is None or len(text) > 87380:
        return (
            "Custom data in OSProfile must be in Base64 encoding and with a maximum length of "
            "87380 characters."
        )
    return None


def invalid_login(profile: dict) -> str | None:
    """ARM's rules for a Linux VM's login: an admin name, and with passwords off at least one
    OpenSSH public key at that user's authorized_keys."""
    user = profile.get("adminUsername")
    if not user or user in {"admin", "root", "administrator", "user", "guest"}:
        return f"adminUsername {user!r} is missing or reserved"
    linux = profile.get("linuxConfiguration", {})
    if linux.get("disablePasswordAuthentication") and not profile.get("adminPassword"):
        keys = linux.get("ssh", {}).get("publicKeys") or []
        if not keys:
            return "Authentication using either SSH or by user name and password must be enabled"
        for key in keys:
            data = key.get("keyData") or ""
            if not data.startswith(("ssh-rsa AAAA", "ssh-ed25519 AAAA")):
                return f"the value of keyData is not a valid SSH public key: {data[:20]!r}"
            if key.get("path") != f"/home/{user}/.ssh/authorized_keys":
                return (
                    f"the SSH key path {key.get('path')!r} is not /home/{user}/.ssh/authorized_keys"
                )
    return None
