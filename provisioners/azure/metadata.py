"""On-node Spot eviction notice from Azure Scheduled Events.

Azure announces a Spot eviction about 30 s ahead only to the VM itself, through the instance
metadata service: ``GET http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01``
with header ``Metadata: true`` returns ``Events``; one with ``EventType`` ``Preempt`` whose
``Resources`` name this VM is the notice, and its ``NotBefore`` (an RFC 1123 date, empty once the
event has started) is the deadline. The control plane sees only the loss, so a worker on the node
runs ``preemption_notice`` in its loop and reports the notice itself.

Standard library only: the node may not have the Azure SDK.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from email.utils import parsedate_to_datetime

from provisioners.base import PreemptionNotice

SCHEDULED_EVENTS_URL = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"


def _deadline_s(not_before: str, now_s: float) -> float:
    """Unix time of ``NotBefore``; ``now_s`` when it is empty or unreadable (the event is due)."""
    if not not_before:
        return now_s
    try:
        return parsedate_to_datetime(not_before).timestamp()
    except (TypeError, ValueError):
        return now_s


def parse_events(
    document: dict, *, vm_name: str, infra: str, now_s: float
) -> PreemptionNotice | None:
    """The Preempt event for ``vm_name`` in a Scheduled Events document, as a notice."""
    for event in document.get("Events") or []:
        if event.get("EventType") != "Preempt":
            continue
        resources = [str(r).lower() for r in event.get("Resources") or []]
        if resources and vm_name.lower() not in resources:
            continue
        deadline = max(_deadline_s(str(event.get("NotBefore") or ""), now_s), now_s)
        return PreemptionNotice(node_id=vm_name, infra=infra, deadline_s=deadline, at_s=now_s)
    return None


def preemption_notice(
    *, vm_name: str, infra: str, url: str = SCHEDULED_EVENTS_URL, timeout_s: float = 2.0
) -> PreemptionNotice | None:
    """Ask this VM's metadata service once; the notice if Azure scheduled its eviction, else None.

    An unreachable service (not on Azure, or Scheduled Events not yet enabled: the first call
    enables it and may take a while) also gives None, so a worker may call this in every loop.
    """
    request = urllib.request.Request(url, headers={"Metadata": "true"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - fixed link-local URL
            document = json.loads(response.read().decode("utf-8"))
    except (TimeoutError, urllib.error.URLError, ConnectionError, ValueError):
        return None
    return parse_events(document, vm_name=vm_name, infra=infra, now_s=time.time())
