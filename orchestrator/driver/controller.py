"""The controller VM's program: a job's Ray head, overlay join service and driver, off the laptop.

``submit --emulate`` writes the job's launch (``controller.json``) into the job's folder (the
job's bucket: the laptop and every controller see the same folder) and has the standing emulated
cloud (standing.py) boot a controller VM that runs ``python -m orchestrator.driver.controller
--job-folder FOLDER``. The program

- takes the job's lock (lock.py: one controller per job; ``status`` names it);
- closes its public interface to all but WireGuard, starts the overlay's join service and the Ray
  head on its overlay address, and builds the wheel its nodes install;
- ends the VMs an earlier controller of the job left running (found by their ``geo-job`` label:
  that controller's nodes cannot rejoin a new head);
- runs the driver actor on the head, reaching the provider's API itself (cloud.py) and the
  emulated cloud's own decisions (``--preempt-at``) through the control socket;
- on SIGTERM (the VM's orderly shutdown) asks the driver to leave: it checkpoints the committed
  step, frees its nodes and records ``stopped`` with ``controller.leaving`` beside it, so that the
  next controller resumes with no committed step lost. A controller that vanishes without one
  (power loss) is resumed from the newest checkpoint and the driver's state;
- writes the plan it ended on (``plan.json``) for the submitter's summary, and exits; its VM
  powers off with it.
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
SERVICE_READY_S = 30.0

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


def run_controller(folder: Path) -> int:
    from orchestrator.driver.lock import JobLock

    launch = json.loads((folder / LAUNCH_FILE).read_text())
    with JobLock.acquire(folder, job=folder.name):
        (folder / LEAVE_FILE).unlink(missing_ok=True)
        final, choice = _serve(folder, launch)
    if choice is not None:
        (folder / PLAN_FILE).write_text(json.dumps(choice.to_dict()))
    print(f"controller: job {folder.name} ended {final.phase} at step {final.step}", flush=True)
    return 0


def _leave(folder: Path) -> None:
    """SIGTERM: the VM shuts down. The driver checkpoints and frees its nodes after this step."""
    (folder / LEAVE_FILE).write_text("the controller VM shuts down\n")


def _serve(folder: Path, launch: dict):
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.actor import DriverSpec
    from orchestrator.driver.cloud import (
        MIGRATION_S,
        NOTICE_S,
        CloudSpec,
        EmulatorMarket,
        emulated_credentials,
        halt_self_command,
    )
    from orchestrator.driver.job import absolute_paths
    from orchestrator.driver.local import serve_and_follow
    from orchestrator.driver.standing import Registration
    from orchestrator.recipe import load_recipe
    from provisioners.local import vms
    from provisioners.local.cluster import session_name, start_head
    from provisioners.registry import provisioner_class

    registration = Registration(**{**launch["cloud"], "regions": tuple(launch["cloud"]["regions"])})
    if registration.provider == "aws":  # the controller VM's own keys (an instance profile's)
        os.environ.update(emulated_credentials())
    recipe = absolute_paths(load_recipe(Path(launch["recipe_path"]), catalog=default_catalog()))
    if launch.get("profile"):
        model = dataclasses.replace(recipe.model, profile=launch["profile"])
        recipe = dataclasses.replace(recipe, model=model)
    own = folder / "controller"
    own.mkdir(mode=0o700, exist_ok=True)
    service, head = None, None
    # the VM's /run (short: Ray's and the overlay's socket paths live under it), gone with the VM
    run_dir = Path(os.environ.get("GEO_RUN_DIR") or tempfile.mkdtemp(prefix="geo-vm-"))
    ray_temp_root = str(run_dir / "ray")
    os.makedirs(ray_temp_root, mode=0o700, exist_ok=True)
    try:
        service, overlay_ip, admin_socket, public_ip = _start_overlay(own, run_dir)
        install = vms.controller_install(vms.build_wheel(own / "wheel"))
        head = start_head(session_name(), 1, node_ip=overlay_ip)
        wanted = {loc.split("/")[1] for loc in recipe.constraints.locations if "/" in loc}
        cloud = CloudSpec(
            provider=registration.provider,
            # the recipe's regions: polling every region the emulation serves would be slow
            regions=tuple(sorted(wanted & set(registration.regions))) or registration.regions,
            endpoint_url=registration.endpoint,
            ray_address=head.address,
            admin_socket=str(admin_socket),
            install=install,
            nodes_dir=str(folder / "nodes"),
            ray_env=tuple(vms.RAY_ENV.items()),
            shutdown_command=halt_self_command(),
            grace_s=recipe.recovery.controller_grace_s,
            node_label=vms.NODE_LABEL,
            api_token=registration.token,
            account=registration.account,
            ray_temp_root=ray_temp_root,
            public_ip=public_ip,
        )
        _end_earlier_nodes(cloud, folder.name)
        spec = DriverSpec(
            recipe=recipe,
            recipe_path=launch["recipe_path"],
            jobs_dir=str(folder.parent),
            gateway=f"emulated-{folder.name}",
            preempt_at=tuple(launch.get("preempt_at", ())),
            preempt_location_at=tuple(launch.get("preempt_location_at", ())),
            lose_at=tuple(launch.get("lose_at", ())),
            migration_s=MIGRATION_S,
            launch_timeout_s=provisioner_class(registration.provider).launch_timeout_s,
            cloud=cloud,
        )
        notice_s = launch.get("notice_s")
        market = EmulatorMarket(
            StandingEmulator(registration), notice_s=NOTICE_S if notice_s is None else notice_s
        )
        return serve_and_follow(
            market,
            spec,
            job=folder.name,
            address=head.address,
            controller=lambda: None,  # the driver on the head, in this VM
            on_step=None,
            env=_aws_keys() if registration.provider == "aws" else None,
            # after Ray's own handler (which would end this process at once)
            connected=lambda: signal.signal(signal.SIGTERM, lambda *_: _leave(folder)),
        )
    finally:
        if head is not None:
            head.shutdown()
        if service is not None:
            service.terminate()
            service.wait(timeout=30)
        shutil.rmtree(run_dir, ignore_errors=True)


def _aws_keys() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


def _start_overlay(own: Path, run_dir: Path) -> tuple[subprocess.Popen, str, Path, str]:
    """The firewall, then the join service on this VM's public address; the service, its overlay
    address, its admin socket and the public address."""
    import select

    from provisioners.bootstrap.script import firewall_rules
    from provisioners.overlay import wg
    from provisioners.overlay.service import ADMIN_SOCKET, WG_PORT

    subprocess.run(["nft", "-f", "-"], input=firewall_rules("eth0", WG_PORT), text=True, check=True)
    public_ip = _address_of("eth0")
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


def _end_earlier_nodes(cloud, job: str) -> None:
    """Terminate the job's VMs an earlier controller left (they cannot join this head)."""
    from orchestrator.driver.cloud import adapter_for
    from provisioners.base import ProvisionerError
    from provisioners.bootstrap.joined import JOB_LABEL

    adapter = adapter_for(cloud)
    try:
        left = [
            vm
            for vm in adapter.labelled(JOB_LABEL)
            if vm.labels.get(JOB_LABEL) == job
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
    parser.add_argument("--job-folder", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray's core worker would catch SIGTERM itself (a stack dump, then a stuck exit): the VM's
    # shutdown is ours to handle (``_leave``)
    os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = "1"
    return run_controller(args.job_folder)


if __name__ == "__main__":
    sys.exit(main())
