"""Azure errors -> the contract's typed errors, each naming the call, what happened and a fix.

ARM reports failures as ``{"error": {"code", "message"}}``; azure-core raises them as
``HttpResponseError`` (at once for a rejected request, or from a long-running operation's poller
when the operation failed, e.g. an allocation failure). The code decides the type: capacity codes
become ``CapacityError`` (the caller tries the next location), quota codes ``QuotaError``, a bad or
missing token ``CredentialsMissing``. Every message passes through ``scrub``.
"""

from __future__ import annotations

from provisioners.base import (
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    ProvisionerError,
    QuotaError,
    scrub,
)

CLOUD = "azure"

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


def is_quota(code: str, message: str) -> bool:
    # OperationNotAllowed is ARM's quota refusal ("... exceeding approved ... quota"), but it also
    # covers unrelated refusals, so only its quota wording makes it a quota error.
    return code in QUOTA_CODES or (code == "OperationNotAllowed" and "quota" in message.lower())


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
    """The typed error for ARM error ``code`` (with its ``message``) from ``call`` at ``where``."""
    code = canonical(code)
    said = scrub(f"[{code}] {message}" if code else message)
    if code in CAPACITY_CODES:
        return CapacityError(
            f"no capacity in {where} ({said})",
            cloud=CLOUD,
            call=call,
            fix="try another zone or region, another VM size, or retry later",
        )
    if is_quota(code, message):
        return QuotaError(
            f"quota exceeded in {where} ({said})",
            cloud=CLOUD,
            call=call,
            fix="request more vCPU quota for this VM family (Spot quota is separate) in the Azure "
            "portal under Subscriptions > Usage + quotas, or use another region",
        )
    if bad_token or status == 401 or code in TOKEN_CODES:
        return CredentialsMissing(
            f"the credential was not accepted ({said})", cloud=CLOUD, call=call, fix=LOGIN_FIX
        )
    if status == 403 or code in PERMISSION_CODES:
        return CloudCallError(
            f"the signed-in identity may not do this ({said})",
            cloud=CLOUD,
            call=call,
            fix="grant the identity the 'Virtual Machine Contributor' and 'Network Contributor' "
            "roles on the resource group (az role assignment create ...)",
        )
    return CloudCallError(
        f"failed in {where} ({said})",
        cloud=CLOUD,
        call=call,
        fix="check the message above; Azure's activity log for the resource group has details",
    )


def _is_client_auth(error: BaseException) -> bool:
    """azure-core's ClientAuthenticationError (also raised by credentials that found nothing)."""
    return any(cls.__name__ == "ClientAuthenticationError" for cls in type(error).__mro__)
