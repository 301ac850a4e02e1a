"""What an emulated Azure needs to host a job's controller, besides VMs: resource groups, storage
accounts with their blob containers, user-assigned managed identities, role assignments, virtual
networks, and the Entra ID tokens that tie them together (served by the Azure fake, azure_api.py).

As strict as ARM on what the adapter sends: a storage account's name (3-24 lowercase letters and
digits), kind, SKU and location, and its group must exist (404 ResourceGroupNotFound); a
container only in an account that exists; a role assignment's name is a GUID, its role a
``roleDefinitions/<guid>`` of this subscription, its principal one Entra ID knows (400
PrincipalNotFound), and a second assignment of the same role to the same principal on the same
scope is 409 RoleAssignmentExists. A storage account's create is accepted (202) and made at once.

Blob data access is by token only: a bearer token maps to a principal (the emulation's own user,
or a VM's identity through its instance metadata service: ``mint``), and a principal reads and
writes an account's blobs only with Storage Blob Data Contributor on the account or a scope above
it, as Azure checks data roles.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import uuid
from dataclasses import dataclass, field

BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
ACCOUNT_NAME = re.compile(r"[a-z0-9]{3,24}")
CONTAINER_NAME = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
Answer = tuple[int, dict | None]  # (HTTP status, JSON body)


def jwt_like(claims: dict) -> str:
    """A token shaped like an Entra ID access token (header.claims.signature, unsigned): what
    the adapter reads its principal from."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    header = part(json.dumps({"typ": "JWT", "alg": "none"}).encode())
    return f"{header}.{part(json.dumps(claims).encode())}.{part(secrets.token_bytes(24))}"


def _error(status: int, code: str, message: str) -> Answer:
    return status, {"error": {"code": code, "message": message}}


def _lookup(store: dict, key: str, what: str) -> Answer:
    found = store.get(key)
    return (
        (200, found) if found is not None else _error(404, "ResourceNotFound", f"{what} not found.")
    )


