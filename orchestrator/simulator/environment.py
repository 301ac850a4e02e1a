"""What the simulator needs from the world, cached for the planner's inner loop.

``NetworkView``: one-way latency and usable bandwidth between two places, for the runtime's number
of parallel TCP streams. A measurement taken with a known number of streams is per-stream-limited on
long links (one TCP stream is window/RTT bound: Erben et al. measured 0.21 Gbit/s US-EU with one
stream), so ``k`` streams get ``k`` times the per-stream figure, up to the relation's aggregate
bandwidth (or the measurement, if higher). Figures with an unstated stream count are taken as the
aggregate. Latency is half the round-trip time.

``PriceView``: $ per GPU-hour of a replica (the cheapest offer in its place whose VM has at least
``tp`` GPUs, spot or on-demand as asked, or the named instance type) and $ per byte of egress.
"""

from __future__ import annotations

from orchestrator.catalog import Catalog, Location, OfferTable
from orchestrator.errors import UserError


class NetworkView:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._links: dict[tuple, tuple[float, float]] = {}
        self._hops: dict[tuple, tuple[float, float, float]] = {}
        self._places: dict[str, Location] = {}
        # all-reduce costs per data-parallel group (algorithm, compression, element size, streams,
        # kinds of replica and their counts; simulator/core.py): the planner evaluates the same
        # groups again and again
        self.sync_cache: dict[tuple, object] = {}

    def place(self, infra: str) -> Location:
        location = self._places.get(infra)
        if location is None:
            location = self._places[infra] = self.catalog.location(infra)
            if location.region is None:
                raise UserError(
                    f"'{infra}' names a whole cloud; a replica runs in a region or zone",
                    field=infra,
                    fix=f"write {location.cloud}/<region>[/<zone>]",
                )
        return location

    def region_of(self, infra: str) -> str:
        place = self.place(infra)
        return f"{place.cloud}/{place.region}"

    def hop(
        self, src: str, dst: str, streams: int, src_gpu: str = "", dst_gpu: str = ""
    ) -> tuple[float, float, float]:
        """What a pipeline transfer between ``src`` and ``dst`` sees: (one-way latency s, the larger
        of the two directions; seconds per byte from ``src`` to ``dst``; and back). With the GPU
        types at both ends, between nodes of those types (``link``)."""
        key = (src, dst, streams, src_gpu, dst_gpu)
        cached = self._hops.get(key)
        if cached is None:
            there = (src_gpu, dst_gpu) if src_gpu else None
            back = (dst_gpu, src_gpu) if src_gpu else None
            lat_f, bw_f = self.link(src, dst, streams, there)
            lat_b, bw_b = self.link(dst, src, streams, back)
            cached = self._hops[key] = (max(lat_f, lat_b), 1.0 / bw_f, 1.0 / bw_b)
        return cached

    def link(
        self, src: str, dst: str, streams: int, gpus: tuple[str, str] | None = None
    ) -> tuple[float, float]:
        """(one-way latency s, bandwidth bytes/s) from ``src`` to ``dst`` with ``streams`` streams;
        with ``gpus``, from a node of the first GPU type to one of the second (a cloud caps a VM's
        network by its type: configs/network/index.yaml's node pairs)."""
        key = (src, dst, streams, gpus)
        cached = self._links.get(key)
        if cached is None:
            estimate = self.catalog.network.link(self.place(src), self.place(dst), gpus)
            bandwidth = estimate.bandwidth_bytes_per_s
            if estimate.streams:
                aggregate = self.catalog.network.defaults[estimate.relation].bandwidth_bytes_per_s
                per_stream = bandwidth / estimate.streams
                bandwidth = min(per_stream * streams, max(aggregate, bandwidth))
            cached = self._links[key] = (estimate.rtt_s / 2, bandwidth)
        return cached


class PriceView:
    def __init__(
        self, catalog: Catalog, market: OfferTable, *, egress_table: str | None = None
    ) -> None:
        self.catalog = catalog
        self.market = market
        self.egress_table = egress_table
        self._gpu_hour: dict[tuple, float] = {}
        # a replica's fields (``Replica._key``: a plain tuple, hashed and compared without calling
        # Python code) -> $/h of its GPUs
        self._by_replica: dict = {}
        self._egress: dict[tuple[str, str], float] = {}
        self._network = NetworkView(catalog)

    def gpu_hour_usd(
        self, gpu: str, infra: str, *, spot: bool, tp: int, instance_type: str | None = None
    ) -> float:
        """$ per GPU-hour for a replica of ``tp`` GPUs in ``infra``."""
        key = (gpu, infra, spot, tp, instance_type)
        price = self._gpu_hour.get(key)
        if price is None:
            price = self._gpu_hour[key] = self._cheapest(gpu, infra, spot, tp, instance_type)
        return price

    def hourly_usd(self, stage_kinds) -> float:
        """$ per hour of all GPUs of a plan, given per stage its (replica, count) kinds."""
        cache = self._by_replica
        total = 0.0
        for kinds in stage_kinds:
            for replica, count in kinds:
                price = cache.get(replica._key)
                if price is None:
                    price = cache[replica._key] = replica.tp * self.gpu_hour_usd(
                        replica.gpu,
                        replica.infra,
                        spot=replica.spot,
                        tp=replica.tp,
                        instance_type=replica.instance_type,
                    )
                total += count * price
        return total

    def _cheapest(
        self, gpu: str, infra: str, spot: bool, tp: int, instance_type: str | None
    ) -> float:
        place = self._network.place(infra)
        here = [
            o
            for o in self.market.offers
            if o.gpu == gpu and (o.location.covers(place) or place.covers(o.location))
        ]
        if instance_type is not None:
            here = [o for o in here if o.instance_type == instance_type]
        kind = "spot" if spot else "on-demand"
        if not here:
            raise UserError(
                f"no {gpu} offer{' of type ' + instance_type if instance_type else ''} in {infra} "
                f"in the market ({self.market.file})",
                field=infra,
                fix=f"see: python -m orchestrator catalog offers --gpu {gpu}",
            )
        fitting = [o for o in here if o.gpus_per_node >= tp]
        if not fitting:
            largest = max(o.gpus_per_node for o in here)
            raise UserError(
                f"tp={tp} is larger than any {gpu} node in {infra} (largest: {largest} GPUs)",
                field=infra,
                fix=f"use tp <= {largest}; tensor parallelism stays inside one node",
            )
        prices = [
            p / o.gpus_per_node
            for o in fitting
            if (p := o.price_usd_per_hour(spot=spot)) is not None
        ]
        if not prices:
            raise UserError(
                f"no {kind} price for {gpu} in {infra}",
                field=infra,
                fix="set spot: false for this replica, or choose a place with spot offers",
            )
        return min(prices)

    def egress_usd_per_byte(self, src: str, dst: str) -> float:
        key = (src, dst)
        price = self._egress.get(key)
        if price is None:  # inside one place: the table's same-zone rule (free unless it has one)
            quote = self.catalog.egress.price(
                self._network.place(src), self._network.place(dst), self.egress_table
            )
            price = self._egress[key] = quote.usd_per_gb / 1e9
        return price
