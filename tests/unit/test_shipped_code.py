"""A module model's code and a profile file reach the controller VM through the job's folder:
packed on the laptop, unpacked on the VM, where the recipe's ``model.code`` then points."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from orchestrator.driver.controller import _recipe
from orchestrator.driver.shipped import CODE_ZIP, carry_profile, pack_code, unpack_code
from orchestrator.errors import UserError
from orchestrator.recipe import load_recipe

PACKAGE = Path(__file__).parents[1] / "fixtures" / "usermodels" / "tiny_lm"
RECIPE = """\
name: shipped
provider: local
model: {module: "tiny_lm:build", args: {depth: 2}, profile: PROFILE}
training: {global_batch_size: 8, microbatch_sizes: [2], steps: 4}
constraints: {gpu_types: [T4], max_gpus: 2}
"""


def _laptop(tmp_path: Path) -> tuple[Path, Path]:
    """The user's folder (recipe, package, profile elsewhere) and the job's folder."""
    home, job = tmp_path / "home", tmp_path / "job"
    shutil.copytree(PACKAGE, home / "tiny_lm")
    (home / "tiny_lm" / "__pycache__").mkdir()
    (home / "tiny_lm" / "__pycache__" / "x.pyc").write_bytes(b"stale")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.json").write_text("{}")
    recipe = home / "job.yaml"
    recipe.write_text(RECIPE.replace("PROFILE", str(tmp_path / "profiles" / "mine.json")))
    job.mkdir()
    return recipe, job


def test_the_package_and_profile_travel_in_the_folder_and_the_vm_recipe_points_at_them(tmp_path):
    recipe_path, job = _laptop(tmp_path)
    recipe = load_recipe(recipe_path)
    assert pack_code(recipe.model, job) == CODE_ZIP
    names = zipfile.ZipFile(job / CODE_ZIP).namelist()
    assert "tiny_lm/__init__.py" in names and not any("__pycache__" in n for n in names)
    profile = carry_profile(recipe.model.profile, job)
    assert profile == "carried-mine.json" and (job / profile).read_text() == "{}"

    vm = tmp_path / "vm"  # the controller's copy of the folder, pulled from the bucket
    vm.mkdir()
    for name in (CODE_ZIP, profile):
        shutil.copyfile(job / name, vm / name)
    (vm / "recipe.yaml").write_text(recipe_path.read_text())
    launch = {"recipe_path": "recipe.yaml", "profile": profile, "code": CODE_ZIP}
    ready = _recipe(vm, launch, bucket_url=None)
    assert ready.model.code == str(vm / "code") and ready.model.profile == str(vm / profile)
    assert (vm / "code" / "tiny_lm" / "__init__.py").is_file()
    json.loads((vm / profile).read_text())


def test_other_models_carry_no_code_and_a_zip_cannot_write_outside_the_folder(tmp_path):
    recipe = load_recipe(_laptop(tmp_path)[0])
    plain = recipe.model.__class__(name="gpt-tiny")
    assert pack_code(plain, tmp_path / "job") is None
    with zipfile.ZipFile(tmp_path / "job" / "bad.zip", "w") as archive:
        archive.writestr("../escape.py", "x = 1")
    with pytest.raises(AssertionError):
        unpack_code(tmp_path / "job", "bad.zip")
    assert not (tmp_path / "escape.py").exists()


def test_a_package_too_large_to_ship_says_what_to_do(tmp_path, monkeypatch):
    recipe = load_recipe(_laptop(tmp_path)[0])
    monkeypatch.setattr("orchestrator.driver.shipped.MAX_CODE_BYTES", 10)
    with pytest.raises(UserError, match="keep data and weights out"):
        pack_code(recipe.model, tmp_path / "job")
