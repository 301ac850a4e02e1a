"""What ``DefaultAzureCredential`` would find, checked offline (no token is fetched).

The chain (azure-identity 1.x) tries, in order: environment variables (a service principal with a
secret or certificate), workload identity (a federated token file, as on AKS), managed identity
(only answerable by the instance metadata endpoint, so not checkable offline), the shared token
cache, the Azure CLI (``az login``), Azure PowerShell and the Azure Developer CLI (``azd``). This
module looks only at the presence of variables, files and commands; it reads no file and never
holds a secret's value.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from provisioners.azure.sdk import identity
from provisioners.base import CredentialsMissing

CALL = "check_credentials"
SECRET_OR_CERT = ("AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH")


@dataclass(frozen=True)
class Found:
    """The first source in the chain that looks usable, and what is missing from the others."""

    source: str | None
    missing: tuple[str, ...]


def _service_principal(env: Mapping[str, str]) -> tuple[bool, str]:
    ids = [name for name in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID") if not env.get(name)]
    secret = any(env.get(name) for name in SECRET_OR_CERT)
    if not ids and secret:
        return True, ""
    lacking = ids + ([] if secret else ["AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH"])
    return False, "service principal: " + ", ".join(lacking) + " not set"


def _workload_identity(env: Mapping[str, str]) -> tuple[bool, str]:
    token_file = env.get("AZURE_FEDERATED_TOKEN_FILE")
    if not token_file:
        return False, "workload identity: AZURE_FEDERATED_TOKEN_FILE not set"
    if not Path(token_file).is_file():
        return False, "workload identity: the file AZURE_FEDERATED_TOKEN_FILE names does not exist"
    lacking = [name for name in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID") if not env.get(name)]
    if lacking:
        return False, "workload identity: " + ", ".join(lacking) + " not set"
    return True, ""


def _azure_cli(env: Mapping[str, str], home: Path, which: Callable[[str], str | None]):
    config = Path(env.get("AZURE_CONFIG_DIR") or home / ".azure")
    if which("az") is None:
        return False, "Azure CLI: `az` is not on PATH"
    if not (config / "azureProfile.json").is_file():
        return (
            False,
            f"Azure CLI: not logged in ({config}/azureProfile.json absent; run `az login`)",
        )
    return True, ""


def _managed_identity_endpoint(env: Mapping[str, str]) -> tuple[bool, str]:
    # App Service, Functions, Cloud Shell and Arc announce their identity endpoint in the
    # environment; on a VM only the metadata endpoint knows, which cannot be asked offline.
    if env.get("IDENTITY_ENDPOINT") or env.get("MSI_ENDPOINT"):
        return True, ""
    return False, (
        "managed identity: cannot be checked offline (on an Azure VM it may still work; pass "
        "credential=ManagedIdentityCredential() to use it without this check)"
    )


def find_credential(
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> Found:
    """The first usable-looking source of DefaultAzureCredential's chain, or what each lacks."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    checks = (
        ("environment (service principal)", lambda: _service_principal(env)),
        ("workload identity", lambda: _workload_identity(env)),
        ("managed identity", lambda: _managed_identity_endpoint(env)),
        ("Azure CLI login", lambda: _azure_cli(env, home, which)),
        (
            "Azure Developer CLI",
            lambda: (which("azd") is not None, "Azure Developer CLI: `azd` not on PATH"),
        ),
    )
    missing = []
    for source, check in checks:
        ok, why = check()
        if ok:
            return Found(source, ())
        missing.append(why)
    return Found(None, tuple(missing))


def require_subscription(subscription_id: str | None) -> str:
    if subscription_id:
        return subscription_id
    raise CredentialsMissing(
        "no subscription id: neither subscription_id= nor AZURE_SUBSCRIPTION_ID is set",
        cloud="azure",
        call=CALL,
        fix="export AZURE_SUBSCRIPTION_ID=<id> (see `az account show --query id -o tsv`) or pass "
        "subscription_id= to AzureProvisioner",
    )


def require_credential(found: Found) -> None:
    if found.source is not None:
        return
    raise CredentialsMissing(
        "DefaultAzureCredential would find no credential; it looked for: "
        + "; ".join(found.missing),
        cloud="azure",
        call=CALL,
        fix="run `az login` (Azure CLI), or export AZURE_TENANT_ID, AZURE_CLIENT_ID and "
        "AZURE_CLIENT_SECRET (or AZURE_CLIENT_CERTIFICATE_PATH) for a service principal, or set "
        "AZURE_FEDERATED_TOKEN_FILE with AZURE_TENANT_ID and AZURE_CLIENT_ID for workload identity",
    )


def default_credential():
    """``DefaultAzureCredential``, quiet: when the chain fails it logs its own multi-line
    warning, where our ``CredentialsMissing`` says the same once, with a fix."""
    made = _identity("DefaultAzureCredential")
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    return made


def managed_identity_credential():
    """The VM's managed identity (what a job's controller and nodes act as on Azure), used
    without the offline check: on a VM only its metadata service knows of it."""
    return _identity("ManagedIdentityCredential")


def _identity(name: str):
    return getattr(identity(), name)()
