"""Where the runtime reads data and writes checkpoints: a local folder, S3, Google Cloud Storage or
Azure Blob Storage, behind one small API.

``open_store("/some/folder")``, ``open_store("s3://bucket/prefix")``,
``open_store("gs://bucket/prefix")`` or
``open_store("https://account.blob.core.windows.net/container/prefix")`` (the URL the Azure portal
shows). Local writes are atomic (temporary file in the same folder, fsync, rename); S3, GCS and Azure
writes are atomic per object. boto3 is imported only for S3 URLs, google-auth only for GCS URLs (its
JSON API over an authorized session: no client library beyond what the GCP extra installs) and
azure-identity only for Azure URLs (the Blob REST API with an Entra ID token: no storage SDK), each
with its SDK's standard credential chain (a VM's instance role, service account or managed
identity); ``endpoint_url`` points tests at moto's server, the GCP fake or the Blob fake
(provisioners/emulated/azure_blob.py), and Azure at Azurite too.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, unquote, urlsplit, urlunsplit

AZURE_BLOB_HOST = ".blob.core.windows.net"


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

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of the object from byte ``start`` (fewer at its end)."""
        try:
            with self._path(key).open("rb") as handle:
                handle.seek(start)
                return handle.read(length)
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

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of the object from byte ``start`` (one ranged GET)."""
        span = f"bytes={start}-{start + length - 1}"
        return self._call("get_object", key, Key=self._key(key), Range=span)["Body"].read()

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


class AzureBlobStore:
    """Blobs of an Azure Storage container under a prefix, through the Blob REST API with an Entra ID
    (OAuth) bearer token."""

    SCOPE = "https://storage.azure.com/.default"
    VERSION = "2021-12-02"  # x-ms-version; bearer tokens need 2017-11-09 or later
    RENEW_BEFORE_S = 300  # a cached token is renewed this long before it expires

    def __init__(
        self,
        account: str,
        container: str,
        prefix: str,
        *,
        endpoint_url: str | None = None,
        credential=None,
    ) -> None:
        """``credential``: an azure-core ``TokenCredential``; None: azure-identity's
        ``DefaultAzureCredential`` (az login's account, or a VM's managed identity).
        ``endpoint_url``: an emulator (Azurite, the Blob fake), addressed path style as Azurite is:
        ``<endpoint_url>/<account>/<container>/<blob>``."""
        self.account, self.container, self.prefix = account, container, prefix.strip("/")
        self.url = f"https://{account}{AZURE_BLOB_HOST}/{container}/{self.prefix}"
        if endpoint_url:
            self._container_url = f"{endpoint_url.rstrip('/')}/{account}/{container}"
        else:
            self._container_url = f"https://{account}{AZURE_BLOB_HOST}/{container}"
        if credential is None:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError:
                raise StoreError(
                    "Azure Blob Storage needs azure-identity: pip install 'geo-orchestrator[azure]'"
                ) from None
            credential = DefaultAzureCredential()
        import requests

        self._credential, self._session = credential, requests.Session()
        self._token: tuple[str, float] | None = None  # (the token, when to ask for a new one)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _blob(self, key: str) -> str:
        return f"{self._container_url}/{quote(self._key(key), safe='/')}"

    def _bearer(self) -> str:
        if self._token is None or time.time() >= self._token[1]:
            try:
                token = self._credential.get_token(self.SCOPE)
            except _azure_auth_errors() as error:
                raise StoreError(
                    f"{self.url}: no Azure token for this store ({type(error).__name__}); sign in "
                    "with `az login`, or give the VM a managed identity with the Storage Blob Data "
                    "Contributor role on the container"
                ) from None
            self._token = (token.token, token.expires_on - self.RENEW_BEFORE_S)
        return self._token[0]

    def _call(self, what: str, key: str, method: str, url: str, *, missing_ok=False, **kwargs):
        import requests

        headers = {
            "Authorization": f"Bearer {self._bearer()}",
            "x-ms-version": self.VERSION,
            "x-ms-date": formatdate(usegmt=True),
            **kwargs.pop("headers", {}),
        }
        try:
            answer = self._session.request(method, url, headers=headers, timeout=60, **kwargs)
        except (requests.RequestException, OSError) as error:
            raise StoreError(
                f"{self.url}: azure {what} of {key!r} failed ({type(error).__name__})"
            ) from None
        if answer.status_code >= 400 and not (missing_ok and answer.status_code == 404):
            code = answer.headers.get("x-ms-error-code")
            why = f"{answer.status_code}: {code}" if code else str(answer.status_code)
            raise StoreError(f"{self.url}: azure {what} of {key!r} failed ({why})")
        return answer

    def put(self, key: str, data: bytes) -> None:
        headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"}
        self._call("put", key, "PUT", self._blob(key), data=data, headers=headers)

    def get(self, key: str) -> bytes:
        return self._call("get", key, "GET", self._blob(key)).content

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        answer = self._call("size", key, "HEAD", self._blob(key), missing_ok=True)
        return int(answer.headers["Content-Length"]) if answer.status_code == 200 else None

    def keys(self, prefix: str = "") -> Iterator[str]:
        from xml.etree import ElementTree

        cut = len(self.prefix) + 1 if self.prefix else 0
        params = {"restype": "container", "comp": "list", "prefix": self._key(prefix)}
        while True:
            answer = self._call("list", prefix, "GET", self._container_url, params=params)
            page = ElementTree.fromstring(answer.content)
            for name in page.iterfind("Blobs/Blob/Name"):
                # names with characters XML cannot carry come percent-encoded, marked Encoded
                text = name.text or ""
                yield (unquote(text) if name.get("Encoded") == "true" else text)[cut:]
            marker = page.findtext("NextMarker")
            if not marker:  # empty when the listing is complete
                return
            params = {**params, "marker": marker}

    def delete(self, key: str) -> None:
        self._call("delete", key, "DELETE", self._blob(key), missing_ok=True)


def _azure_auth_errors() -> tuple[type[BaseException], ...]:
    """What a credential raises when it has no token (none without azure-core: a hand-made
    credential then raises what it likes)."""
    try:
        from azure.core.exceptions import ClientAuthenticationError
    except ImportError:
        return ()
    return (ClientAuthenticationError,)


def _azure_store(url: str, endpoint_url: str | None, credential) -> AzureBlobStore:
    parts = urlsplit(url)
    shown = urlunsplit(parts._replace(query="", fragment=""))  # a SAS token stays out of messages
    account = (parts.hostname or "")[: -len(AZURE_BLOB_HOST)]
    container, _, prefix = unquote(parts.path).lstrip("/").partition("/")
    if not account or not container:
        raise StoreError(
            f"{shown}: no account or container; write "
            f"https://<account>{AZURE_BLOB_HOST}/<container>[/<prefix>]"
        )
    if parts.query:
        raise StoreError(
            f"{shown}: drop the query (a SAS token?): the store signs in with Entra ID "
            "(az login, or a VM's managed identity)"
        )
    return AzureBlobStore(
        account, container, prefix, endpoint_url=endpoint_url, credential=credential
    )


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    session=None,
    credentials=None,
    credential=None,
) -> ObjectStore:
    """A store for ``url``: ``s3://bucket[/prefix]``, ``gs://bucket[/prefix]``,
    ``https://<account>.blob.core.windows.net/<container>[/<prefix>]`` or a local folder.
    ``session``: a boto3 session (S3); ``credentials``: google-auth's (GCS); ``credential``: an
    azure-core ``TokenCredential`` (Azure)."""
    if url.startswith("https://") and (urlsplit(url).hostname or "").endswith(AZURE_BLOB_HOST):
        return _azure_store(url, endpoint_url, credential)
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
