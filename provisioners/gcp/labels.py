"""Changing a running instance's labels (a job renewing its lease tag).

``instances.setLabels`` replaces every label and takes the label fingerprint of the instance as
last read: a change made meanwhile by anyone else fails the call (412) instead of being lost, and
the next renewal reads again. Labels go through the same rules as at insert (``sanitize_labels``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioners.gcp import sdk
from provisioners.gcp.instances import sanitize_labels


def set_labels(api: Any, *, zone: str, name: str, labels: Mapping[str, str]) -> None:
    """Set ``labels`` on the instance, keeping its others."""
    compute = sdk.compute_module()
    client = api.client("InstancesClient")
    instance = api.call(
        "instances.get", zone, lambda: client.get(project=api.project, zone=zone, instance=name)
    )
    merged = sanitize_labels((*dict(instance.labels).items(), *labels.items()))
    change = compute.InstancesSetLabelsRequest(
        labels=dict(merged), label_fingerprint=instance.label_fingerprint
    )
    api.call(
        "instances.setLabels",
        zone,
        lambda: client.set_labels_unary(
            project=api.project,
            zone=zone,
            instance=name,
            instances_set_labels_request_resource=change,
        ),
    )
