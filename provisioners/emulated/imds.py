"""A cloud's instance metadata service for one emulated VM, served inside the VM's network.

The VM's loopback gets 169.254.169.254, as every EC2 and GCE instance reaches it, and a small HTTP
server bound there in the VM's namespace answers what a node asks of it.

- EC2 (IMDSv2, ``InstanceMetadata``): a session token (``PUT /latest/api/token``), then, with that
  token only, ``instance-id``, ``ami-launch-index``, ``placement/availability-zone`` and
  ``spot/instance-action`` (404 until a notice is given, then ``{"action": "terminate", "time":
  ...}``, as EC2 does two minutes before a spot reclaim), and for an instance launched with an
  instance profile ``iam/security-credentials/<role>``: keys made for the instance, which the
  SDKs' credential chains find as they find a real instance role's (the emulated API accepts
  any key).
- GCE (``GceMetadata``): only with ``Metadata-Flavor: Google`` (403 without, as GCE answers),
  ``/computeMetadata/v1/instance/`` ``id``, ``name``, ``zone`` and ``preempted`` (``FALSE``, then
  ``TRUE`` from the preemption notice on, about 30 s before the VM stops).
- Azure (``AzureMetadata``): only with ``Metadata: true``, Scheduled Events
  (``/metadata/scheduledevents``): none, then a ``Preempt`` event for this VM with its
  ``NotBefore`` (about 30 s before a Spot eviction); ``/metadata/instance/compute`` (its name,
  resource group, subscription, location); and for a VM with a managed identity
  ``/metadata/identity/oauth2/token?resource=...``: a token for it, as azure-identity's
  ``ManagedIdentityCredential`` asks (400 ``identity not found`` on a VM without one).
"""

from __future__ import annotations

import http.server
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioners.local import netns

ADDRESS = "169.254.169.254"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"


@dataclass
class InstanceMetadata:
    instance_id: str
    launch_index: int
    zone: str
    notice_at_s: float | None = None  # the reclaim time once a notice is given (Unix s)
    tokens: set[str] = field(default_factory=set)
    role: str | None = None  # the instance profile's role, if it was launched with one
    keys: dict[str, str] = field(default_factory=dict, repr=False)

    def notice(self, at_s: float) -> None:
        """A spot reclaim at ``at_s``: ``spot/instance-action`` answers from now on."""
        self.notice_at_s = at_s

    def answer(self, path: str) -> str | None:
        base = "/latest/meta-data/"
        if not path.startswith(base):
            return None
        key = path[len(base) :]
        if key.startswith("iam/security-credentials/"):
            return self._role_keys(key[len("iam/security-credentials/") :])
        if key == "spot/instance-action":
            if self.notice_at_s is None:
                return None
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.notice_at_s))
            return json.dumps({"action": "terminate", "time": when})
        return {
            "instance-id": self.instance_id,
            "ami-launch-index": str(self.launch_index),
            "placement/availability-zone": self.zone,
        }.get(key)

    def _role_keys(self, role: str) -> str | None:
        if self.role is None:
            return None
        if not role:
            return self.role  # the listing: the role's name
        if role != self.role:
            return None
        if not self.keys:
            self.keys = {
                "AccessKeyId": "ASIA" + secrets.token_hex(8).upper(),
                "SecretAccessKey": secrets.token_urlsafe(30),
                "Token": secrets.token_urlsafe(60),
            }
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 6 * 3600))
        return json.dumps(
            {"Code": "Success", "Type": "AWS-HMAC", **self.keys, "Expiration": expires}
        )


class _Quiet(http.server.BaseHTTPRequestHandler):
    """Replies with a text body and logs nothing."""

    extra_headers: dict[str, str] = {}

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        for name, value in self.extra_headers.items():
            self.send_header(name, value)
        # as the real services type their answers (google-auth reads the header to parse them)
        kind = "application/json" if body.startswith(("{", "[")) else "application/text"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        return None


def _handler(metadata: InstanceMetadata) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path != "/latest/api/token" or not self.headers.get(TTL_HEADER):
                self._reply(400, "")
                return
            token = secrets.token_urlsafe(24)
            metadata.tokens.add(token)
            self._reply(200, token)

        def do_GET(self) -> None:  # noqa: N802
            if self.headers.get(TOKEN_HEADER) not in metadata.tokens:
                self._reply(401, "")  # IMDSv2 only, as our launches ask
                return
            text = metadata.answer(self.path)
            self._reply(404 if text is None else 200, text or "")

    return Handler


