"""An in-memory Azure (Resource Manager, compute and network, plus the Retail Prices API) behind an
azure-core HTTP transport, so that tests drive the REAL ``ComputeManagementClient`` offline; and
over the wire for the emulated Azure (azure.py): ``serve`` answers relayed requests on a VM of the
job's simulated internet (azure_wire.py).

``FakeAzureTransport`` is an ``HttpTransport``: the SDK builds real requests (URLs, api-versions,
JSON bodies, bearer tokens) and this class answers them from ``FakeAzure``'s state instead of the
network. ``FakeCredential`` is a ``TokenCredential`` that hands out a planted token string; tests
check that it never shows up in anything the adapter returns, raises or logs.

The fake models what the adapter relies on: resource SKUs with location/zone restrictions, VM
creates as long-running operations (``Azure-AsyncOperation`` polling) that can fail with ARM's
allocation error codes, instance views with provisioning and power states, spot eviction (the VM
vanishes under eviction policy Delete, or is deallocated under Deallocate), NICs, and the paged
Retail Prices API.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from azure.core.credentials import AccessToken
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest

# azure-core has no public in-memory response; HttpResponseImpl is the base its own transports use.
from azure.core.rest._http_response_impl import HttpResponseImpl
from azure.core.utils import case_insensitive_dict

from provisioners.emulated.azure_blob import FakeBlobs
from provisioners.emulated.azure_checks import invalid_custom_data, invalid_login, invalid_rules
from provisioners.emulated.azure_hosting import FakeHosting

ARM = "management.azure.com"
PRICES = "prices.azure.com"
BLOBS = ".blob.core.windows.net"
FAKE_TOKEN = "fake-azure-token-PLANTED-7f3a9c1e"  # noqa: S105 - a planted secret, not a real one


class FakeCredential:
    """A ``TokenCredential`` returning a planted token (counts how often it was asked)."""

    def __init__(self, token: str = FAKE_TOKEN) -> None:
        self.token, self.calls = token, 0

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.calls += 1
        return AccessToken(self.token, int(time.time()) + 3600)


class _Closer:
    """The 'internal response' HttpResponseImpl closes; nothing to release in memory."""

    def close(self) -> None:
        return None


def _response(request: HttpRequest, status: int, body: Any = None, headers: dict | None = None):
    content = b"" if body is None else json.dumps(body).encode()
    response = HttpResponseImpl(
        request=request,
        internal_response=_Closer(),
        status_code=status,
        reason={200: "OK", 201: "Created", 202: "Accepted", 204: "No Content"}.get(status, "Error"),
        content_type="application/json",
        headers=case_insensitive_dict({"Content-Type": "application/json", **(headers or {})}),
        stream_download_generator=lambda **_: iter([content]),
    )
    response.read()  # like the real transports do when the caller does not stream
    return response


def raw_response(request: HttpRequest, status: int, content: bytes, headers: dict):
    response = HttpResponseImpl(
        request=request,
        internal_response=_Closer(),
        status_code=status,
        reason="OK" if status < 400 else "Error",
        content_type=headers.get("Content-Type", "application/json"),
        headers=case_insensitive_dict(headers),
        stream_download_generator=lambda **_: iter([content]),
    )
    response.read()
    return response


def _error(request: HttpRequest, status: int, code: str, message: str):
    return _response(request, status, {"error": {"code": code, "message": message}})


def sku(
    name: str,
    location: str,
    *,
    gpus: int,
    vcpus: int,
    memory_gb: float,
    zones: tuple[str, ...] = ("1", "2", "3"),
    restricted_zones: tuple[str, ...] = (),
    location_restricted: bool = False,
) -> dict:
    """A ``Microsoft.Compute/skus`` entry in the REST shape, with optional restrictions."""
    restrictions = []
    if restricted_zones:
        restrictions.append(
            {
                "type": "Zone",
                "values": [location],
                "restrictionInfo": {"locations": [location], "zones": list(restricted_zones)},
                "reasonCode": "NotAvailableForSubscription",
            }
        )
    if location_restricted:
        restrictions.append(
            {
                "type": "Location",
                "values": [location],
                "restrictionInfo": {"locations": [location]},
                "reasonCode": "NotAvailableForSubscription",
            }
        )
    capabilities = [("vCPUs", vcpus), ("MemoryGB", memory_gb), ("GPUs", gpus)]
    return {
        "resourceType": "virtualMachines",
        "name": name,
        "tier": "Standard",
        "size": name.removeprefix("Standard_"),
        "locations": [location],
        "locationInfo": [{"location": location, "zones": list(zones)}],
        "capabilities": [{"name": k, "value": str(v)} for k, v in capabilities if v is not None],
        "restrictions": restrictions,
    }


def price(region: str, arm_sku: str, usd_per_hour: float, sku_name: str, product: str = "") -> dict:
    """A Retail Prices API item; ``sku_name`` carries 'Spot' / 'Low Priority' as Azure writes it."""
    return {
        "currencyCode": "USD",
        "retailPrice": usd_per_hour,
        "unitPrice": usd_per_hour,
        "armRegionName": region,
        "armSkuName": arm_sku,
        "skuName": sku_name,
        "meterName": sku_name,
        "productName": product or "Virtual Machines NCads A100 v4 Series",
        "serviceName": "Virtual Machines",
        "type": "Consumption",
        "unitOfMeasure": "1 Hour",
    }


@dataclass
class FakeVm:
    name: str
    body: dict
    provisioning: str = "Creating"
    power: str = "starting"


@dataclass
class FakeAzure:
    """The state of the fake cloud; tests arrange it and read what the adapter asked for."""

    subscription_id: str = "00000000-0000-0000-0000-000000000001"
    skus: list[dict] = field(default_factory=list)
    prices: list[dict] = field(default_factory=list)
    prices_page_size: int = 2  # small, so the adapter must follow NextPageLink
    # (vm size, zone) -> VMs that zone can still start; beyond it creates fail with the code below
    capacity: dict[tuple[str, str], int] = field(default_factory=dict)
    capacity_error: str = "ZonalAllocationFailed"
    # vm size -> (HTTP status, code, message) returned at once by the create PUT (quota, SKU)
    create_errors: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    vms: dict[str, FakeVm] = field(default_factory=dict)
    nics: dict[str, dict] = field(default_factory=dict)
    public_ips: dict[str, dict] = field(default_factory=dict)
    security_groups: dict[str, dict] = field(default_factory=dict)
    operations: dict[str, dict] = field(default_factory=dict)
    create_bodies: list[dict] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, url)
    auth_headers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count = field(default_factory=itertools.count)
    hosting: FakeHosting = field(init=False)  # storage, identities, roles, networks, tokens

    blobs: FakeBlobs = field(init=False)  # the storage accounts' blobs

    def __post_init__(self) -> None:
        self.hosting = FakeHosting(subscription_id=self.subscription_id)
        self.blobs = FakeBlobs(
            containers=self.hosting.containers, authorize=self.hosting.may_use_blobs
        )

    # ---- what tests do to the cloud --------------------------------------------------------------

    def evict(self, name: str) -> None:
        """A spot eviction: policy Delete removes the VM (and its NIC), Deallocate stops it."""
        with self.lock:
            vm = self.vms[name]
            if vm.body["properties"].get("evictionPolicy") == "Delete":
                del self.vms[name]
                self._drop_nics(vm)
            else:
                vm.power = "deallocated"

    def alive(self) -> list[str]:
        return sorted(self.vms)

    # ---- request handling --------------------------------------------------------------------------

    def handle(self, request: HttpRequest):
        url = urlsplit(request.url)
        with self.lock:
            self.requests.append((request.method, request.url))
            if url.hostname == PRICES:
                return self._prices(request, url)
            if (url.hostname or "").endswith(BLOBS):
                return self._blobs(request, url)
            assert url.hostname == ARM, f"the fake answers only ARM and prices, not {url.hostname}"
            self.auth_headers.append(request.headers.get("Authorization", ""))
            token = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if self.hosting.tokens and token not in self.hosting.tokens:  # tokens are checked
                return _error(request, 401, "InvalidAuthenticationToken", "The token is invalid.")
            return self._arm(request, url.path)

    def _arm(self, request: HttpRequest, path: str):
        body = json.loads(request.content) if request.content else None
        hosted = self.hosting.arm(request.method, path, body)
        if hosted is not None:
            return _response(request, *hosted)
        sub = f"/subscriptions/{self.subscription_id}"
        routes = (
            (rf"{sub}/providers/Microsoft\.Compute/skus", self._skus),
            (rf"{sub}/providers/Microsoft\.Compute/locations/[^/]+/operations/([^/]+)", self._op),
            (
                rf"{sub}/resourceGroups/[^/]+/providers/Microsoft\.Compute/virtualMachines/([^/]+)/instanceView",
                self._instance_view,
            ),
            (
                rf"{sub}/resourceGroups/[^/]+/providers/Microsoft\.Compute/virtualMachines",
                self._list_vms,
            ),
            (
                rf"{sub}/resourceGroups/[^/]+/providers/Microsoft\.Compute/virtualMachines/([^/]+)",
                self._vm,
            ),
            (
                rf"{sub}/resourceGroups/[^/]+/providers/Microsoft\.Network/networkInterfaces/([^/]+)",
                self._nic,
            ),
            (
                rf"{sub}/resourceGroups/[^/]+/providers/Microsoft\.Network/publicIPAddresses/([^/]+)",
                self._public_ip,
            ),
            (
                rf"{sub}/resourceGroups/[^/]+/providers/Microsoft\.Network/networkSecurityGroups",
                self._list_security_groups,
            ),
            (
                rf"{sub}/resourceGroups/[^/]+/providers/Microsoft\.Network/networkSecurityGroups/([^/]+)",
                self._security_group,
            ),
        )
        for pattern, handler in routes:
            match = re.fullmatch(pattern, path, flags=re.IGNORECASE)
            if match:
                return handler(request, *match.groups())
        return _error(request, 404, "InvalidResourceType", f"no route for {path}")

    def _blobs(self, request: HttpRequest, url):
        status, headers, data = self.blobs.handle(
            request.method,
            url.hostname.split(".", 1)[0],
            unquote(url.path),
            parse_qs(url.query, keep_blank_values=True),
            dict(request.headers),
            request.content or b"",
        )
        return raw_response(request, status, data, headers)

    def _skus(self, request: HttpRequest):
        query = parse_qs(urlsplit(request.url).query)
        wanted = re.findall(r"location eq '([^']+)'", query.get("$filter", [""])[0])
        value = [s for s in self.skus if not wanted or wanted[0].lower() in s["locations"]]
        return _response(request, 200, {"value": value})

    def _op(self, request: HttpRequest, op_id: str):
        op = self.operations[op_id]
        if op["status"] == "InProgress":  # one poll in progress, then the outcome
            op["status"] = op.pop("then")
            return _response(request, 200, {"status": "InProgress"})
        if op["status"] == "Succeeded" and op.get("vm") in self.vms:
            vm = self.vms[op["vm"]]
            vm.provisioning, vm.power = "Succeeded", "running"
        return _response(request, 200, {k: v for k, v in op.items() if k in ("status", "error")})

    def _list_vms(self, request: HttpRequest):
        if request.method != "GET":
            return _error(request, 405, "MethodNotAllowed", f"{request.method} on a VM list")
        expand = parse_qs(urlsplit(request.url).query).get("$expand") == ["instanceView"]
        listed = []
        for vm in self.vms.values():
            body = self._vm_json(vm)
            if expand:  # each VM's instance view inside it, as ARM lists them
                body["properties"]["instanceView"] = {"statuses": _statuses(vm)}
            listed.append(body)
        return _response(request, 200, {"value": listed})

    def _vm(self, request: HttpRequest, name: str):
        if request.method == "PUT":
            return self._create_vm(request, name)
        vm = self.vms.get(name)
        if request.method == "PATCH" and vm is not None:  # an update: its tags, here
            vm.body["tags"] = json.loads(request.content).get("tags", vm.body.get("tags"))
            return self._async(request, 200, self._vm_json(vm), status="Succeeded")
        if request.method == "DELETE":
            self.deleted.append(name)
            if vm is None:
                return _response(request, 204)
            del self.vms[name]
            self._drop_nics(vm)
            return self._async(request, 202, {}, status="Succeeded")
        if vm is None:
            return _error(request, 404, "ResourceNotFound", f"The Resource '{name}' was not found.")
        return _response(request, 200, self._vm_json(vm))

    def _create_vm(self, request: HttpRequest, name: str):
        body = json.loads(request.content)
        self.create_bodies.append(body)
        props = body["properties"]
        size = props["hardwareProfile"]["vmSize"]
        problem = self._invalid_create(props) or self._invalid_identity(body.get("identity"))
        if problem:
            return _error(request, 400, "InvalidParameter", problem)
        if size in self.create_errors:
            status, code, message = self.create_errors[size]
            return _error(request, status, code, message)
        vm = FakeVm(name=name, body=body)
        self.vms[name] = vm
        zone = (body.get("zones") or [""])[0]
        left = self.capacity.get((size, zone))
        if left is not None and left <= 0:
            vm.provisioning = "Failed"
            error = {
                "code": self.capacity_error,
                "message": f"Allocation failed for {size} in zone {zone}.",
            }
            return self._async(request, 201, self._vm_json(vm), status="Failed", error=error)
        if left is not None:
            self.capacity[(size, zone)] = left - 1
        return self._async(request, 201, self._vm_json(vm), status="Succeeded", vm=name)

    def _invalid_create(self, props: dict) -> str | None:
        """What real ARM would reject in a create body, as far as the adapter's choices go."""
        for nic in props["networkProfile"]["networkInterfaces"]:
            if nic["id"].rsplit("/", 1)[-1] not in self.nics:
                return f"network interface {nic['id']} does not exist"
        if props.get("priority") == "Spot":
            if props.get("evictionPolicy") not in ("Delete", "Deallocate"):
                return "a Spot VM needs evictionPolicy Delete or Deallocate"
            # billingProfile.maxPrice may be left out: ARM then caps at the pay-as-you-go price
            price = props.get("billingProfile", {}).get("maxPrice", -1)
            if price != -1 and not (isinstance(price, (int, float)) and price > 0):
                return f"billingProfile.maxPrice {price!r}: -1 or a positive price"
        profile = props.get("osProfile", {})
        return invalid_login(profile) or invalid_custom_data(profile.get("customData"))

    def _invalid_identity(self, identity: dict | None) -> str | None:
        if identity is None:
            return None
        named = identity.get("userAssignedIdentities") or {}
        if identity.get("type") != "UserAssigned" or not named:
            return "identity: type UserAssigned with userAssignedIdentities, for what we send"
        missing = [i for i in named if self.hosting.identity_of(i) is None]
        return f"identity {missing[0]} does not exist" if missing else None

    def _async(self, request: HttpRequest, http_status: int, body: dict, **op: Any):
        op_id = f"op-{next(self._ids)}"
        self.operations[op_id] = {"status": "InProgress", "then": op.pop("status"), **op}
        location = f"https://{ARM}/subscriptions/{self.subscription_id}/providers/Microsoft.Compute/locations/eastus/operations/{op_id}?api-version=2024-07-01"
        return _response(request, http_status, body, {"Azure-AsyncOperation": location})

    def _vm_json(self, vm: FakeVm) -> dict:
        return {
            **vm.body,
            "name": vm.name,
            "id": f"/subscriptions/{self.subscription_id}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/{vm.name}",
            "properties": {**vm.body["properties"], "provisioningState": vm.provisioning},
        }

    def _instance_view(self, request: HttpRequest, name: str):
        vm = self.vms.get(name)
        if vm is None:
            return _error(request, 404, "ResourceNotFound", f"The Resource '{name}' was not found.")
        return _response(request, 200, {"statuses": _statuses(vm)})

    def _public_ip(self, request: HttpRequest, name: str):
        if request.method == "PUT":
            body = json.loads(request.content)
            if body.get("sku", {}).get("name") != "Standard":
                return _error(request, 400, "InvalidParameter", "use a Standard public IP")
            address = f"203.0.113.{len(self.public_ips) % 250 + 2}"
            body.setdefault("properties", {}).update(
                ipAddress=address, provisioningState="Succeeded"
            )
            self.public_ips[name] = {**body, "name": name, "id": _path_of(request)}
            return _response(request, 201, self.public_ips[name])
        return _stored(request, self.public_ips, name, "public IP")

    def _security_group(self, request: HttpRequest, name: str):
        if request.method == "PUT":
            body = json.loads(request.content)
            problem = invalid_rules(body.get("properties", {}).get("securityRules", []))
            if problem:
                return _error(request, 400, "SecurityRuleInvalid", problem)
            body["properties"]["provisioningState"] = "Succeeded"
            self.security_groups[name] = {**body, "name": name, "id": _path_of(request)}
            return _response(request, 200, self.security_groups[name])
        if request.method == "DELETE" and any(
            (nic["properties"].get("networkSecurityGroup") or {}).get("id", "").endswith(f"/{name}")
            for nic in self.nics.values()
        ):
            return _error(
                request, 400, "InUseNetworkSecurityGroupCannotBeDeleted",
                f"Network security group {name} cannot be deleted because it is in use by a NIC",
            )  # fmt: skip
        return _stored(request, self.security_groups, name, "network security group")

    def _list_security_groups(self, request: HttpRequest):
        return _response(request, 200, {"value": list(self.security_groups.values())})

    def ingress(self, vm_body: dict) -> tuple[tuple[str, int, int, str], ...] | None:
        """What the VM's NICs' security groups admit from the internet ((protocol, first port,
        last port, source CIDR) rules), None where no group stands in front of it."""
        rules, grouped = set(), False
        for ref in vm_body["properties"]["networkProfile"]["networkInterfaces"]:
            nic = self.nics.get(ref["id"].rsplit("/", 1)[-1], {})
            group_ref = nic.get("properties", {}).get("networkSecurityGroup")
            if not group_ref:
                continue
            grouped = True
            group = self.security_groups.get(group_ref["id"].rsplit("/", 1)[-1], {})
            for rule in group.get("properties", {}).get("securityRules", []):
                props = rule["properties"]
                if props["direction"] != "Inbound" or props["access"] != "Allow":
                    continue
                low, _, high = props["destinationPortRange"].partition("-")
                protocol = {"Udp": "udp", "Tcp": "tcp"}.get(props["protocol"], "-1")
                for source in props.get("sourceAddressPrefixes", []):
                    rules.add((protocol, int(low), int(high or low), source))
        return tuple(sorted(rules)) if grouped else None

    def _nic(self, request: HttpRequest, name: str):
        if request.method == "PUT":
            body = json.loads(request.content)
            problem = self._invalid_nic(body["properties"])
            if problem:
                return _error(request, 400, "InvalidResourceReference", problem)
            ip = f"10.0.0.{len(self.nics) + 4}"
            body["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] = ip
            body["properties"]["provisioningState"] = "Succeeded"
            self.nics[name] = {**body, "name": name, "id": _path_of(request)}
            return _response(request, 201, self.nics[name])
        return _stored(request, self.nics, name, "network interface")

    def _invalid_nic(self, props: dict) -> str | None:
        """A NIC may reference only a public IP and a security group that exist."""
        for config in props.get("ipConfigurations", []):
            public = config.get("properties", {}).get("publicIPAddress")
            if public and public["id"].rsplit("/", 1)[-1] not in self.public_ips:
                return f"public IP {public['id']} does not exist"
        group = props.get("networkSecurityGroup")
        if group and group["id"].rsplit("/", 1)[-1] not in self.security_groups:
            return f"network security group {group['id']} does not exist"
        return None

    def _drop_nics(self, vm: FakeVm) -> None:
        for nic in vm.body["properties"]["networkProfile"]["networkInterfaces"]:
            if nic.get("properties", {}).get("deleteOption") == "Delete":
                gone = self.nics.pop(nic["id"].rsplit("/", 1)[-1], None) or {}
                for config in gone.get("properties", {}).get("ipConfigurations", []):
                    public = config.get("properties", {}).get("publicIPAddress") or {}
                    if public.get("properties", {}).get("deleteOption") == "Delete":
                        self.public_ips.pop(public["id"].rsplit("/", 1)[-1], None)

    def _prices(self, request: HttpRequest, url) -> Any:
        query = parse_qs(url.query)
        flt = query.get("$filter", [""])[0]
        region = re.search(r"armRegionName eq '([^']+)'", flt)
        names = set(re.findall(r"armSkuName eq '([^']+)'", flt))
        items = [
            p
            for p in self.prices
            if (region is None or p["armRegionName"] == region.group(1))
            and (not names or p["armSkuName"] in names)
        ]
        skip = int(query.get("$skip", ["0"])[0])
        page = items[skip : skip + self.prices_page_size]
        more = skip + self.prices_page_size < len(items)
        next_link = None
        if more:
            more_query = urlencode({"$filter": flt, "$skip": skip + self.prices_page_size})
            next_link = f"https://{PRICES}{url.path}?{more_query}"
        return _response(
            request, 200, {"BillingCurrency": "USD", "Items": page, "NextPageLink": next_link}
        )


class FakeAzureTransport(HttpTransport):
    """An azure-core transport answering from a ``FakeAzure``; never opens a socket."""

    def __init__(self, cloud: FakeAzure) -> None:
        self.cloud = cloud

    def send(self, request: HttpRequest, **kwargs: Any):
        return self.cloud.handle(request)

    def sleep(self, duration: float) -> None:
        # the SDK's retry and LRO waits go through the transport: keep the tests fast
        time.sleep(min(duration, 0.001))

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> FakeAzureTransport:
        return self

    def __exit__(self, *args: Any) -> None:
        return None


def _statuses(vm: FakeVm) -> list[dict]:
    return [
        {"code": f"ProvisioningState/{vm.provisioning.lower()}", "level": "Info"},
        {"code": f"PowerState/{vm.power}", "level": "Info"},
    ]


def _stored(request: HttpRequest, store: dict, name: str, what: str):
    """GET or DELETE of a stored network resource (a missing one: 404; deleting it: fine)."""
    if request.method == "DELETE":
        store.pop(name, None)
        return _response(request, 200)
    if name not in store:
        return _error(request, 404, "NotFound", f"{what} {name} not found")
    return _response(request, 200, store[name])


def _path_of(request: HttpRequest) -> str:
    return request.url.split("?")[0].split(ARM)[1]
