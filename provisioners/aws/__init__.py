"""The AWS adapter: EC2 GPU instances through boto3 (imported only when the adapter is used).

``AwsProvisioner`` implements the cloud contract; ``metadata.interruption_notice`` runs on a node
and reads the two-minute spot interruption notice from the instance metadata service.
"""

from provisioners.aws.provisioner import AwsConfig, AwsProvisioner

__all__ = ["AwsConfig", "AwsProvisioner"]
