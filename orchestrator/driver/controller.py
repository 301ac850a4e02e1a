"""The controller VM's program: a job's Ray head, overlay join service and driver, off the laptop.

``submit`` pushes the job's folder with its launch (``controller.json``) to the job's bucket
(bucket.py) and launches the controller as an instance of the job's cloud (hosts.py), whose boot
script runs ``python -m orchestrator.driver.controller --bucket URL --region R --provider P``.
The program

- pulls the job's folder from the bucket and pushes its state back every few seconds (a
  ``stop.request`` comes the other way);
- takes the job's lock (lock.py: one controller per job; ``status`` names it);
- closes its public interface to all but WireGuard, starts the overlay's join service and the Ray
  head on its overlay address, and builds the wheel its nodes install;
- ends the VMs an earlier controller of the job left running (found by their ``geo-job`` label:
  that controller's nodes cannot rejoin a new head);
- runs the driver actor on the head, reaching the provider's API itself (cloud.py) and, on an
  emulated cloud, the cloud's own decisions (``--preempt-at``) through its control socket;
- on SIGTERM (the VM's orderly shutdown) asks the driver to leave: it checkpoints the committed
  step, frees its nodes and records ``stopped`` with ``controller.leaving`` beside it, so that the
  next controller resumes with no committed step lost. A controller that vanishes without one
  (power loss) is resumed from the newest checkpoint and the driver's state;
- writes the plan it ended on (``plan.json``) for the submitter's summary, and exits; its VM
  powers off with it (an Azure VM deletes itself: a stopped one is still billed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

LAUNCH_FILE = "controller.json"
LEAVE_FILE = "controller.leaving"
PLAN_FILE = "plan.json"
RECIPE_FILE = "recipe.yaml"  # the recipe, in a folder that travels through the bucket
SERVICE_READY_S = 30.0
FIRST_PULL_S = 600.0  # how long a new identity's storage role may take to apply
REAL_NODES_DIR = "/var/lib/geo-orchestrator/nodes"  # on each node's own disk

log = logging.getLogger(__name__)


class StandingEmulator:
    """The emulated cloud's own decisions, asked of the standing daemon (EmulatorMarket's)."""

    def __init__(self, registration) -> None:
        self.registration = registration

    def _call(self, op: str, **args) -> dict:
        from orchestrator.driver.standing import call

        return call(self.registration, op, **args)

    def interrupt(self, instance_id: str, *, notice_s: float) -> None:
        self._call("interrupt", instance=instance_id, notice_s=notice_s)

    def lose(self, instance_id: str) -> None:
        self._call("lose", instance=instance_id)

    def interrupt_zone(self, zone: str, *, notice_s: float) -> list[str]:
        return self._call("interrupt_zone", zone=zone, notice_s=notice_s)["instances"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hosted:
    """A controller launched as an instance of its cloud (hosts.py): where its job's bucket is."""

    provider: str
    region: str
    bucket_url: str
    endpoint_url: str | None  # an emulated API's; None: the provider's own


def run_controller(folder: Path, *, hosted: Hosted) -> int:
    """Run the job of ``folder``, whose files come from (and go back to) the job's bucket,
    mirrored every ``bucket.MIRROR_S``."""
    from orchestrator.driver.lock import JobLock

    mirror = _Mirror.start(folder, hosted)
    try:
        launch = json.loads((folder / LAUNCH_FILE).read_text())
        with JobLock.acquire(folder, job=folder.name):
            (folder / LEAVE_FILE).unlink(missing_ok=True)
            final, choice = _serve(folder, launch, hosted)
        if choice is not None:
            (folder / PLAN_FILE).write_text(json.dumps(choice.to_dict()))
    finally:
        mirror.stop()  # its last push: the final state and the plan
    print(f"controller: job {folder.name} ended {final.phase} at step {final.step}", flush=True)
    if hosted.provider == "azure":
        _delete_own_vm(launch)
    return 0


