"""On-node watcher for the spot interruption notice in the EC2 instance metadata service (IMDSv2).

Two minutes before AWS takes a spot instance back, ``/latest/meta-data/spot/instance-action``
answers ``{"action": "terminate", "time": "2026-01-01T12:00:00Z"}``; until then it answers 404.
IMDSv2 wants a session token first (PUT ``/latest/api/token``). This module uses only the standard
library: it runs on the node, which need not have boto3, and it reads no credentials.

Two readings of one exchange (``_ask``): ``notice`` for the node's watcher (any answer but 200 is
"no notice", an unreachable service an ``OSError`` it logs and asks again), and
``interruption_notice`` for a caller that wants a failure named (``CloudCallError``) and the notice
as the contract's ``PreemptionNotice`` (the instance and its zone).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime

from provisioners.base import CloudCallError, PreemptionNotice

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_S = 300  # the token lives only as long as one check needs it
CALL = "imds spot/instance-action"
ACTION = "spot/instance-action"


@dataclass(frozen=True)
class Notice:
    """What the node's watcher drains its Ray node with (provisioners/bootstrap/watcher.py)."""

    deadline_s: float  # Unix seconds AWS takes the instance at
    text: str


@dataclass(frozen=True)
class _Answer:
    url: str
    status: int
    body: str


def _fetch(url: str, *, method: str = "GET", headers: dict[str, str], timeout_s: float) -> _Answer:
    """One metadata answer, an HTTP error as its status; ``OSError`` when nothing answers."""
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 (fixed host)
            return _Answer(url, answer.status, answer.read().decode("utf-8"))
    except urllib.error.HTTPError as error:
        return _Answer(url, error.code, "")


def _ask(endpoint: str, paths: tuple[str, ...], *, timeout_s: float) -> list[_Answer]:
    """The token's answer, then each of ``paths`` under ``/latest/meta-data/`` with that token;
    the paths after the instance action only when it answered 200 (a notice is out)."""
    token = _fetch(
        f"{endpoint}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
        timeout_s=timeout_s,
    )
    headers = {"X-aws-ec2-metadata-token": token.body if token.status == 200 else ""}
    answers = [token]
    for path in paths:
        answer = _fetch(f"{endpoint}/latest/meta-data/{path}", headers=headers, timeout_s=timeout_s)
        answers.append(answer)
        if path == ACTION and answer.status != 200:
            break
    return answers


def _epoch_s(stamp: str) -> float:
    """'2026-01-01T12:00:00Z' -> Unix seconds (fromisoformat takes 'Z' only from Python 3.11)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def notice(*, endpoint: str = DEFAULT_ENDPOINT, timeout_s: float = 1.0) -> Notice | None:
    """The spot interruption notice for this instance, None while AWS has sent none (or the
    service answers anything but 200); ``OSError`` when no metadata service answers."""
    _, action = _ask(endpoint, (ACTION,), timeout_s=timeout_s)
    if action.status != 200:
        return None
    # {"action": "terminate", "time": "2026-11-25T17:00:00Z"}: two minutes' notice
    said = json.loads(action.body)
    return Notice(deadline_s=_epoch_s(said["time"]), text=f"EC2 spot {said['action']}")


def interruption_notice(
    *, endpoint: str = DEFAULT_ENDPOINT, timeout_s: float = 1.0
) -> PreemptionNotice | None:
    """The interruption notice for the instance this runs on, or None if AWS has not sent one.

    The notice names the instance and its zone as the metadata service reports them, so that it
    matches the ``Node`` the provisioner launched (``aws/<region>/<zone>``)."""
    paths = (ACTION, "placement/availability-zone", "placement/region", "instance-id")
    try:
        answers = _ask(endpoint, paths, timeout_s=timeout_s)
    except OSError as error:  # URLError, a timeout, a refused connection
        raise CloudCallError(
            f"no instance metadata service at {endpoint}: {error}",
            cloud="aws",
            call=CALL,
            fix="run this on an EC2 instance (the service lives at 169.254.169.254), or pass "
            "the endpoint of a test server",
        ) from None
    for answer in answers:
        if answer.status not in (200, 404):
            raise CloudCallError(
                f"the instance metadata service answered HTTP {answer.status} for {answer.url}",
                cloud="aws",
                call=CALL,
                fix="enable IMDS on the instance (metadata-options http-endpoint=enabled) and "
                "allow a PUT hop limit of 2 inside containers",
            )
    _, action, *place = answers
    if action.status != 200:
        return None
    zone, region, instance = (a.body if a.status == 200 else "" for a in place)
    region = region or zone[:-1]
    return PreemptionNotice(
        node_id=instance,
        infra="/".join(p for p in ("aws", region, zone) if p),
        deadline_s=_epoch_s(json.loads(action.body)["time"]),
    )
