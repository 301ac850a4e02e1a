"""The simulated spot market of the local cloud: offers whose spot price and capacity change over
market time, and which nodes it takes back.

Market time runs ``speed`` times faster than the wall clock (``MarketClock``). The market runs from
one of two sources:

- a trace (trace.py): capacity and spot price per offer at given market times; when capacity falls
  below the nodes in use, the newest nodes beyond it are preempted (as in SAILOR's availability
  traces, where a drop in available GPUs is a preemption);
- a seeded random model: every spot node is preempted after an exponential time with its offer's
  ``preemption_rate_per_hour``, and the spot price follows a mean-reverting walk around the listed
  price (hourly steps in market time, at most ±30%).

The market knows nothing of Ray: the provisioner asks it which nodes to preempt and launches or kills
Ray nodes itself.
"""

from __future__ import annotations

import csv
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from provisioners.base import Offer
from provisioners.local.trace import Trace

PRICE_WALK_LIMIT = 0.3  # the random model's spot price stays within ±30% of the listed price
PRICE_WALK_STEP = 0.05  # standard deviation of one hourly step (fraction of the listed price)


class MarketClock:
    """Market seconds since the market opened: ``speed`` times the wall seconds since then."""

    def __init__(self, *, speed: float = 1.0, wall: Callable[[], float] = time.monotonic) -> None:
        assert speed > 0
        self.speed, self._wall = speed, wall
        self._start = wall()

    def now_s(self) -> float:
        return (self._wall() - self._start) * self.speed

    def wall_s_until(self, market_s: float) -> float:
        """Wall seconds from now until market time ``market_s`` (0 if it has passed)."""
        return max(0.0, (market_s - self.now_s()) / self.speed)


def default_offers_file() -> Path:
    """configs/local/offers.csv as shipped: configs/ sits beside provisioners/ in the checkout and
    in site-packages alike."""
    return Path(__file__).resolve().parents[2] / "configs" / "local" / "offers.csv"


def read_offers(path: Path, *, observed_at_s: float) -> list[Offer]:
    """Offers of a CSV in the configs/ offers format (local rows only)."""
    offers = []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["cloud"] != "local":
                continue
            offers.append(
                Offer(
                    cloud="local",
                    region=row["region"],
                    zone=row["zone"] or None,
                    instance_type=row["instance_type"],
                    gpu=row["gpu"],
                    gpus_per_node=int(row["gpus_per_node"]),
                    vcpus=float(row["vcpus"]),
                    memory_gib=float(row["memory_gib"]),
                    on_demand_usd_per_hour=_number(row["on_demand_usd_per_hour"]),
                    spot_usd_per_hour=_number(row["spot_usd_per_hour"]),
                    available_count=int(row["available_count"]) if row["available_count"] else None,
                    preemption_rate_per_hour=_number(row["preemption_rate_per_hour"]),
                    observed_at_s=observed_at_s,
                    source=f"local market {path.name}",
                )
            )
    return offers


def _number(text: str) -> float | None:
    return float(text) if text else None


@dataclass(frozen=True)
class Holding:
    """A node the market has handed out: which offer, when (market s), spot or not."""

    node_id: str
    infra: str
    instance_type: str
    spot: bool
    since_s: float


