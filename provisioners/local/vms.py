"""The local cloud's VMs as network namespaces that boot the way a cloud's VMs do.

``NamespaceCluster`` has ``LocalCluster``'s interface (cluster.py), so the provisioner, its market
and its chaos work unchanged; what differs is what a node is:

- the job gets a simulated internet (netns.py): a bridge in a namespace of its own, TEST-NET-2
  "public" addresses, no route to this machine's network;
- the **controller VM** (``geo+<job>+controller``) runs the overlay's join service and admin
  socket (provisioners/overlay/service.py) and the Ray head, bound to the controller's overlay
  address 100.64.0.1. The submitting process enters that namespace (``netns.Entered``) before the
  head starts, so the head, the local cloud's API (the gateway it serves) and the process that
  follows the job all live in the controller VM; it leaves it at shutdown;
- every other node (the driver's controller node, each GPU node) is a VM namespace that runs the
  node bootstrap (provisioners/bootstrap/): the script installs the wheel built from this checkout
  into a venv of its own (nothing downloaded: the controller's Ray and torch are seen through a
  .pth file), closes its public interface to all but WireGuard, joins the overlay with a one-use
  token minted for it, ``ray start``s on its overlay address and becomes its watcher;
- a node is found in the GCS by its ``geo-node`` label; a bootstrap that exits first, or does not
  join within the launch's timeout, raises ``BootstrapFailed`` with its log's last lines and the
  VM is removed;
- killing a node removes its namespace (every process in it at once: a VM that vanishes) and its
  overlay peer; ``shutdown`` leaves the controller VM and sweeps every namespace of the job. The
  reaper (reaper.py) sweeps them too when the submitting process dies, even by ``kill -9``.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provisioners.bootstrap.script import TAIL_LINES, Install, NodeBoot, firewall_rules, render
from provisioners.local import netns, reaper
from provisioners.local.cluster import (
    OBJECT_STORE_BYTES,
    ClusterNodes,
    NodeSpec,
    alive_nodes,
    session_name,
    start_head,
)
from provisioners.overlay import wg
from provisioners.overlay.service import ADMIN_SOCKET, WG_PORT, admin_call

log = logging.getLogger(__name__)

CONTROLLER_VM = "controller"
FAILED_MARK = "GEO-BOOTSTRAP-FAILED"  # node.sh's first line when a step fails
NODE_LABEL = "geo-node"
SERVICE_READY_S = 30.0
JOIN_POLL_S = 0.25  # how long one wait on a booting node's process lasts between GCS looks
TOKEN_TTL_S = 120.0  # a local VM boots in seconds: its token need not live longer
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}  # as the local head (cluster.py)


class BootstrapFailed(RuntimeError):
    """A node's bootstrap exited or timed out before the node joined; the message ends with the
    last lines of its log (also in ``log_tail``)."""

    def __init__(self, message: str, *, log_tail: str, log_file: Path) -> None:
        super().__init__(f"{message}; last lines of {log_file}:\n{log_tail}")
        self.log_tail, self.log_file = log_tail, log_file


@dataclass
class _VmNode:
    name: str
    process: subprocess.Popen
    folder: Path


def unsupported_reason() -> str | None:
    """None where this machine can run namespace VMs; else why not."""
    reason = netns.unsupported_reason()
    if reason is None and not (package_root() / "pyproject.toml").exists():
        reason = f"no checkout at {package_root()} to build the nodes' wheel from"
    return reason


def package_root() -> Path:
    import provisioners

    return Path(provisioners.__file__).resolve().parents[1]


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout (the nodes install it, as a cloud's VMs install a release);
    the one already in ``out`` when no file of the checkout changed since it was built (a
    relaunched controller does not wait for a new one), else a copy of this user's cached one
    for this checkout (``wheel_cache``) when it is that recent, else one built now."""
    out.mkdir(parents=True, exist_ok=True)
    newest = _newest_source_ns()
    built = list(out.glob("geo_orchestrator-*.whl"))
    if len(built) == 1 and built[0].stat().st_mtime_ns > newest:
        return built[0]
    for old in out.glob("*.whl"):
        old.unlink()
    cache = wheel_cache()
    cached = [w for w in cache.glob("geo_orchestrator-*.whl") if w.stat().st_mtime_ns > newest]
    source = cached[0] if len(cached) == 1 else _build_into(cache)
    target = out / source.name
    shutil.copy2(source, target)  # with its time, which says it is newer than the sources
    return target


