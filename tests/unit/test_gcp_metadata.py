"""GCE's preemption notice as a node reads it (provisioners/gcp/metadata.py), against the emulated
GCE metadata server (provisioners/emulated/imds.py) served on 127.0.0.1."""

from __future__ import annotations

import http.server
import socket
import threading
import time
import urllib.error

import pytest

from provisioners.emulated import imds
from provisioners.gcp import metadata


@pytest.fixture
def gce():
    """The emulated metadata of one VM, and the endpoint that serves it."""
    vm = imds.GceMetadata(instance_id="1001", name="train-1-0", zone="us-central1-a")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), imds._gce_handler(vm))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield vm, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_no_notice_until_the_preemption_then_thirty_seconds(gce):
    vm, endpoint = gce
    assert metadata.notice(endpoint=endpoint) is None  # preempted reads FALSE
    vm.notice(at_s=time.time() + 30)
    before = time.time()
    # the emulation answers 403 without Metadata-Flavor: Google, so a notice proves the header
    found = metadata.notice(endpoint=endpoint, timeout_s=2.0)
    assert found is not None and found.text == "GCE preemption"
    assert before + metadata.NOTICE_S <= found.deadline_s <= time.time() + metadata.NOTICE_S


def test_an_http_error_is_no_notice(gce):
    vm, endpoint = gce
    vm.notice(at_s=time.time())
    assert metadata.notice(endpoint=f"{endpoint}/not-gce") is None  # a 404


def test_an_unreachable_server_raises_for_the_watcher_to_log():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(urllib.error.URLError):
        metadata.notice(endpoint=f"http://127.0.0.1:{port}", timeout_s=1.0)
