"""A small Compute Engine and Cloud Billing Catalog REST API, in memory (the GCP adapter's tests
on 127.0.0.1; the emulated GCP, gcp.py, on a VM of the job's simulated internet).

The real google-cloud-compute client (REST transport) talks to it through
``client_options={"api_endpoint": fake.url}``; the adapter's Billing Catalog session through
``billing_endpoint=fake.url``. It holds zones, accelerator types, machine types, instances, zone
operations and SKUs in memory, records every insert body and delete, checks the bearer token on
every request, applies GCE's metadata limits, and can be told to run out of capacity in a zone,
refuse for quota, or preempt an instance (deleting it and recording a
``compute.instances.preempted`` zone operation).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from provisioners.emulated.gcs_api import FakeGcs

PROJECT = "test-project"
COMPUTE = f"/compute/v1/projects/{PROJECT}"
SELF_LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}"


def _machine(name: str, vcpus: int, memory_mb: int, gpus: tuple[str, int] | None = None) -> dict:
    machine: dict[str, Any] = {"name": name, "guestCpus": vcpus, "memoryMb": memory_mb}
    if gpus is not None:
        machine["accelerators"] = [
            {"guestAcceleratorType": gpus[0], "guestAcceleratorCount": gpus[1]}
        ]
    return machine


N1 = [
    _machine("n1-standard-8", 8, 30720),
    _machine("n1-standard-16", 16, 61440),
    _machine("n1-standard-32", 32, 122880),
    _machine("e2-standard-4", 4, 16384),
]
ZONES = {"us-central1-a": "UP", "us-central1-b": "UP", "us-central1-f": "DOWN", "us-west1-b": "UP"}
ACCELERATORS = {
    "us-central1-a": [("nvidia-tesla-t4", 4), ("nvidia-tesla-a100", 16)],
    "us-central1-b": [("nvidia-tesla-t4", 4)],
    "us-central1-f": [("nvidia-tesla-t4", 4)],
    "us-west1-b": [("nvidia-tesla-v100", 8), ("nvidia-l4", 8)],
}
MACHINES = {
    "us-central1-a": [*N1, _machine("a2-highgpu-1g", 12, 87040, ("nvidia-tesla-a100", 1))],
    "us-central1-b": list(N1),
    "us-central1-f": list(N1),
    "us-west1-b": [*N1, _machine("g2-standard-8", 8, 32768, ("nvidia-l4", 1))],
}
AMERICAS = ["us-central1", "us-west1"]


def _sku(description: str, usage: str, usd: float, unit: str = "h") -> dict:
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {
        "description": description,
        "category": {"resourceFamily": "Compute", "usageType": usage},
        "serviceRegions": AMERICAS,
        "pricingInfo": [
            {
                "pricingExpression": {
                    "usageUnit": unit,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {
                                "currencyCode": "USD",
                                "units": str(units),
                                "nanos": nanos,
                            },
                        }
                    ],
                }
            }
        ],
    }


SKUS = [
    _sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", 0.35),
    _sku("Spot Preemptible Nvidia Tesla T4 GPU running in Americas", "Preemptible", 0.14),
    _sku("Nvidia Tesla T4 Virtual Workstation GPU running in Americas", "OnDemand", 0.55),
    _sku("Commitment v1: Nvidia Tesla T4 GPU running in Americas for 1 Year", "Commit1Yr", 0.22),
    _sku("Nvidia Tesla A100 GPU running in Americas", "OnDemand", 2.933908),
    _sku("Spot Preemptible Nvidia Tesla A100 GPU running in Americas", "Preemptible", 1.17),
    _sku("Nvidia Tesla V100 GPU running in Americas", "OnDemand", 2.48),
    _sku("Spot Preemptible Nvidia Tesla V100 GPU running in Americas", "Preemptible", 0.992),
    _sku("N1 Predefined Instance Core running in Americas", "OnDemand", 0.031611),
    _sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "Preemptible", 0.0066),
    _sku("N1 Predefined Instance Ram running in Americas", "OnDemand", 0.004237, "GiBy.h"),
    _sku(
        "Spot Preemptible N1 Predefined Instance Ram running in Americas",
        "Preemptible",
        0.0009,
        "GiBy.h",
    ),
    _sku("A2 Instance Core running in Americas", "OnDemand", 0.031611),
    _sku("A2 Instance Ram running in Americas", "OnDemand", 0.004237, "GiBy.h"),
    # L4 and G2 are deliberately unpriced: their offers must be left out.
]

CAPACITY_MESSAGE = (
    "The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later."
)


@dataclass
class FakeGcp:
    """The fake's state; ``start()`` serves it, ``stop()`` shuts it down."""

    token: str
    capacity: dict[str, int] = field(default_factory=dict)  # zone -> inserts it still accepts
    quota_zones: set[str] = field(default_factory=set)  # inserts here fail with a 403 quota error
    denied: bool = False  # every compute call answers 403 (no IAM permission)
    stagings_before_running: int = 1  # instances.get shows STAGING this many times first
    instances: dict[tuple[str, str], dict] = field(default_factory=dict)
    firewalls: dict[str, dict] = field(default_factory=dict)  # name -> the rule
    operations: dict[tuple[str, str], dict] = field(default_factory=dict)
    inserted: list[dict] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    storage: FakeGcs = field(default_factory=FakeGcs)  # Cloud Storage, on the same endpoint
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self, *, host: str = "127.0.0.1", port: int = 0, listen=None) -> FakeGcp:
        """Serve on ``host:port``; ``listen(make)``: where the socket is made (a VM's network)."""
        make = lambda: ThreadingHTTPServer((host, port), _handler(self))  # noqa: E731
        self._server = make() if listen is None else listen(make)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # ---- what tests do to the cloud -------------------------------------------------------------

    def preempt(self, name: str) -> None:
        """GCP preempts a spot VM: the instance goes, a preempted operation stays."""
        with self._lock:
            zone = next(z for (z, n) in self.instances if n == name)
            del self.instances[(zone, name)]
            self._operation(zone, name, kind="compute.instances.preempted")

    def vanish(self, name: str) -> None:
        """The instance disappears without a preemption (a host failure, someone deleted it)."""
        with self._lock:
            zone = next(z for (z, n) in self.instances if n == name)
            del self.instances[(zone, name)]

    def stopped(self, name: str) -> None:
        """The guest powered itself off: GCE keeps the instance, TERMINATED."""
        with self._lock:
            for (_, n), instance in self.instances.items():
                if n == name:
                    instance["status"] = "TERMINATED"

    def snapshot(self) -> list[tuple[str, dict]]:
        """Every instance now: (zone, its fields, copied)."""
        with self._lock:
            return [(zone, dict(i)) for (zone, _), i in self.instances.items()]

    # ---- request handling -----------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, body: dict) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(f"{method} {path}")
            if path.startswith("/v1/services/"):
                return self._skus(query)
            if self.denied:
                return _error(403, "Required 'compute.instances.list' permission", "forbidden")
            for pattern, handler in self._routes():
                match = re.fullmatch(pattern, path)
                if match and handler[0] == method:
                    return handler[1](query, body, *match.groups())
            return _error(404, f"no route {method} {path}", "notFound")

    def _routes(self) -> list[tuple[str, tuple[str, Any]]]:
        zone = COMPUTE + "/zones/([^/]+)"
        return [
            (COMPUTE + "/zones", ("GET", self._zones)),
            (COMPUTE + "/aggregated/acceleratorTypes", ("GET", self._accelerators)),
            (COMPUTE + "/aggregated/machineTypes", ("GET", self._machine_types)),
            (COMPUTE + "/aggregated/instances", ("GET", self._aggregated_instances)),
            (zone + "/machineTypes/([^/]+)", ("GET", self._machine_type)),
            (zone + "/instances", ("POST", self._insert)),
            (zone + "/instances", ("GET", self._list_instances)),
            (zone + "/instances/([^/]+)", ("GET", self._get_instance)),
            (zone + "/instances/([^/]+)", ("DELETE", self._delete_instance)),
            (zone + "/instances/([^/]+)/setLabels", ("POST", self._set_labels)),
            (zone + "/operations", ("GET", self._list_operations)),
            (COMPUTE + "/global/firewalls", ("GET", self._list_firewalls)),
            (COMPUTE + "/global/firewalls", ("POST", self._insert_firewall)),
            (COMPUTE + "/global/firewalls/([^/]+)", ("PATCH", self._patch_firewall)),
            (COMPUTE + "/global/firewalls/([^/]+)", ("DELETE", self._delete_firewall)),
            (zone + "/operations/([^/]+)", ("GET", self._get_operation)),
        ]

    def _zones(self, query: dict, body: dict) -> tuple[int, dict]:
        items = [
            {"name": z, "status": s, "region": f"{SELF_LINK}/regions/{z.rsplit('-', 1)[0]}"}
            for z, s in ZONES.items()
        ]
        return 200, {"items": items}

    def _accelerators(self, query: dict, body: dict) -> tuple[int, dict]:
        items = {
            f"zones/{zone}": {
                "acceleratorTypes": [
                    {
                        "name": name,
                        "zone": f"{SELF_LINK}/zones/{zone}",
                        "maximumCardsPerInstance": most,
                    }
                    for name, most in kinds
                ]
            }
            for zone, kinds in ACCELERATORS.items()
        }
        return 200, {"items": items}

    def _machine_types(self, query: dict, body: dict) -> tuple[int, dict]:
        items = {
            f"zones/{zone}": {
                "machineTypes": [{**m, "zone": f"{SELF_LINK}/zones/{zone}"} for m in machines]
            }
            for zone, machines in MACHINES.items()
        }
        return 200, {"items": items}

    def _machine_type(self, query: dict, body: dict, zone: str, name: str) -> tuple[int, dict]:
        for machine in MACHINES.get(zone, ()):
            if machine["name"] == name:
                return 200, {**machine, "zone": f"{SELF_LINK}/zones/{zone}"}
        return _error(404, f"machine type {name} not found in {zone}", "notFound")

    def _insert(self, query: dict, body: dict, zone: str) -> tuple[int, dict]:
        self.inserted.append({"zone": zone, **body})
        problem = _invalid_metadata(body.get("metadata", {})) or _invalid_accounts(body)
        if problem:
            return _error(400, problem, "invalid")
        if zone in self.quota_zones:
            region = zone.rsplit("-", 1)[0]
            return _error(
                403,
                f"Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region {region}.",
                "quotaExceeded",
            )
        name = body["name"]
        left = self.capacity.get(zone)
        if left is not None and left <= 0:
            message = CAPACITY_MESSAGE.format(project=PROJECT, zone=zone)
            error = {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message}]}
            return 200, self._operation(zone, name, kind="insert", done=True, error=error)
        if left is not None:
            self.capacity[zone] = left - 1
        number = next(self._ids)
        self.instances[(zone, name)] = {
            "id": str(1000 + number),
            "name": name,
            "zone": f"{SELF_LINK}/zones/{zone}",
            "status": "PROVISIONING",
            "machineType": body.get("machineType", ""),
            "labels": body.get("labels", {}),
            "labelFingerprint": f"fp-{number}-0",
            "scheduling": body.get("scheduling", {}),
            "metadata": body.get("metadata", {}),
            "tags": body.get("tags", {}),
            "serviceAccounts": body.get("serviceAccounts", []),
            "networkInterfaces": [
                {"networkIP": f"10.0.0.{number}", "accessConfigs": [{"natIP": f"34.1.0.{number}"}]}
            ],
            "_gets": 0,
        }
        # RUNNING at first: the client must poll the operation until DONE
        return 200, self._operation(zone, name, kind="insert", done=False)

    def _operation(
        self, zone: str, target: str, *, kind: str, done: bool = True, error: dict | None = None
    ) -> dict:
        name = f"operation-{next(self._ids)}"
        operation = {
            "name": name,
            "operationType": kind,
            "targetLink": f"{SELF_LINK}/zones/{zone}/instances/{target}",
            "zone": f"{SELF_LINK}/zones/{zone}",
            "status": "DONE" if done else "RUNNING",
        }
        if error is not None:
            operation["error"] = error
            operation["httpErrorStatusCode"] = 503
        self.operations[(zone, name)] = operation
        return operation

    def _get_operation(self, query: dict, body: dict, zone: str, name: str) -> tuple[int, dict]:
        operation = self.operations.get((zone, name))
        if operation is None:
            return _error(404, f"operation {name} not found", "notFound")
        operation["status"] = "DONE"
        return 200, operation

    def _list_operations(self, query: dict, body: dict, zone: str) -> tuple[int, dict]:
        wanted = query.get("filter", [""])[0]
        items = [
            op
            for (z, _), op in self.operations.items()
            if z == zone and (not wanted or op["operationType"] in wanted)
        ]
        return 200, {"items": items}

    def _set_labels(self, query: dict, body: dict, zone: str, name: str) -> tuple[int, dict]:
        instance = self.instances.get((zone, name))
        if instance is None:
            return _error(404, f"The resource 'projects/{PROJECT}/zones/{zone}/instances/{name}' "
                          "was not found", "notFound")  # fmt: skip
        if body.get("labelFingerprint") != instance["labelFingerprint"]:
            return _error(412, "Labels fingerprint either invalid or resource labels have "
                          "changed", "conditionNotMet")  # fmt: skip
        instance["labels"] = dict(body.get("labels", {}))
        number, changes = instance["labelFingerprint"][3:].rsplit("-", 1)
        instance["labelFingerprint"] = f"fp-{number}-{int(changes) + 1}"
        return 200, self._operation(zone, name, kind="setLabels")

    # ---- firewall rules (global) ------------------------------------------------------------------

    def _list_firewalls(self, query: dict, body: dict) -> tuple[int, dict]:
        wanted = re.findall(r'name = "([^"]+)"', query.get("filter", [""])[0])
        items = [r for n, r in self.firewalls.items() if not wanted or n in wanted]
        return 200, {"items": items}

    def _insert_firewall(self, query: dict, body: dict) -> tuple[int, dict]:
        problem = _invalid_firewall(body)
        if problem:
            return _error(400, problem, "invalid")
        name = body["name"]
        if name in self.firewalls:
            return _error(409, f"The resource 'projects/{PROJECT}/global/firewalls/{name}' "
                          "already exists", "alreadyExists")  # fmt: skip
        self.firewalls[name] = dict(body)
        return 200, self._global_operation(name, "insert")

    def _patch_firewall(self, query: dict, body: dict, name: str) -> tuple[int, dict]:
        if name not in self.firewalls:
            return _error(404, f"The resource 'projects/{PROJECT}/global/firewalls/{name}' "
                          "was not found", "notFound")  # fmt: skip
        merged = {**self.firewalls[name], **body}
        problem = _invalid_firewall(merged)
        if problem:
            return _error(400, problem, "invalid")
        self.firewalls[name] = merged
        return 200, self._global_operation(name, "patch")

    def _delete_firewall(self, query: dict, body: dict, name: str) -> tuple[int, dict]:
        if self.firewalls.pop(name, None) is None:
            return _error(
                404, f"The resource 'projects/{PROJECT}/global/firewalls/{name}' was not found",
                "notFound",
            )  # fmt: skip
        return 200, self._global_operation(name, "delete")

    def _global_operation(self, target: str, kind: str) -> dict:
        return {
            "name": f"operation-{next(self._ids)}",
            "operationType": kind,
            "targetLink": f"{SELF_LINK}/global/firewalls/{target}",
            "status": "DONE",
        }

    def ingress(self, instance: dict) -> tuple[tuple[str, int, int, str], ...]:
        """What the network's firewall admits to ``instance`` from outside: the ingress rules
        that target it (by network tag, or every VM), as GCP applies them; nothing else (the
        VPC's implied rule denies all other ingress)."""
        tags = set(instance.get("tags", {}).get("items", []))
        with self._lock:
            firewalls = list(self.firewalls.values())
        rules = set()
        for rule in firewalls:
            if rule.get("direction", "INGRESS") != "INGRESS" or rule.get("disabled"):
                continue
            if rule.get("targetTags") and not tags & set(rule["targetTags"]):
                continue
            for allowed in rule.get("allowed", []):
                protocol = allowed.get("IPProtocol", "all")
                for ports in allowed.get("ports") or ["0-65535"]:
                    first, _, last = ports.partition("-")
                    for source in rule.get("sourceRanges", ["0.0.0.0/0"]):
                        kind = "-1" if protocol == "all" else protocol
                        rules.add((kind, int(first), int(last or first), source))
        return tuple(sorted(rules))

    def _public(self, instance: dict) -> dict:
        return {k: v for k, v in instance.items() if not k.startswith("_")}

    def _get_instance(self, query: dict, body: dict, zone: str, name: str) -> tuple[int, dict]:
        instance = self.instances.get((zone, name))
        if instance is None:
            return _error(
                404,
                f"The resource 'projects/{PROJECT}/zones/{zone}/instances/{name}' was not found",
                "notFound",
            )
        instance["_gets"] += 1
        if instance["status"] != "TERMINATED":
            running = instance["_gets"] > self.stagings_before_running
            instance["status"] = "RUNNING" if running else "STAGING"
        return 200, self._public(instance)

    def _list_instances(self, query: dict, body: dict, zone: str) -> tuple[int, dict]:
        items = [self._public(i) for (z, _), i in self.instances.items() if z == zone]
        return 200, {"items": items}

    def _aggregated_instances(self, query: dict, body: dict) -> tuple[int, dict]:
        """instances.aggregatedList with GCE's ``labels.KEY="VALUE"`` filter (the only form the
        adapter sends; anything else is refused, as a filter GCE cannot parse is)."""
        wanted = query.get("filter", [""])[0]
        match = (
            re.fullmatch(r'labels\.([a-z][a-z0-9_]*)="([a-z0-9_-]*)"', wanted) if wanted else None
        )
        if wanted and match is None:
            return _error(
                400,
                f"Invalid value for field 'filter': '{wanted}'. Invalid list filter expression.",
                "invalid",
            )
        items: dict[str, dict] = {}
        for (zone, _), instance in self.instances.items():
            labels = instance.get("labels", {})
            if match and labels.get(match.group(1)) != match.group(2):
                continue
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(
                self._public(instance)
            )
        return 200, {"items": items}

    def _delete_instance(self, query: dict, body: dict, zone: str, name: str) -> tuple[int, dict]:
        if self.instances.pop((zone, name), None) is None:
            return _error(
                404,
                f"The resource 'projects/{PROJECT}/zones/{zone}/instances/{name}' was not found",
                "notFound",
            )
        self.deleted.append(name)
        return 200, self._operation(zone, name, kind="delete")

    def _skus(self, query: dict) -> tuple[int, dict]:
        """Two pages, to make the client follow nextPageToken."""
        if query.get("pageToken", [""])[0] == "page-2":
            return 200, {"skus": SKUS[len(SKUS) // 2 :], "nextPageToken": ""}
        return 200, {"skus": SKUS[: len(SKUS) // 2], "nextPageToken": "page-2"}


def _error(status: int, message: str, reason: str) -> tuple[int, dict]:
    return status, {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


def _handler(fake: FakeGcp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            storage = url.path.startswith(("/storage/v1", "/upload/storage/v1"))
            if self.headers.get("Authorization") != f"Bearer {fake.token}":
                # a careless server could echo the header: the adapter must scrub it
                echoed = self.headers.get("Authorization", "")
                status, answer = _error(
                    401, f"Invalid credentials: Authorization: {echoed}", "authError"
                )
            elif storage:
                with fake._lock:
                    fake.requests.append(f"{method} {url.path}")
                    status, answer = fake.storage.handle(method, url.path, parse_qs(url.query), raw)
            else:
                body = json.loads(raw or b"{}")
                status, answer = fake.handle(method, url.path, parse_qs(url.query), body)
            media = isinstance(answer, bytes)
            data = answer if media else json.dumps(answer).encode()
            self.send_response(status)
            kind = "application/octet-stream" if media else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

        def do_PATCH(self) -> None:  # noqa: N802
            self._serve("PATCH")

        def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
            return

    return Handler


def _invalid_firewall(rule: dict) -> str | None:
    """What GCE refuses in a firewall rule we send (its required fields)."""
    for key in ("name", "network"):
        if not rule.get(key):
            return f"Invalid value for field 'resource.{key}': ''. Must be set."
    if not rule.get("allowed") and not rule.get("denied"):
        return "Invalid value for field 'resource.allowed': ''. Must specify at least one rule."
    for allowed in rule.get("allowed", []):
        if allowed.get("IPProtocol") in ("tcp", "udp", "sctp") and not allowed.get("ports"):
            continue  # every port of the protocol
        for ports in allowed.get("ports", []):
            if not re.fullmatch(r"\d+(-\d+)?", ports):
                return f"Invalid value for field 'resource.allowed[].ports[]': '{ports}'."
    for source in rule.get("sourceRanges", []):
        if not re.fullmatch(r"\d+\.\d+\.\d+\.\d+/\d+", source):
            return f"Invalid value for field 'resource.sourceRanges[]': '{source}'."
    return None


def _invalid_accounts(body: dict) -> str | None:
    """GCE's rules for an instance's service accounts: at most one, an e-mail or ``default``,
    with scopes."""
    accounts = body.get("serviceAccounts", [])
    if len(accounts) > 1:
        return "Invalid value for field 'resource.serviceAccounts': at most one is allowed"
    for account in accounts:
        email = account.get("email", "")
        if email != "default" and not re.fullmatch(r"[^@\s]+@[^@\s]+\.gserviceaccount\.com", email):
            return f"Invalid value for field 'resource.serviceAccounts[0].email': '{email}'"
        if not account.get("scopes"):
            return "Invalid value for field 'resource.serviceAccounts[0].scopes': ''"
    return None


def _invalid_metadata(metadata: dict) -> str | None:
    """GCE's metadata limits: keys of [a-zA-Z0-9_-] up to 128 characters, each value up to
    256 KiB, all of them up to 512 KiB."""
    total = 0
    for item in metadata.get("items", []):
        key, value = item.get("key", ""), item.get("value", "")
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,128}", key):
            return f"Invalid value for field 'resource.metadata': metadata key {key!r}"
        size = len(value.encode())
        if size > 256 * 1024:
            return f"Metadata value for key {key!r} is {size} bytes; the limit is 262144"
        total += size
    if total > 512 * 1024:
        return f"Metadata is {total} bytes in all; the limit is 524288"
    return None
