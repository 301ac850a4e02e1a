"""Lazy access to google-cloud-compute and google-auth, and GCP's failures as typed errors.

Everything that imports the SDK does it here, inside functions (through
``provisioners.sdk_loader``), so that ``import provisioners.gcp`` works without the SDK installed;
a missing SDK is ``SdkMissing`` naming the pip extra.

GCP reports the same failure two ways: synchronously, as an HTTP error of the call
(``google.api_core.exceptions.GoogleAPICallError``), or later, in the ``error.errors`` list of the
zone operation that the call started (stock-outs usually arrive this way). Both go through one
``ErrorMap`` (``ERRORS``), so ``ZONE_RESOURCE_POOL_EXHAUSTED`` becomes ``CapacityError`` and
``QUOTA_EXCEEDED`` becomes ``QuotaError`` whichever way they came. All text passes ``scrub``
(``ProvisionerError`` does it) so no token reaches a message.
"""

from __future__ import annotations

import re
from typing import Any

from provisioners.base import CloudCallError, CredentialsMissing, ProvisionerError
from provisioners.error_map import ErrorMap, Match
from provisioners.gcp.catalog import MachineShape
from provisioners.sdk_loader import load_sdk

CLOUD = "gcp"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

# ---- GCP's failures, by kind -----------------------------------------------------------------

CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
# An HTTP error carries its reason in prose or in its details, not as the code we are given, so the
# capacity codes are searched in the text too (case-sensitive, as GCP spells them).
_CAPACITY_TEXT = re.compile(
    r"(?-i:ZONE_RESOURCE_POOL_EXHAUSTED)|does not have enough resources|resource pool exhausted"
    r"|stockout",
    re.IGNORECASE,
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
CAPACITY_FIX = "try another zone or region (or on-demand instead of spot), or retry later"
QUOTA_FIX = (
    "ask for more quota (IAM & Admin > Quotas, e.g. GPUS_ALL_REGIONS and the GPU's regional "
    "quota, PREEMPTIBLE_NVIDIA_*_GPUS for spot) or use another region"
)
NETWORK_FIX = "check the network and the API endpoint, then retry"

ERRORS = ErrorMap(
    cloud=CLOUD,
    capacity=Match(codes=CAPACITY_CODES, message=_CAPACITY_TEXT),
    quota=Match(message=_QUOTA_TEXT),
    credentials=Match(statuses=(401,)),
    permission=Match(statuses=(403,)),
    fixes={
        "capacity": CAPACITY_FIX,
        "quota": QUOTA_FIX,
        "credentials": CREDENTIALS_FIX,
        "permission": PERMISSION_FIX,
        "other": "read the message above; retry, or check the request in the Cloud Console",
    },
)


def classify(text: str, *, call: str, where: str, status: int | None = None) -> ProvisionerError:
    """The typed error for a failure described by ``text`` (codes and messages) and HTTP status
    (GCP's JSON errors carry the HTTP status as their ``code``)."""
    return ERRORS.error(str(status) if status else "", text, call=call, where=where, status=status)


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
    if not errors:
        return classify(
            str(getattr(operation, "http_error_message", "")),
            call=call,
            where=where,
            status=status,
        )
    # the first error's code leads; any others follow in the message, codes and all
    first, *others = errors
    message = "; ".join([first.message, *(f"{e.code}: {e.message}" for e in others)])
    return ERRORS.error(first.code, message, call=call, where=where, status=status)


def typed(error: BaseException, *, call: str, where: str) -> ProvisionerError:
    """The typed error for any exception ``sdk_errors()`` names."""
    from google.auth import exceptions as auth_exceptions

    if isinstance(error, auth_exceptions.GoogleAuthError):
        return ERRORS.error("", str(error), call=call, kind="credentials")
    if hasattr(error, "code") and hasattr(error, "message"):
        return from_api_error(error, call=call, where=where)  # type: ignore[arg-type]
    return CloudCallError(
        f"could not reach the API for {where}: {error}", cloud=CLOUD, call=call, fix=NETWORK_FIX
    )


# ---- the SDK ---------------------------------------------------------------------------------


def compute_module() -> Any:
    """``google.cloud.compute_v1``; ``SdkMissing`` naming the pip extra when it cannot import."""
    return load_sdk(
        "google.cloud.compute_v1", cloud=CLOUD, package="google-cloud-compute", extra="gcp"
    )


def sdk_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a google-cloud-compute or google-auth call may raise."""
    compute_module()
    import requests
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions

    return (
        api_exceptions.GoogleAPIError,
        auth_exceptions.GoogleAuthError,
        requests.RequestException,
    )


def not_found_error() -> type[BaseException]:
    compute_module()
    from google.api_core.exceptions import NotFound

    return NotFound


def default_credentials() -> tuple[Any, str | None]:
    """google.auth.default(), with a missing credential turned into a CredentialsMissing that
    says where the chain looked."""
    compute_module()
    import google.auth
    from google.auth import exceptions as auth_exceptions

    try:
        return google.auth.default(scopes=list(SCOPES))
    except auth_exceptions.DefaultCredentialsError as error:
        raise CredentialsMissing(
            "google.auth.default() found no credentials. It looks, in order, at "
            "GOOGLE_APPLICATION_CREDENTIALS (a key file), gcloud's application-default "
            "credentials (~/.config/gcloud/application_default_credentials.json, or under "
            f"CLOUDSDK_CONFIG), and the GCE metadata server. ({error})",
            cloud=CLOUD,
            call="google.auth.default",
            fix=CREDENTIALS_FIX,
        ) from None


def shape(machine: Any) -> MachineShape:
    return MachineShape(
        name=machine.name,
        vcpus=float(machine.guest_cpus),
        memory_gib=machine.memory_mb / 1024,
        accelerators=tuple(
            (a.guest_accelerator_type, a.guest_accelerator_count) for a in machine.accelerators
        ),
    )


def authorized_session(credentials: Any) -> Any:
    """A requests session that adds the credentials' token (for the Billing Catalog's REST API)."""
    compute_module()
    from google.auth.transport.requests import AuthorizedSession

    return AuthorizedSession(credentials)


def token_credentials(token: str) -> Any:
    """Credentials that send a fixed bearer ``token`` (an emulated API's), never refreshed."""
    from google.oauth2.credentials import Credentials

    return Credentials(token=token)
