"""The wheel ships configs/ and recipes/ as data, and an installed copy works outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=build,
    )
    (path,) = out.glob("*.whl")
    return path


def test_wheel_contains_packages_and_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [
        p.relative_to(REPO).as_posix()
        for folder in ("configs", "recipes")
        for p in (REPO / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    missing = [name for name in data if name not in names]
    assert not missing, missing
    for module in (
        "orchestrator/__main__.py",
        "orchestrator/catalog/catalog.py",
        "runtime/models/specs.py",
        "provisioners/__init__.py",
    ):
        assert module in names
    assert not any(name.startswith("tests/") for name in names)


def test_installed_copy_finds_its_data(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    code = (
        "import orchestrator.catalog.catalog as c, sys\n"
        "assert c.PACKAGED_CONFIGS_DIR.is_relative_to(sys.argv[1]), c.PACKAGED_CONFIGS_DIR\n"
        "from orchestrator.recipe import load_recipe\n"
        "recipe = load_recipe(c.PACKAGED_CONFIGS_DIR.parent / 'recipes' / 'quickstart.yaml')\n"
        "print(recipe.name, len(c.default_catalog().offers))\n"
    )
    # run from an unrelated folder with only the installed copy on the path (not the checkout)
    result = subprocess.run(
        [sys.executable, "-c", code, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    name, offers = result.stdout.split()
    assert name == "quickstart" and int(offers) > 500
