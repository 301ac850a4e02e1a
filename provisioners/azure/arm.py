"""One Azure Resource Manager REST call through the compute client's own pipeline.

azure-mgmt-network, -storage, -msi and -authorization are not dependencies: the few network,
storage, identity and role calls the adapter makes are plain ARM requests sent with
``ComputeManagementClient.send_request`` (same credential, retries and logging as the compute
calls). A missing resource is None; every other failure is the contract's typed error.
"""

from __future__ import annotations

from typing import Any

from provisioners.azure.sdk import map_error

# the network API version of every Microsoft.Network call (NICs, addresses, security groups)
NETWORK_API_VERSION = "2023-11-01"


def arm_call(
    client: Any,
    method: str,
    path: str,
    body: dict | None = None,
    *,
    api_version: str,
    call: str,
) -> dict | None:
    """``method`` on the resource at ``path`` (``/subscriptions/...``); its JSON, or None when
    ARM answers 404 (a missing resource) or with no body (an accepted delete)."""
    from azure.core.exceptions import AzureError
    from azure.core.rest import HttpRequest

    url = f"{path}?api-version={api_version}"
    try:
        response = client.send_request(HttpRequest(method, url, json=body))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json() if response.content else None
    except AzureError as error:
        raise map_error(error, call=call, where=path.rsplit("/", 1)[-1]) from error
