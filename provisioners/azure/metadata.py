"""On-node Spot eviction notice from Azure Scheduled Events.

Azure announces a Spot eviction about 30 s ahead only to the VM itself, through the instance
metadata service: ``GET http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01``
with header ``Metadata: true`` returns ``Events``; one with ``EventType`` ``Preempt`` (whose
``Resources`` name this VM, when the VM's name is known) is the notice, and its ``NotBefore`` (an
RFC 1123 date, empty once the event has started) is the deadline. The control plane sees only the
loss, so the node's watcher (provisioners/bootstrap/watcher.py) calls ``notice`` in its loop, and
a worker may call ``preemption_notice`` for the contract's ``PreemptionNotice``.

Standard library only: the node may not have the Azure SDK.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from provisioners.base import PreemptionNotice

ENDPOINT = "http://169.254.169.254"
PATH = "/metadata/scheduledevents?api-version=2020-07-01"
SCHEDULED_EVENTS_URL = ENDPOINT + PATH


@dataclass(frozen=True)
class Notice:
    """What the node's watcher needs of a notice (its ``Notice``'s fields)."""

    deadline_s: float  # Unix seconds Azure takes the VM at
    text: str


def notice(
    *, endpoint: str = ENDPOINT, timeout_s: float = 1.0, vm_name: str | None = None
) -> Notice | None:
    """Ask this VM's metadata service once: the Preempt event's notice (for ``vm_name``'s VM when
    given, else for any), or None when there is none or the service does not answer."""
    now_s = time.time()
    event = _preempt_event(_scheduled_events(endpoint.rstrip("/") + PATH, timeout_s), vm_name)
    if event is None:
        return None
    return Notice(deadline_s=_deadline_s(event, now_s), text="Azure spot eviction")


def parse_events(
    document: dict, *, vm_name: str, infra: str, now_s: float
) -> PreemptionNotice | None:
    """The Preempt event for ``vm_name`` in a Scheduled Events document, as a notice (a deadline
    already past is now)."""
    event = _preempt_event(document, vm_name)
    if event is None:
        return None
    deadline = max(_deadline_s(event, now_s), now_s)
    return PreemptionNotice(node_id=vm_name, infra=infra, deadline_s=deadline, at_s=now_s)


def preemption_notice(
    *, vm_name: str, infra: str, url: str = SCHEDULED_EVENTS_URL, timeout_s: float = 2.0
) -> PreemptionNotice | None:
    """Ask this VM's metadata service once; the notice if Azure scheduled its eviction, else None.

    An unreachable service (not on Azure, or Scheduled Events not yet enabled: the first call
    enables it and may take a while) also gives None, so a worker may call this in every loop.
    """
    document = _scheduled_events(url, timeout_s)
    return parse_events(document, vm_name=vm_name, infra=infra, now_s=time.time())


def _scheduled_events(url: str, timeout_s: float) -> dict:
    """The Scheduled Events document at ``url``; an empty one when the service does not answer
    (or answers with an error, or with something other than JSON)."""
    request = urllib.request.Request(url, headers={"Metadata": "true"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - fixed link-local URL
            document = json.loads(response.read().decode("utf-8"))
    except (TimeoutError, urllib.error.URLError, ConnectionError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def _preempt_event(document: dict, vm_name: str | None) -> dict | None:
    """The first Preempt event of ``document`` naming ``vm_name`` (an event that names no
    resources concerns every VM; with no ``vm_name``, the first Preempt event)."""
    for event in document.get("Events") or []:
        if event.get("EventType") != "Preempt":
            continue
        resources = [str(r).lower() for r in event.get("Resources") or []]
        if vm_name is not None and resources and vm_name.lower() not in resources:
            continue
        return event
    return None


def _deadline_s(event: dict, now_s: float) -> float:
    """Unix time of the event's ``NotBefore``; ``now_s`` when it is empty or unreadable (the
    event is due)."""
    not_before = str(event.get("NotBefore") or "")
    if not not_before:
        return now_s
    try:
        return parsedate_to_datetime(not_before).timestamp()
    except (TypeError, ValueError):
        return now_s