def _delete_own_vm(launch: dict) -> None:
    """An Azure VM that powers itself off is stopped, not deallocated, and still billed (AWS
    terminates it on shutdown, GCP bills a stopped VM's disk only): this one deletes itself, by
    its managed identity (Contributor on the group), once its job's state is in the bucket."""
    from orchestrator.driver.cloud import azure_on_vm, emulated_adapter
    from provisioners.base import LabelledVm, NodeState, ProvisionerError

    compute = azure_compute()
    registration = _registration(launch)
    if registration is not None:  # an emulated Azure: its API and token
        adapter = emulated_adapter(registration)
    else:
        adapter = azure_on_vm(compute["subscriptionId"], compute["resourceGroupName"])
    own = LabelledVm(
        node_id=compute["name"],
        infra=f"azure/{compute.get('location', '')}",
        instance_type="",
        state=NodeState.RUNNING,
    )
    try:
        print(f"controller: deleting this VM ({own.node_id})", flush=True)
        adapter.terminate_labelled([own])
    except ProvisionerError as error:  # its lease label shows it as a leak in status --all
        print(f"controller: could not delete this VM: {error}", flush=True)
    finally:
        adapter.close()


class _Mirror:
    """The folder's state pushed to the job's bucket while the job runs, a stop pulled from it."""

    def __init__(self, folder: Path, bucket) -> None:
        import threading

        self.folder, self.bucket = folder, bucket
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bucket-mirror", daemon=True)

    @classmethod
    def start(cls, folder: Path, hosted: Hosted) -> _Mirror:
        from orchestrator.driver.bucket import BucketRecord

        record = BucketRecord(
            url=hosted.bucket_url,
            provider=hosted.provider,
            region=hosted.region,
            endpoint_url=hosted.endpoint_url,
        )

        # with this VM's identity (its instance role, service account or managed identity)
        bucket = _first_pull(record, folder, provider=hosted.provider)
        bucket.delete(LEAVE_FILE)  # an earlier controller's: this one has not left
        mirror = cls(folder, bucket)
        mirror._thread.start()
        return mirror

    def _loop(self) -> None:
        from orchestrator.driver.bucket import ASKED, FOLLOWED, MIRROR_S
        from runtime.storage import StoreError

        while not self._done.wait(MIRROR_S):
            try:
                self.bucket.push(self.folder, FOLLOWED)
                self.bucket.pull(self.folder, ASKED)
            except StoreError as error:  # the next round tries again
                log.warning("bucket mirror: %s", error)

    def stop(self) -> None:
        from orchestrator.driver.bucket import FOLLOWED

        self._done.set()
        self._thread.join(timeout=30)
        self.bucket.push(self.folder, FOLLOWED)


def _first_pull(record, folder: Path, *, provider: str):
    """The job's folder from its bucket, opened with this VM's identity; the bucket. On Azure a
    role given to the VM's identity a moment ago may take minutes to reach Blob Storage: refused,
    the bucket is opened and asked again. Elsewhere a refusal ends the controller (its VM powers
    off and the submitter boots another, whose SDK looks for its credentials afresh)."""
    import threading
    import time

    from orchestrator.driver.bucket import JobBucket
    from orchestrator.driver.hosts import vm_bucket_auth
    from runtime.storage import StoreError

    deadline, pause = time.monotonic() + FIRST_PULL_S, threading.Event()
    while True:
        bucket = JobBucket.open(record, **vm_bucket_auth(provider))
        try:
            bucket.pull(folder)
            return bucket
        except StoreError as error:
            if provider != "azure" or time.monotonic() > deadline:
                raise
            print(f"controller: the job's bucket refused ({error}); asking again", flush=True)
        pause.wait(10.0)


def _registration(launch: dict):
    """The standing emulated cloud the launch names (its API, token and control socket), or
    None on a real cloud."""
    from orchestrator.driver.standing import Registration

    cloud = launch.get("cloud")
    return None if not cloud else Registration(**{**cloud, "regions": tuple(cloud["regions"])})


def _leave(folder: Path) -> None:
    """SIGTERM: the VM shuts down. The driver checkpoints and frees its nodes after this step."""
    (folder / LEAVE_FILE).write_text("the controller VM shuts down\n")


