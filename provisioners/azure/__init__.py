"""Azure adapter (azure-mgmt-compute): GPU offers from resource SKUs and retail prices, Spot VM
gangs, eviction detection from instance views; ``metadata`` holds the on-node eviction notice.

Importing this package does not import the Azure SDK; the adapter imports it when first used.
"""

from provisioners.azure.instances import VmSettings
from provisioners.azure.provisioner import AzureProvisioner, PriceSource

__all__ = ["AzureProvisioner", "PriceSource", "VmSettings"]
