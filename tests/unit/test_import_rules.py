"""DESIGN.md's import rules: runtime/ and provisioners/ import neither orchestrator/ nor each other;
cloud SDKs are imported only inside their adapter; `import orchestrator` pulls in no cloud SDK."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLOUD_SDKS = ("boto3", "botocore", "google.cloud", "googleapiclient", "google.auth", "azure", "sky")
# Each SDK may appear only in its adapter's folder.
SDK_HOMES = {
    # S3 for data shards and checkpoints: the runtime's object store, not a cloud adapter
    "boto3": ("provisioners/aws", "runtime/storage.py"),
    "botocore": ("provisioners/aws", "runtime/storage.py"),
    "google.cloud": "provisioners/gcp",
    "googleapiclient": "provisioners/gcp",
    # GCS for checkpoints and a job's bucket: the runtime's object store again
    "google.auth": ("provisioners/gcp", "runtime/storage.py"),
    # the emulated Azure's API speaks azure-core (its API and its wire); the Blob store takes
    # azure-identity's credentials
    "azure": (
        "provisioners/azure",
        "provisioners/emulated/azure_api.py",
        "provisioners/emulated/azure_wire.py",
        "runtime/storage.py",
    ),
    "sky": "provisioners/skypilot",
}
FORBIDDEN = {
    "runtime": ("orchestrator", "provisioners"),
    "provisioners": ("orchestrator", "runtime"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement names, at any depth (function-level imports included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _python_files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def _is(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_runtime_and_provisioners_stay_independent(package):
    violations = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in _python_files(package)
        for line, module in _imports(path)
        if any(_is(module, other) for other in FORBIDDEN[package])
    ]
    assert not violations, "\n".join(violations)


def test_cloud_sdks_only_inside_their_adapter():
    violations = []
    for folder in ("orchestrator", "runtime", "provisioners"):
        for path in _python_files(folder):
            relative = path.relative_to(REPO).as_posix()
            for line, module in _imports(path):
                for sdk, homes in SDK_HOMES.items():
                    homes = (homes,) if isinstance(homes, str) else homes
                    if _is(module, sdk) and not any(
                        relative == home or relative.startswith(home + "/") for home in homes
                    ):
                        violations.append(
                            f"{relative}:{line} imports {module} (allowed only in {', '.join(homes)})"
                        )
    assert not violations, "\n".join(violations)


def test_the_guard_sees_function_level_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import boto3\n    from orchestrator.cli import main\n")
    assert [m for _, m in _imports(sample)] == ["boto3", "orchestrator.cli"]


def test_import_orchestrator_loads_no_cloud_sdk_nor_heavy_frameworks():
    """Importing the package, the CLI, and validating a recipe pull in no cloud SDK, Ray or torch."""
    code = (
        "import sys, orchestrator, orchestrator.cli, orchestrator.catalog, orchestrator.recipe\n"
        "from orchestrator.recipe import load_recipe\n"
        f"load_recipe({str(REPO / 'recipes' / 'quickstart.yaml')!r})\n"
        f"sdks = {CLOUD_SDKS!r}\n"
        "bad = sorted(m for m in sys.modules if any(m == s or m.startswith(s + '.') for s in sdks + ('ray', 'torch')))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"imported: {result.stdout.strip()}"
