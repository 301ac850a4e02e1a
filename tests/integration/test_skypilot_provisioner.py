"""The SkyPilot adapter against a hand-written fake of the few ``sky`` calls it makes (runs without
SkyPilot installed), and, where SkyPilot is installed, its real catalog and Resources offline.

The fake keeps clusters in a dict: ``launch`` makes one UP (or fails as told), ``status`` lists
them, ``down`` removes them, ``preempt`` takes a spot cluster away as a cloud would. Catalog calls
read the CSV fixtures in SkyPilot's v8 schema under ``fixtures/skypilot/<cloud>/vms.csv``.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from provisioners.base import (
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    Feature,
    LaunchRequest,
    NodeLost,
    NodeState,
    QuotaError,
    SdkMissing,
    Unsupported,
)
from provisioners.skypilot import SkyPilotProvisioner
from tests.integration import contract
from tests.integration.contract import Harness, wait_for

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "skypilot"
SECRET = "fake-sky-secret-9d1c7e"  # planted in the environment and in the fake's error texts
GCP_A = "gcp/us-central1/us-central1-a"


# ---- the fake SDK ---------------------------------------------------------------------------------


class ResourcesUnavailableError(Exception):
    def __init__(self, message: str, failover_history: list[Exception] | None = None) -> None:
        super().__init__(message)
        self.failover_history = failover_history or []


class ClusterDoesNotExist(ValueError):
    pass


class CsvFrame:
    """What the adapter uses of SkyPilot's lazy pandas frame: ``to_dict(orient="records")``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def to_dict(self, orient: str) -> list[dict[str, str]]:
        assert orient == "records"
        with self.path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))


class FakeTask:
    def __init__(self, *, name: str, setup: str | None, run: str, num_nodes: int) -> None:
        self.name, self.setup, self.run, self.num_nodes = name, setup, run, num_nodes
        self.resources: Any = None

    def set_resources(self, resources: Any) -> None:
        self.resources = resources


@dataclass
class FakeSky:
    """launch / status / down / check / api_status / get / api_cancel and the catalog loader."""

    catalog_dir: Path = FIXTURES
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (infra, instance type) -> the exception launch ends with (after leaving an INIT cluster)
    failures: dict[tuple[str, str], Exception] = field(default_factory=dict)
    hang: set[tuple[str, str]] = field(default_factory=set)  # launches that never end
    check_result: Any = None
    launched: list[tuple[FakeTask, str]] = field(default_factory=list)
    downs: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    _results: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # as in SkyPilot >= 0.10: the top-level `check` is a module (calling it fails); the
        # client's function is sky.client.sdk.check
        self.check = ModuleType("sky.check")
        self.client = SimpleNamespace(sdk=SimpleNamespace(check=self._check))
        self.exceptions = SimpleNamespace(
            ResourcesUnavailableError=ResourcesUnavailableError,
            ClusterDoesNotExist=ClusterDoesNotExist,
        )
        self.StatusRefreshMode = SimpleNamespace(AUTO="auto", NONE="none")
        self.Task = FakeTask
        self.Resources = lambda **kwargs: SimpleNamespace(**kwargs)
        self.catalog = SimpleNamespace(
            common=SimpleNamespace(
                get_catalog_path=lambda name: str(self.catalog_dir / name),
                read_catalog=lambda name: CsvFrame(self.catalog_dir / name),
            )
        )

    def _request(self, state: str, value: Any) -> str:
        request_id = f"req-{len(self._results)}"
        self._results[request_id] = (state, value)
        return request_id

    # requests
    def api_status(self, request_ids: list[str]) -> list[dict[str, str]]:
        return [{"status": self._results[r][0]} for r in request_ids]

    def get(self, request_id: str) -> Any:
        state, value = self._results[request_id]
        if state == "FAILED":
            raise value
        return value

    def api_cancel(self, request_id: str, silent: bool = False) -> str:
        self.cancelled.append(request_id)
        self._results[request_id] = ("CANCELLED", None)
        return self._request("SUCCEEDED", [request_id])

    # clusters
    def launch(self, task: FakeTask, cluster_name: str, retry_until_up: bool = False) -> str:
        self.launched.append((task, cluster_name))
        key = (task.resources.infra, task.resources.instance_type)
        if key in self.hang:
            self.clusters[cluster_name] = self._record(cluster_name, task, "INIT")
            return self._request("RUNNING", None)
        if key in self.failures:
            self.clusters[cluster_name] = self._record(cluster_name, task, "INIT")  # half-made
            return self._request("FAILED", self.failures[key])
        self.clusters[cluster_name] = self._record(cluster_name, task, "UP")
        return self._request("SUCCEEDED", (1, None))

    def _record(self, name: str, task: FakeTask, status: str) -> dict[str, Any]:
        _, region, *zone = task.resources.infra.split("/")
        handle = SimpleNamespace(
            launched_resources=SimpleNamespace(region=region, zone=(zone or ["zone-x"])[0]),
            stable_internal_external_ips=[
                (f"10.0.0.{i}", f"34.1.1.{i}") for i in range(task.num_nodes)
            ],
        )
        return {
            "name": name,
            "status": SimpleNamespace(value=status),
            "handle": handle,
            "launched_at": 1_700_000_000,
        }

    def status(self, cluster_names: list[str], refresh: Any = None) -> str:
        assert refresh == "auto", "spot clusters need a refresh to show preemption"
        rows = [self.clusters[n] for n in cluster_names if n in self.clusters]
        return self._request("SUCCEEDED", rows)

    def down(self, cluster_name: str) -> str:
        self.downs.append(cluster_name)
        if self.clusters.pop(cluster_name, None) is None:
            return self._request("FAILED", ClusterDoesNotExist(f"{cluster_name} does not exist"))
        return self._request("SUCCEEDED", None)

    def _check(self, infra_list: tuple[str, ...] | None, verbose: bool, workspace=None) -> str:
        """``sky.client.sdk.check``: a request id, whose result is ``{workspace: {cloud: [..]}}``."""
        return self._request("SUCCEEDED", self.check_result)

    # what a cloud does
    def preempt(self, node_id: str, *, status: str | None = None) -> None:
        cluster = node_id.rsplit("-", 1)[0]
        if status is None:
            del self.clusters[cluster]  # the spot VMs went, SkyPilot's refresh drops the cluster
        else:
            self.clusters[cluster]["status"] = SimpleNamespace(value=status)


