"""The simulator: iteration time, memory per GPU and dollars of a plan, before anything runs.

from orchestrator.simulator import simulate, views_for
network, prices, settings = views_for(catalog, market)
estimate = simulate(profile, plan, network=network, prices=prices, settings=settings)
estimate.to_dict()
"""

from __future__ import annotations

from orchestrator.catalog import Catalog, OfferTable
from orchestrator.simulator.core import latency_aware_plan_warmup, simulate
from orchestrator.simulator.environment import NetworkView, PriceView
from orchestrator.simulator.estimate import Estimate
from orchestrator.simulator.settings import SimulatorSettings, load_settings
from orchestrator.simulator.validate import check_plan_runs, normalize_plan

__all__ = [
    "latency_aware_plan_warmup",
    "Estimate",
    "NetworkView",
    "PriceView",
    "SimulatorSettings",
    "check_plan_runs",
    "load_settings",
    "normalize_plan",
    "simulate",
    "views_for",
]


def views_for(
    catalog: Catalog,
    market: OfferTable,
    *,
    egress_table: str | None = None,
    runtime: str | None = None,
) -> tuple[NetworkView, PriceView, SimulatorSettings]:
    """The network, price and settings views the simulator reads, over one catalog and market;
    ``runtime`` names another runtime than ours (configs/simulator.yaml ``runtimes:``)."""
    return (
        NetworkView(catalog),
        PriceView(catalog, market, egress_table=egress_table),
        load_settings(catalog, runtime),
    )
