"""GCP failures as the contract's typed errors, each with the call, what happened and a fix.

GCP reports the same failure two ways: synchronously, as an HTTP error of the call
(``google.api_core.exceptions.GoogleAPICallError``), or later, in the ``error.errors`` list of the
zone operation that the call started (stock-outs usually arrive this way). Both are classified
from their codes and text here, so ``ZONE_RESOURCE_POOL_EXHAUSTED`` becomes ``CapacityError`` and
``QUOTA_EXCEEDED`` becomes ``QuotaError`` whichever way they came. All text passes ``scrub``
(``ProvisionerError`` does it) so no token reaches a message.
"""

from __future__ import annotations

import re

from provisioners.base import (
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    ProvisionerError,
    QuotaError,
)

CLOUD = "gcp"

CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
_CAPACITY_TEXT = re.compile(
    r"does not have enough resources|resource pool exhausted|stockout", re.IGNORECASE
)
_QUOTA_TEXT = re.compile(r"QUOTA_EXCEEDED|quota\b.*\bexceeded", re.IGNORECASE)

CREDENTIALS_FIX = (
    "log in with `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
    "to a service-account key file, or run on a GCE VM whose service account has the "
    "cloud-platform scope"
)
PERMISSION_FIX = (
    "grant the account roles/compute.instanceAdmin.v1 (and roles/iam.serviceAccountUser) on the "
    "project, check that the Compute Engine API is enabled, or log in as another account with "
    "`gcloud auth application-default login`"
)
PROJECT_FIX = (
    "pass project=..., set GOOGLE_CLOUD_PROJECT, or run `gcloud config set project PROJECT_ID`"
)


def classify(text: str, *, call: str, where: str, status: int | None = None) -> ProvisionerError:
    """The typed error for a failure described by ``text`` (codes and messages) and HTTP status."""
    if any(code in text for code in CAPACITY_CODES) or _CAPACITY_TEXT.search(text):
        return CapacityError(
            f"{where} has no capacity for this request now: {text}",
            cloud=CLOUD,
            call=call,
            fix="try another zone or region (or on-demand instead of spot), or retry later",
        )
    if _QUOTA_TEXT.search(text):
        return QuotaError(
            f"a quota of the project forbids this request in {where}: {text}",
            cloud=CLOUD,
            call=call,
            fix="ask for more quota (IAM & Admin > Quotas, e.g. GPUS_ALL_REGIONS and the GPU's "
            "regional quota, PREEMPTIBLE_NVIDIA_*_GPUS for spot) or use another region",
        )
    if status == 401:
        return CredentialsMissing(
            f"the credentials were rejected (HTTP 401): {text}",
            cloud=CLOUD,
            call=call,
            fix=CREDENTIALS_FIX,
        )
    if status == 403:
        return CloudCallError(
            f"permission denied (HTTP 403): {text}", cloud=CLOUD, call=call, fix=PERMISSION_FIX
        )
    return CloudCallError(
        f"failed in {where}: {text}",
        cloud=CLOUD,
        call=call,
        fix="read the message above; retry, or check the request in the Cloud Console",
    )


def from_api_error(error: Exception, *, call: str, where: str) -> ProvisionerError:
    """The typed error for an exception the google-cloud-compute client raised."""
    status = getattr(error, "code", None)
    reasons = " ".join(
        str(getattr(detail, "reason", "") or "") for detail in getattr(error, "details", ()) or ()
    )
    text = f"{getattr(error, 'message', '') or error} {reasons}".strip()
    return classify(
        text, call=call, where=where, status=status if isinstance(status, int) else None
    )


def from_operation(operation: object, *, call: str, where: str) -> ProvisionerError | None:
    """The typed error a finished zone operation carries, or None when it succeeded."""
    error = getattr(operation, "error", None)
    errors = list(getattr(error, "errors", ()) or ())
    status = getattr(operation, "http_error_status_code", 0) or None
    if not errors and not status:
        return None
    text = "; ".join(f"{e.code}: {e.message}" for e in errors) or str(
        getattr(operation, "http_error_message", "")
    )
    return classify(text, call=call, where=where, status=status)
