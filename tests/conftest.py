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