def _adapter(fake: FakeSky, **options: Any) -> SkyPilotProvisioner:
    return SkyPilotProvisioner(sdk=fake, poll_interval_s=0.001, fetch_catalog=False, **options)


def _request(**overrides: Any) -> LaunchRequest:
    values: dict[str, Any] = dict(
        gang="train-0", infra=GCP_A, instance_type="a2-highgpu-1g", gpu="A100", count=2
    )
    values.update(overrides)
    return LaunchRequest(**values)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSky:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    sky = FakeSky()
    sky.failures[("aws/us-east-1", "p4d.24xlarge")] = ResourcesUnavailableError(
        f"Failed to acquire resources in all zones in us-east-1 (key {SECRET})",
        [Exception("InsufficientInstanceCapacity: no p4d.24xlarge in use1-az4")],
    )
    return sky


# ---- offers ---------------------------------------------------------------------------------------


def test_offers_come_from_the_catalog_files_per_zone_where_it_names_zones(fake: FakeSky):
    offers = {(o.infra, o.instance_type): o for o in _adapter(fake).offers()}
    assert set(offers) == {
        ("aws/us-east-1", "g5.xlarge"),  # zone ids (use1-az1) are account-specific: region level
        ("aws/us-east-1", "p4d.24xlarge"),
        (GCP_A, "a2-highgpu-1g"),
        ("gcp/us-central1/us-central1-b", "a2-highgpu-1g"),
        (GCP_A, "a2-highgpu-8g"),
        ("gcp/us-west1/us-west1-a", "g2-standard-4"),
        ("azure/eastus", "Standard_NC24ads_A100_v4"),  # Azure's catalog has no zones
        ("azure/eastus", "Standard_NC4as_T4_v3"),
    }  # CPU-only rows and GCP's attachable V100 (no instance type) are left out
    g5 = offers[("aws/us-east-1", "g5.xlarge")]
    assert (g5.cloud, g5.zone, g5.gpu, g5.gpus_per_node) == ("aws", None, "A10G", 1)
    assert g5.spot_usd_per_hour == 0.3805  # the cheaper of its two zones
    a2 = offers[("gcp/us-central1/us-central1-a", "a2-highgpu-8g")]
    assert (a2.gpus_per_node, a2.vcpus, a2.memory_gib) == (8, 96.0, 680.0)
    assert (a2.on_demand_usd_per_hour, a2.spot_usd_per_hour) == (29.38708, 8.816124)
    assert offers[("azure/eastus", "Standard_NC4as_T4_v3")].spot_usd_per_hour is None
    assert all(o.source.startswith("sky.catalog ") and o.observed_at_s > 0 for o in offers.values())