def _serve(folder: Path, launch: dict, hosted: Hosted):
    from orchestrator.driver.actor import DriverSpec
    from orchestrator.driver.cloud import MIGRATION_S, NOTICE_S, EmulatorMarket
    from orchestrator.driver.local import serve_and_follow
    from provisioners.local.cluster import session_name, start_head
    from provisioners.registry import provisioner_class

    # an emulated cloud: its control socket carries its own decisions
    registration = _registration(launch)
    provider = hosted.provider
    recipe = _recipe(folder, launch, bucket_url=hosted.bucket_url if _real(hosted) else None)
    own = folder / "controller"
    own.mkdir(mode=0o700, exist_ok=True)
    service, head, lease = None, None, None
    # the VM's /run (short: Ray's and the overlay's socket paths live under it), gone with the VM
    run_dir = Path(os.environ.get("GEO_RUN_DIR") or tempfile.mkdtemp(prefix="geo-vm-"))
    ray_temp_root = str(run_dir / "ray")
    os.makedirs(ray_temp_root, mode=0o700, exist_ok=True)
    try:
        service, overlay_ip, admin_socket, public_ip = _start_overlay(
            own, run_dir, real=_real(hosted), provider=provider
        )
        head = start_head(session_name(), 1, node_ip=overlay_ip)
        cloud = _cloud_spec(
            folder,
            launch,
            recipe,
            registration=registration,
            hosted=hosted,
            ray_address=head.address,
            admin_socket=str(admin_socket),
            ray_temp_root=ray_temp_root,
            public_ip=public_ip,
        )
        _end_earlier_nodes(cloud, folder.name)
        lease = _LeaseKeeper.start(cloud, folder.name)
        spec = DriverSpec(
            recipe=recipe,
            recipe_path=str(folder / launch["recipe_path"]),  # absolute stays absolute
            jobs_dir=str(folder.parent),
            gateway=f"emulated-{folder.name}",
            preempt_at=tuple(launch.get("preempt_at", ())),
            preempt_location_at=tuple(launch.get("preempt_location_at", ())),
            lose_at=tuple(launch.get("lose_at", ())),
            migration_s=MIGRATION_S,
            launch_timeout_s=provisioner_class(provider).launch_timeout_s,
            cloud=cloud,
        )
        notice_s = launch.get("notice_s")
        market = None
        if registration is not None:
            market = EmulatorMarket(
                StandingEmulator(registration), notice_s=NOTICE_S if notice_s is None else notice_s
            )
        return serve_and_follow(
            market or _NoChaos(),
            spec,
            job=folder.name,
            folder=folder,
            address=head.address,
            controller=lambda: None,  # the driver on the head, in this VM
            on_step=None,
            env=_aws_keys() if provider == "aws" else None,
            # after Ray's own handler (which would end this process at once)
            connected=lambda: signal.signal(signal.SIGTERM, lambda *_: _leave(folder)),
        )
    finally:
        if lease is not None:
            lease.stop()
        if head is not None:
            head.shutdown()
        if service is not None:
            service.terminate()
            service.wait(timeout=30)
        shutil.rmtree(run_dir, ignore_errors=True)


class _LeaseKeeper:
    """This controller VM's own expiry label, moved a lease ahead every half lease while the
    job runs (a VM whose label expired looks leaked in ``status --all``)."""

    def __init__(self, adapter, job: str) -> None:
        import threading

        self.adapter, self.job = adapter, job
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="own-lease", daemon=True)

    @classmethod
    def start(cls, cloud, job: str) -> _LeaseKeeper:
        from orchestrator.driver.cloud import adapter_for

        keeper = cls(adapter_for(cloud), job)
        keeper._thread.start()
        return keeper

    def _loop(self) -> None:
        import time

        from orchestrator.driver.hosts import LEASE_S, renew_controller_lease
        from provisioners.base import ProvisionerError

        while not self._done.wait(LEASE_S / 2):
            try:
                renew_controller_lease(self.adapter, self.job, now_s=time.time())
            except ProvisionerError as error:  # the next half lease tries again
                log.warning("own lease: %s", error)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        self.adapter.close()


class _NoChaos:
    """A real cloud's market takes no orders: its reclaims are its own (the watchers hear them)."""

    def __getattr__(self, name: str):
        raise AttributeError(f"a real cloud has no {name}: --preempt-at needs --emulate")


def _real(hosted: Hosted) -> bool:
    return hosted.endpoint_url is None


def _recipe(folder: Path, launch: dict, *, bucket_url: str | None):
    """The recipe as the driver reads it: the launch's profile, and on a real cloud
    (``bucket_url``: the job's) the job's checkpoints in its bucket (a node's disk goes with the
    node)."""
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.job import absolute_paths
    from orchestrator.recipe import load_recipe

    recipe = absolute_paths(load_recipe(folder / launch["recipe_path"], catalog=default_catalog()))
    if launch.get("profile"):
        # a file the folder holds (measured on the laptop), else as the recipe says (analytic)
        held = folder / launch["profile"]
        profile = str(held) if held.is_file() else launch["profile"]
        model = dataclasses.replace(recipe.model, profile=profile)
        recipe = dataclasses.replace(recipe, model=model)
    if launch.get("code"):  # a module model's package, carried from the laptop (shipped.py)
        from orchestrator.driver.shipped import unpack_code

        code = str(unpack_code(folder, launch["code"]))
        recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, code=code))
    path = launch.get("checkpoint_path") or recipe.checkpointing.path
    if bucket_url is not None and not path.startswith(("s3://", "gs://", "https://")):
        path = f"{bucket_url}/checkpoints"
    checkpointing = dataclasses.replace(recipe.checkpointing, path=path)
    return dataclasses.replace(recipe, checkpointing=checkpointing)