@dataclass
class FakeHosting:
    subscription_id: str
    tenant_id: str = "00000000-0000-0000-0000-0000000000aa"
    groups: dict[str, dict] = field(default_factory=dict)  # lowercased name -> resource
    accounts: dict[str, dict] = field(default_factory=dict)  # name -> resource
    identities: dict[str, dict] = field(default_factory=dict)  # lowercased id -> resource
    assignments: dict[str, dict] = field(default_factory=dict)  # lowercased id -> properties
    networks: dict[str, dict] = field(default_factory=dict)  # lowercased id -> resource
    tokens: dict[str, str] = field(default_factory=dict)  # bearer token -> principal id
    containers: set[tuple[str, str]] = field(default_factory=set)  # (account, container)

    # ---- tokens ----------------------------------------------------------------------------------

    def mint(self, principal: str) -> str:
        """A new token for ``principal`` (what a VM's metadata service hands out)."""
        token = jwt_like({"oid": principal, "tid": self.tenant_id, "n": secrets.token_hex(4)})
        self.tokens[token] = principal
        return token

    def identity_of(self, identity_id: str) -> dict | None:
        return self.identities.get(identity_id.lower())

    def may_use_blobs(self, token: str, account: str) -> bool:
        """Whether the token's principal holds Storage Blob Data Contributor on ``account``."""
        principal = self.tokens.get(token)
        found = self.accounts.get(account)
        if principal is None or found is None:
            return False
        target = found["id"].lower()
        return any(
            a["principalId"] == principal
            and a["roleDefinitionId"].lower().endswith(BLOB_DATA_CONTRIBUTOR)
            and (target == a["scope"] or target.startswith(a["scope"] + "/"))
            for a in self.assignments.values()
        )

    # ---- ARM -------------------------------------------------------------------------------------

    def arm(self, method: str, path: str, body: dict | None) -> Answer | None:
        """The answer to an ARM request on one of these resources; None: not one of them."""
        sub = f"/subscriptions/{self.subscription_id}"
        group = rf"{sub}/resourceGroups/([^/]+)"
        storage = rf"{group}/providers/Microsoft\.Storage/storageAccounts"
        routes = (
            (r"(.+)/providers/Microsoft\.Authorization/roleAssignments/([^/]+)", self._assignment),
            (rf"{storage}/([^/]+)/blobServices/default/containers/([^/]+)", self._container),
            (rf"{storage}/([^/]+)", self._account),
            (storage, self._accounts),
            (
                rf"{group}/providers/Microsoft\.ManagedIdentity/userAssignedIdentities/([^/]+)",
                self._identity,
            ),
            (rf"{group}/providers/Microsoft\.Network/virtualNetworks/([^/]+)", self._network),
            (group, self._group),
        )
        for pattern, handler in routes:
            match = re.fullmatch(pattern, path, flags=re.IGNORECASE)
            if match:
                return handler(method, path, body or {}, *match.groups())
        return None

    def _group(self, method: str, path: str, body: dict, name: str) -> Answer:
        if method == "PUT":
            if not body.get("location"):
                return _error(400, "LocationRequired", "The location property is required.")
            made = name.lower() not in self.groups
            self.groups.setdefault(name.lower(), {"id": path, "name": name, **body})
            return 201 if made else 200, self.groups[name.lower()]
        found = self.groups.get(name.lower())
        if found is None:
            return _error(
                404, "ResourceGroupNotFound", f"Resource group '{name}' could not be found."
            )
        return 200, found

    def _no_group(self, name: str) -> Answer | None:
        if name.lower() in self.groups:
            return None
        return _error(404, "ResourceGroupNotFound", f"Resource group '{name}' could not be found.")

    def _accounts(self, method: str, path: str, body: dict, group: str) -> Answer:
        return self._no_group(group) or (
            200,
            {"value": [a for a in self.accounts.values() if a["group"] == group.lower()]},
        )

    def _account(self, method: str, path: str, body: dict, group: str, name: str) -> Answer:
        if method != "PUT":
            found = self.accounts.get(name)
            if found is None:
                return _error(404, "ResourceNotFound", f"Storage account {name} not found.")
            return 200, found
        missing = self._no_group(group)
        if missing:
            return missing
        if not ACCOUNT_NAME.fullmatch(name):
            return _error(400, "AccountNameInvalid", f"{name} is not a valid storage account name")
        if not (body.get("location") and body.get("kind") and body.get("sku", {}).get("name")):
            return _error(400, "InvalidRequestContent", "location, kind and sku.name are required")
        properties = {
            **body.get("properties", {}),
            "provisioningState": "Succeeded",
            "primaryEndpoints": {"blob": f"https://{name}.blob.core.windows.net/"},
        }
        self.accounts[name] = {
            **body,
            "id": path,
            "name": name,
            "group": group.lower(),
            "properties": properties,
        }
        return 202, None  # accepted: a client reads the account until it is provisioned

    def _container(self, method: str, path: str, body: dict, group: str, account: str, name: str):
        if account not in self.accounts:
            return _error(404, "ParentResourceNotFound", f"Storage account {account} not found.")
        if method == "PUT":
            if not CONTAINER_NAME.fullmatch(name):
                return _error(400, "ContainerOperationFailure", f"invalid container name {name}")
            self.containers.add((account, name))
            return 201, {"id": path, "name": name, "properties": body.get("properties", {})}
        if (account, name) not in self.containers:
            return _error(
                404, "ContainerNotFound", f"The specified container {name} does not exist."
            )
        return 200, {"id": path, "name": name, "properties": {}}

    def _identity(self, method: str, path: str, body: dict, group: str, name: str) -> Answer:
        key = path.lower()
        if method != "PUT":
            return _lookup(self.identities, key, f"identity {name}")
        if self._no_group(group) or not body.get("location"):
            return self._no_group(group) or _error(
                400, "LocationRequired", "The location property is required."
            )
        made = key not in self.identities
        if made:
            ids = {
                "principalId": str(uuid.uuid4()),
                "clientId": str(uuid.uuid4()),
                "tenantId": self.tenant_id,
            }
            self.identities[key] = {**body, "id": path, "name": name, "properties": ids}
        return 201 if made else 200, self.identities[key]

    def _assignment(self, method: str, path: str, body: dict, scope: str, name: str) -> Answer:
        if method != "PUT":
            found = self.assignments.get(path.lower())
            if found is None:
                return _error(404, "RoleAssignmentNotFound", f"{name} not found.")
            return 200, {"id": path, "name": name, "properties": found}
        properties = body.get("properties", {})
        role = properties.get("roleDefinitionId", "")
        definitions = f"/subscriptions/{self.subscription_id}/providers/Microsoft.Authorization/roleDefinitions/"
        if not GUID.fullmatch(name):
            return _error(400, "InvalidRoleAssignmentId", f"{name} is not a GUID.")
        if not (
            role.lower().startswith(definitions.lower()) and GUID.fullmatch(role.rsplit("/", 1)[-1])
        ):
            return _error(400, "InvalidRoleDefinitionId", f"role definition {role!r} is not valid.")
        principal = properties.get("principalId", "")
        known = set(self.tokens.values()) | {
            i["properties"]["principalId"] for i in self.identities.values()
        }
        if principal not in known:
            return _error(
                400, "PrincipalNotFound", f"Principal {principal} does not exist in the directory."
            )
        for held in self.assignments.values():
            if (held["scope"], held["principalId"], held["roleDefinitionId"].lower()) == (
                scope.lower(),
                principal,
                role.lower(),
            ):
                return _error(409, "RoleAssignmentExists", "The role assignment already exists.")
        self.assignments[path.lower()] = {**properties, "scope": scope.lower()}
        return 201, {"id": path, "name": name, "properties": self.assignments[path.lower()]}

    def _network(self, method: str, path: str, body: dict, group: str, name: str) -> Answer:
        key = path.lower()
        if method != "PUT":
            return _lookup(self.networks, key, f"virtual network {name}")
        if self._no_group(group):
            return self._no_group(group)
        prefixes = body.get("properties", {}).get("addressSpace", {}).get("addressPrefixes")
        if not (body.get("location") and prefixes):
            return _error(400, "InvalidRequestFormat", "location and addressSpace are required")
        self.networks[key] = {
            **body,
            "id": path,
            "name": name,
            "properties": {**body["properties"], "provisioningState": "Succeeded"},
        }
        return 201, self.networks[key]
