"""The local simulated cloud as the job's world: this process owns the cloud (its market and
its VMs, as processes or as namespace VMs: docs/bootstrap.md), serves its API to the driver actor
and follows the job. A real provider's world would launch a controller VM and follow from here;
the driver itself (assembly.py) sees only the provider's contract.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import signal
import sys
import threading
from pathlib import Path

from orchestrator.driver.actor import NAMESPACE, DriverSpec, follow, start_driver
from orchestrator.driver.events import Event, EventLog
from orchestrator.driver.job import ask_to_stop
from orchestrator.driver.machine import Choice
from orchestrator.driver.state import FINAL_PHASES, StateStore
from orchestrator.errors import UserError
from orchestrator.recipe.schema import Recipe

# a move's pause on the local cloud until one is measured (bench/recovery.py --path checkpoint,
# BENCHMARKS.md): a restart from a checkpoint on a node booted as a process, or as a namespace VM
MIGRATION_S = {"processes": 5.0, "namespaces": 13.0}
RAY_LOGS = "ray-logs"  # in the job's folder: Ray's own logs of the job's cluster


def run_on_local_cloud(
    spec: DriverSpec,
    *,
    folder: Path,
    recipe_path: Path,
    vms: str | None,
    notice_s: float | None,
    on_step,
    dashboard: bool = True,
):
    """Start the local cloud (its head with Ray's dashboard where ``dashboard``), run the job's
    driver on it, follow it to its end; the final state and plan."""
    from provisioners.local.provisioner import LocalProvisioner

    recipe, local = spec.recipe, spec.recipe.local_cloud
    cluster = local_vms(
        job=folder.name,
        folder=folder,
        recipe_path=recipe_path,
        wanted=vms or local.vms,
        grace_s=recipe.recovery.controller_grace_s,
        host_gpus=host_gpus(local.devices),
        dashboard=dashboard,
    )
    provisioner = LocalProvisioner(
        seed=recipe.training.seed,
        offers_file=local_offers(recipe, recipe_path.parent),
        notice_s=notice_s if notice_s is not None else local.notice_s,
        slow_nodes=local.slow_nodes,
        slowdown=local.slowdown,
        cluster=cluster,
    )
    spec = dataclasses.replace(
        spec,
        migration_s=MIGRATION_S[cluster.mode],
        launch_timeout_s=provisioner.launch_timeout_s,
    )
    left = False
    try:
        return serve_and_follow(
            provisioner,
            spec,
            job=folder.name,
            address=provisioner.address,
            controller=lambda: provisioner.launch_controller(name=f"{folder.name}-controller"),
            on_step=on_step,
            on_interrupt=lambda: ask_to_stop(folder),
            folder=folder,
            expose=cluster.reachable,
        )
    except KeyboardInterrupt:
        left = True
        raise
    finally:
        provisioner.close()
        if left:  # the driver and every node went with the local cloud: the state says so
            _left_at_once(folder)


def first_choice(
    recipe: Recipe, recipe_path: Path, catalog, *, plan_file: Path | None = None
) -> Choice:
    """The plan the job starts on and its price, before anything is rented: the planner's best on
    the local market now, or the plan in ``plan_file`` checked against that market (UserError
    when it does not fit). Nothing starts: the market is read, no VM boots."""
    from orchestrator.driver.market_plans import MarketPlans
    from orchestrator.plan import PlanError, load_plan
    from provisioners.local.provisioner import LocalProvisioner

    market = LocalProvisioner(
        seed=recipe.training.seed, offers_file=local_offers(recipe, recipe_path.parent)
    )
    given = None if plan_file is None else load_plan(plan_file)
    plans = MarketPlans(recipe, catalog, market, given=given)
    if given is None:
        return plans.choose(excluded=frozenset(), held={})
    try:
        return plans.given_choice(plans.market({}))
    except PlanError as error:  # the plan itself: its batch, its layers, its memory
        raise PlanError(error.message, file=str(plan_file), fix=error.fix) from None
    except UserError as error:
        raise UserError(
            f"the plan does not fit the local market now: {error.message}",
            file=str(plan_file),
            fix=f"write a plan for this market: python -m orchestrator plan {recipe_path} -o PLAN",
        ) from None


def _left_at_once(folder: Path) -> None:
    """A job left while running (Ctrl-C twice): its driver and nodes went with this process, so
    its state says stopped, not the phase it was in, and a resubmit resumes it from its newest
    checkpoint."""
    store = StateStore(folder)
    if not store.exists():
        return
    state = store.load().state
    if state.phase in FINAL_PHASES:
        return
    store.save(state.evolve(phase="stopped", nodes=()))
    EventLog(folder / "events.jsonl").append(
        Event(
            event="stopped",
            decision="left at once: the driver and its nodes ended with the submitting process",
            reason=f"interrupted twice in {state.phase} at step {state.step}; submit again "
            f"resumes from the checkpoint of step {state.checkpoint_step}",
            details={"step": state.step, "checkpoint_step": state.checkpoint_step},
        )
    )


def local_vms(
    *,
    job: str,
    folder: Path,
    recipe_path: Path,
    wanted: str,
    grace_s: float,
    host_gpus: int = 0,
    dashboard: bool = False,
):
    """The local cloud's VMs: network namespaces booted by the node bootstrap where this machine
    allows them (``auto``, ``namespaces``), else Ray nodes on this machine's network; says which.
    ``host_gpus``: this machine's CUDA GPUs, which the VMs' GPUs then are."""
    from provisioners.local.cluster import LocalCluster

    if wanted != "processes":
        from provisioners.local import vms

        reason = vms.unsupported_reason()
        if reason is None and threading.current_thread() is not threading.main_thread():
            reason = "the job runs outside the main thread, which alone can enter a VM's network"
        if reason is None:
            print(
                "local cloud: each VM is a network namespace on a simulated internet, booted by "
                "the node bootstrap and joined over WireGuard",
                file=sys.stderr,
            )
            return vms.NamespaceCluster(
                job=job,
                folder=folder / "vms",
                grace_s=grace_s,
                host_gpus=host_gpus,
                dashboard=dashboard,
            )
        if wanted == "namespaces":
            raise UserError(
                f"namespace VMs cannot run here: {reason}",
                file=str(recipe_path),
                field="local_cloud.vms",
                fix="run as root with the tools named, or write vms: processes",
            )
        print(f"local cloud: each VM is a process on this machine ({reason})", file=sys.stderr)
    else:
        print("local cloud: each VM is a process on this machine (vms: processes)", file=sys.stderr)
    return LocalCluster(host_gpus=host_gpus, dashboard=dashboard)


def host_gpus(devices: str) -> int:
    """This machine's CUDA GPUs the local cloud's nodes train on (``local_cloud.devices``):
    all of them under ``auto``, none under ``cpu`` or where torch sees none."""
    if devices == "cpu":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def serve_and_follow(
    service,
    spec: DriverSpec,
    *,
    job: str,
    address: str,
    controller,
    on_step,
    env=None,
    connected=None,
    on_interrupt=None,
    folder: Path | None = None,
    expose=None,
):
    """Join the cluster at ``address``, serve ``service`` (the local cloud's API, or an emulated
    provider's market) to the driver actor through the gateway, start the driver on the node
    ``controller()`` launches (None: wherever the ``controller`` resource is) and follow the job.
    ``env``: the driver's environment's additions; ``connected()``: called once this process
    has joined the cluster (Ray's ``init`` sets its own SIGTERM handler: a caller replaces it
    there). ``on_interrupt()``: asks the job to stop cleanly on the first Ctrl-C (the driver
    checkpoints and lets its nodes go; this process follows it to ``stopped``); a second one
    leaves at once (None: the first does). ``folder``: the job's, where Ray's logs are kept.
    ``expose(host, port)``: a port of the cluster's network as this machine reaches it (the
    dashboard and the driver's metrics are then announced; None: they are not)."""
    import ray

    from orchestrator.recipe.models import code_env
    from provisioners.local.gateway import serve, start_gateway

    stop, server, actor, ray_logs = threading.Event(), None, None, None
    main = threading.current_thread() is threading.main_thread()  # signals: main thread only
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        # a module model's package, uploaded once: the driver and its workers inherit it
        # Ray's own lines (connecting, a raylet's end) go to its logs, not the terminal
        context = ray.init(
            address=address,
            log_to_driver=False,
            logging_level=logging.WARNING,
            namespace=NAMESPACE,
            runtime_env=code_env(spec.recipe.model),
        )
        ray_logs = link_ray_logs(folder)
        ray_messages_to(folder)
        if connected is not None:
            connected()
        elif handler is not None:
            signal.signal(signal.SIGTERM, handler)  # the program's own (cli.run), not Ray's
        node = controller()
        gateway = start_gateway(spec.gateway)
        server = threading.Thread(
            target=serve, args=(service, gateway, stop), name="cloud-api", daemon=True
        )
        server.start()
        actor = start_driver(spec, job=job, node=None if node is None else node.node_id, env=env)
        if expose is not None:
            announce_endpoints(context, actor, expose, folder)
        try:
            return follow(actor, on_step)
        except KeyboardInterrupt:
            if on_interrupt is None:
                raise
            on_interrupt()
            print(
                "\nstopping: the driver checkpoints and lets its nodes go "
                "(Ctrl-C again leaves at once)",
                file=sys.stderr,
            )
        return follow(actor, on_step)  # to ``stopped`` (a second Ctrl-C leaves from here)
    finally:
        if actor is not None:
            ray.kill(actor, no_restart=True)
        stop.set()
        if server is not None:
            server.join(timeout=10)
        if ray.is_initialized():
            ray.shutdown()
        if ray_logs is not None:
            keep_ray_logs(folder, ray_logs)
        if folder is not None:
            (folder / ENDPOINTS_FILE).unlink(missing_ok=True)  # gone with the cluster


ENDPOINTS_FILE = "endpoints.json"  # in the job's folder while it runs: its dashboard, its metrics


def announce_endpoints(context, actor, expose, folder: Path | None) -> dict:
    """Say where the job's Ray dashboard (and its HTTP API: ``ray list actors``) and the
    driver's Prometheus metrics answer from this machine; kept in the job's folder while it
    runs. A part Ray does not report is left out."""
    import ray

    found = {}
    if context.dashboard_url:
        host, _, port = context.dashboard_url.rpartition(":")
        found["dashboard"] = f"http://{expose(host, int(port))}"
    node_id = ray.get(actor.progress.remote(-1, 0.0))["node"]  # where the driver runs
    for node in ray.nodes():
        if node["NodeID"] == node_id and node.get("MetricsExportPort"):
            where = expose(node["NodeManagerAddress"], int(node["MetricsExportPort"]))
            found["metrics"] = f"http://{where}/metrics"
    if "dashboard" in found:
        print(
            f"dashboard: {found['dashboard']} (ray list actors --address {found['dashboard']})",
            file=sys.stderr,
        )
    if "metrics" in found:
        print(f"the job's metrics (Prometheus): {found['metrics']}", file=sys.stderr)
    if folder is not None:
        (folder / ENDPOINTS_FILE).write_text(json.dumps(found, indent=1) + "\n")
    return found


RAY_MESSAGES = "ray-messages.log"  # in the job's folder: what Ray pushes to the connected process


def ray_messages_to(folder: Path | None) -> None:
    """What the cluster pushes to this process (a raylet's "node marked dead", an actor's death)
    goes to the job's ``ray-messages.log``, not the terminal: the job's own lines say what
    happened there. Ray prints these from a thread of its own through a module function, with
    no setting to turn it off (``log_to_driver`` covers only the workers' output): that
    function is replaced in this process."""
    import ray._private.worker as ray_worker

    if folder is None or not hasattr(ray_worker, "print_to_stdstream"):
        return
    path = folder / RAY_MESSAGES

    def to_file(data: dict, ignore_prefix: bool) -> None:
        try:
            with path.open("a", encoding="utf-8") as handle:
                for line in data.get("lines", ()):
                    handle.write(f"({data.get('pid', 'ray')}) {line}\n")
        except OSError:
            pass  # the folder went (the job is being removed): nothing to keep

    ray_worker.print_to_stdstream = to_file


def link_ray_logs(folder: Path | None) -> Path | None:
    """Ray's logs of this cluster (its session's ``logs``: every node's raylet, the workers'
    output), reachable from the job's folder as ``ray-logs`` while the job runs; None where
    there is no folder or Ray says nothing of its session."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    if folder is None or node is None:
        return None
    logs = Path(node.get_logs_dir_path())
    link = folder / RAY_LOGS
    try:
        if link.is_symlink():
            link.unlink()
        if not link.exists():
            link.symlink_to(logs, target_is_directory=True)
    except OSError as exc:
        print(f"note: Ray's logs stay in {logs} ({exc.strerror})", file=sys.stderr)
    return logs


def keep_ray_logs(folder: Path, logs: Path) -> None:
    """Ray's logs copied into the job's folder once the cluster is gone (its session folder
    under /tmp goes with the machine's next start)."""
    link = folder / RAY_LOGS
    if not link.is_symlink():
        return
    link.unlink()
    try:
        shutil.copytree(logs, link, symlinks=True, ignore_dangling_symlinks=True)
        link.chmod(0o700)  # the job's own, as its other files
    except (OSError, shutil.Error) as exc:
        print(f"note: Ray's logs stay in {logs} ({exc})", file=sys.stderr)


def local_offers(recipe: Recipe, folder: Path) -> Path | None:
    """The simulated market's offers file the recipe names (``local_cloud.offers``), if any."""
    offers = recipe.local_cloud.offers
    return None if offers is None else (folder / offers).resolve()


def _local_tp_degrees(recipe: Recipe, spec, folder: Path) -> tuple[int, ...]:
    """The tensor-parallel degrees the local cloud could run the model at: the recipe's, where
    the model splits that many ways and some offered node has that many slots."""
    import time

    from orchestrator.planner.space import splits
    from provisioners.local.market import default_offers_file, read_offers

    path = local_offers(recipe, folder) or default_offers_file()
    widest = max((o.gpus_per_node for o in read_offers(path, observed_at_s=time.time())), default=1)
    return tuple(
        d for d in recipe.parallelism.tensor_parallel if d > 1 and d <= widest and splits(spec, d)
    )


def measured_here(
    recipe: Recipe, folder: Path, recipe_folder: Path | None = None, *, device: str = "cpu"
) -> Recipe:
    """On the local cloud a worker is a CPU slot standing in for a T4, or this machine's GPU
    (``device``: "cuda"): with ``profile: auto``, time the model on this machine once
    (runtime/profiler.py; kept in the job's folder) so the plan's predictions are about this
    machine rather than a real T4; split too, at the tensor-parallel degrees the local nodes
    could run (``recipe_folder``: where the recipe's relative paths start)."""
    from orchestrator.recipe.models import model_label, spec_of

    spec = spec_of(recipe.model)
    if recipe.model.profile != "auto":
        return recipe
    label = model_label(recipe.model)
    path = (folder / f"profile-{label.replace(':', '-')}.json").resolve()
    if not path.exists():
        from orchestrator.profiles.measured import profile_here
        from orchestrator.profiles.profile import profile_to_json

        # the very modules the workers train (a Hugging Face model's own, not a look-alike)
        tp_degrees = _local_tp_degrees(recipe, spec, recipe_folder or folder)
        measured = profile_here(recipe, spec, tp_degrees=tp_degrees, device=device)
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile_to_json(measured, "T4"), indent=1))
        where = "this machine's GPU" if device == "cuda" else "this machine"
        print(f"profiled {spec.name} on {where}: {path}", file=sys.stderr)
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, profile=str(path)))
