"""A small, strict fake of the SkyPilot API server (``sky api start``), on 127.0.0.1.

The real ``sky`` client (``sky.client.sdk``) talks to it when ``SKYPILOT_API_SERVER_ENDPOINT`` is set
to ``fake.url``. It serves only what the adapter's credential check needs, in the wire format of
SkyPilot 0.14 (``sky/server/server.py``, ``sky/server/requests/requests.py``):

- ``GET /api/health``: a healthy server of the client's own build (it echoes the client's
  ``X-SkyPilot-API-Version`` / ``X-SkyPilot-Version`` unless told other versions), so the client's
  compatibility check passes and it neither warns nor tries to start a local server;
- ``POST /check``: records the body (``clouds``, ``verbose``, ``workspace``) and schedules a request
  whose result is ``check_result``, e.g. ``{"default": {"AWS": ["compute"], "GCP": []}}``; the
  request id comes back in the ``X-Skypilot-Request-ID`` header, as from the real server;
- ``GET /api/status?request_ids=...``: the requests' display payloads; a request reads RUNNING for
  ``polls_before_done`` looks, then SUCCEEDED (or stays RUNNING for ever with ``finishes=False``);
- ``GET /api/get?request_id=...``: the full payload with the JSON-encoded return value (the real
  server blocks until the request ends; so does this one, up to ``get_wait_s``);
- ``POST /api/cancel``: cancels the named requests and records them.

Every request must carry the client's version headers (400 otherwise), and every other method or
path is answered 404, so a protocol change in a new SkyPilot shows up as a failing test rather than a
silently different conversation. ``received`` lists every request in order.
"""

from __future__ import annotations

import base64
import json
import pickle
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

API_VERSION_HEADER = "X-SkyPilot-API-Version"
VERSION_HEADER = "X-SkyPilot-Version"
REQUEST_ID_HEADER = "X-Skypilot-Request-ID"
USER_ID = "fake-user"
ACTIVE = ("PENDING", "WAITING", "RUNNING")
# The real server pickles the entrypoint and request body; the client unpickles them for
# bookkeeping only, so a pickled None keeps this fake free of SkyPilot's classes.
_PICKLED_NONE = base64.b64encode(pickle.dumps(None)).decode()


