"""The GCP adapter: GPU VMs on Compute Engine (google-cloud-compute, imported only when used)."""

from provisioners.gcp.provisioner import GcpOptions, GcpProvisioner

__all__ = ["GcpOptions", "GcpProvisioner"]
