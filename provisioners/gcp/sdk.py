"""Lazy access to google-cloud-compute and google-auth, and their exceptions as typed errors.

Everything that imports the SDK does it here, inside functions, so that ``import provisioners.gcp``
works without the SDK installed; a missing SDK is ``SdkMissing`` naming the pip extra.
"""

from __future__ import annotations

from typing import Any

from provisioners.base import CloudCallError, CredentialsMissing, ProvisionerError, SdkMissing
from provisioners.gcp import errors
from provisioners.gcp.catalog import MachineShape

CLOUD = "gcp"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


def compute_module() -> Any:
    try:
        from google.cloud import compute_v1
    except ImportError as error:
        raise sdk_missing(str(error)) from None
    return compute_v1


def sdk_missing(detail: str) -> SdkMissing:
    return SdkMissing(
        f"google-cloud-compute is not installed ({detail})",
        cloud=CLOUD,
        call="import google.cloud.compute_v1",
        fix="pip install 'geo-orchestrator[gcp]'",
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


def typed(error: BaseException, *, call: str, where: str) -> ProvisionerError:
    from google.auth import exceptions as auth_exceptions

    if isinstance(error, auth_exceptions.GoogleAuthError):
        return CredentialsMissing(
            f"the credentials could not be used: {error}",
            cloud=CLOUD,
            call=call,
            fix=errors.CREDENTIALS_FIX,
        )
    if hasattr(error, "code") and hasattr(error, "message"):
        return errors.from_api_error(error, call=call, where=where)  # type: ignore[arg-type]
    return CloudCallError(
        f"could not reach the API for {where}: {error}",
        cloud=CLOUD,
        call=call,
        fix="check the network and the API endpoint, then retry",
    )


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
            fix=errors.CREDENTIALS_FIX,
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
