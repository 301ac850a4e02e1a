"""On-node watcher for the spot interruption notice in the EC2 instance metadata service (IMDSv2).

Two minutes before AWS takes a spot instance back, ``/latest/meta-data/spot/instance-action``
answers ``{"action": "terminate", "time": "2026-01-01T12:00:00Z"}``; until then it answers 404.
IMDSv2 wants a session token first (PUT ``/latest/api/token``). This module uses only the standard
library: it runs on the node, which need not have boto3, and it reads no credentials.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime

from provisioners.base import CloudCallError, PreemptionNotice

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_S = 300  # the token lives only as long as one check needs it
CALL = "imds spot/instance-action"


def _request(
    url: str, *, method: str = "GET", headers: dict[str, str], timeout_s: float
) -> str | None:
    """The body of a metadata answer, None on 404 (nothing to report)."""
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 (fixed host)
            return answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise CloudCallError(
            f"the instance metadata service answered HTTP {error.code} for {url}",
            cloud="aws",
            call=CALL,
            fix="enable IMDS on the instance (metadata-options http-endpoint=enabled) and allow "
            "a PUT hop limit of 2 inside containers",
        ) from None
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise CloudCallError(
            f"no instance metadata service at {url}: {error}",
            cloud="aws",
            call=CALL,
            fix="run this on an EC2 instance (the service lives at 169.254.169.254), or pass "
            "the endpoint of a test server",
        ) from None


def _epoch_s(stamp: str) -> float:
    """'2026-01-01T12:00:00Z' -> Unix seconds (fromisoformat takes 'Z' only from Python 3.11)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def interruption_notice(
    *, endpoint: str = DEFAULT_ENDPOINT, timeout_s: float = 1.0
) -> PreemptionNotice | None:
    """The interruption notice for the instance this runs on, or None if AWS has not sent one.

    The notice names the instance and its zone as the metadata service reports them, so that it
    matches the ``Node`` the provisioner launched (``aws/<region>/<zone>``)."""
    token = _request(
        f"{endpoint}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
        timeout_s=timeout_s,
    )
    headers = {"X-aws-ec2-metadata-token": token or ""}

    def get(path: str) -> str | None:
        return _request(f"{endpoint}/latest/meta-data/{path}", headers=headers, timeout_s=timeout_s)

    action = get("spot/instance-action")
    if action is None:
        return None
    notice = json.loads(action)
    zone = get("placement/availability-zone") or ""
    region = get("placement/region") or zone[:-1]
    return PreemptionNotice(
        node_id=get("instance-id") or "",
        infra="/".join(p for p in ("aws", region, zone) if p),
        deadline_s=_epoch_s(notice["time"]),
    )
