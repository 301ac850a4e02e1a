"""Where the runtime reads data and writes checkpoints: a local folder, S3 or Google Cloud Storage,
behind one small API.

``open_store("/some/folder")``, ``open_store("s3://bucket/prefix")`` or
``open_store("gs://bucket/prefix")``. Local writes are atomic (temporary file in the same folder,
fsync, rename); S3 and GCS writes are atomic per object. boto3 is imported only for S3 URLs, and
google-auth only for GCS URLs (its JSON API over an authorized session: no client library beyond
what the GCP extra installs), each with its SDK's standard credential chain (a VM's instance role or
service account); ``endpoint_url`` points tests at moto's server or the GCP fake.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class StoreError(OSError):
    """A read or write failed: names the store, the key, and what to do."""


class ObjectStore(Protocol):
    url: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int | None:
        """The object's size in bytes, None when there is none."""

    def keys(self, prefix: str = "") -> Iterator[str]: ...

    def delete(self, key: str) -> None: ...


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise StoreError(f"key {key!r} leaves the store {self.url}")
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)  # atomic: readers see the old file or the new one
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"{self.url}: no {key!r}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else None

    def keys(self, prefix: str = "") -> Iterator[str]:
        for path in sorted(self.root.rglob("*")):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and not path.name.startswith(".") and key.startswith(prefix):
                yield key

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3Store:
    def __init__(
        self, bucket: str, prefix: str, *, endpoint_url: str | None = None, session=None
    ) -> None:
        """``session``: a boto3 session to use (its keys and region); None: boto3's default
        chain, as a VM finds its instance role's keys."""
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}"
        try:
            import boto3
        except ImportError:
            raise StoreError("S3 needs boto3: pip install 'geo-orchestrator[aws]'") from None
        self._client = (session or boto3).client("s3", endpoint_url=endpoint_url)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, key: str, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, what)(Bucket=self.bucket, **kwargs)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "?")
            raise StoreError(f"{self.url}: s3 {what} of {key!r} failed ({code})") from None
        except BotoCoreError as error:
            raise StoreError(
                f"{self.url}: s3 {what} of {key!r} failed ({type(error).__name__})"
            ) from None

    def put(self, key: str, data: bytes) -> None:
        self._call("put_object", key, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes:
        return self._call("get_object", key, Key=self._key(key))["Body"].read()

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError:
            return None
        return int(head["ContentLength"])

    def keys(self, prefix: str = "") -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        start = self._key(prefix)
        cut = len(self.prefix) + 1 if self.prefix else 0
        for page in paginator.paginate(Bucket=self.bucket, Prefix=start):
            for item in page.get("Contents", []):
                yield item["Key"][cut:]

    def delete(self, key: str) -> None:
        self._call("delete_object", key, Key=self._key(key))


class GcsStore:
    """Objects of a GCS bucket under a prefix, through the JSON API (storage/v1)."""

    SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"

    def __init__(
        self, bucket: str, prefix: str, *, endpoint_url: str | None = None, credentials=None
    ) -> None:
        """``credentials``: google-auth credentials to use; None: ``google.auth.default()`` (a
        VM's service account through its metadata server)."""
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}"
        self._api = (endpoint_url or "https://storage.googleapis.com").rstrip("/")
        try:
            import google.auth
            import google.auth.exceptions
            from google.auth.transport.requests import AuthorizedSession
        except ImportError:
            raise StoreError("GCS needs google-auth: pip install 'geo-orchestrator[gcp]'") from None
        if credentials is None:
            try:
                credentials, _ = google.auth.default(scopes=[self.SCOPE])
            except google.auth.exceptions.DefaultCredentialsError:
                raise StoreError(
                    f"{self.url}: google.auth.default() found no credentials "
                    "(gcloud auth application-default login, or a VM's service account)"
                ) from None
        self._session = AuthorizedSession(credentials)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _object(self, key: str) -> str:
        from urllib.parse import quote

        return f"{self._api}/storage/v1/b/{self.bucket}/o/{quote(self._key(key), safe='')}"

    def _call(self, what: str, key: str, method: str, url: str, *, missing_ok=False, **kwargs):
        import google.auth.exceptions
        import requests

        try:
            answer = self._session.request(method, url, timeout=60, **kwargs)
        except google.auth.exceptions.GoogleAuthError:  # a 401, and no way to a new token
            raise StoreError(f"{self.url}: gcs {what} of {key!r} failed (401)") from None
        except (requests.RequestException, OSError) as error:
            raise StoreError(
                f"{self.url}: gcs {what} of {key!r} failed ({type(error).__name__})"
            ) from None
        if answer.status_code >= 400 and not (missing_ok and answer.status_code == 404):
            raise StoreError(f"{self.url}: gcs {what} of {key!r} failed ({answer.status_code})")
        return answer

    def put(self, key: str, data: bytes) -> None:
        url = f"{self._api}/upload/storage/v1/b/{self.bucket}/o"
        self._call(
            "put",
            key,
            "POST",
            url,
            params={"uploadType": "media", "name": self._key(key)},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )

    def get(self, key: str) -> bytes:
        return self._call("get", key, "GET", self._object(key), params={"alt": "media"}).content

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        answer = self._call("size", key, "GET", self._object(key), missing_ok=True)
        return int(answer.json()["size"]) if answer.status_code == 200 else None

    def keys(self, prefix: str = "") -> Iterator[str]:
        cut = len(self.prefix) + 1 if self.prefix else 0
        params = {"prefix": self._key(prefix)}
        while True:
            url = f"{self._api}/storage/v1/b/{self.bucket}/o"
            page = self._call("list", prefix, "GET", url, params=params).json()
            for item in page.get("items", []):
                yield item["name"][cut:]
            if not page.get("nextPageToken"):
                return
            params = {**params, "pageToken": page["nextPageToken"]}

    def delete(self, key: str) -> None:
        self._call("delete", key, "DELETE", self._object(key), missing_ok=True)


def open_store(
    url: str, *, endpoint_url: str | None = None, session=None, credentials=None
) -> ObjectStore:
    """A store for ``url``: ``s3://bucket[/prefix]``, ``gs://bucket[/prefix]`` or a local
    folder. ``session``: a boto3 session (S3); ``credentials``: google-auth's (GCS)."""
    if url.startswith("gs://"):
        bucket, _, prefix = url[len("gs://") :].partition("/")
        if not bucket:
            raise StoreError(f"{url}: no bucket; write gs://bucket/prefix")
        return GcsStore(bucket, prefix, endpoint_url=endpoint_url, credentials=credentials)
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise StoreError(f"{url}: no bucket; write s3://bucket/prefix")
        return S3Store(bucket, prefix, endpoint_url=endpoint_url, session=session)
    return LocalStore(Path(url))
