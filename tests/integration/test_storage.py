"""runtime.storage: the same behaviour from a local folder, from S3 (moto's server on 127.0.0.1),
from GCS (the GCP fake's Cloud Storage JSON API, through google-auth's authorized session) and from
Azure Blob Storage (the Blob fake served on 127.0.0.1, with an azure-core token credential)."""

from __future__ import annotations

import time

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

from provisioners.emulated.azure_api import FAKE_TOKEN, FakeAzure, FakeCredential
from provisioners.emulated.azure_blob import FakeBlobs
from provisioners.emulated.azure_wire import serve
from runtime.storage import LocalStore, StoreError, open_store

AZURE_URL = "https://acct.blob.core.windows.net/ckpt/job-1"


@pytest.fixture
def blobs():
    """A Blob fake holding the container acct/ckpt, served on 127.0.0.1: (the fake, its URL)."""
    fake = FakeBlobs(containers={("acct", "ckpt")})
    cloud = FakeAzure()
    cloud.blobs = fake  # served as the emulated Azure serves its accounts' blobs
    server = serve(cloud, host="127.0.0.1", port=0)
    host, port = server.server_address[:2]
    yield fake, f"http://{host}:{port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    if request.param == "azure":
        _, endpoint = request.getfixturevalue("blobs")
        return open_store(AZURE_URL, endpoint_url=endpoint, credential=FakeCredential())
    if request.param == "gcs":
        from google.oauth2.credentials import Credentials

        from provisioners.emulated.gcp_api import FakeGcp

        fake = FakeGcp(token="tok").start()
        request.addfinalizer(fake.stop)
        fake.storage.buckets["ckpt"], fake.storage.objects["ckpt"] = {"name": "ckpt"}, {}
        return open_store(
            "gs://ckpt/job-1", endpoint_url=fake.url, credentials=Credentials(token="tok")
        )
    request.getfixturevalue("s3_env")
    endpoint = request.getfixturevalue("s3_endpoint")
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="ckpt")
    return open_store("s3://ckpt/job-1", endpoint_url=endpoint)


def test_put_get_list_delete(store):
    store.put("a/x.bin", b"one")
    store.put("a/y.bin", b"two")
    store.put("a/x.bin", b"three")  # overwrite
    assert store.get("a/x.bin") == b"three" and store.exists("a/y.bin")
    assert list(store.keys("a/")) == ["a/x.bin", "a/y.bin"]
    store.delete("a/y.bin")
    assert not store.exists("a/y.bin")
    with pytest.raises(StoreError, match="a/none"):
        store.get("a/none")


def test_local_writes_leave_no_temporary_files_and_stay_inside(tmp_path):
    store = LocalStore(tmp_path)
    store.put("deep/k", b"v")
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["k"]
    with pytest.raises(StoreError, match="leaves the store"):
        store.put("../outside", b"v")


def test_an_s3_url_without_a_bucket_is_refused():
    with pytest.raises(StoreError, match="no bucket"):
        open_store("s3:///prefix")


def test_gcs_needs_the_token_the_api_accepts_and_lists_every_page():
    from google.oauth2.credentials import Credentials

    from provisioners.emulated.gcp_api import FakeGcp

    fake = FakeGcp(token="tok").start()
    try:
        fake.storage.buckets["b"], fake.storage.objects["b"] = {"name": "b"}, {}
        good = open_store("gs://b/p", endpoint_url=fake.url, credentials=Credentials(token="tok"))
        for i in range(5):  # the fake pages by 2: the store follows nextPageToken
            good.put(f"k{i}", b"x")
        assert list(good.keys()) == [f"k{i}" for i in range(5)]
        bad = open_store("gs://b/p", endpoint_url=fake.url, credentials=Credentials(token="no"))
        with pytest.raises(StoreError, match="401"):
            bad.put("k", b"x")
    finally:
        fake.stop()


class _Expiring:
    """A TokenCredential whose tokens expire within the store's renewal margin, or that fails."""

    def __init__(self, *, fails: bool = False) -> None:
        self.fails, self.calls = fails, 0

    def get_token(self, *scopes: str, **kwargs) -> AccessToken:
        self.calls += 1
        assert scopes == ("https://storage.azure.com/.default",)
        if self.fails:
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")
        return AccessToken(FAKE_TOKEN, int(time.time()) + 60)


def test_azure_lists_every_page_and_reuses_its_token_until_near_expiry(blobs):
    fake, endpoint = blobs
    credential = FakeCredential()
    store = open_store(AZURE_URL, endpoint_url=endpoint, credential=credential)
    names = [f"k{i}" for i in range(5)] + ["odd name+%/x"]  # quoted in the URL, '/' kept
    for name in names:  # the fake pages by 2: the store follows NextMarker
        store.put(name, name.encode())
    assert list(store.keys()) == sorted(names) and store.get("odd name+%/x") == b"odd name+%/x"
    assert ("acct", "ckpt", "job-1/odd name+%/x") in fake.blobs and store.size("k0") == 2
    assert credential.calls == 1  # an hour-long token is asked for once
    short = _Expiring()
    store = open_store(AZURE_URL, endpoint_url=endpoint, credential=short)
    assert store.exists("k0") and store.exists("k1")
    assert short.calls == 2  # expires within 5 minutes: asked for again