def _cloud_spec(folder: Path, launch: dict, recipe, *, registration, hosted, **where):
    """How the driver reaches the provider and boots nodes into this controller's cluster."""
    from orchestrator.driver.cloud import CloudSpec, halt_self_command
    from orchestrator.driver.hosts import node_install
    from orchestrator.driver.standing import emulator_regions
    from provisioners.bootstrap.script import VM_SHUTDOWN
    from provisioners.local import vms

    provider = hosted.provider
    served = registration.regions if registration else tuple(emulator_regions(provider))
    wanted = {loc.split("/")[1] for loc in recipe.constraints.locations if "/" in loc}
    install = vms.controller_install(vms.build_wheel(folder / "controller" / "wheel"))
    if _real(hosted):  # each node's URL for it is made at its boot (node_boot)
        install = node_install(install, launch["wheel_url"])
    return CloudSpec(
        provider=provider,
        # the recipe's regions: polling every region the provider serves would be slow
        regions=tuple(sorted(wanted & set(served))) or served,
        endpoint_url=registration.endpoint if registration else None,
        install=install,
        nodes_dir=REAL_NODES_DIR if _real(hosted) else str(folder / "nodes"),
        ray_env=tuple(vms.RAY_ENV.items()),
        shutdown_command=VM_SHUTDOWN if _real(hosted) else halt_self_command(),
        grace_s=recipe.recovery.controller_grace_s,
        node_label=vms.NODE_LABEL,
        api_token=registration.token if registration else None,
        account=registration.account if registration else _own_account(provider, hosted),
        managed_identity=_real(hosted) and provider == "azure",
        node_identity=launch.get("node_identity"),
        **where,
    )


def _own_account(provider: str, hosted) -> str | None:
    """A real Azure controller's subscription (its metadata says it); None elsewhere (the SDK
    finds the account or project itself)."""
    return azure_compute()["subscriptionId"] if _real(hosted) and provider == "azure" else None


def _aws_keys() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


