"""What a job's controller needs of Azure besides VMs: a private storage account, two identities
and a network, in the adapter's resource group (made when missing).

- **The bucket**: a storage account per location, ``geo`` + 21 hex digits of a hash of the
  subscription, group and location (account names are global: 3-24 lowercase letters and
  digits), StorageV2, Standard_LRS, HTTPS and TLS 1.2 only, no anonymous blob access, tagged
  ``geo-orchestrator: jobs``; its container ``geo`` holds a job's folder under ``jobs/<job>/``.
  Its URL is the container's, ``https://<account>.blob.core.windows.net/geo``
  (runtime/storage.py).
- **Access by Entra ID tokens, not account keys**: role assignments of Storage Blob Data
  Contributor on the account for the caller (the ``oid`` of its own ARM token), the controller and
  the nodes. Making them needs Owner (or User Access Administrator) on the resource group: README.
- **The identities**: user-assigned managed identities ``geo-orchestrator-controller``
  (Contributor on the resource group: it makes the job's VMs, NICs, addresses and security groups)
  and ``geo-orchestrator-node`` (the account's blobs only). A VM reads its identity's token from
  its instance metadata service; no key of the user's leaves the laptop.
- **The network**: a virtual network per location, ``geo-orchestrator-<location>``
  (10.42.0.0/16, its subnet ``default``), for VMs launched without a given subnet.
- No presigned URLs: a VM fetches the wheel with its identity's token (bootstrap ``common.sh``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import uuid
from typing import Any

from provisioners.azure.arm import NETWORK_API_VERSION, arm_call
from provisioners.azure.sdk import CLOUD
from provisioners.base import CloudCallError, Identities, ProvisionerError

log = logging.getLogger(__name__)

CONTAINER = "geo"
JOBS_TAG = ("geo-orchestrator", "jobs")
IDENTITY_NAMES = ("geo-orchestrator-controller", "geo-orchestrator-node")
VNET_PREFIX, SUBNET_PREFIX = "10.42.0.0/16", "10.42.0.0/20"
# Azure's built-in role definitions (the same id in every tenant)
CONTRIBUTOR = "b24988ac-6180-42a0-ab88-20f7382dd24c"
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
STORAGE_API, MSI_API, ROLES_API = "2023-01-01", "2023-01-31", "2022-04-01"
GROUPS_API, NETWORK_API = "2021-04-01", NETWORK_API_VERSION
PROVISIONED_S = 120.0  # a storage account is made in well under a minute
# Entra ID replicates a new identity's principal within a minute or two
PRINCIPAL_KNOWN_S = 120.0
ARM_SCOPE = "https://management.azure.com/.default"


class Hosting:
    """The hosting calls of one subscription's resource group (see the module's docstring)."""

    def __init__(
        self,
        client: Any,
        *,
        subscription_id: str,
        resource_group: str,
        credential: Any,
        poll_interval_s: float = 5.0,
        stop: threading.Event | None = None,
    ) -> None:
        self._client, self._credential = client, credential
        self.subscription_id, self.resource_group = subscription_id, resource_group
        self.group_id = f"/subscriptions/{subscription_id}/resourceGroups/{resource_group}"
        self._poll_interval_s, self._stop = poll_interval_s, stop or threading.Event()

    # ---- the bucket ------------------------------------------------------------------------------

    def account_name(self, location: str) -> str:
        seed = f"{self.subscription_id}/{self.resource_group}/{location}".lower()
        return "geo" + hashlib.sha256(seed.encode()).hexdigest()[:21]

    def ensure_bucket(self, location: str) -> str:
        """The job container in ``location``'s storage account (both made when missing), with
        the caller allowed to read and write its blobs; its URL."""
        self.ensure_group(location)
        name = self.account_name(location)
        path = f"{self.group_id}/providers/Microsoft.Storage/storageAccounts/{name}"
        account = self._get(path, STORAGE_API, "storageAccounts GET")
        if account is None:
            body = {
                "location": location,
                "kind": "StorageV2",
                "sku": {"name": "Standard_LRS"},
                "tags": dict([JOBS_TAG]),
                "properties": {
                    "allowBlobPublicAccess": False,
                    "minimumTlsVersion": "TLS1_2",
                    "supportsHttpsTrafficOnly": True,
                },
            }
            self._put(path, body, STORAGE_API, "storageAccounts PUT")
            account = self._provisioned(path)
        container = f"{path}/blobServices/default/containers/{CONTAINER}"
        if self._get(container, STORAGE_API, "containers GET") is None:
            body = {"properties": {"publicAccess": "None"}}
            self._put(container, body, STORAGE_API, "containers PUT")
        caller = principal_of(self._credential.get_token(ARM_SCOPE).token)
        if caller is None:  # not an Entra ID token: the caller's access is its own business
            log.warning("azure: the caller's principal is unknown; no blob role assigned to it")
        else:
            self.assign(caller, BLOB_DATA_CONTRIBUTOR, scope=path, principal_type=None)
        return _container_url(account or {}, name)

    def job_buckets(self) -> dict[str, str]:
        """The resource group's job containers that exist now: location -> URL."""
        listed = self._get(
            f"{self.group_id}/providers/Microsoft.Storage/storageAccounts",
            STORAGE_API,
            "storageAccounts GET",
        )
        found = {}
        for account in (listed or {}).get("value", []):
            if (account.get("tags") or {}).get(JOBS_TAG[0]) == JOBS_TAG[1]:
                found[account["location"].lower()] = _container_url(account, account["name"])
        return found

    def ensure_group(self, location: str) -> None:
        path = f"/subscriptions/{self.subscription_id}/resourcegroups/{self.resource_group}"
        if self._get(path, GROUPS_API, "resourceGroups GET") is None:
            self._put(path, {"location": location}, GROUPS_API, "resourceGroups PUT")

    def _provisioned(self, path: str) -> dict:
        """Wait until ARM has made the account (its create is a long-running operation)."""
        deadline = time.monotonic() + PROVISIONED_S
        while True:
            account = self._get(path, STORAGE_API, "storageAccounts GET") or {}
            state = account.get("properties", {}).get("provisioningState")
            if state == "Succeeded":
                return account
            if time.monotonic() > deadline or self._stop.is_set():
                raise CloudCallError(
                    f"storage account {path.rsplit('/', 1)[-1]} not made in time ({state})",
                    cloud=CLOUD,
                    call="storageAccounts PUT",
                    fix="retry; see the resource group's activity log",
                )
            self._stop.wait(self._poll_interval_s)

    # ---- identities ------------------------------------------------------------------------------

    def ensure_identities(self, bucket_url: str) -> Identities:
        """The controller's and the nodes' managed identities (made when missing), with their
        roles; each as the resource id a VM's ``identity`` names."""
        account = bucket_url.split("//", 1)[1].split(".", 1)[0]
        account_id = f"{self.group_id}/providers/Microsoft.Storage/storageAccounts/{account}"
        location = self._location_of(account_id)
        ids = []
        for name in IDENTITY_NAMES:
            path = (
                f"{self.group_id}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/{name}"
            )
            made = self._get(path, MSI_API, "userAssignedIdentities GET")
            if made is None:
                body = {"location": location, "tags": dict([JOBS_TAG])}
                made = self._put(path, body, MSI_API, "userAssignedIdentities PUT") or {}
            principal = made.get("properties", {}).get("principalId")
            if not principal:
                raise CloudCallError(
                    f"identity {name} has no principal id yet",
                    cloud=CLOUD,
                    call="userAssignedIdentities PUT",
                    fix="retry in a minute",
                )
            self.assign(principal, BLOB_DATA_CONTRIBUTOR, scope=account_id)
            if name == IDENTITY_NAMES[0]:
                self.assign(principal, CONTRIBUTOR, scope=self.group_id)
            ids.append(path)
        return Identities(controller=ids[0], node=ids[1])

    def _location_of(self, account_id: str) -> str:
        account = self._get(account_id, STORAGE_API, "storageAccounts GET")
        if account is None:
            raise CloudCallError(
                f"no storage account {account_id.rsplit('/', 1)[-1]} in {self.resource_group}",
                cloud=CLOUD,
                call="storageAccounts GET",
                fix="submit again: it makes the account",
            )
        return account["location"]

    def assign(
        self,
        principal: str,
        role: str,
        *,
        scope: str,
        principal_type: str | None = "ServicePrincipal",
    ) -> None:
        """Give ``principal`` the built-in ``role`` on ``scope`` (once: the assignment's name is
        derived from the three, and an existing one is fine)."""
        name = uuid.uuid5(uuid.NAMESPACE_URL, f"{scope}|{principal}|{role}")
        path = f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}"
        properties = {
            "roleDefinitionId": f"/subscriptions/{self.subscription_id}/providers/"
            f"Microsoft.Authorization/roleDefinitions/{role}",
            "principalId": principal,
        }
        if principal_type:  # a new identity's principal may not have replicated yet: say what
            properties["principalType"] = principal_type
        deadline = time.monotonic() + PRINCIPAL_KNOWN_S
        while True:
            try:
                self._put(path, {"properties": properties}, ROLES_API, "roleAssignments PUT")
                return
            except ProvisionerError as error:
                if "RoleAssignmentExists" in error.message:
                    return
                # only a principal made a moment ago (an identity's) may still be replicating
                fresh = principal_type is not None and "PrincipalNotFound" in error.message
                if not fresh or time.monotonic() > deadline:
                    raise
            self._stop.wait(self._poll_interval_s)

    # ---- the network -----------------------------------------------------------------------------

    def ensure_subnet(self, location: str) -> str:
        """The subnet of ``location``'s virtual network (made when missing); its id."""
        self.ensure_group(location)
        path = f"{self.group_id}/providers/Microsoft.Network/virtualNetworks/geo-orchestrator-{location}"
        subnet = f"{path}/subnets/default"
        if self._get(path, NETWORK_API, "virtualNetworks GET") is None:
            body = {
                "location": location,
                "tags": dict([JOBS_TAG]),
                "properties": {
                    "addressSpace": {"addressPrefixes": [VNET_PREFIX]},
                    "subnets": [
                        {"name": "default", "properties": {"addressPrefix": SUBNET_PREFIX}}
                    ],
                },
            }
            self._put(path, body, NETWORK_API, "virtualNetworks PUT")
        return subnet

    # ---- ARM ---------------------------------------------------------------------------------------

    def _get(self, path: str, api_version: str, call: str) -> dict | None:
        return arm_call(self._client, "GET", path, api_version=api_version, call=call)

    def _put(self, path: str, body: dict, api_version: str, call: str) -> dict | None:
        return arm_call(self._client, "PUT", path, body, api_version=api_version, call=call)


def _container_url(account: dict, name: str) -> str:
    endpoint = (account.get("properties", {}).get("primaryEndpoints") or {}).get("blob")
    return f"{(endpoint or f'https://{name}.blob.core.windows.net/').rstrip('/')}/{CONTAINER}"


def principal_of(token: str) -> str | None:
    """The ``oid`` claim of an Entra ID access token (a JWT; read, not verified: it is our own
    token, and only says whom to grant a role to), or None for any other token."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    oid = claims.get("oid") if isinstance(claims, dict) else None
    return oid if isinstance(oid, str) else None
