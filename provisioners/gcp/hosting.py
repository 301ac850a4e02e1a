"""What a job's controller needs of GCP besides VMs: a private bucket and an identity.

- **The bucket** ``geo-<project>-<region>`` in Cloud Storage (the JSON API through the adapter's
  own credentials): made the first time with uniform bucket-level access and public access
  prevention enforced, in the job's region. A job's folder lives under ``jobs/<job>/``.
- **The identity**: the project's default compute service account (``default``) with the
  ``cloud-platform`` scope, for the controller and the nodes alike; what it may do is its IAM
  roles (Compute Instance Admin and Storage Object Admin on the bucket: README). A VM reads its
  token from its metadata server; no key of the user's leaves the laptop.
- No presigned URLs: a VM fetches the wheel with its own token (bootstrap ``common.sh``).
"""

from __future__ import annotations

import re
from typing import Any

from provisioners.base import CloudCallError, Identities
from provisioners.gcp import sdk

IDENTITIES = Identities(controller="default", node="default")
STORAGE_API = "https://storage.googleapis.com"


def bucket_name(project: str, region: str) -> str:
    """GCS's rules: 3-63 of [a-z0-9-_.], starting and ending with a letter or digit."""
    return (_stem(project) + region.lower())[:63].strip("-")


def _stem(project: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", f"geo-{project}-".lower())


def job_buckets(api: Any, *, endpoint: str | None) -> dict[str, str]:
    """The project's job buckets: region -> ``gs://`` URL."""
    from google.auth.transport.requests import AuthorizedSession

    stem = _stem(api.project)
    base = (endpoint or STORAGE_API).rstrip("/")
    session, found, params = AuthorizedSession(api.credentials), [], {"project": api.project}
    params["prefix"] = stem
    while True:
        page = _request(session, "GET", f"{base}/storage/v1/b", call="buckets.list", params=params)
        if page.status_code != 200:
            raise _failed(page, "buckets.list", stem)
        answer = page.json()
        found += [b["name"] for b in answer.get("items", [])]
        if not answer.get("nextPageToken"):
            return {name[len(stem) :]: f"gs://{name}" for name in found}
        params["pageToken"] = answer["nextPageToken"]


def ensure_bucket(api: Any, region: str, *, endpoint: str | None) -> str:
    """The project's bucket for jobs in ``region`` (made when missing); its ``gs://`` URL."""
    from google.auth.transport.requests import AuthorizedSession

    name = bucket_name(api.project, region)
    base = (endpoint or STORAGE_API).rstrip("/")
    session = AuthorizedSession(api.credentials)
    found = _request(session, "GET", f"{base}/storage/v1/b/{name}", call="buckets.get")
    if found.status_code == 200:
        return f"gs://{name}"
    if found.status_code != 404:
        raise _failed(found, "buckets.get", name)
    body = {
        "name": name,
        "location": region,
        "iamConfiguration": {
            "uniformBucketLevelAccess": {"enabled": True},
            "publicAccessPrevention": "enforced",
        },
        "labels": {"geo-orchestrator": "jobs"},
    }
    made = _request(
        session,
        "POST",
        f"{base}/storage/v1/b",
        call="buckets.insert",
        params={"project": api.project},
        json=body,
    )
    if made.status_code not in (200, 409):  # 409: made meanwhile, ours
        raise _failed(made, "buckets.insert", name)
    return f"gs://{name}"


def _request(session: Any, method: str, url: str, *, call: str, **kwargs) -> Any:
    import requests

    try:
        return session.request(method, url, timeout=60, **kwargs)
    except (requests.RequestException, OSError) as error:
        raise CloudCallError(
            f"Cloud Storage did not answer ({type(error).__name__})",
            cloud=sdk.CLOUD,
            call=f"storage.{call}",
            fix="check network access to storage.googleapis.com, then retry",
        ) from None


def _failed(answer: Any, call: str, name: str) -> CloudCallError:
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = answer.reason
    fix = (
        "grant the account roles/storage.admin on the project (it makes the bucket once), "
        "or make the bucket yourself"
        if answer.status_code == 403
        else "check the project and the region"
    )
    return CloudCallError(
        f"{answer.status_code} for bucket {name}: {message}",
        cloud=sdk.CLOUD,
        call=f"storage.{call}",
        fix=fix,
    )