def test_azure_refusals_name_the_status_never_the_token(blobs):
    fake, endpoint = blobs
    fake.authorize = lambda token, account: False
    store = open_store(AZURE_URL, endpoint_url=endpoint, credential=FakeCredential())
    with pytest.raises(StoreError, match="403: AuthorizationPermissionMismatch") as refused:
        store.put("k", b"x")
    assert FAKE_TOKEN not in str(refused.value) and refused.value.__cause__ is None
    lost = open_store(AZURE_URL, endpoint_url=endpoint, credential=_Expiring(fails=True))
    with pytest.raises(StoreError, match="az login") as unsigned:
        lost.get("k")
    assert AZURE_URL in str(unsigned.value)
    fake.authorize = lambda token, account: token == FAKE_TOKEN
    other = open_store(
        "https://acct.blob.core.windows.net/nope",
        endpoint_url=endpoint,
        credential=FakeCredential(),
    )
    with pytest.raises(StoreError, match="404: ContainerNotFound"):
        other.put("k", b"x")


@pytest.mark.parametrize(
    "url",
    ["https://acct.blob.core.windows.net", "https://acct.blob.core.windows.net/"],
)
def test_an_azure_url_without_a_container_is_refused(url):
    with pytest.raises(StoreError, match="<container>"):
        open_store(url, credential=FakeCredential())


def test_an_azure_url_with_a_sas_token_is_refused_without_echoing_it():
    with pytest.raises(StoreError, match="drop the query") as refused:
        open_store("https://acct.blob.core.windows.net/c/p?sv=2022&sig=SECRET", credential=None)
    assert "SECRET" not in str(refused.value)


def _request(fake: FakeBlobs, method: str, path: str, query="", body=b"", **headers: str | None):
    """FakeBlobs.handle with a valid version and token, ``headers`` added (None: left out)."""
    from urllib.parse import parse_qs

    sent = {"x-ms-version": "2021-12-02", "Authorization": "Bearer t", **headers}
    sent = {name: value for name, value in sent.items() if value is not None}
    return fake.handle(method, "acct", path, parse_qs(query, keep_blank_values=True), sent, body)


LIST = "restype=container&comp=list"
SIZED = {"Content-Length": "1"}


@pytest.mark.parametrize(
    ("method", "path", "query", "headers", "status", "code"),
    [
        ("PUT", "/ckpt/k", "", SIZED, 400, "MissingRequiredHeader"),  # no x-ms-blob-type
        ("PUT", "/ckpt/k", "", {**SIZED, "x-ms-blob-type": "Page"}, 400, "InvalidHeaderValue"),
        ("PUT", "/ckpt/k", "", {"x-ms-blob-type": "BlockBlob"}, 411, "MissingContentLengthHeader"),
        ("GET", "/ckpt/k", "", {"x-ms-version": ""}, 400, "MissingRequiredHeader"),
        ("GET", "/ckpt/k", "", {"Authorization": None}, 401, "NoAuthenticationInformation"),
        ("GET", "/ckpt/k", "", {"Authorization": "Basic dTpw"}, 401, "NoAuthenticationInformation"),
        ("GET", "/other/k", "", {}, 404, "ContainerNotFound"),
        ("GET", "/ckpt/k", "", {}, 404, "BlobNotFound"),
        ("GET", "/ckpt", "comp=list", {}, 400, "InvalidUri"),
        ("GET", "/ckpt", f"{LIST}&maxresults=0", {}, 400, "OutOfRangeQueryParameterValue"),
    ],
)
def test_the_blob_fake_is_as_strict_as_azure(method, path, query, headers, status, code):
    from xml.etree import ElementTree

    fake = FakeBlobs(containers={("acct", "ckpt")})
    answer = _request(fake, method, path, query, b"x", **headers)
    assert answer[0] == status and answer[1]["x-ms-error-code"] == code
    assert ElementTree.fromstring(answer[2]).findtext("Code") == code and not fake.blobs


def test_the_blob_fake_refuses_a_token_its_account_does_not_accept():
    fake = FakeBlobs(containers={("acct", "ckpt")}, authorize=lambda token, account: False)
    status, headers, _ = _request(fake, "GET", "/ckpt", LIST)
    assert (status, headers["x-ms-error-code"]) == (403, "AuthorizationPermissionMismatch")


def test_the_blob_fake_answers_head_without_a_body_and_lists_in_xml():
    from xml.etree import ElementTree

    fake = FakeBlobs(containers={("acct", "ckpt")}, page_size=1)
    put = _request(
        fake,
        "PUT",
        "/ckpt/a/b",
        "",
        b"abc",
        **{"x-ms-blob-type": "BlockBlob", "Content-Length": "3"},
    )
    assert put[0] == 201 and fake.blobs == {("acct", "ckpt", "a/b"): b"abc"}
    fake.blobs[("acct", "ckpt", "a/c")] = b""
    status, headers, body = _request(fake, "HEAD", "/ckpt/a/b")
    assert (status, headers["Content-Length"], body) == (200, "3", b"")
    status, headers, body = _request(fake, "GET", "/ckpt", f"{LIST}&prefix=a/")
    page = ElementTree.fromstring(body)
    assert headers["Content-Type"] == "application/xml" and page.findtext("Prefix") == "a/"
    assert page.findtext("Blobs/Blob/Name") == "a/b" and page.findtext("NextMarker") == "a/c"
    assert page.findtext("Blobs/Blob/Properties/Content-Length") == "3"
    _, _, body = _request(fake, "GET", "/ckpt", f"{LIST}&marker=a/c")
    assert ElementTree.fromstring(body).findtext("NextMarker") == ""  # the last page
    assert _request(fake, "DELETE", "/ckpt/a/b")[0] == 202


def test_the_blob_server_takes_the_real_host_style_too(blobs):
    import requests

    fake, endpoint = blobs
    fake.blobs[("acct", "ckpt", "a b")] = b"v"
    headers = {"Host": "acct.blob.core.windows.net", "x-ms-version": "2021-12-02"}
    headers["Authorization"] = "Bearer t"
    assert requests.get(f"{endpoint}/ckpt/a%20b", headers=headers, timeout=10).content == b"v"
