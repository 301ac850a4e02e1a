"""Fixtures shared by integration tests: moto's S3 server on 127.0.0.1, fake AWS credentials, and a
Ray cluster of a test module's own; and which tests may run beside which under xdist.

The tier runs on two xdist workers, which hand out units of work longest first: the namespace VMs
and standing emulated clouds together (``NAMESPACES``), each module that starts Ray on its own
(``RAY``), every other test alone (the adapters' tests against fakes fill in around the rest)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

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


# The namespace VMs and standing emulated clouds: one unit of work, run test after test on one
# worker (correctness with generous waits, whatever runs beside them; never two of them at once).
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
# The runtime modules whose groups need nothing but places and slots share one Ray cluster and one
# pool of workers (``shared_runtime``): one unit, so they run one after another in one process.
RUNTIME = frozenset(
    {
        "test_checkpoint",
        "test_plan_shapes",
        "test_runtime_models",
        "test_runtime_tensor_parallel",
        "test_runtime_training",
    }
)
# Every other module that starts Ray (the runtime's failures and takeovers, which kill workers and
# count named actors; local-cloud jobs) is a unit of its own: its module-scoped cluster serves all
# its tests on one worker. The adapters' tests against fakes and in-memory servers are a unit per
# test and fill in around them.
RAY = frozenset(
    {
        "test_chaos",
        "test_gpu_runtime",
        "test_local_gateway",
        "test_local_provisioner",
        "test_own_models_submit",
        "test_runtime_failures",
        "test_runtime_takeover",
        "test_straggler",
        "test_terminal",
    }
)
# Seconds each unit took in a full run of this tier on this machine (BENCHMARKS.md, "The test
# suite's time"), for the order the units start in only: longest first, so that the two workers
# end at about the same time (an unlisted unit counts as short). A stale figure costs wall time,
# never a result.
UNIT_S = {
    "namespaces": 425,
    "runtime": 210,
    "test_own_models_submit": 115,
    "test_chaos": 105,
    "test_terminal": 90,
    "test_straggler": 55,
    "test_bench_runtime_vs_torch": 35,
    "test_runtime_takeover": 35,
    "test_local_provisioner": 15,
    "test_runtime_failures": 15,
}


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def _group(module: str) -> str:
    return "namespaces" if module in NAMESPACES else "runtime" if module in RUNTIME else module


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to under xdist: ``namespaces``, ``runtime``, its module
    (a Ray module), or the test itself."""
    module = _module(nodeid)
    return _group(module) if module in NAMESPACES | RUNTIME | RAY else nodeid


def _unit_s(nodeid: str) -> float:
    """The seconds of the test's unit (of its module, for a test that is a unit alone)."""
    return UNIT_S.get(_group(_module(nodeid)), 0.0)


def pytest_collection_modifyitems(config, items) -> None:
    """Every test under tests/integration carries the ``integration`` mark, whether its module
    says so or not (``-m "not integration"`` then leaves exactly this folder out); and the tests
    come longest unit first (xdist hands the units out in this order)."""
    here = os.path.dirname(__file__)
    ours = [item for item in items if os.path.dirname(str(item.path)) == here]
    for item in ours:
        item.add_marker(pytest.mark.integration)
    others = [item for item in items if os.path.dirname(str(item.path)) != here]
    # stable: within a unit, and among units of equal weight, the files' own order
    items[:] = others + sorted(ours, key=lambda item: -_unit_s(item.nodeid))


def pytest_xdist_make_scheduler(config, log):
    """Under xdist: each unit (``_unit``) goes to one worker whole, in the collection's order
    (longest first, above). (xdist's own ``--dist loadgroup`` reads groups off node ids that
    pytest 9 no longer lets it change.)"""
    from xdist.scheduler import LoadScopeScheduling

    class MachineScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # xdist would order the units by their test counts
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
    after use; yields the ``ray`` module. ``runtime_env``: the job's (its actors inherit it).

    Its head runs as the local cloud's do (provisioners/local/cluster.py): no log monitor or
    autoscaler monitor, which ``ray.init`` would start and nothing here reads."""
    import ray
    import ray.cluster_utils

    from provisioners.local.cluster import QUIET_NODE

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = ray.cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": num_cpus,
            "resources": resources,
            "include_dashboard": False,
            "no_monitor": True,
            **QUIET_NODE,
        },
    )
    try:
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=runtime_env)
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()


class ReusedWorkers:
    """Starts each worker group of a test module with the processes of the group before it
    (``WorkerGroup.start(reuse=...)``), as a re-layout keeps its workers: each start only makes
    the workers the last layout had no slot for. The tests' losses, which must be the single
    process's, are then also the check that a reused worker trains as a new one does."""

    def __init__(self) -> None:
        self._last = None

    def start(self, layout, config, **options):
        from runtime.group import WorkerGroup

        previous, self._last = self._last, None  # handed over even when the start fails
        self._last = WorkerGroup.start(layout, config, reuse=previous, **options)
        return self._last

    def shutdown(self) -> None:
        if self._last is not None:
            self._last.shutdown(graceful=False)
            self._last = None


@contextmanager
def reused_workers() -> Iterator[ReusedWorkers]:
    """A module's ``ReusedWorkers``, its last group stopped at the end."""
    workers = ReusedWorkers()
    try:
        yield workers
    finally:
        workers.shutdown()


# The shared runtime cluster: every place the RUNTIME modules name, with the slots the largest of
# their groups needs (8) beside a test's own group of 2; their users' packages shipped to every
# worker (one runtime_env, so that any worker can be reused by any module).
SHARED_PLACES = {
    "local/sim-us/sim-us-a": 8,
    "local/sim-us/sim-us-b": 8,
    "local/sim-eu/sim-eu-a": 8,
    "local/sim-us/sim-us-c": 2,
}
USER_MODELS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "usermodels")
SHARED_PACKAGES = ("llama_lm", "tiny_lm")


class SharedRuntime:
    """One Ray cluster and one ``ReusedWorkers`` pool for the RUNTIME modules of this process,
    made by the first test that asks and shut down before any test of another module runs (which
    may start a cluster of its own: one Ray connection per process) or at the session's end."""

    def __init__(self) -> None:
        self._up: ExitStack | None = None  # the cluster and the pool, closed in reverse order
        self.workers: ReusedWorkers | None = None

    def get(self) -> ReusedWorkers:
        if self.workers is None:
            shipped = {"py_modules": [os.path.join(USER_MODELS, p) for p in SHARED_PACKAGES]}
            resources = {f"infra:{place}": float(n) for place, n in SHARED_PLACES.items()}
            with ExitStack() as up:
                up.enter_context(local_ray(num_cpus=10, resources=resources, runtime_env=shipped))
                self.workers = up.enter_context(reused_workers())
                self._up = up.pop_all()
        return self.workers

    def close(self) -> None:
        if self._up is not None:
            up, self._up, self.workers = self._up, None, None
            up.close()


SHARED = SharedRuntime()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """A test outside the RUNTIME modules first closes their shared cluster, if up (before its
    fixtures start a cluster of their own)."""
    if _module(item.nodeid) not in RUNTIME:
        SHARED.close()


def pytest_sessionfinish(session) -> None:
    SHARED.close()


@pytest.fixture(scope="module")
def shared_workers() -> ReusedWorkers:
    """The RUNTIME modules' pool of workers on their shared cluster (``SharedRuntime``)."""
    return SHARED.get()
