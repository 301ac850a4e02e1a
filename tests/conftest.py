"""Shared fixtures: the repository root, the packaged catalog, and a recipe writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.catalog import Catalog, default_catalog

REPO = Path(__file__).resolve().parents[1]


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
