"""What a job's controller VM needs from the laptop besides the recipe: a module model's code
and a profile file the recipe names outside the job's folder.

The job's folder travels through the job's bucket as top-level files (bucket.py), so the code
goes as one zip (``code.zip``: the model's top-level package or module, as ``code_env`` ships it
to workers) and the profile as a copy. On the VM the zip is unpacked into the folder's ``code``
and the recipe's ``model.code`` points there; from the controller the driver's Ray job ships it
to the workers (``runtime_env``), as on the local cloud.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path, PurePosixPath

from orchestrator.errors import UserError

CODE_ZIP = "code.zip"
CODE_FOLDER = "code"
MAX_CODE_BYTES = 64 * 2**20  # a model's code, not its data or weights


def pack_code(model, folder: Path) -> str | None:
    """Zip a module model's package into ``folder``; its file name, or None for other models."""
    from orchestrator.recipe.models import code_env

    env = code_env(model)
    if env is None:
        return None
    source = Path(env["py_modules"][0])
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    files = [p for p in files if "__pycache__" not in p.parts]
    size = sum(p.stat().st_size for p in files)
    if size > MAX_CODE_BYTES:
        raise UserError(
            f"model.module's code {source} holds {size / 2**20:.0f} MiB; the controller takes at "
            f"most {MAX_CODE_BYTES / 2**20:.0f} MiB of code",
            field="model.code",
            fix="keep data and weights out of the package (data.path, model.weights)",
        )
    with zipfile.ZipFile(folder / CODE_ZIP, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.relative_to(source.parent).as_posix())
    return CODE_ZIP


def unpack_code(folder: Path, name: str) -> Path:
    """Unpack the zip ``pack_code`` made into the folder's ``code``; that folder."""
    target = folder / CODE_FOLDER
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(mode=0o700)
    with zipfile.ZipFile(folder / name) as archive:
        for entry in archive.namelist():
            parts = PurePosixPath(entry).parts
            # our own zip, through the job's bucket: still, nothing outside the folder
            assert parts and not PurePosixPath(entry).is_absolute() and ".." not in parts, entry
        archive.extractall(target)
    return target


def carry_profile(profile: str | None, folder: Path) -> str | None:
    """A profile file outside ``folder`` copied into it; its name there (None: not a file)."""
    if not profile or not Path(profile).is_file():
        return None
    path = Path(profile)
    if path.parent.resolve() == folder.resolve():
        return path.name
    name = f"carried-{path.name}"  # never one of the folder's own files
    shutil.copyfile(path, folder / name)
    return name
