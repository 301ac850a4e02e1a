"""The SkyPilot adapter: GPU clusters on AWS, GCP and Azure through SkyPilot's SDK (``sky``), which is
imported only when the adapter is first used, so this package imports without it.

``SkyPilotProvisioner`` implements the cloud contract: offers from SkyPilot's catalog files, one
SkyPilot cluster per gang with our Ray on its nodes, losses seen in ``sky.status``.
"""

from provisioners.skypilot.provisioner import SkyPilotConfig, SkyPilotProvisioner

__all__ = ["SkyPilotConfig", "SkyPilotProvisioner"]
