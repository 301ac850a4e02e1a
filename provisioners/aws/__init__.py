"""The AWS adapter: EC2 GPU instances through boto3 (imported only when the adapter is used).

``AwsProvisioner`` implements the cloud contract; ``metadata.notice`` (the node's watcher) and
``metadata.interruption_notice`` run on a node and read the two-minute spot interruption notice
from the instance metadata service.
"""

from provisioners.aws.provisioner import AwsConfig, AwsProvisioner

__all__ = ["AwsConfig", "AwsProvisioner"]
