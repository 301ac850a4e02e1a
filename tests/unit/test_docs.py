"""The README's Quickstart and CI agree, and docs/recipe.md documents every recipe field."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

from orchestrator.recipe import Recipe

REPO = Path(__file__).resolve().parents[2]


def _quickstart_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_quickstart_is_two_commands_and_ci_runs_the_second():
    commands = _quickstart_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    install_run, tests = commands
    assert "pip install torch==2.13.0" in install_run and "python -m orchestrator" in install_run
    assert "pip install torch==2.13.0" in tests and "pytest" in tests
    ci_lines = [
        line
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert ci_lines[-1] == tests


def _fields(cls: type, prefix: str = "") -> list[str]:
    names = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            names += _fields(hints[field.name], prefix + field.name + ".")
        else:
            names.append(prefix + field.name)
    return names


def test_recipe_doc_covers_every_field():
    doc = (REPO / "docs" / "recipe.md").read_text()
    missing = [
        name
        for name in _fields(Recipe)
        if f"`{name.rsplit('.', 1)[-1]}`" not in doc and f"`{name.split('.', 1)[-1]}`" not in doc
    ]
    assert not missing, missing
