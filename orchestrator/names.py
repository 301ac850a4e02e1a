"""Job names: the one rule for what may name a job, its folder and its checkpoints.

A job's name becomes a folder under the jobs home, a prefix of its checkpoints' keys and a Ray
actor's name, and is echoed to terminals. So it is a short slug: letters, digits, '.', '_' or '-',
starting with a letter or digit, at most ``JOB_NAME_MAX`` characters. No separator, no '..', no
control or escape characters can get through, so a job's folder is always inside the jobs home.

``job_name_problem`` says what is wrong with a name (None when it is fine); ``default_job_name``
makes a valid name from a recipe's file name (a recipe without ``name:``).
"""

from __future__ import annotations

import re
from pathlib import Path

JOB_NAME_MAX = 64
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_NOT_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def job_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a job, or None when it can."""
    if not name:
        return "the name is empty"
    if len(name) > JOB_NAME_MAX:
        return f"the name has {len(name):,} characters; at most {JOB_NAME_MAX} are allowed"
    if not _JOB_NAME.match(name):
        return (
            f"{ascii(name)} is not a job name: use letters, digits, '.', '_' or '-', starting "
            "with a letter or digit"
        )
    return None


def default_job_name(recipe_file: str | Path) -> str:
    """A valid job name from a recipe's file name: ``My Recipe (2).yaml`` -> ``My-Recipe-2``."""
    slug = _NOT_SLUG.sub("-", Path(recipe_file).stem).strip("-._")[:JOB_NAME_MAX].rstrip("-._")
    return slug or "job"
