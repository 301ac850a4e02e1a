"""The SkyPilot adapter's ``sky check`` credential check through the real ``sky`` client, offline.

``test_skypilot_provisioner.py`` drives the adapter with a hand-written fake of the ``sky`` module;
here the real client (``sky.client.sdk.check``, ``sky.api_status``, ``sky.get``, ``sky.api_cancel``)
runs and talks HTTP to a fake SkyPilot API server on 127.0.0.1 (``sky_api_fake.py``), so a change in
SkyPilot's call signatures, wire format or result shape fails here. Each check runs in a subprocess
(the ``sky`` module caches its server URL and versions per process) with its own home and runtime
folders, ``SKYPILOT_API_SERVER_ENDPOINT`` at the fake, starting a local API server disabled and
refused, and every socket other than the fake's refused.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integration.sky_api_fake import FakeSkyApiServer

# found, not imported: importing `sky` here would set up its logging in the test process, which
# changes what other tests' log captures see; the checks run in subprocesses
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("sky") is None, reason="SkyPilot is not installed"),
]

REPO = Path(__file__).resolve().parents[2]
CLOUDS = ("aws", "gcp")

_PROBE = textwrap.dedent(
    """
    import json, socket, sys
    port, clouds, call_timeout_s = int(sys.argv[1]), sys.argv[2].split(","), float(sys.argv[3])
    attempts = []
    real_connect = socket.socket.connect
    def guarded(self, address, *args, **kwargs):
        if isinstance(address, tuple) and tuple(address[:2]) == ("127.0.0.1", port):
            return real_connect(self, address, *args, **kwargs)
        attempts.append(repr(address))
        raise OSError("the test forbids the network")
    socket.socket.connect = guarded
    socket.socket.connect_ex = lambda self, address: guarded(self, address) or 0
    import sky.server.common as server_common
    def no_local_server(*args, **kwargs):
        attempts.append("start a local API server")
        raise RuntimeError("the test forbids starting a local API server")
    server_common._start_api_server = no_local_server
    from provisioners.base import ProvisionerError
    from provisioners.skypilot import SkyPilotProvisioner
    provisioner = SkyPilotProvisioner(clouds=clouds, credential_check="skypilot",
                                      poll_interval_s=0.05, call_timeout_s=call_timeout_s)
    raised = None
    try:
        provisioner.check_credentials()
    except ProvisionerError as error:
        raised = {"type": type(error).__name__, "call": error.call, "message": error.message}
    print(json.dumps({
        "raised": raised,
        "attempts": attempts,
        "server_url": server_common.get_server_url(),
        "local": server_common.is_api_server_local(),
    }))
    """
)


def _check(fake: FakeSkyApiServer, home: Path, *, call_timeout_s: float = 30.0) -> dict[str, Any]:
    """Run the adapter's credential check in a fresh interpreter against the fake; its report."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SKYPILOT_", "SKY_")) and not key.lower().endswith("_proxy")
    }
    unroutable = "http://10.255.255.1:9"  # anything that slips past NO_PROXY goes nowhere
    env.update(
        HOME=str(home),
        SKY_RUNTIME_DIR=str(home),
        SKYPILOT_API_SERVER_ENDPOINT=fake.url,
        SKYPILOT_DISABLE_LOCAL_API_SERVER="1",
        SKYPILOT_DISABLE_USAGE_COLLECTION="1",
        HTTP_PROXY=unroutable,
        HTTPS_PROXY=unroutable,
        NO_PROXY="127.0.0.1",
        PYTHONPATH=str(REPO),
    )
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(fake.port), ",".join(CLOUDS), str(call_timeout_s)],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["attempts"] == [], "the sky client tried the network or a local API server"
    assert report["server_url"] == fake.url and report["local"] is False
    return report


def _check_request(fake: FakeSkyApiServer) -> str:
    """The one check the fake scheduled; asserts the body the client sent for it."""
    (body,) = fake.bodies("/check")
    assert body["clouds"] == list(CLOUDS)
    assert body["verbose"] is False
    assert body.get("workspace") is None
    (request,) = [r for r in fake.requests.values() if r.name == "check"]
    return request.request_id


def test_a_cloud_sky_check_did_not_enable_is_named(tmp_path: Path):
    result = {"default": {"AWS": ["compute", "storage"], "GCP": []}}
    with FakeSkyApiServer(check_result=result, polls_before_done=1) as fake:
        report = _check(fake, tmp_path)

    raised = report["raised"]
    assert raised is not None and raised["type"] == "CredentialsMissing", report
    assert raised["call"] == "sky.check"
    assert raised["message"].startswith("gcp: `sky check gcp` did not enable it")
    assert "aws" not in raised["message"]

    request_id = _check_request(fake)
    # health check, submit, one look while RUNNING, one when SUCCEEDED, then the result
    assert fake.paths() == [
        "GET /api/health",
        "POST /check",
        "GET /api/status",
        "GET /api/status",
        "GET /api/get",
    ]
    assert all(q["request_ids"] == [request_id] for q in fake.queries("/api/status"))
    assert fake.queries("/api/get") == [{"request_id": [request_id]}]
    assert fake.requests[request_id].status == "SUCCEEDED"


def test_every_cloud_enabled_passes(tmp_path: Path):
    result = {"default": {"AWS": ["compute", "storage"], "GCP": ["compute"]}}
    with FakeSkyApiServer(check_result=result, polls_before_done=0) as fake:
        report = _check(fake, tmp_path)

    assert report["raised"] is None, report
    request_id = _check_request(fake)
    assert fake.queries("/api/get") == [{"request_id": [request_id]}]


def test_a_check_that_never_ends_is_cancelled_on_the_server(tmp_path: Path):
    with FakeSkyApiServer(finishes=False) as fake:
        report = _check(fake, tmp_path, call_timeout_s=1.0)

    raised = report["raised"]
    assert raised is not None and raised["type"] == "CloudCallError", report
    assert raised["call"] == "sky.check"
    assert "did not end in time" in raised["message"]
    request_id = _check_request(fake)
    (cancel,) = fake.bodies("/api/cancel")
    assert cancel["request_ids"] == [request_id]
    assert fake.requests[request_id].status == "CANCELLED"
    assert not fake.bodies("/api/get"), "the adapter read the result of a request it gave up on"
