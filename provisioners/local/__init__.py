"""The local simulated spot cloud: a market over time (market.py, trace.py) on a real multi-node Ray
cluster on this machine (cluster.py), behind the cloud contract (provisioner.py)."""

from provisioners.local.provisioner import LocalProvisioner

__all__ = ["LocalProvisioner"]
