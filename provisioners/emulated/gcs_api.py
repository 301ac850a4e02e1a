"""Google Cloud Storage's JSON API, the part a job uses, in memory (served by the GCP fake).

Buckets (``buckets.get`` / ``buckets.insert``) and their objects (media upload, ``objects.get``
with or without ``alt=media``, ``objects.list`` by prefix with pages, ``objects.delete``). As strict
as GCS on what we send: a bucket name of 3-63 lowercase letters, digits, '-', '_' and '.', starting
and ending with a letter or digit; a location on insert; an object name on upload; 404 for what is
not there; 409 for a bucket that exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

PAGE = 2  # objects per list page: small, so that a client must follow pageToken
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")


@dataclass
class FakeGcs:
    buckets: dict[str, dict] = field(default_factory=dict)  # name -> its resource
    objects: dict[str, dict[str, bytes]] = field(default_factory=dict)  # bucket -> name -> data

    def handle(self, method: str, path: str, query: dict, raw: bytes) -> tuple[int, object]:
        """(status, a JSON answer or the bytes of an object)."""
        if path == "/storage/v1/b" and method == "POST":
            return self._insert_bucket(query, raw)
        if path == "/storage/v1/b" and method == "GET":
            if not query.get("project"):
                return _invalid("Required parameter: project")
            prefix = query.get("prefix", [""])[0]
            items = [b for n, b in sorted(self.buckets.items()) if n.startswith(prefix)]
            return 200, {"kind": "storage#buckets", "items": items}
        match = re.fullmatch(r"/storage/v1/b/([^/]+)", path)
        if match and method == "GET":
            found = self.buckets.get(match.group(1))
            return (200, found) if found else _missing("bucket", match.group(1))
        match = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", path)
        if match and method == "POST":
            return self._upload(match.group(1), query, raw)
        match = re.fullmatch(r"/storage/v1/b/([^/]+)/o", path)
        if match and method == "GET":
            return self._list(match.group(1), query)
        match = re.fullmatch(r"/storage/v1/b/([^/]+)/o/(.+)", path)
        if match:
            bucket, name = match.group(1), unquote(match.group(2))
            return self._object(method, bucket, name, query)
        return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}

    def _insert_bucket(self, query: dict, raw: bytes) -> tuple[int, object]:
        import json

        body = json.loads(raw or b"{}")
        name = body.get("name", "")
        if not query.get("project"):
            return _invalid("Required parameter: project")
        if not BUCKET_NAME.fullmatch(name):
            return _invalid(f"Invalid bucket name: '{name}'")
        if not body.get("location"):
            return _invalid("a bucket's location is required by this API's callers")
        if name in self.buckets:
            return 409, {"error": {"code": 409, "message": "Your previous request to create "
                         "the named bucket succeeded and you already own it."}}  # fmt: skip
        self.buckets[name] = {"kind": "storage#bucket", **body}
        self.objects[name] = {}
        return 200, self.buckets[name]

    def _upload(self, bucket: str, query: dict, raw: bytes) -> tuple[int, object]:
        if bucket not in self.buckets:
            return _missing("bucket", bucket)
        if query.get("uploadType", [""])[0] != "media" or not query.get("name"):
            return _invalid("uploadType=media and name are required")
        name = query["name"][0]
        self.objects[bucket][name] = raw
        return 200, _resource(bucket, name, raw)

    def _list(self, bucket: str, query: dict) -> tuple[int, object]:
        if bucket not in self.buckets:
            return _missing("bucket", bucket)
        prefix = query.get("prefix", [""])[0]
        names = sorted(n for n in self.objects[bucket] if n.startswith(prefix))
        start = int(query.get("pageToken", ["0"])[0])
        page = names[start : start + PAGE]
        answer: dict = {
            "kind": "storage#objects",
            "items": [_resource(bucket, n, self.objects[bucket][n]) for n in page],
        }
        if start + PAGE < len(names):
            answer["nextPageToken"] = str(start + PAGE)
        return 200, answer

    def _object(self, method: str, bucket: str, name: str, query: dict) -> tuple[int, object]:
        held = self.objects.get(bucket, {})
        if name not in held:
            return _missing("object", f"{bucket}/{name}")
        if method == "DELETE":
            del held[name]
            return 204, b""
        if query.get("alt", [""])[0] == "media":
            return 200, held[name]
        return 200, _resource(bucket, name, held[name])


def _resource(bucket: str, name: str, data: bytes) -> dict:
    return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data))}


def _missing(what: str, name: str) -> tuple[int, dict]:
    return 404, {"error": {"code": 404, "message": f"No such {what}: {name}"}}


def _invalid(message: str) -> tuple[int, dict]:
    return 400, {"error": {"code": 400, "message": message}}
