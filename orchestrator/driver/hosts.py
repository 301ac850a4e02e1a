"""Where a job's controller VM runs, as the submitting side sees it: launched, watched, followed.

``remote.py`` follows a job whose controller runs in a VM; a host is how it reaches that VM:

- ``CloudHost``: the controller is an on-demand CPU instance launched through the provider's own
  adapter, as every other VM (AWS: ``run_instances`` with the controller's boot script as
  user-data, the instance profile ``geo-orchestrator-controller`` as its identity, a security group
  open to the overlay's UDP port only). The job's folder lives in the account's bucket (bucket.py):
  the laptop pushes the job there and pulls its state back. The same class drives a real account
  and a standing emulated one (moto's EC2 and S3 on the simulated internet, every instance booted
  as a namespace VM from its user-data), so the emulation tests the real path.
  GCP and Azure the same way: a VM with the project's service account, or with a user-assigned
  managed identity; the bucket a Cloud Storage bucket, or a storage account's container.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from orchestrator.driver.bucket import ASKED, FOLLOWED, BucketRecord, JobBucket
from orchestrator.errors import UserError

ROLE_LABEL = "geo-role"  # "controller" on a job's controller VM (a node has none)
# 2 vCPU, 8 GiB: the Ray head and the driver
CONTROLLER_TYPES = {"aws": "m6i.large", "gcp": "e2-standard-2", "azure": "Standard_D2s_v5"}
# Ubuntu 22.04 (apt has WireGuard's tools): the controller needs no GPU driver
CONTROLLER_AMI_PARAMETER = (
    "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
)
CONTROLLER_GCP_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
# (publisher, offer, SKU) of Canonical's Ubuntu 22.04 image on Azure
CONTROLLER_AZURE_IMAGE = ("Canonical", "0001-com-ubuntu-server-jammy", "22_04-lts-gen2")
# what an emulated VM's google-auth asks its metadata server at (no DNS on the simulated internet)
GCE_METADATA_ENV = {"GCE_METADATA_HOST": "169.254.169.254", "GCE_METADATA_IP": "169.254.169.254"}
CONTROLLER_BOOT_S = 600.0  # a CPU VM's boot plus the install of torch and Ray from PyPI
WHEEL_URL_S = 3600.0  # a presigned wheel URL: long enough for one VM's boot
PROFILE_READY_S = 60.0  # IAM: a new instance profile may be unknown to EC2 for seconds
LEASE_S = 24 * 3600.0  # the controller's expiry label: it lives as long as its job


class CloudHost:
    """A job's controller as an instance of the job's cloud (see the module's docstring)."""

    def __init__(self, provider: str, region: str, *, registration=None) -> None:
        """``registration``: a standing emulated cloud's (standing.py) to call instead of the
        provider's own endpoint."""
        from orchestrator.driver.cloud import standing_adapter

        self.provider, self.region, self.registration = provider, region, registration
        if registration is not None:
            self.adapter = standing_adapter(registration)
        else:
            self.adapter = _real_adapter(provider, region)
        self._identities = None

    def describe(self) -> str:
        where = f"emulated {self.provider}" if self.registration else self.provider
        return f"{where} {self.region}"

    def record(self, job: str) -> BucketRecord:
        """The job's place in the account's bucket (the bucket made when missing)."""
        bucket = self.adapter.job_bucket(self.region)
        return BucketRecord(
            url=f"{bucket}/jobs/{job}",
            provider=self.provider,
            region=self.region,
            endpoint_url=self.registration.endpoint if self.registration else None,
            api_netns=self.registration.api_netns if self.registration else None,
        )

    def bucket(self, record: BucketRecord) -> JobBucket:
        return JobBucket.open(record, **bucket_auth(record, self.registration))

    def launch(self, folder: Path, record: BucketRecord, *, wheel: Path) -> str:
        """Push the job's folder and the wheel, then launch the controller VM; its id."""
        from orchestrator.driver.controller import LEAVE_FILE
        from provisioners.base import Firewall, LaunchRequest
        from provisioners.bootstrap.joined import EXPIRES_LABEL, JOB_LABEL
        from provisioners.bootstrap.script import render_controller
        from provisioners.overlay.service import WG_PORT

        job = folder.name
        bucket = self.bucket(record)
        bucket.delete(ASKED[0])  # a stop asked of an earlier run
        bucket.delete(LEAVE_FILE)  # the last controller's leaving: the laptop has seen it
        bucket.push(folder)
        self.node_identity(record)
        boot = self._boot(job, record, bucket, wheel)
        request = LaunchRequest(
            gang=f"ctl-{job}",
            infra=f"{self.provider}/{self.region}",
            instance_type=CONTROLLER_TYPES[self.provider],
            gpu="",
            count=1,
            spot=False,
            gpus_per_node=0,
            labels=(
                (JOB_LABEL, job),
                (ROLE_LABEL, "controller"),
                (EXPIRES_LABEL, f"{time.time() + LEASE_S:.0f}"),
            ),
            timeout_s=CONTROLLER_BOOT_S,
            boot_scripts=(render_controller(boot),),
            # open to nodes not known yet: only WireGuard with the job's keys answers there
            firewall=Firewall(job=job, port=WG_PORT, sources=("0.0.0.0/0",), role="controller"),
            identity=self._identities.controller,
        )
        (node,) = self._launch_when_known(request)
        return node.node_id

    def node_identity(self, record: BucketRecord) -> str:
        """What the job's nodes act as (made when missing)."""
        if self._identities is None:
            self._identities = self.adapter.identities(record.url.split("/jobs/")[0])
        return self._identities.node

    def _launch_when_known(self, request):
        """IAM is eventually consistent: a profile made a moment ago may be refused by EC2."""
        import threading

        from provisioners.base import CloudCallError

        deadline, pause = time.monotonic() + PROFILE_READY_S, threading.Event()
        while True:
            try:
                return self.adapter.launch(request)
            except CloudCallError as error:
                if "instance profile" not in error.message.lower() or time.monotonic() > deadline:
                    raise
            pause.wait(5.0)

    def _boot(self, job: str, record: BucketRecord, bucket: JobBucket, wheel: Path):
        from provisioners.bootstrap.script import ControllerBoot

        args = ["--provider", self.provider, "--bucket", record.url, "--region", self.region]
        if self.registration is None:
            key = f"wheel/{wheel.name}"
            bucket.put(key, wheel.read_bytes())
            url = wheel_url(self.adapter, f"{record.url}/{key}")
            return ControllerBoot(job=job, install=_pip_install(url), args=tuple(args))
        from orchestrator.driver.cloud import halt_self_command
        from orchestrator.driver.standing import emulation_home
        from provisioners.local import vms

        # an emulated VM shares this machine's disk: a folder of its own, and this checkout
        vm_dir = emulation_home(self.provider) / "controllers" / f"{job}-{time.time_ns():x}"
        args += ["--endpoint-url", self.registration.endpoint]
        return ControllerBoot(
            job=job,
            install=vms.controller_install(wheel),
            args=tuple(args),
            vm_dir=str(vm_dir),
            env={
                "PYTHONPATH": str(vms.package_root()),
                "RAY_AUTH_MODE": "disabled",
                # its /run: short (sockets), in the cloud's own folder, gone with the cloud
                # (at most 30 characters: Ray's socket paths under it take 77 of the 107)
                "GEO_RUN_DIR": str(Path(self.registration.socket).parent / vm_dir.name[-3:]),
                **(GCE_METADATA_ENV if self.provider == "gcp" else {}),
            },
            shutdown_command=halt_self_command(),
            log_file=str(vm_dir / "bootstrap.log"),
        )

    def running(self, job: str) -> bool:
        """Whether the job's controller VM is starting or running (an API that does not answer
        this time: taken as running, so that no second controller is launched beside it)."""
        from provisioners.base import ProvisionerError

        try:
            return bool(self.controllers(job))
        except ProvisionerError as error:
            say(f"note: job {job}: {error.cloud} did not list its VMs ({error.message})")
            return True

    def controllers(self, job: str) -> list:
        from provisioners.bootstrap.joined import JOB_LABEL, of_job

        return [
            vm
            for vm in self.adapter.labelled(JOB_LABEL)
            if of_job(vm.labels, job)
            and vm.labels.get(ROLE_LABEL) == "controller"
            and vm.state.value in ("pending", "running", "preempting")
        ]

    def follow(self, folder: Path, record: BucketRecord, bucket: JobBucket | None = None) -> None:
        """The job's state as its controller last pushed it, into the laptop's copy."""
        (bucket or self.bucket(record)).pull(folder, FOLLOWED)

    def close(self) -> None:
        self.adapter.close()


def _real_adapter(provider: str, region: str):
    """The provider's adapter with the SDK's own credentials, launching controller images."""
    if provider == "aws":
        from provisioners.aws import AwsProvisioner

        return AwsProvisioner(regions=(region,), ami_ssm_parameter=CONTROLLER_AMI_PARAMETER)
    if provider == "azure":
        from provisioners.azure import AzureProvisioner, VmSettings

        publisher, offer, sku = CONTROLLER_AZURE_IMAGE
        image = VmSettings(image_publisher=publisher, image_offer=offer, image_sku=sku)
        return AzureProvisioner(locations=(region,) if region else None, vm=image)
    from provisioners.gcp import GcpProvisioner

    return GcpProvisioner(regions=(region,) if region else (), image=CONTROLLER_GCP_IMAGE)


def wheel_url(adapter, url: str) -> str:
    """How a VM fetches our wheel from the job's bucket: a presigned URL where the cloud makes
    them (S3), else the object's own URL, which the VM's bootstrap fetches with its identity's
    token (GCS: common.sh)."""
    if url.startswith("s3://"):
        return adapter.presign(url, expires_s=WHEEL_URL_S)
    return url


def bucket_auth(record: BucketRecord, registration=None) -> dict:
    """What opens the job's bucket from this machine: the SDK's chain (a real cloud), or keys
    made for an emulated cloud (its registration: AWS keys, GCP's bearer token)."""
    if not record.api_netns:
        return {}
    if record.provider in ("gcp", "azure"):
        if registration is None:
            from orchestrator.driver.standing import find

            registration = find(record.provider)
        if registration is None:
            from runtime.storage import StoreError

            raise StoreError(f"the emulated {record.provider} that holds {record.url} is down")
        if record.provider == "azure":
            from provisioners.emulated.azure_api import FakeCredential

            return {"credential": FakeCredential(registration.token)}
        from provisioners.gcp.sdk import token_credentials

        return {"credentials": token_credentials(registration.token)}
    from orchestrator.driver.cloud import emulated_credentials
    from provisioners.aws.sdk import keyed_session

    return {"session": keyed_session(emulated_credentials())}


def vm_bucket_auth(provider: str) -> dict:
    """What opens the job's bucket on one of its VMs: the SDK's chain finds the VM's identity,
    except on Azure, whose chain cannot tell offline that a VM has one: its managed identity."""
    if provider != "azure":
        return {}
    from provisioners.azure.credentials import managed_identity_credential

    return {"credential": managed_identity_credential()}


def _pip_install(wheel_url: str):
    """What a real controller VM installs: this machine's versions, from PyPI (torch's CPU
    build: the controller trains nothing)."""
    import importlib.metadata as metadata

    from provisioners.bootstrap.script import Install

    return Install(
        mode="pip",
        wheel=wheel_url,
        package_version=metadata.version("geo-orchestrator"),
        ray_version=metadata.version("ray"),
        torch_version=metadata.version("torch").split("+")[0],
    )


def node_install(install, wheel_url: str):
    """A real node's install: the controller's versions, torch from PyPI (its CUDA build)."""
    return dataclasses.replace(
        install, mode="pip", wheel=wheel_url, torch_index_url="https://pypi.org/simple"
    )


def host_region(recipe, provider: str) -> str:
    """Where the controller runs: the first region the recipe allows on the provider."""
    from orchestrator.driver.standing import emulator_regions

    for location in recipe.constraints.locations:
        parts = location.split("/")
        if parts[0] == provider and len(parts) > 1:
            return parts[1]
    regions = emulator_regions(provider)
    if not regions:
        raise UserError(
            f"the catalog lists no {provider} region",
            field="constraints.locations",
            fix=f"name a {provider} region in the recipe's locations",
        )
    return "us-east-1" if "us-east-1" in regions else regions[0]


def renew_controller_lease(adapter, job: str, *, now_s: float) -> int:
    """Move the expiry label of the job's controller VM a lease ahead: nothing else renews it
    (``JoinedProvisioner`` renews the nodes it launched). How many VMs it relabelled."""
    from provisioners.bootstrap.joined import EXPIRES_LABEL, JOB_LABEL, of_job

    ours = [
        vm
        for vm in adapter.labelled(JOB_LABEL)
        if of_job(vm.labels, job)
        and vm.labels.get(ROLE_LABEL) == "controller"
        and vm.state.value in ("pending", "running")
    ]
    if ours:
        adapter.relabel_labelled(ours, {EXPIRES_LABEL: f"{now_s + LEASE_S:.0f}"})
    return len(ours)


def bucket_of(folder: Path) -> JobBucket | None:
    """The bucket of a job whose controller runs as a cloud's instance (None: any other job),
    opened with this machine's credentials (an emulated cloud's: keys made for the call)."""
    record = BucketRecord.load(folder)
    if record is None:
        return None
    return JobBucket.open(record, **bucket_auth(record))


def refresh(folder: Path) -> None:
    """The laptop's copy of a hosted job's state brought up to date from its bucket, once; a
    bucket that does not answer leaves the copy as it was, with a note."""
    BucketReader(folder)()


class BucketReader:
    """Brings the laptop's copy of a hosted job's state up to date from its bucket each time it
    is called, for those that read it again and again (``logs -f``). The bucket is opened on the
    first call and kept: opening makes an SDK client, ~0.1 CPU-s for boto3, most of a read's
    cost. It is opened afresh after a read that failed or when the job's record changed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._opened: tuple[BucketRecord, JobBucket] | None = None

    def __call__(self) -> None:
        from runtime.storage import StoreError

        record = BucketRecord.load(self.folder)
        if record is None:
            return
        if record.api_netns:
            from provisioners.local import netns

            if record.api_netns not in netns.namespaces():  # its emulated cloud was taken down
                say(
                    f"note: job {self.folder.name}: the emulated {record.provider} that holds "
                    "its bucket is down; its last state here"
                )
                return
        try:
            if self._opened is None or self._opened[0] != record:
                self._opened = (record, JobBucket.open(record, **bucket_auth(record)))
            self._opened[1].pull(self.folder, FOLLOWED)
        except (StoreError, OSError) as error:
            self._opened = None  # its keys or its cloud may have changed: open it again
            say(
                f"note: job {self.folder.name}: its bucket did not answer ({error}); its last "
                "state here"
            )


def ask_stop(folder: Path) -> None:
    """A stop asked of a hosted job reaches its controller through the bucket."""
    bucket = bucket_of(folder)
    if bucket is not None:
        bucket.put(ASKED[0], b"stop\n")


def find_job(job: str, provider: str, *, registration=None) -> BucketRecord | None:
    """The job's place in ``provider``'s job buckets (every region's), looked up with this
    machine's credentials: a job submitted from another machine. ``registration``: a standing
    emulated cloud's to ask instead."""
    from orchestrator.driver.cloud import standing_adapter

    adapter = (
        standing_adapter(registration)
        if registration is not None
        else _real_adapter(provider, "us-east-1" if provider == "aws" else "")  # any region
    )
    try:
        buckets = adapter.job_buckets()
    finally:
        adapter.close()
    for region, url in sorted(buckets.items()):
        record = BucketRecord(
            url=f"{url}/jobs/{job}",
            provider=provider,
            region=region,
            endpoint_url=registration.endpoint if registration else None,
            api_netns=registration.api_netns if registration else None,
        )
        if JobBucket.open(record, **bucket_auth(record, registration)).exists("state.json"):
            return record
    return None


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
