"""One authenticated door to the Compute API: the project, the clients, and typed errors.

Credentials come from google-auth's standard chain (``google.auth.default()``) unless a test
injects them; the project from the caller, else from the chain. Each google-cloud-compute client is
made once, on first use, with the caller's ``client_options`` (a test points them at a local fake).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from provisioners.base import CredentialsMissing
from provisioners.gcp import sdk


class ComputeApi:
    """Credentials, project and clients, resolved lazily and kept."""

    def __init__(
        self,
        *,
        project: str | None,
        credentials: Any = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._project, self._injected = project, credentials
        self._client_options = dict(client_options or {})
        self._auth: tuple[Any, str] | None = None
        self._clients: dict[str, Any] = {}

    def credentials_and_project(self) -> tuple[Any, str]:
        """Resolve both once; raise ``CredentialsMissing`` naming what is missing."""
        if self._auth is not None:
            return self._auth
        credentials, project = self._injected, self._project
        if credentials is None or project is None:
            found, found_project = sdk.default_credentials()
            credentials = credentials if credentials is not None else found
            project = project or found_project
        if not project:
            raise CredentialsMissing(
                "no GCP project: none was passed and google.auth.default() found none "
                "(it reads GOOGLE_CLOUD_PROJECT, the key file, gcloud's config and the metadata "
                "server)",
                cloud=sdk.CLOUD,
                call="google.auth.default",
                fix=sdk.PROJECT_FIX,
            )
        self._auth = (credentials, project)
        return self._auth

    @property
    def credentials(self) -> Any:
        return self.credentials_and_project()[0]

    @property
    def project(self) -> str:
        return self.credentials_and_project()[1]

    def client(self, name: str) -> Any:
        """A google-cloud-compute client by class name (``InstancesClient``), made once."""
        if name not in self._clients:
            compute = sdk.compute_module()
            self._clients[name] = getattr(compute, name)(
                credentials=self.credentials, client_options=dict(self._client_options)
            )
        return self._clients[name]

    def call(self, call: str, where: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` with the SDK's exceptions turned into typed, scrubbed errors."""
        try:
            return fn()
        except sdk.sdk_errors() as error:
            raise sdk.typed(error, call=call, where=where) from None
