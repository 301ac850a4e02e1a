"""Fixtures shared by integration tests: moto's S3 server on 127.0.0.1 and fake AWS credentials."""

from __future__ import annotations

import pytest

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_endpoint():
    """The URL of one moto S3 server for the whole run (tests use their own buckets/prefixes)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(monkeypatch):
    """Fake credentials for boto3's chain, for this test only."""
    for key, value in FAKE_AWS.items():
        monkeypatch.setenv(key, value)
