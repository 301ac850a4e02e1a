"""The Azure fake over the wire, for the emulated Azure (azure.py): ``serve`` answers on a VM of the
job's simulated internet, ``RelayTransport`` is an azure-core client's side in another process.

An SDK request is relayed: sent to the server with its real URL (ARM, Retail Prices) in a header,
so the real SDK builds every request and the fake answers it. A request without that header is
Blob Storage's: host style (the account's ``<account>.blob.core.windows.net`` in Host, as the
real service) or path style as Azurite takes it (``/<account>/<container>/<blob>``: what
runtime/storage.py sends to an ``endpoint_url``).
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest

from provisioners.emulated.azure_api import BLOBS, FakeAzure, raw_response

RELAY_URL_HEADER = "X-Relay-Url"  # the request's real URL (ARM, Retail Prices), relayed as a header


def serve(cloud: FakeAzure, *, host: str, port: int, listen=None):
    """An HTTP server that answers relayed requests from ``cloud``; ``listen(make)``: where its
    socket is made (a VM's network). Returns the server (its ``shutdown`` stops it)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k != RELAY_URL_HEADER}
            url = self.headers.get(RELAY_URL_HEADER) or _blob_url(
                self.path, self.headers.get("Host") or ""
            )
            request = HttpRequest(self.command, url, headers=headers, content=body)
            response = cloud.handle(request)
            head = self.command == "HEAD"  # its Content-Length is the blob's, and no body
            data = b"" if head else (response.content or b"")
            self.send_response(response.status_code)
            for name, value in response.headers.items():
                if head or name.lower() != "content-length":
                    self.send_header(name, value)
            if not head:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _relay  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
            return None

    make = lambda: ThreadingHTTPServer((host, port), Handler)  # noqa: E731
    server = make() if listen is None else listen(make)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


class RelayTransport(HttpTransport):
    """An azure-core transport that sends every request to ``endpoint`` (``serve``), its real URL in
    a header: the real SDK builds the requests, the emulated cloud answers them."""

    def __init__(self, endpoint: str, *, timeout_s: float = 30.0) -> None:
        self.endpoint, self.timeout_s = endpoint, timeout_s

    def send(self, request: HttpRequest, **kwargs: Any):
        import urllib.error
        import urllib.request

        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        data = request.content
        relayed = urllib.request.Request(
            self.endpoint,
            data=(data.encode() if isinstance(data, str) else data) or None,
            headers={**headers, RELAY_URL_HEADER: request.url},
            method=request.method,
        )
        try:
            with urllib.request.urlopen(relayed, timeout=self.timeout_s) as answer:
                status, body, reply_headers = answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as error:
            status, body, reply_headers = error.code, error.read(), dict(error.headers)
        return raw_response(request, status, body, reply_headers)

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> RelayTransport:
        return self

    def __exit__(self, *args: Any) -> None:
        return None


def _blob_url(path: str, host: str) -> str:
    """A Blob Storage request's URL as the service's own host names it: host style (the real
    service's name in Host) or path style (``/<account>/...``)."""
    split = urlsplit(path)
    named = host.split(":")[0]
    if named.endswith(BLOBS):
        account, rest = named.removesuffix(BLOBS), split.path.lstrip("/")
    else:
        account, _, rest = split.path.lstrip("/").partition("/")
    query = f"?{split.query}" if split.query else ""
    return f"https://{account}{BLOBS}/{rest}{query}"
