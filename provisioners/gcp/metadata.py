"""GCE's preemption notice, as the VM itself reads it from its metadata server.

GCE gives a spot VM about 30 s between the preemption notice and the stop, and tells only the VM:
its metadata server's ``instance/preempted`` turns ``TRUE`` (the control plane learns of it later,
from the zone's operations). A node's watcher polls ``notice()`` and drains its Ray node.

Standard library only: this runs on the node, in the watcher, where no cloud SDK is installed.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

# the metadata server's address rather than metadata.google.internal: no name to resolve, and
# GCE documents both
ENDPOINT = "http://169.254.169.254"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
NOTICE_S = 30.0  # GCE's notice before it stops a preempted VM


@dataclass(frozen=True)
class Notice:
    """A preemption announced: when the cloud takes the node, and what it said."""

    deadline_s: float  # Unix seconds
    text: str


def notice(*, endpoint: str = ENDPOINT, timeout_s: float = 1.0) -> Notice | None:
    """The preemption notice if it has begun, else None. An HTTP error answer (the server's
    404 off GCE, say) is no notice; a server that cannot be reached raises the ``OSError``
    (``urllib.error.URLError``), which the watcher logs."""
    status, body = _get(
        f"{endpoint.rstrip('/')}{PREEMPTED_PATH}",
        {"Metadata-Flavor": "Google"},
        timeout_s=timeout_s,
    )
    if status == 200 and body.strip() == b"TRUE":
        return Notice(deadline_s=time.time() + NOTICE_S, text="GCE preemption")
    return None


def _get(url: str, headers: dict[str, str], *, timeout_s: float) -> tuple[int, bytes]:
    """(HTTP status, body) of a GET; an HTTP error is its status with an empty body."""
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
