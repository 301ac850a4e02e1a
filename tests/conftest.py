"""Shared fixtures: the repository root, the packaged catalog, and a recipe writer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.catalog import Catalog, default_catalog

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config) -> None:
    """One torch thread per xdist worker: two workers on two cores, each with torch's default
    of a thread per core, made a 2.6 s test take 41 s (threads spinning for a core the other
    worker held)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(1)
    # xdist's `load` scheduler deals each worker a quarter of its share up front, in collection
    # order; one test at a time instead, so that the slow tests put first (below) spread over both
    # workers and a long test never starts last, beside an idle worker. (`loadscope`, which the
    # integration tier's conftest uses, does not read this option.)
    if getattr(config.option, "maxschedchunk", "absent") is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items) -> None:
    """The unit and fuzz tiers' ``slow`` tests first (stable otherwise): under xdist they then
    run first, each on whichever worker is free, and the many short tests fill in after them.
    The integration tier orders its own tests (its conftest); its items keep their places."""
    integration = REPO / "tests" / "integration"

    def later(item) -> bool:
        return item.path.is_relative_to(integration) or item.get_closest_marker("slow") is None

    items.sort(key=later)


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return default_catalog()


@pytest.fixture
def write_recipe(tmp_path: Path):
    """Write YAML text to a file in a temporary folder and return its path."""

    def write(text: str, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