@dataclass(frozen=True)
class Received:
    """One HTTP request the fake got."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any  # the parsed JSON body, or None
    headers: dict[str, str]


@dataclass
class _Request:
    """One scheduled SkyPilot request (``check`` or ``api_cancel``)."""

    request_id: str
    name: str
    body: dict[str, Any]
    return_value: Any
    finishes: bool
    polls_left: int
    status: str = "PENDING"
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def payload(self, *, full: bool) -> dict[str, Any]:
        """``Request.encode()`` (full, for /api/get) or ``readable_encode()`` (for /api/status)."""
        return {
            "request_id": self.request_id,
            "name": self.name,
            "entrypoint": _PICKLED_NONE if full else self.name,
            "request_body": _PICKLED_NONE if full else json.dumps(self.body),
            "status": self.status,
            "created_at": self.created_at,
            "user_id": USER_ID,
            "user_name": USER_ID,
            "return_value": json.dumps(self.return_value if full else None),
            "error": json.dumps(None),
            "pid": None,
            "schedule_type": "short",
            "cluster_name": None,
            "status_msg": None,
            "should_retry": False,
            "finished_at": self.finished_at,
            "file_mounts_blob_id": None,
        }


class _Refused(Exception):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class FakeSkyApiServer:
    """The fake API server; use as a context manager (``with FakeSkyApiServer(...) as fake``)."""

    def __init__(
        self,
        *,
        check_result: Any = None,
        polls_before_done: int = 1,
        finishes: bool = True,
        api_version: int | None = None,
        version: str | None = None,
        get_wait_s: float = 5.0,
    ) -> None:
        self.check_result = check_result if check_result is not None else {"default": {}}
        self.polls_before_done = polls_before_done
        self.finishes = finishes
        self.api_version, self.version = api_version, version
        self.get_wait_s = get_wait_s
        self.received: list[Received] = []
        self.requests: dict[str, _Request] = {}
        self._changed = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeSkyApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # ---- what the tests read ------------------------------------------------------------------

    def paths(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.received]

    def bodies(self, path: str) -> list[Any]:
        return [r.body for r in self.received if r.path == path]

    def queries(self, path: str) -> list[dict[str, list[str]]]:
        return [r.query for r in self.received if r.path == path]

    # ---- the endpoints ------------------------------------------------------------------------

    def serve(self, got: Received) -> tuple[int, Any, dict[str, str]]:
        """(HTTP status, JSON body, extra headers) for one request."""
        if got.method == "GET" and got.path == "/api/health":
            return 200, self._health(got), {}
        if got.method == "POST" and got.path == "/check":
            body = _object(got.body, "clouds", "verbose")
            clouds = body.get("clouds")
            if clouds is not None and not (
                isinstance(clouds, list) and all(isinstance(c, str) for c in clouds)
            ):
                raise _Refused(422, f"clouds must be a list of names or null, not {clouds!r}")
            if not isinstance(body.get("verbose", False), bool):
                raise _Refused(422, "verbose must be a boolean")
            request = self._schedule("check", body, self.check_result, finishes=self.finishes)
            return 200, None, {REQUEST_ID_HEADER: request.request_id}
        if got.method == "GET" and got.path == "/api/status":
            return 200, self._status(got.query), {}
        if got.method == "GET" and got.path == "/api/get":
            return self._get(got.query)
        if got.method == "POST" and got.path == "/api/cancel":
            body = _object(got.body, "request_ids")
            cancelled = self._cancel(body.get("request_ids"))
            request = self._schedule("api_cancel", body, cancelled, finishes=True, polls=0)
            return 200, None, {REQUEST_ID_HEADER: request.request_id}
        raise _Refused(404, f"the fake SkyPilot API server does not serve {got.method} {got.path}")

    def _health(self, got: Received) -> dict[str, Any]:
        api_version, version = self._versions(got.headers)
        return {
            "status": "healthy",
            "api_version": str(api_version),
            "version": version,
            "version_on_disk": version,
            "commit": "fake",
            "basic_auth_enabled": False,
            "user": None,
        }

    def _versions(self, headers: dict[str, str]) -> tuple[int, str]:
        """The versions this server claims: those given, else the calling client's own."""
        return (
            self.api_version or int(headers[API_VERSION_HEADER.lower()]),
            self.version or headers[VERSION_HEADER.lower()],
        )

    def _schedule(
        self,
        name: str,
        body: dict[str, Any],
        result: Any,
        *,
        finishes: bool,
        polls: int | None = None,
    ) -> _Request:
        request = _Request(
            request_id=str(uuid.uuid4()),
            name=name,
            body=body,
            return_value=result,
            finishes=finishes,
            polls_left=self.polls_before_done if polls is None else polls,
        )
        with self._changed:
            self.requests[request.request_id] = request
        if polls == 0 and finishes:
            self._end(request, "SUCCEEDED")
        return request

    def _end(self, request: _Request, status: str) -> None:
        with self._changed:
            if request.status in ACTIVE:
                request.status, request.finished_at = status, time.time()
            self._changed.notify_all()

    def _matching(self, prefix: str) -> list[_Request]:
        with self._changed:
            return [r for k, r in self.requests.items() if k.startswith(prefix)]

    def _status(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        if "request_ids" in query:
            found = [r for prefix in query["request_ids"] for r in self._matching(prefix)]
        else:
            all_status = query.get("all_status", ["false"])[-1].lower() == "true"
            found = [r for r in self._matching("") if all_status or r.status in ACTIVE]
        for request in found:
            self._advance(request)
        return [r.payload(full=False) for r in found]

    def _advance(self, request: _Request) -> None:
        """One look at a request: RUNNING while it has looks left, then SUCCEEDED if it ends."""
        with self._changed:
            if request.status not in ACTIVE:
                return
            if request.polls_left > 0:
                request.polls_left -= 1
                request.status = "RUNNING"
            elif request.finishes:
                self._end(request, "SUCCEEDED")

    def _get(self, query: dict[str, list[str]]) -> tuple[int, Any, dict[str, str]]:
        if set(query) != {"request_id"} or len(query["request_id"]) != 1:
            raise _Refused(422, "GET /api/get takes exactly one request_id")
        found = self._matching(query["request_id"][0])
        if not found:
            raise _Refused(404, f"Request {query['request_id'][0]!r} not found")
        if len(found) > 1:
            raise _Refused(400, f"Request ID prefix {query['request_id'][0]!r} is ambiguous")
        (request,) = found
        if request.finishes:
            self._end(request, "SUCCEEDED")  # the real server waits for the request to end
        with self._changed:
            ended = self._changed.wait_for(
                lambda: request.status not in ACTIVE, timeout=self.get_wait_s
            )
        if not ended:
            raise _Refused(504, f"the fake's request {request.request_id} never ends")
        return 200, request.payload(full=True), {}

    def _cancel(self, request_ids: Any) -> list[str]:
        if not (isinstance(request_ids, list) and all(isinstance(r, str) for r in request_ids)):
            raise _Refused(422, "the fake cancels named requests only (request_ids: [...])")
        cancelled = []
        for prefix in request_ids:
            for request in self._matching(prefix):
                if request.status in ACTIVE:
                    self._end(request, "CANCELLED")
                    cancelled.append(request.request_id)
        return cancelled


def _object(body: Any, *required: str) -> dict[str, Any]:
    """The JSON object body, which must hold ``required`` (other fields are ignored, as pydantic
    does on the real server: SkyPilot adds common fields to every body from release to release)."""
    if not isinstance(body, dict):
        raise _Refused(422, "the body must be a JSON object")
    missing = [key for key in required if key not in body]
    if missing:
        raise _Refused(422, f"missing body fields {missing}")
    return body


def _handler(fake: FakeSkyApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's pooled session expects

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def do_PUT(self) -> None:
            self._answer()

        def do_DELETE(self) -> None:
            self._answer()

        def _answer(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            extra: dict[str, str] = {}
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            got = Received(
                self.command, url.path, parse_qs(url.query, keep_blank_values=True), body, headers
            )
            fake.received.append(got)
            try:
                if (
                    API_VERSION_HEADER.lower() not in headers
                    or VERSION_HEADER.lower() not in headers
                ):
                    raise _Refused(
                        400,
                        {
                            "error": "version_mismatch",
                            "message": "the fake wants the client's "
                            f"{API_VERSION_HEADER} and {VERSION_HEADER} headers",
                        },
                    )
                status, answer, extra = fake.serve(got)
            except _Refused as refused:
                status, answer = refused.status, refused.detail
                if not isinstance(answer, dict):
                    answer = {"detail": answer}
            except Exception as error:  # a bug in the fake: say so, never hang the client
                status, answer = 500, {"detail": f"fake server error: {error!r}"}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if API_VERSION_HEADER.lower() in headers and VERSION_HEADER.lower() in headers:
                api_version, version = fake._versions(headers)
                self.send_header(API_VERSION_HEADER, str(api_version))
                self.send_header(VERSION_HEADER, version)
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler
