"""One way every cloud adapter imports its SDK: lazily, and when it is missing, one error that
names the package and the extra that installs it (apart from missing credentials, which the
adapter's ``check_credentials`` reports).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from provisioners.base import SdkMissing


def install_fix(extra: str) -> str:
    """How to install an adapter's SDK, from PyPI or from a checkout of this project."""
    return (
        f"pip install 'geo-orchestrator[{extra}]' (from a checkout of this project: "
        f"pip install -e '.[{extra}]')"
    )


def load_sdk(module: str, *also: str, cloud: str, package: str, extra: str) -> ModuleType:
    """Import ``module`` (and the submodules ``also`` the adapter needs) and return ``module``;
    ``SdkMissing`` naming ``package`` and the pip extra when any of them cannot be imported."""
    try:
        loaded = importlib.import_module(module)
        for name in also:
            importlib.import_module(name)
    except ImportError as error:
        raise SdkMissing(
            f"{package} is not installed or does not import ({error})",
            cloud=cloud,
            call=f"import {module}",
            fix=install_fix(extra),
        ) from None
    return loaded