def wheel_cache() -> Path:
    """This user's folder of the wheel built from this checkout (``$XDG_CACHE_HOME`` or
    ~/.cache, one folder per checkout): each job's VMs install it, and building it takes
    seconds of CPU that every namespace job would otherwise spend again."""
    import hashlib

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    checkout = hashlib.sha256(str(package_root()).encode()).hexdigest()[:16]
    folder = base / "geo-orchestrator" / "wheels" / checkout
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _build_into(cache: Path) -> Path:
    """Build the checkout's wheel in a folder of its own and move it into ``cache`` in one
    step (two jobs building at once each leave a whole wheel, the later one replacing the
    earlier)."""
    work = Path(tempfile.mkdtemp(dir=cache, prefix="build-"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
            + ["--no-index", "-w", str(work), str(package_root())],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        wheels = list(work.glob("geo_orchestrator-*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"building the nodes' wheel failed: {done.stderr.strip()[-400:]}")
        for stale in cache.glob("geo_orchestrator-*.whl"):
            if stale.name != wheels[0].name:
                stale.unlink(missing_ok=True)
        return wheels[0].replace(cache / wheels[0].name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _newest_source_ns() -> int:
    """When a file the wheel is made of last changed (the packages' files, pyproject.toml)."""
    root = package_root()
    newest = (root / "pyproject.toml").stat().st_mtime_ns
    for package in ("orchestrator", "runtime", "provisioners", "configs", "recipes"):
        for path in (root / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                newest = max(newest, path.stat().st_mtime_ns)
    return newest


def controller_install(wheel: Path) -> Install:
    """The local cloud's install: this interpreter's versions, this checkout's wheel."""
    import importlib.metadata as metadata
    import site

    return Install(
        mode="local",
        wheel=str(wheel),
        package_version=metadata.version("geo-orchestrator"),
        ray_version=metadata.version("ray"),
        torch_version=metadata.version("torch"),
        python=sys.executable,
        controller_site=_sites(site.getsitepackages()),
    )


def _sites(own: list[str]) -> tuple[str, ...]:
    """Where this interpreter finds its packages: its site folders, and those that Ray's, torch's
    and boto3's folders lie in (a controller that itself runs in a VM's venv sees them through
    a .pth file, which a node's venv would not follow)."""
    import importlib.util

    found = list(own)
    for name in ("ray", "torch", "boto3", "moto"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            folder = str(Path(spec.origin).parent.parent)
            if folder not in found:
                found.append(folder)
    return tuple(found)


class NamespaceCluster(ClusterNodes):
    """Starts the controller VM on first use; boots, drains and kills VM nodes."""

    mode = "namespaces"

    def __init__(
        self,
        *,
        job: str,
        folder: Path,
        grace_s: float,
        head_cpus: int = 1,
        install: Install | None = None,
        host_gpus: int = 0,
        dashboard: bool = False,
    ) -> None:
        """``folder``: where the VMs' folders (scripts, logs, venvs, keys) go, owner-only;
        ``grace_s``: each node's dead-man switch; ``install``: what nodes install (default: the
        wheel of this checkout, built at start, and this interpreter's versions);
        ``host_gpus``: this machine's CUDA GPUs, which the VMs' GPUs then are."""
        self.job, self.folder, self.grace_s = job, Path(folder), grace_s
        self.host_gpus, self.dashboard = host_gpus, dashboard
        self.install = install
        self._forwards: list = []  # PortForward: the VMs' ports reachable from this machine
        self._head_cpus = head_cpus
        self._internet: netns.Internet | None = None
        self._entered: netns.Entered | None = None
        self._reaper: reaper.Reaper | None = None
        self._service: subprocess.Popen | None = None
        self._cluster = None
        self._runtime_dir: Path | None = None  # short paths: the admin socket's
        self._nodes: dict[str, _VmNode] = {}  # Ray node id -> its VM
        self._names: set[str] = set()

    @property
    def address(self) -> str:
        return self._started().address

    def reachable(self, host: str, port: int) -> str:
        """``host:port`` as the controller VM sees it (the dashboard on its 127.0.0.1, a node's
        overlay address), made reachable from this machine: ``127.0.0.1:<port>`` of this
        machine's loopback, relayed by this process (forward.py; nothing is routed)."""
        from provisioners.local.forward import PortForward, loopback_listener

        assert self._entered is not None, "the cluster is not started"
        forward = PortForward(self._entered.at_home(loopback_listener), (host, port))
        self._forwards.append(forward)
        return f"127.0.0.1:{forward.port}"

    @property
    def admin_socket(self) -> Path:
        """The overlay's admin socket (mint, remove, nodes), owner-only."""
        assert self._runtime_dir is not None, "the cluster is not started"
        return self._runtime_dir / ADMIN_SOCKET

    @property
    def internet(self) -> netns.Internet | None:
        """The job's simulated internet (its VMs by name), once started."""
        return self._internet

    def _started(self):
        if self._cluster is None:
            start = time.monotonic()
            self._start()
            atexit.register(self.shutdown)
            log.info("local cloud: controller VM up in %.1f s", time.monotonic() - start)
        return self._cluster

    def _start(self) -> None:
        session = session_name()
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._internet = netns.Internet(self.job)
        self._internet.create()
        # a Unix socket's path is limited to 107 bytes, a job's folder is not
        self._runtime_dir = Path(tempfile.mkdtemp(prefix=f"geo-{self.job[:20]}-"))  # 0700
        self._reaper = reaper.Reaper.start(
            session, netns_prefix=netns.prefix(self.job), remove_dir=str(self._runtime_dir)
        )
        try:
            controller = self._internet.add_vm(CONTROLLER_VM)
            rules = firewall_rules("eth0", WG_PORT)  # the controller VM's: as every node's
            netns.run_in(controller, ["nft", "-f", "-"], input_text=rules)
            controller_ip = self._start_overlay(controller)
            if self.install is None:
                self.install = controller_install(build_wheel(self.folder / "wheel"))
            self._entered = netns.Entered(controller.netns)
            self._cluster = start_head(
                session, self._head_cpus, node_ip=controller_ip, dashboard=self.dashboard
            )
        except BaseException:
            self.shutdown()
            raise

    def _start_overlay(self, controller: netns.Vm) -> str:
        """The join service in the controller VM; its overlay address once it is ready."""
        import json

        state = self.folder / CONTROLLER_VM / "overlay"
        self._service = self._internet.popen(
            controller,
            [sys.executable, "-m", "provisioners.overlay.service", "--job", self.job]
            + ["--public-ip", controller.public_ip, "--state-dir", str(state)]
            + ["--interface", wg.interface_name(self.job, CONTROLLER_VM)]
            + ["--admin-socket", str(self.admin_socket)],
            log_file=self.folder / CONTROLLER_VM / "overlay.log",
            env=_vm_env(checkout=True),  # the controller runs the controller's code
            stdout_pipe=True,
        )
        ready, _, _ = select.select([self._service.stdout], [], [], SERVICE_READY_S)
        line = self._service.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(
                f"the overlay service did not start in {SERVICE_READY_S:g} s "
                f"(see {self.folder / CONTROLLER_VM / 'overlay.log'})"
            )
        return json.loads(line)["controller_ip"]

    def add(self, spec: NodeSpec, *, timeout_s: float) -> str:
        """Boot a VM for ``spec`` and wait until its node registers; return its node id."""
        cluster = self._started()
        name = self._unique(spec.name)
        vm = self._internet.add_vm(name)
        folder = self.folder / name
        shutil.rmtree(folder, ignore_errors=True)  # a VM of that name in an earlier run
        folder.mkdir(mode=0o700)
        log_file = folder / "bootstrap.log"
        try:
            token = admin_call(
                self.admin_socket, {"op": "mint", "node": name, "ttl_s": TOKEN_TTL_S}
            )
            script = folder / "bootstrap.sh"
            script.write_text(render(self._boot(spec, name, vm, token["token"], cluster.address)))
            script.chmod(0o700)
            process = self._internet.popen(
                vm, ["bash", str(script)], log_file=log_file, env=_vm_env()
            )
            node_id = self._wait_joined(name, process, log_file, timeout_s=timeout_s)
        except BaseException:
            self._remove(name)
            raise
        self._nodes[node_id] = _VmNode(name, process, folder)
        return node_id

    def _boot(self, spec: NodeSpec, name: str, vm: netns.Vm, token: str, address: str) -> NodeBoot:
        gpus, env = self._gpu_settings(spec)
        halt = f"{shlex.quote(sys.executable)} -m provisioners.local.netns halt {vm.netns}"
        return NodeBoot(
            job=self.job,
            node=name,
            install=self.install,
            join_token=token,
            ray_address=address,
            node_dir=str(self.folder / name),
            labels={**spec.labels(), NODE_LABEL: name},
            resources=spec.resources(),
            num_cpus=max(1, int(spec.vcpus)),
            num_gpus=gpus,
            object_store_bytes=OBJECT_STORE_BYTES,
            grace_s=self.grace_s,
            shutdown_command=f"PYTHONPATH={shlex.quote(str(package_root()))} {halt}",
            log_file=str(self.folder / name / "bootstrap.log"),
            ray_env={**RAY_ENV, **env},
        )

    def _wait_joined(
        self, name: str, process: subprocess.Popen, log_file: Path, *, timeout_s: float
    ) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            joined = [
                n for n, v in alive_nodes(self.address, label=NODE_LABEL).items() if v == name
            ]
            if joined:
                return joined[0]
            try:
                code = process.wait(timeout=JOIN_POLL_S)  # the wait is the look's period
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                raise BootstrapFailed(
                    f"node {name}: its bootstrap exited with {code} before it joined",
                    log_tail=log_tail(log_file),
                    log_file=log_file,
                )
            if time.monotonic() > deadline:
                raise BootstrapFailed(
                    f"node {name} did not join within {timeout_s:g} s",
                    log_tail=log_tail(log_file),
                    log_file=log_file,
                )

    def _unique(self, name: str) -> str:
        candidate, n = name, 1
        while candidate in self._names or candidate == CONTROLLER_VM:
            n += 1
            candidate = f"{name}-{n}"
        self._names.add(candidate)
        return candidate

    def _remove(self, name: str) -> None:
        self._internet.kill_vm(name)
        try:
            admin_call(self.admin_socket, {"op": "remove", "node": name})
        except (OSError, wg.OverlayError) as error:  # the controller's service is going too
            log.warning("overlay: removing %s: %s", name, error)

    def kill(self, node_id: str) -> None:
        """Remove the node's VM: every process in it at once, then its namespace and peer."""
        node = self._nodes.pop(node_id, None)
        if node is not None:
            self._remove(node.name)

    def vm_of(self, node_id: str) -> str | None:
        node = self._nodes.get(node_id)
        return None if node is None else node.name

    def shutdown(self) -> None:
        """Stop the head, leave the controller VM, remove every namespace of the job."""
        for forward in self._forwards:
            forward.close()
        self._forwards = []
        try:
            if self._cluster is not None:
                self._cluster.shutdown()
        finally:
            self._cluster, self._nodes = None, {}
            if self._entered is not None:
                self._entered.leave()
                self._entered = None
            if self._internet is not None:
                self._internet.close()
                self._internet = None
            if self._runtime_dir is not None:
                shutil.rmtree(self._runtime_dir, ignore_errors=True)
                self._runtime_dir = None
            if self._reaper is not None:
                self._reaper.release()
                self._reaper = None


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The log's last ``lines`` up to the bootstrap's failure line (after it, the script
    repeats its tail for a console)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"(no log: {error})"
    marks = [i for i, line in enumerate(text) if line.startswith(FAILED_MARK)]
    if marks:
        text = text[: marks[0] + 1]
    return "\n".join(text[-lines:])


def _vm_env(*, checkout: bool = False) -> dict[str, str]:
    """A VM's processes see a clean environment, as after a boot (and no credentials of ours);
    a node imports only what its bootstrap installed, the controller this checkout."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    if checkout:
        env["PYTHONPATH"] = str(package_root())
    return env