def test_offer_filters_ignore_case_like_skypilots(fake: FakeSky):
    adapter = _adapter(fake, clouds=("gcp", "azure"))
    assert {o.gpu for o in adapter.offers(gpus=["a100"])} == {"A100"}
    assert {o.region for o in adapter.offers(regions=["EASTUS"])} == {"eastus"}
    assert adapter.offers(gpus=["H100"]) == []


def test_a_missing_catalog_is_an_error_not_a_download_when_fetching_is_off(tmp_path: Path):
    with pytest.raises(CloudCallError) as caught:
        _adapter(FakeSky(catalog_dir=tmp_path), clouds=("aws",)).offers()
    assert "sky show-gpus --infra aws" in str(caught.value) and "To fix" in str(caught.value)


# ---- the contract ---------------------------------------------------------------------------------


def _harness(fake: FakeSky) -> Harness:
    return Harness(
        provisioner=_adapter(fake),
        launchable=_request(),
        no_capacity=_request(
            gang="big", infra="aws/us-east-1", instance_type="p4d.24xlarge", count=2
        ),
        preempt=fake.preempt,
        secrets=(SECRET,),
        event_timeout_s=5.0,
    )


def test_contract_on_the_fake_sdk(fake: FakeSky, caplog: pytest.LogCaptureFixture):
    harness = _harness(fake)
    contract.run_contract(harness, caplog)
    assert "geo-big" in fake.downs, "the failed gang's half-made cluster was downed"
    assert not fake.clusters


# ---- launch ---------------------------------------------------------------------------------------


def test_launch_builds_one_pinned_cluster_with_our_ray_on_it(fake: FakeSky):
    adapter = _adapter(fake)
    nodes = adapter.launch(_request(labels=(("team", "ml"),)))
    ((task, cluster),) = fake.launched
    assert cluster == "geo-train-0" and task.num_nodes == 2
    resources = task.resources
    assert resources.infra == GCP_A and resources.instance_type == "a2-highgpu-1g"
    assert resources.accelerators == {"A100": 1} and resources.use_spot is True
    assert resources.labels == {"team": "ml"}
    assert "--port=6379" in task.run and "6380" not in task.run  # SkyPilot's own Ray stays alone
    assert "geo-zone=us-central1-a" in task.run and "gpu:A100" in task.run
    assert [n.node_id for n in nodes] == ["geo-train-0-0", "geo-train-0-1"]
    assert [n.address for n in nodes] == ["34.1.1.0", "34.1.1.1"]
    assert all(n.infra == GCP_A and n.gpus == 1 and n.spot for n in nodes)

    adapter.launch(
        _request(
            gang="od", infra="gcp/us-central1", instance_type="a2-highgpu-8g", count=1, spot=False
        )
    )
    task, _ = fake.launched[-1]
    assert task.resources.use_spot is False and task.resources.accelerators == {"A100": 8}


def test_quota_messages_become_quota_errors_and_the_gang_is_downed(fake: FakeSky):
    fake.failures[(GCP_A, "a2-highgpu-1g")] = ResourcesUnavailableError(
        "Failed to provision all possible launchable resources.",
        [Exception("QUOTA_EXCEEDED: Quota 'NVIDIA_A100_GPUS' exceeded. Limit: 0.0")],
    )
    adapter = _adapter(fake)
    with pytest.raises(QuotaError) as caught:
        adapter.launch(_request())
    assert "NVIDIA_A100_GPUS" in str(caught.value) and caught.value.call == "sky.launch"
    assert fake.downs == ["geo-train-0"] and not fake.clusters
    assert adapter.nodes(gang="train-0") == []


def test_other_failures_are_cloud_call_errors_without_the_secret(fake: FakeSky):
    fake.failures[(GCP_A, "a2-highgpu-1g")] = RuntimeError(f"API server said token={SECRET}")
    with pytest.raises(CloudCallError) as caught:
        _adapter(fake).launch(_request())
    assert SECRET not in str(caught.value) and "RuntimeError" in str(caught.value)
    assert "sky check" in caught.value.fix


def test_the_api_servers_refusal_says_who_can_grant_access(fake: FakeSky):
    class PermissionDeniedError(Exception):  # SkyPilot's name for its API server's refusal
        pass

    fake.failures[(GCP_A, "a2-highgpu-1g")] = PermissionDeniedError(
        "user alice may not use workspace research"
    )
    with pytest.raises(CloudCallError) as caught:
        _adapter(fake).launch(_request())
    assert "workspace research" in str(caught.value) and "sky api info" in caught.value.fix
    assert fake.downs == ["geo-train-0"] and not fake.clusters