@dataclass
class GceMetadata:
    instance_id: str
    name: str
    zone: str
    project_number: str = "123456789012"
    preempted: bool = False
    project_id: str = ""
    external_ip: str = ""
    # the instance's service account, if it has one: its e-mail and the token its metadata
    # hands out (the emulated API's own bearer token: what the API accepts)
    service_account: str | None = None
    token: str | None = field(default=None, repr=False)

    def notice(self, at_s: float) -> None:
        """A preemption: ``instance/preempted`` reads TRUE from now on."""
        self.preempted = True

    def answer(self, path: str) -> str | None:
        path = path.split("?", 1)[0]
        if path in ("", "/"):
            return ""  # google-auth's ping: is this GCE?
        if path == "/computeMetadata/v1/project/project-id":
            return self.project_id or None
        base = "/computeMetadata/v1/instance/"
        if not path.startswith(base):
            return None
        key = path[len(base) :]
        if key.startswith("service-accounts/"):
            return self._account(key[len("service-accounts/") :].rstrip("/"))
        return {
            "id": self.instance_id,
            "name": self.name,
            "zone": f"projects/{self.project_number}/zones/{self.zone}",
            "preempted": "TRUE" if self.preempted else "FALSE",
            "network-interfaces/0/access-configs/0/external-ip": self.external_ip or None,
        }.get(key)

    def _account(self, key: str) -> str | None:
        if self.service_account is None or self.token is None:
            return None
        account, _, what = key.partition("/")
        if account not in ("default", self.service_account):
            return None
        if what == "":  # ?recursive=true: the account's description
            scopes = ["https://www.googleapis.com/auth/cloud-platform"]
            return json.dumps(
                {"email": self.service_account, "scopes": scopes, "aliases": ["default"]}
            )
        if what == "token":
            return json.dumps(
                {"access_token": self.token, "expires_in": 3599, "token_type": "Bearer"}
            )
        return {"email": self.service_account}.get(what)


@dataclass
class AzureMetadata:
    name: str
    evict_at_s: float | None = None
    compute: dict = field(default_factory=dict)  # /metadata/instance/compute
    mint: Callable[[], str | None] | None = None  # a token for the VM's identity, None: none

    def token(self, query: dict[str, list[str]]) -> tuple[int, str]:
        resource = (query.get("resource") or [""])[0]
        token = self.mint() if self.mint is not None and resource else None
        if token is None:
            why = "resource is required" if not resource else "Identity not found"
            return 400, json.dumps({"error": "invalid_request", "error_description": why})
        now = int(time.time())
        return 200, json.dumps(
            {
                "access_token": token,
                "expires_in": "3599",
                "expires_on": str(now + 3599),
                "ext_expires_in": "3599",
                "not_before": str(now),
                "resource": resource,
                "token_type": "Bearer",
            }
        )

    def notice(self, at_s: float) -> None:
        """A Spot eviction at ``at_s``: a ``Preempt`` scheduled event from now on."""
        self.evict_at_s = at_s

    def answer(self, path: str) -> str | None:
        if path.startswith("/metadata/instance/compute"):
            return json.dumps(self.compute)
        if not path.startswith("/metadata/scheduledevents"):
            return None
        events = []
        if self.evict_at_s is not None:
            events.append(
                {
                    "EventId": f"evict-{self.name}",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": [self.name],
                    "EventStatus": "Scheduled",
                    "NotBefore": time.strftime(
                        "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(self.evict_at_s)
                    ),
                    "EventSource": "Platform",
                }
            )
        return json.dumps({"DocumentIncarnation": len(events), "Events": events})


def _azure_handler(metadata: AzureMetadata) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.headers.get("Metadata") != "true":
                self._reply(400, '{"error": "Bad request. Required metadata header not specified"}')
                return
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/metadata/identity/oauth2/token":
                self._reply(*metadata.token(urllib.parse.parse_qs(url.query)))
                return
            text = metadata.answer(self.path)
            self._reply(404 if text is None else 200, text or "")

    return Handler


def _gce_handler(metadata: GceMetadata) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        extra_headers = {"Metadata-Flavor": "Google"}

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.headers.get("Metadata-Flavor") != "Google":
                self._reply(403, "Missing Metadata-Flavor:Google header.")
                return
            text = metadata.answer(self.path)
            self._reply(404 if text is None else 200, text or "")

    return Handler


class MetadataService:
    """The metadata server of one VM; ``close`` stops it (removing the VM removes the address)."""

    def __init__(
        self, vm: netns.Vm, metadata: InstanceMetadata | GceMetadata | AzureMetadata
    ) -> None:
        self.metadata = metadata
        netns.run_in(vm, ["ip", "address", "add", f"{ADDRESS}/32", "dev", "lo"])
        handlers = {GceMetadata: _gce_handler, AzureMetadata: _azure_handler}
        handler = handlers.get(type(metadata), _handler)(metadata)
        # the listening socket is made inside the VM's network; it serves from any thread
        self._server = netns.in_namespace(
            vm.netns, lambda: http.server.ThreadingHTTPServer((ADDRESS, 80), handler)
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"imds-{vm.name}", daemon=True
        )
        self._thread.start()

    def notice(self, at_s: float) -> None:
        self.metadata.notice(at_s)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
