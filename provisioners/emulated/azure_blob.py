"""Azure Blob Storage's REST API, the part a job uses, in memory: the Blob service of the emulated
Azure, and what tests point ``runtime.storage.AzureBlobStore`` at.

Put Blob (block blobs in one request), Get Blob, Get Blob Properties (HEAD), List Blobs (flat, by
prefix, in pages a client must follow through NextMarker) and Delete Blob, in containers that other
code makes (the ARM fake, or a test adding to ``containers``). As strict as the real service on what
a client sends: ``x-ms-version`` on every request, an ``Authorization: Bearer`` token the account
accepts, ``x-ms-blob-type: BlockBlob`` and a Content-Length on a put, ``restype=container&comp=list``
on a listing. Errors come as Azure sends them: an XML ``<Error><Code/><Message/></Error>`` body and
the code again in the ``x-ms-error-code`` header (the header alone on HEAD, which has no body).

``FakeBlobs.handle`` knows no transport. Its ``path`` is ``/<container>[/<blob>]``, already
percent-decoded (the transport decodes it, as the real front end does; a blob name keeps its '/'),
without the account, which comes apart. The emulated Azure's server (azure_wire.py) puts it on the
wire.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from xml.etree import ElementTree

BLOB_HOST = ".blob.core.windows.net"
MAX_RESULTS = 5000  # the most a List Blobs page holds, whatever maxresults asks

Answer = tuple[int, dict[str, str], bytes]

# The error codes the fake answers with: their status and the message Azure writes.
ERRORS = {
    "MissingRequiredHeader": (
        400,
        "An HTTP header that's mandatory for this request is not specified.",
    ),
    "InvalidHeaderValue": (
        400,
        "The value for one of the HTTP headers is not in the correct format.",
    ),
    "InvalidQueryParameterValue": (
        400,
        "Value for one of the query parameters specified in the request URI is invalid.",
    ),
    "OutOfRangeQueryParameterValue": (
        400,
        "One of the query parameters specified in the request URI is outside the permissible range.",
    ),
    "InvalidUri": (400, "The requested URI does not represent any resource on the server."),
    "NoAuthenticationInformation": (
        401,
        "Server failed to authenticate the request. Please refer to the information in the www-authenticate header.",
    ),
    "AuthorizationPermissionMismatch": (
        403,
        "This request is not authorized to perform this operation using this permission.",
    ),
    "ContainerNotFound": (404, "The specified container does not exist."),
    "BlobNotFound": (404, "The specified blob does not exist."),
    "UnsupportedHttpVerb": (405, "The resource doesn't support specified Http Verb."),
    "MissingContentLengthHeader": (411, "Content-Length HTTP header is missing."),
}


def _any_token(token: str, account: str) -> bool:
    return bool(token)


@dataclass
class FakeBlobs:
    """The Blob service of every storage account of an emulated Azure."""

    containers: set[tuple[str, str]] = field(default_factory=set)  # (account, container)
    blobs: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # (acct, cont, name)
    authorize: Callable[[str, str], bool] = _any_token  # (bearer token, account) -> allowed
    page_size: int = 2  # blobs per List Blobs page: small, so that clients must follow NextMarker
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def handle(
        self,
        method: str,
        account: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        body: bytes,
    ) -> Answer:
        """(status, headers, body) for one request. ``query`` as ``parse_qs(...,
        keep_blank_values=True)`` gives it; header names in any case. A HEAD answer carries the
        Content-Length its GET would have, and no body."""
        headers = {name.lower(): value for name, value in headers.items()}
        with self._lock:  # a threaded server calls in concurrently
            status, sent, data = self._answer(method, account, path, query, headers, body)
        sent = {"x-ms-request-id": str(uuid.uuid4()), "Content-Length": str(len(data)), **sent}
        if headers.get("x-ms-version"):  # Azure answers in the version asked for, and says so
            sent["x-ms-version"] = headers["x-ms-version"]
        return status, sent, b"" if method == "HEAD" else data

    def _answer(
        self, method: str, account: str, path: str, query: dict, headers: dict, body: bytes
    ) -> Answer:
        if not headers.get("x-ms-version"):
            return _error("MissingRequiredHeader", HeaderName="x-ms-version")
        bearer = re.fullmatch(r"Bearer (\S+)", headers.get("authorization", ""))
        if bearer is None:
            status, sent, data = _error("NoAuthenticationInformation")
            sent["WWW-Authenticate"] = "Bearer resource_id=https://storage.azure.com"
            return status, sent, data
        if not self.authorize(bearer.group(1), account):
            return _error("AuthorizationPermissionMismatch")
        container, _, name = path.removeprefix("/").partition("/")
        if not container:  # List Containers and the account's properties: not what a job sends
            return _error("InvalidUri")
        if (account, container) not in self.containers:
            return _error("ContainerNotFound")
        if not name:
            return self._list(method, account, container, query)
        if method not in ("PUT", "GET", "HEAD", "DELETE"):
            return _error("UnsupportedHttpVerb")
        if "comp" in query:  # Put Block, Set Blob Metadata, ...: not what a job sends
            return _error("InvalidQueryParameterValue", QueryParameterName="comp")
        if method == "PUT":
            return self._put(account, container, name, headers, body)
        data = self.blobs.get((account, container, name))
        if data is None:
            return _error("BlobNotFound")
        if method == "DELETE":
            del self.blobs[(account, container, name)]
            return 202, {}, b""
        kind = {"Content-Type": "application/octet-stream", "x-ms-blob-type": "BlockBlob"}
        return 200, kind, data

    def _put(self, account: str, container: str, name: str, headers: dict, body: bytes) -> Answer:
        kind = headers.get("x-ms-blob-type")
        if kind is None:
            return _error("MissingRequiredHeader", HeaderName="x-ms-blob-type")
        if kind != "BlockBlob":  # page and append blobs exist, but a job writes block blobs
            return _error("InvalidHeaderValue", HeaderName="x-ms-blob-type", HeaderValue=kind)
        if "content-length" not in headers:
            return _error("MissingContentLengthHeader")
        self.blobs[(account, container, name)] = bytes(body)
        return 201, {}, b""

    def _list(self, method: str, account: str, container: str, query: dict) -> Answer:
        asked = {key: values[0] for key, values in query.items()}
        if method != "GET" or asked.get("restype") != "container" or asked.get("comp") != "list":
            return _error("InvalidUri")  # of a container's operations, the fake has List Blobs
        prefix, marker = asked.get("prefix", ""), asked.get("marker", "")
        wanted = asked.get("maxresults", str(MAX_RESULTS))
        if not wanted.isdigit() or int(wanted) <= 0:
            return _error("OutOfRangeQueryParameterValue", QueryParameterName="maxresults")
        names = sorted(
            n
            for (a, c, n) in self.blobs
            if (a, c) == (account, container) and n.startswith(prefix) and n >= marker
        )
        page = min(int(wanted), MAX_RESULTS, self.page_size)
        # the marker names where the next page starts: it survives deletes between pages
        following = names[page] if len(names) > page else ""
        root = ElementTree.Element(
            "EnumerationResults",
            ServiceEndpoint=f"https://{account}{BLOB_HOST}/",
            ContainerName=container,
        )
        ElementTree.SubElement(root, "Prefix").text = prefix
        ElementTree.SubElement(root, "Marker").text = marker
        if "maxresults" in asked:
            ElementTree.SubElement(root, "MaxResults").text = wanted
        listed = ElementTree.SubElement(root, "Blobs")
        for name in names[:page]:
            blob = ElementTree.SubElement(listed, "Blob")
            ElementTree.SubElement(blob, "Name").text = name
            properties = ElementTree.SubElement(blob, "Properties")
            size = str(len(self.blobs[(account, container, name)]))
            ElementTree.SubElement(properties, "Content-Length").text = size
            ElementTree.SubElement(properties, "Content-Type").text = "application/octet-stream"
            ElementTree.SubElement(properties, "BlobType").text = "BlockBlob"
        ElementTree.SubElement(root, "NextMarker").text = following  # empty: the last page
        return 200, {"Content-Type": "application/xml"}, _xml(root)


def _xml(root: ElementTree.Element) -> bytes:
    text = ElementTree.tostring(root, encoding="unicode")
    return b'<?xml version="1.0" encoding="utf-8"?>' + text.encode()


def _error(code: str, **detail: str) -> Answer:
    """Azure's error answer for ``code``; ``detail``: the elements it adds (HeaderName, ...)."""
    status, message = ERRORS[code]
    root = ElementTree.Element("Error")
    ElementTree.SubElement(root, "Code").text = code
    ElementTree.SubElement(root, "Message").text = message
    for name, value in detail.items():
        ElementTree.SubElement(root, name).text = value
    return status, {"Content-Type": "application/xml", "x-ms-error-code": code}, _xml(root)
