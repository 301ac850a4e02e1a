"""Fixtures shared by integration tests: moto's S3 server on 127.0.0.1, fake AWS credentials, and a
Ray cluster of a test module's own; and which tests may run beside which under xdist.

The tier runs on two xdist workers. The modules that take the whole machine form two groups, each
run one test after another on one worker: the Ray runtime and local-cloud jobs (``RAY``: their
timings stay what they were written for, e.g. the straggler test's measured shares), and the
namespace VMs and standing emulated clouds (``NAMESPACES``: correctness with generous waits,
whatever runs beside them). The adapters' tests against fakes and in-memory servers fill in
around them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# a Hugging Face GPT-2 small enough for two CPU cores; dropout off, because a pipeline's workers
# draw their masks from other generators than one process does
SMALL_GPT2 = {
    "n_layer": 4,
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 32,
    "vocab_size": 512,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


NAMESPACES = frozenset(
    {
        "test_controller_vm",
        "test_emulated_aws",
        "test_emulated_submit",
        "test_netns_cloud",
        "test_orphans",
        "test_overlay",
    }
)
# (test_bench_runtime_vs_torch's quick run checks equal losses, not speed: it runs beside them)
RAY = frozenset(
    {
        "test_chaos",
        "test_checkpoint",
        "test_gpu_runtime",
        "test_local_gateway",
        "test_local_provisioner",
        "test_own_models_submit",
        "test_plan_shapes",
        "test_runtime_failures",
        "test_runtime_models",
        "test_runtime_takeover",
        "test_runtime_tensor_parallel",
        "test_runtime_training",
        "test_straggler",
        "test_terminal",
    }
)


def pytest_collection_modifyitems(config, items) -> None:
    """Every test under tests/integration carries the ``integration`` mark, whether its module
    says so or not (``-m "not integration"`` then leaves exactly this folder out)."""
    here = os.path.dirname(__file__)
    for item in items:
        if os.path.dirname(str(item.path)) == here:
            item.add_marker(pytest.mark.integration)


def pytest_xdist_make_scheduler(config, log):
    """Under xdist: each group of machine-wide modules is one unit of work (one worker runs it
    test after test), every other test a unit of its own. (xdist's own ``--dist loadgroup`` reads
    groups off node ids that pytest 9 no longer lets it change.)"""
    from xdist.scheduler import LoadScopeScheduling

    class MachineScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
            if module in RAY:
                return "ray"
            return "namespaces" if module in NAMESPACES else nodeid

    return MachineScheduling(config, log)


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


@contextmanager
def local_ray(*, num_cpus: int, resources: dict[str, float], runtime_env=None) -> Iterator:
    """A Ray cluster of its own on this machine (never one another process started), shut down
    after use; yields the ``ray`` module. ``runtime_env``: the job's (its actors inherit it)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",
        num_cpus=num_cpus,
        resources=resources,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=runtime_env,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
