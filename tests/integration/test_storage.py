"""runtime.storage: the same behaviour from a local folder and from S3 (moto's server on 127.0.0.1)."""

from __future__ import annotations

import pytest

from runtime.storage import LocalStore, StoreError, open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
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
