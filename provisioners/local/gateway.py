"""The local cloud's API, served to a driver that runs as a Ray actor elsewhere in the cluster.

A real cloud's API is a service the driver calls from wherever it runs. The local simulated cloud
is an object in the process that started it (it owns the Ray nodes it launched), so that process
serves it: a ``CloudGateway`` actor on the head node (never preempted) queues each call, the
serving process (``serve``) takes calls off the queue, runs them on the ``LocalProvisioner`` and
posts the outcome back, and ``RemoteProvisioner`` is the driver's side: the provisioner methods a
driver uses, each one call through the gateway. Errors travel as themselves (``CapacityError``
stays a ``CapacityError``). Nothing waits by sleeping: the gateway's queue and futures do.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Collection, Sequence

from provisioners.base import Event, LaunchRequest, Node, Offer

log = logging.getLogger(__name__)

NAMESPACE = "geo-orchestrator"
CALLS = frozenset(
    {
        "offers",
        "launch",
        "nodes",
        "terminate",
        "poll_events",
        "preempt_now",
        "lose_now",
        "preempt_location",
    }
)
TAKE_TIMEOUT_S = 1.0  # how long the server waits for a call before looking at its stop flag


class CloudGateway:
    """The queue between callers (drivers) and the serving process; an async Ray actor."""

    def __init__(self) -> None:
        self._calls: asyncio.Queue = asyncio.Queue()
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()

    async def call(self, method: str, args: tuple, kwargs: dict):
        """Queue one call and wait for its outcome: ("ok", value) or ("error", exception)."""
        future = asyncio.get_running_loop().create_future()
        number = next(self._ids)
        self._pending[number] = future
        await self._calls.put((number, method, args, kwargs))
        return await future

    async def take(self, timeout_s: float):
        """The next queued call, or None after ``timeout_s``."""
        try:
            return await asyncio.wait_for(self._calls.get(), timeout_s)
        except asyncio.TimeoutError:
            return None

    async def answer(self, number: int, outcome: tuple) -> None:
        future = self._pending.pop(number, None)
        if future is not None and not future.done():  # its caller may have died meanwhile
            future.set_result(outcome)


def start_gateway(name: str):
    """The gateway actor ``name`` on the head node (the local cloud's head carries ``head: 1``)."""
    import ray

    remote = ray.remote(CloudGateway).options(
        name=name, namespace=NAMESPACE, num_cpus=0, resources={"head": 0.001}
    )
    return remote.remote()


def serve(provisioner, gateway, stop: threading.Event) -> None:
    """Run calls from ``gateway`` on ``provisioner`` until ``stop`` is set (in a thread of the
    process that owns the local cloud)."""
    import ray

    while not stop.is_set():
        call = ray.get(gateway.take.remote(TAKE_TIMEOUT_S))
        if call is None:
            continue
        number, method, args, kwargs = call
        if method not in CALLS:
            outcome = ("error", ValueError(f"the local cloud's gateway has no call {method!r}"))
        else:
            try:
                outcome = ("ok", getattr(provisioner, method)(*args, **kwargs))
            except Exception as error:  # any: handed to the caller and raised there
                outcome = ("error", error)
        gateway.answer.remote(number, outcome)


class RemoteProvisioner:
    """The local cloud as seen from another process of the cluster, through its gateway."""

    cloud = "local"

    def __init__(self, gateway_name: str, *, timeout_s: float = 300.0) -> None:
        self.gateway_name, self.timeout_s = gateway_name, timeout_s
        self._gateway = None

    def _call(self, method: str, *args, **kwargs):
        import ray

        if self._gateway is None:
            self._gateway = ray.get_actor(self.gateway_name, namespace=NAMESPACE)
        status, value = ray.get(
            self._gateway.call.remote(method, args, kwargs), timeout=self.timeout_s
        )
        if status == "error":
            raise value
        return value

    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        return self._call("offers", gpus=gpus, regions=regions)

    def launch(self, request: LaunchRequest) -> list[Node]:
        return self._call("launch", request)

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        return self._call("nodes", gang=gang)

    def terminate(self, node_ids: Sequence[str]) -> None:
        self._call("terminate", list(node_ids))

    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        return self._call("poll_events", timeout_s=timeout_s)

    def preempt_now(self, node_id: str) -> None:
        self._call("preempt_now", node_id)

    def lose_now(self, node_id: str) -> None:
        self._call("lose_now", node_id)

    def preempt_location(self, infra: str, *, outage_s: float) -> list[str]:
        return self._call("preempt_location", infra, outage_s=outage_s)
