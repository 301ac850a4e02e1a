"""runtime.storage: the same behaviour from a local folder, from S3 (moto's server on 127.0.0.1) and
from GCS (the GCP fake's Cloud Storage JSON API, through google-auth's authorized session)."""

from __future__ import annotations

import pytest

from runtime.storage import LocalStore, StoreError, open_store


@pytest.fixture(params=["local", "s3", "gcs"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
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
