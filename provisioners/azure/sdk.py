"""The Azure SDK behind one door, and Azure's failures as the contract's typed errors.

azure-mgmt-compute, azure-core and azure-identity (the ``azure`` extra) are imported lazily,
through ``provisioners.sdk_loader``, so the adapter imports without them and a missing one is one
``SdkMissing`` naming the extra.

ARM reports failures as ``{"error": {"code", "message"}}``; azure-core raises them as
``HttpResponseError`` (at once for a rejected request, or from a long-running operation's poller
when the operation failed, e.g. an allocation failure). ``ERRORS`` says, as data, what each code
means: capacity codes become ``CapacityError`` (the caller tries the next location), quota codes
``QuotaError``, a bad or missing token ``CredentialsMissing``. Every message passes through
``scrub`` (in ``ErrorMap.error``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from provisioners.base import ProvisionerError
from provisioners.error_map import ErrorMap, Match
from provisioners.sdk_loader import load_sdk

CLOUD = "azure"
EXTRA = "azure"  # the pip extra that installs every package below

# ARM error codes meaning "no capacity for this size here now" (documented under
# "Resolve errors for SKU not available" and "allocation failures" on learn.microsoft.com).
CAPACITY_CODES = frozenset(
    {
        "SkuNotAvailable",
        "ZonalAllocationFailed",
        "AllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
    }
)
QUOTA_CODES = frozenset({"QuotaExceeded", "ResourceQuotaExceeded"})
TOKEN_CODES = frozenset(
    {"InvalidAuthenticationToken", "ExpiredAuthenticationToken", "AuthenticationFailed"}
)
PERMISSION_CODES = frozenset({"AuthorizationFailed", "LinkedAuthorizationFailed"})

# (no "credential:"-style wording here or in messages: ``scrub`` would hide what follows it)
LOGIN_FIX = (
    "sign in again with `az login`, or set AZURE_TENANT_ID, AZURE_CLIENT_ID and "
    "AZURE_CLIENT_SECRET for a service principal (DefaultAzureCredential looks there)"
)

ERRORS = ErrorMap(
    cloud=CLOUD,
    capacity=Match(codes=CAPACITY_CODES),
    # OperationNotAllowed is ARM's quota refusal ("... exceeding approved ... quota"), but it also
    # covers unrelated refusals, so only its quota wording makes it a quota error (the pattern
    # sees "<code> <message>")
    quota=Match(codes=QUOTA_CODES, message=re.compile(r"^OperationNotAllowed (?is:.*quota)")),
    credentials=Match(codes=TOKEN_CODES, statuses={401}),
    permission=Match(codes=PERMISSION_CODES, statuses={403}),
    fixes={
        "capacity": "try another zone or region, another VM size, or retry later",
        "quota": "request more vCPU quota for this VM family (Spot quota is separate) in the Azure "
        "portal under Subscriptions > Usage + quotas, or use another region",
        "credentials": LOGIN_FIX,
        "permission": "grant the identity the 'Virtual Machine Contributor' and 'Network "
        "Contributor' roles on the resource group (az role assignment create ...)",
        "other": "check the message above; Azure's activity log for the resource group has details",
    },
)


# ---- the SDK -------------------------------------------------------------------------------------


def compute_client() -> Any:
    """azure-mgmt-compute's ``ComputeManagementClient`` class."""
    compute = load_sdk("azure.mgmt.compute", cloud=CLOUD, package="azure-mgmt-compute", extra=EXTRA)
    return compute.ComputeManagementClient


def identity() -> ModuleType:
    """azure-identity (its credential classes)."""
    return load_sdk("azure.identity", cloud=CLOUD, package="azure-identity", extra=EXTRA)


def core() -> ModuleType:
    """azure-core (its ``PipelineClient``, for calls outside ARM)."""
    return load_sdk("azure.core", cloud=CLOUD, package="azure-core", extra=EXTRA)


def exceptions() -> ModuleType:
    """azure-core's exceptions (``AzureError``, ``ResourceNotFoundError``...)."""
    return load_sdk("azure.core.exceptions", cloud=CLOUD, package="azure-core", extra=EXTRA)


# ---- errors --------------------------------------------------------------------------------------


@contextmanager
def mapped(*, call: str, where: str) -> Iterator[None]:
    """Run the block; an azure-core error raised in it becomes the typed error of ``call``."""
    azure_error = exceptions().AzureError
    try:
        yield
    except azure_error as error:
        raise map_error(error, call=call, where=where) from error


def error_code(error: BaseException) -> tuple[str, str]:
    """ARM's (code, message) of an azure-core error; ('', str(error)) when it carries none."""
    odata = getattr(error, "error", None)  # azure-core parses the ARM error body into this
    code = getattr(odata, "code", None) or ""
    message = getattr(odata, "message", None) or ""
    response = getattr(error, "response", None)
    if not code and response is not None:
        try:
            body = response.json()
        except ValueError:  # not JSON: the status line says it all
            body = {}
        inner = body.get("error") or {} if isinstance(body, dict) else {}
        code, message = inner.get("code") or "", inner.get("message") or ""
    return code, message or str(error).splitlines()[0]


def map_error(error: BaseException, *, call: str, where: str) -> ProvisionerError:
    """The typed error for an azure-core exception raised by ``call`` at ``where`` (a location)."""
    code, message = error_code(error)
    return from_code(
        code,
        message,
        call=call,
        where=where,
        status=getattr(error, "status_code", None),
        bad_token=_is_client_auth(error),
    )


def canonical(code: str) -> str:
    """ARM's spelling of a code that an instance view reports in lower case."""
    known = CAPACITY_CODES | QUOTA_CODES | TOKEN_CODES | PERMISSION_CODES | {"OperationNotAllowed"}
    return next((k for k in known if k.lower() == code.lower()), code)


def from_code(
    code: str,
    message: str,
    *,
    call: str,
    where: str,
    status: int | None = None,
    bad_token: bool = False,
) -> ProvisionerError:
    """The typed error for ARM error ``code`` (with its ``message``) from ``call`` at ``where``;
    ``bad_token``: the SDK itself rejected the credential (short of a capacity or quota code)."""
    code = canonical(code)
    kind = ERRORS.kind(code, message, status)
    if bad_token and kind not in ("capacity", "quota"):
        kind = "credentials"
    return ERRORS.error(code, message, call=call, where=where, status=status, kind=kind)


def _is_client_auth(error: BaseException) -> bool:
    """azure-core's ClientAuthenticationError (also raised by credentials that found nothing)."""
    return any(cls.__name__ == "ClientAuthenticationError" for cls in type(error).__mro__)