def _start_overlay(
    own: Path, run_dir: Path, *, real: bool, provider: str
) -> tuple[subprocess.Popen, str, Path, str]:
    """The firewall, then the join service on this VM's public address; the service, its overlay
    address, its admin socket and the public address. ``real``: a cloud's VM, whose interface
    holds a private address behind the cloud's NAT (its public one comes from the metadata)."""
    import select

    from provisioners.bootstrap.script import firewall_rules
    from provisioners.overlay import wg
    from provisioners.overlay.service import ADMIN_SOCKET, WG_PORT

    interface = _default_interface() if real else "eth0"
    subprocess.run(
        ["nft", "-f", "-"], input=firewall_rules(interface, WG_PORT), text=True, check=True
    )
    public_ip = _public_ipv4(provider) if real else _address_of(interface)
    job = own.parent.name
    admin_socket = run_dir / ADMIN_SOCKET
    with open(own / "overlay.log", "ab") as out:
        service = subprocess.Popen(
            [sys.executable, "-m", "provisioners.overlay.service", "--job", job]
            + ["--public-ip", public_ip, "--state-dir", str(own / "overlay")]
            + ["--interface", wg.interface_name(job, "controller")]
            + ["--admin-socket", str(admin_socket)],
            stdout=subprocess.PIPE,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
    ready, _, _ = select.select([service.stdout], [], [], SERVICE_READY_S)
    line = service.stdout.readline() if ready else b""
    if not line:
        service.kill()
        raise RuntimeError(f"the overlay service did not start (see {own / 'overlay.log'})")
    return service, json.loads(line)["controller_ip"], admin_socket, public_ip


def _address_of(interface: str) -> str:
    shown = subprocess.run(
        ["ip", "-j", "-4", "address", "show", "dev", interface],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(shown.stdout)[0]["addr_info"][0]["local"]


def _default_interface() -> str:
    shown = subprocess.run(
        ["ip", "-j", "route", "show", "default"], capture_output=True, text=True, check=True
    )
    return json.loads(shown.stdout)[0]["dev"]


def _public_ipv4(provider: str) -> str:
    """The VM's public address, from its cloud's metadata server."""
    import urllib.request

    if provider == "azure":  # IMDS has no Standard public IP: ARM does, asked as this VM
        from orchestrator.driver.cloud import azure_on_vm

        compute = azure_compute()
        adapter = azure_on_vm(compute["subscriptionId"], compute["resourceGroupName"])
        try:
            return adapter.address_of(compute["name"])
        finally:
            adapter.close()
    if provider == "gcp":
        ask = urllib.request.Request(
            "http://169.254.169.254/computeMetadata/v1/instance/network-interfaces/0/"
            "access-configs/0/external-ip",
            headers={"Metadata-Flavor": "Google"},
        )
        with urllib.request.urlopen(ask, timeout=5) as reply:
            return reply.read().decode().strip()

    base = "http://169.254.169.254/latest"
    ask = urllib.request.Request(
        f"{base}/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
    )
    with urllib.request.urlopen(ask, timeout=5) as reply:
        token = reply.read().decode()
    get = urllib.request.Request(
        f"{base}/meta-data/public-ipv4", headers={"X-aws-ec2-metadata-token": token}
    )
    with urllib.request.urlopen(get, timeout=5) as reply:
        return reply.read().decode().strip()


def azure_compute() -> dict:
    """This Azure VM's name, resource group, subscription and location, from its metadata."""
    import urllib.request

    ask = urllib.request.Request(
        "http://169.254.169.254/metadata/instance/compute?api-version=2021-02-01",
        headers={"Metadata": "true"},
    )
    with urllib.request.urlopen(ask, timeout=5) as reply:
        return json.load(reply)


def _end_earlier_nodes(cloud, job: str) -> None:
    """Terminate the job's VMs an earlier controller left (they cannot join this head)."""
    from orchestrator.driver.cloud import adapter_for
    from orchestrator.driver.hosts import ROLE_LABEL
    from provisioners.base import ProvisionerError
    from provisioners.bootstrap.joined import JOB_LABEL, of_job

    adapter = adapter_for(cloud)
    try:
        left = [
            vm
            for vm in adapter.labelled(JOB_LABEL)
            if of_job(vm.labels, job)
            and vm.labels.get(ROLE_LABEL) != "controller"  # this one among them
            and vm.state.value in ("pending", "running", "preempting")
        ]
        if left:
            log.info("ending %d VM(s) of an earlier controller", len(left))
            print(f"controller: ending {len(left)} VM(s) an earlier controller left", flush=True)
            adapter.terminate_labelled(left)
    except ProvisionerError as error:  # their dead-man switch ends them anyway
        print(f"controller: could not list the job's earlier VMs: {error}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.driver.controller")
    parser.add_argument(
        "--bucket", required=True, help="the job's folder in its bucket (s3://.../jobs/JOB)"
    )
    parser.add_argument("--region", required=True, help="the bucket's (and this VM's) region")
    parser.add_argument("--provider", choices=("aws", "gcp", "azure"), default="aws")
    parser.add_argument("--endpoint-url", help="an emulated cloud's API")
    parser.add_argument("--jobs-dir", type=Path, default=Path("/var/lib/geo-orchestrator/jobs"))
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray's core worker would catch SIGTERM itself (a stack dump, then a stuck exit): the VM's
    # shutdown is ours to handle (``_leave``)
    os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = "1"
    if args.provider == "aws":
        os.environ.setdefault("AWS_DEFAULT_REGION", args.region)
        # the instance role's keys come from the metadata service, which boto3 asks once with a
        # 1 s timeout: a busy host (a fresh VM still booting its services) misses that
        os.environ.setdefault("AWS_METADATA_SERVICE_TIMEOUT", "5")
        os.environ.setdefault("AWS_METADATA_SERVICE_NUM_ATTEMPTS", "3")
    hosted = Hosted(
        provider=args.provider,
        region=args.region,
        bucket_url=args.bucket,
        endpoint_url=args.endpoint_url,
    )
    folder = args.jobs_dir / args.bucket.rstrip("/").rsplit("/", 1)[-1]
    return run_controller(folder, hosted=hosted)


if __name__ == "__main__":
    sys.exit(main())
