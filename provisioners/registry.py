"""Provisioners by name; each adapter's module (and so its cloud SDK) is imported only when asked for."""

from __future__ import annotations

import importlib

from provisioners.base import Provisioner

# name -> (module, class): the one place that lists the adapters
ADAPTERS: dict[str, tuple[str, str]] = {
    "local": ("provisioners.local", "LocalProvisioner"),
    "aws": ("provisioners.aws", "AwsProvisioner"),
    "gcp": ("provisioners.gcp", "GcpProvisioner"),
    "azure": ("provisioners.azure", "AzureProvisioner"),
    "skypilot": ("provisioners.skypilot", "SkyPilotProvisioner"),
}


def provisioner_class(name: str) -> type[Provisioner]:
    """The adapter class for ``name`` (one of ``ADAPTERS``); its SDK is not imported yet."""
    module, cls = ADAPTERS[name]
    return getattr(importlib.import_module(module), cls)


def create(name: str, **options) -> Provisioner:
    """An adapter instance; ``options`` are its constructor's keyword arguments."""
    return provisioner_class(name)(**options)