def test_a_launch_past_its_timeout_is_cancelled_downed_and_a_capacity_error(fake: FakeSky):
    fake.hang.add((GCP_A, "a2-highgpu-1g"))
    with pytest.raises(CapacityError) as caught:
        _adapter(fake).launch(_request(timeout_s=0.02))
    assert "within 0.02 s" in str(caught.value)
    assert fake.cancelled and fake.downs == ["geo-train-0"] and not fake.clusters


def test_an_instance_type_not_in_the_catalog_fails_before_any_launch(fake: FakeSky):
    with pytest.raises(CloudCallError, match="not in SkyPilot's gcp catalog"):
        _adapter(fake).launch(_request(instance_type="a3-highgpu-8g"))
    assert not fake.launched


# ---- events and terminate -------------------------------------------------------------------------


def test_an_on_demand_cluster_gone_unhealthy_is_a_failure_and_is_downed(fake: FakeSky):
    adapter = _adapter(fake)
    nodes = adapter.launch(_request(spot=False))
    adapter.poll_events()  # NodeReady x 2
    fake.preempt(nodes[1].node_id, status="INIT")  # SkyPilot: some node of the cluster is gone
    events = adapter.poll_events(timeout_s=1.0)
    assert [(type(e), e.reason) for e in events] == [(NodeLost, "failed")] * 2
    assert fake.downs == ["geo-train-0"], "what is left of the broken cluster stops billing"
    assert {n.state for n in adapter.nodes()} == {NodeState.LOST}
    assert adapter.poll_events() == []


def test_a_spot_loss_is_preemption_and_notices_are_declared_unsupported(fake: FakeSky):
    adapter = _adapter(fake)
    nodes = adapter.launch(_request())
    harness = Harness(adapter, _request(), _request(), preempt=None, event_timeout_s=2.0)
    fake.preempt(nodes[0].node_id)
    seen = wait_for(harness, lambda es: any(isinstance(e, NodeLost) for e in es), "NodeLost")
    assert {e.reason for e in seen if isinstance(e, NodeLost)} == {"preempted"}
    assert not adapter.supports(Feature.PREEMPTION_NOTICE)
    assert "interruption notices" in adapter.unsupported[Feature.PREEMPTION_NOTICE]


def test_terminate_is_per_gang_and_idempotent(fake: FakeSky):
    adapter = _adapter(fake)
    nodes = adapter.launch(_request())
    with pytest.raises(Unsupported, match="as a whole"):
        adapter.terminate([nodes[0].node_id])
    assert fake.clusters, "a partial request ends nothing"
    adapter.terminate([n.node_id for n in nodes] + ["unknown-node"])
    adapter.terminate([n.node_id for n in nodes])
    assert {n.state for n in adapter.nodes()} == {NodeState.TERMINATED} and not fake.clusters


def test_skypilots_own_ray_port_is_refused():
    with pytest.raises(ValueError, match="6380"):
        SkyPilotProvisioner(ray_port=6380, sdk=FakeSky())


# ---- credentials and the SDK ----------------------------------------------------------------------


@pytest.fixture
def bare_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUDSDK_CONFIG",
        "AZURE_CLIENT_ID",
        "AZURE_CONFIG_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_offline_credential_check_names_what_each_cloud_lacks(bare_home: Path, fake: FakeSky):
    adapter = _adapter(fake)
    with pytest.raises(CredentialsMissing) as caught:
        adapter.check_credentials()
    text = str(caught.value)
    assert "aws:" in text and "$AWS_ACCESS_KEY_ID" in text and str(bare_home / ".aws") in text
    assert "gcloud auth application-default login" in text and "az login" in text
    (bare_home / ".aws").mkdir()
    (bare_home / ".aws" / "credentials").write_text(f"aws_secret_access_key = {SECRET}\n")
    (bare_home / ".azure").mkdir()
    (bare_home / ".azure" / "azureProfile.json").write_text("{}")
    with pytest.raises(CredentialsMissing) as caught:
        adapter.check_credentials()
    assert "aws:" not in str(caught.value) and "gcp:" in str(caught.value)
    assert SECRET not in str(caught.value)
    os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(bare_home / "sa.json")
    try:
        adapter.check_credentials()
    finally:
        del os.environ["GOOGLE_APPLICATION_CREDENTIALS"]


