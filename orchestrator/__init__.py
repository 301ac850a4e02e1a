"""Plan, simulate and run the training of one model on spot GPUs across zones, regions and clouds.

The package holds the recipe, the data catalog, the simulator, the planner, the driver actor, the
CLI (``python -m orchestrator``) and the notebook API. Importing it is cheap: it imports no cloud
SDK, and neither Ray nor torch until a command needs them.
"""

__version__ = "0.1.0"

_API = ("submit", "job", "Job")


def __getattr__(name: str):
    """``orchestrator.submit`` / ``job`` / ``Job`` (api.py), imported on first use so that
    ``import orchestrator`` stays cheap."""
    if name in _API:
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
