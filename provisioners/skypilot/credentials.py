"""Which clouds SkyPilot could use: its own ``sky check``, or an offline look for credentials.

SkyPilot's check asks each cloud who we are, which needs the network and its API server; the offline
look only asks whether the places each cloud's standard chain reads from exist (environment
variables, files). Neither reads a secret: we report names of places, never contents.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Chain:
    """Where one cloud's standard credential chain looks, and how a user fills it."""

    env_any: tuple[str, ...]  # any one of these set is enough
    config_dir_env: str | None  # an environment variable that moves the config folder
    config_dir: str  # the folder, relative to the home folder
    files_any: tuple[str, ...]  # any one of these files in the folder is enough
    login: str  # the command that fills the chain

    def found(self, environ: Mapping[str, str], home: Path) -> bool:
        if any(environ.get(name) for name in self.env_any):
            return True
        folder = Path(environ.get(self.config_dir_env or "", "") or home / self.config_dir)
        return any((folder / name).exists() for name in self.files_any)

    def describe(self, home: Path) -> str:
        places = [f"${name}" for name in self.env_any]
        folder = f"${self.config_dir_env} or " if self.config_dir_env else ""
        places.append(f"{' / '.join(self.files_any)} in {folder}{home / self.config_dir}")
        return f"looked for {', '.join(places)}; to fix: {self.login}"


CHAINS: dict[str, Chain] = {
    "aws": Chain(
        env_any=("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"),
        config_dir_env=None,
        config_dir=".aws",
        files_any=("credentials", "config"),
        login="`aws configure` (or `aws sso login`), then `sky check aws`",
    ),
    "gcp": Chain(
        env_any=("GOOGLE_APPLICATION_CREDENTIALS",),
        config_dir_env="CLOUDSDK_CONFIG",
        config_dir=".config/gcloud",
        files_any=("application_default_credentials.json", "credentials.db"),
        login="`gcloud auth login && gcloud auth application-default login`, then `sky check gcp`",
    ),
    "azure": Chain(
        env_any=("AZURE_CLIENT_ID",),
        config_dir_env="AZURE_CONFIG_DIR",
        config_dir=".azure",
        files_any=("msal_token_cache.json", "azureProfile.json"),
        login="`az login`, then `sky check azure`",
    ),
}


def missing_offline(
    clouds: Sequence[str], *, environ: Mapping[str, str] | None = None, home: Path | None = None
) -> dict[str, str]:
    """cloud -> what was looked for, for each cloud whose chain has nothing in place."""
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    missing = {}
    for cloud in clouds:
        chain = CHAINS.get(cloud)
        if chain is None:
            missing[cloud] = f"no offline check for {cloud}; to fix: run `sky check {cloud}`"
        elif not chain.found(environ, home):
            missing[cloud] = chain.describe(home)
    return missing


def enabled_by_check(result: Any) -> set[str]:
    """Cloud names (lower case) that ``sky check`` enabled, from its per-workspace answer
    ``{workspace: {cloud: [capabilities]}}`` (or, from older servers, ``{cloud: [...]}``)."""
    enabled: set[str] = set()
    for key, value in (result or {}).items():
        if isinstance(value, Mapping):
            enabled |= {str(cloud).lower() for cloud, caps in value.items() if caps}
        elif value:
            enabled.add(str(key).lower())
    return enabled


def missing_by_check(clouds: Sequence[str], result: Any) -> dict[str, str]:
    """cloud -> what to do, for each cloud ``sky check`` did not enable."""
    enabled = enabled_by_check(result)
    return {
        cloud: f"`sky check {cloud}` did not enable it; run `sky check {cloud} -v` for the reason"
        for cloud in clouds
        if cloud.lower() not in enabled
    }