class LocalMarket:
    """Offers, capacity and preemptions of the local cloud over market time."""

    def __init__(
        self,
        offers: Sequence[Offer],
        *,
        clock: MarketClock,
        trace: Trace | None = None,
        seed: int = 0,
    ) -> None:
        self.clock, self.trace = clock, trace
        self._offers = {(o.infra, o.instance_type): o for o in offers}
        self._rng = random.Random(seed)
        self._walk: dict[tuple[str, str], list[float]] = {}  # hourly price factors per offer
        self._held: dict[str, Holding] = {}
        self._doom: dict[str, float] = {}  # node id -> market time the random model preempts it
        self._outage_until: dict[str, float] = {}  # infra -> market time its spot capacity returns

    # -- what the market offers now ------------------------------------------------------------

    def offers(self) -> list[Offer]:
        now = self.clock.now_s()
        observed = time.time()
        return [self._offer_at(key, offer, now, observed) for key, offer in self._offers.items()]

    def _offer_at(self, key: tuple[str, str], offer: Offer, now: float, observed: float) -> Offer:
        capacity, price = offer.available_count, offer.spot_usd_per_hour
        if self.trace is not None:
            point = self.trace.at(offer.infra, offer.gpu, now)
            if point is not None:
                capacity = point.available_count if point.available_count is not None else capacity
                price = point.spot_usd_per_hour if point.spot_usd_per_hour is not None else price
        elif price is not None:
            price = round(price * self._price_factor(key, now), 4)
        if self._outage_until.get(offer.infra, float("-inf")) > now:
            capacity = 0  # a location-wide reclaim: nothing to hand out until it ends
        if capacity is not None:
            capacity = max(0, capacity - self.in_use(offer.infra, offer.instance_type))
        return replace(
            offer, available_count=capacity, spot_usd_per_hour=price, observed_at_s=observed
        )

    def _price_factor(self, key: tuple[str, str], now: float) -> float:
        """The random model's price factor at market hour ``now // 3600`` (seeded, reproducible)."""
        walk = self._walk.setdefault(key, [1.0])
        while len(walk) <= int(now // 3600):
            step = walk[-1] + self._rng.gauss(0.0, PRICE_WALK_STEP) - 0.2 * (walk[-1] - 1.0)
            walk.append(min(1 + PRICE_WALK_LIMIT, max(1 - PRICE_WALK_LIMIT, step)))
        return walk[int(now // 3600)]

    def offer(self, infra: str, instance_type: str) -> Offer | None:
        return self._offers.get((infra, instance_type))

    # -- handing out and taking back nodes -----------------------------------------------------

    def in_use(self, infra: str, instance_type: str) -> int:
        return sum(
            1 for h in self._held.values() if (h.infra, h.instance_type) == (infra, instance_type)
        )

    def capacity(self, infra: str, instance_type: str) -> int | None:
        """Nodes of this offer the market can hand out now (None: unlimited)."""
        offer = self._offers.get((infra, instance_type))
        assert offer is not None, (infra, instance_type)
        return self._offer_at(
            (infra, instance_type), offer, self.clock.now_s(), 0.0
        ).available_count

    def hold(self, node_id: str, infra: str, instance_type: str, *, spot: bool) -> None:
        now = self.clock.now_s()
        self._held[node_id] = Holding(node_id, infra, instance_type, spot, now)
        offer = self._offers[(infra, instance_type)]
        rate = offer.preemption_rate_per_hour
        if spot and self.trace is None and rate:
            self._doom[node_id] = now + self._rng.expovariate(rate / 3600.0)

    def outage(self, infra: str, *, duration_s: float) -> None:
        """No capacity in ``infra`` for the next ``duration_s`` market seconds (what a provider
        reclaiming a whole zone looks like from outside)."""
        self._outage_until[infra] = self.clock.now_s() + duration_s

    def release(self, node_id: str) -> None:
        self._held.pop(node_id, None)
        self._doom.pop(node_id, None)

    def due_preemptions(self) -> list[str]:
        """Spot nodes the market takes back now (each named once; the caller releases them)."""
        now = self.clock.now_s()
        due = [node for node, at in self._doom.items() if at <= now]
        if self.trace is not None:
            due += self._over_capacity(now)
        for node in due:
            self._doom.pop(node, None)
        return sorted(set(due))

    def _over_capacity(self, now: float) -> list[str]:
        """Newest spot nodes beyond each offer's traced capacity."""
        assert self.trace is not None
        due = []
        for (infra, instance_type), offer in self._offers.items():
            point = self.trace.at(infra, offer.gpu, now)
            if point is None or point.available_count is None:
                continue
            held = sorted(
                (
                    h
                    for h in self._held.values()
                    if (h.infra, h.instance_type) == (infra, instance_type)
                ),
                key=lambda h: h.since_s,
            )
            excess = len(held) - point.available_count
            due += [h.node_id for h in reversed(held) if h.spot][: max(0, excess)]
        return due

    def next_event_wall_s(self) -> float:
        """Wall seconds until the next scheduled change (a preemption or a trace step)."""
        now = self.clock.now_s()
        times = list(self._doom.values())
        if self.trace is not None:
            later = self.trace.next_time_after(now)
            if later is not None:
                times.append(later)
        return min((self.clock.wall_s_until(t) for t in times), default=math.inf)