def test_skypilot_credential_check_names_clouds_sky_check_left_disabled(fake: FakeSky):
    fake.check_result = {"default": {"AWS": ["compute", "storage"], "GCP": []}}
    adapter = _adapter(fake, clouds=("aws", "gcp"), credential_check="skypilot")
    with pytest.raises(CredentialsMissing) as caught:
        adapter.check_credentials()
    assert "gcp:" in str(caught.value) and "sky check gcp -v" in str(caught.value)
    assert "aws:" not in str(caught.value)


def test_without_skypilot_every_call_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "sky", None)  # `import sky` now fails as if not installed
    adapter = SkyPilotProvisioner()
    for call in (adapter.check_credentials, adapter.offers):
        with pytest.raises(SdkMissing) as caught:
            call()
        assert "pip install 'geo-orchestrator[skypilot]'" in str(caught.value)
        assert caught.value.cloud == "skypilot"


def test_the_package_imports_without_skypilot():
    code = "import sys; sys.modules['sky'] = None; import provisioners.skypilot; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


# ---- the real SkyPilot, offline -------------------------------------------------------------------

_REAL_SKY_PROBE = textwrap.dedent(
    """
    import dataclasses, json, socket, subprocess, sys
    attempts = []
    def refuse(self, address, *args, **kwargs):
        attempts.append(repr(address))
        raise OSError("the test forbids the network")
    socket.socket.connect = refuse
    socket.create_connection = lambda address, *a, **k: refuse(None, address)
    import sky
    from provisioners.base import LaunchRequest
    from provisioners.skypilot import SkyPilotProvisioner
    from provisioners.skypilot.instances import build_task
    offers = SkyPilotProvisioner(fetch_catalog=False).offers(gpus=["a100"])
    request = LaunchRequest(gang="g", infra="gcp/us-central1/us-central1-a",
                            instance_type="a2-highgpu-1g", gpu="A100", count=2)
    task = build_task(sky, request, cluster="geo-g", gpus_per_node=1, setup=None, ray_port=6379)
    (res,) = list(task.resources)
    # the gang the driver launches: each rank boots its own script (a join token each)
    booting = dataclasses.replace(request, boot_scripts=("echo rank-zero", "echo rank-one"))
    joined = build_task(sky, booting, cluster="geo-g", gpus_per_node=1, setup=None, ray_port=6379)
    ran = [subprocess.run(["bash", "-c", joined.run], env={"SKYPILOT_NODE_RANK": str(rank),
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True).stdout.strip()
           for rank in range(2)]
    print(json.dumps({
        "offers": sorted(o.infra + " " + o.instance_type for o in offers),
        "task": [task.num_nodes, res.use_spot, res.region, res.zone, res.accelerators,
                 res.instance_type, str(res.cloud)],
        "joined": [joined.num_nodes, ran, "ray start --head" in joined.run],
        "attempts": attempts,
    }))
    """
)


def test_real_skypilot_reads_the_fixture_catalog_and_accepts_our_task(tmp_path: Path):
    pytest.importorskip("sky")
    catalogs = tmp_path / ".sky" / "catalogs" / "v8"
    for cloud in ("aws", "gcp", "azure"):
        (catalogs / cloud).mkdir(parents=True)
        (catalogs / cloud / "vms.csv").write_bytes((FIXTURES / cloud / "vms.csv").read_bytes())
    unroutable = "http://10.255.255.1:9"
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        SKY_RUNTIME_DIR=str(tmp_path),
        SKYPILOT_DISABLE_USAGE_COLLECTION="1",
        HTTP_PROXY=unroutable,
        HTTPS_PROXY=unroutable,
        PYTHONPATH=str(REPO),
    )
    done = subprocess.run(
        [sys.executable, "-c", _REAL_SKY_PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["attempts"] == [], "SkyPilot tried the network"
    assert answer["offers"] == [
        "aws/us-east-1 p4d.24xlarge",
        "gcp/us-central1/us-central1-a a2-highgpu-1g",
        "gcp/us-central1/us-central1-a a2-highgpu-8g",
        "gcp/us-central1/us-central1-b a2-highgpu-1g",
    ]
    assert answer["task"] == [
        2,
        True,
        "us-central1",
        "us-central1-a",
        {"A100": 1},
        "a2-highgpu-1g",
        "GCP",
    ]
    assert answer["joined"] == [2, ["rank-zero", "rank-one"], False]
