"""SkyPilot's SDK, imported only when the adapter is used, and the few calls we make around it.

SkyPilot (>= 0.8) answers ``launch``, ``status``, ``down`` and ``check`` with a request id served by
its API server; ``wait`` polls ``api_status`` until the request ends or a deadline passes, then
``get``s the result, which re-raises the request's own exception (``ResourcesUnavailableError``...).
SkyPilot raises exception classes, not error codes: ``to_error`` takes the class's name as the code
and the text of the error and of every place SkyPilot tried as the message, and ``ERRORS`` (the
one error mapper, provisioners/error_map.py) makes them the contract's typed, scrubbed error.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from provisioners.base import ProvisionerError
from provisioners.error_map import NEVER, ErrorMap, Match
from provisioners.sdk_loader import load_sdk as _load

CLOUD = "skypilot"
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
_MAX_MESSAGE_CHARS = 600  # SkyPilot's failover histories are long; the head says what happened

ERRORS = ErrorMap(
    cloud=CLOUD,
    # SkyPilot gave up on every place it may use; to_error also passes the class's subclasses
    # (KubeAPIUnreachableError) as capacity, by isinstance
    capacity=Match(codes={"ResourcesUnavailableError"}),
    # Words SkyPilot's failover messages use when an account limit, not the cloud's stock, said
    # no (AWS VcpuLimitExceeded / MaxSpotInstanceCountExceeded, GCP QUOTA_EXCEEDED, Azure
    # QuotaExceeded); they decide before the class does (see to_error)
    quota=Match(message=re.compile(r"(?i)quota|limitexceeded|countexceeded|vcpu ?limit")),
    # Credentials are judged by check_credentials (`sky check`, or the offline look); a failed
    # launch or status stays a CloudCallError (a CredentialsMissing would stop the driver)
    credentials=NEVER,
    # the SkyPilot API server's own access control (its users, roles and workspaces)
    permission=Match(codes={"PermissionDeniedError", "NoWorkspaceAccessError"}),
    fixes={
        "capacity": "try another zone, region or cloud, a smaller gang, or on-demand nodes",
        "quota": "raise the quota in the cloud's console (SkyPilot's message names it), "
        "or launch in another region or cloud",
        "permission": "ask whoever runs the SkyPilot API server to give this user access to the "
        "workspace (`sky api info` names the user and the server), or run `sky check` and "
        "`sky api status` to see what it allows",
        "other": "run `sky check` and `sky api status` to see whether SkyPilot and its API "
        "server are healthy, then retry",
    },
)


class RequestTimeout(Exception):
    """A SkyPilot request did not end before its deadline (it was cancelled)."""


def load_sdk() -> Any:
    """The ``sky`` module with the submodules the adapter uses: the catalog CSV loader behind
    offers, the client's ``check`` (``sky.check`` is a module since 0.10) and the error types
    we map; ``SdkMissing`` naming the extra if SkyPilot is not installed."""
    return _load(
        "sky",
        "sky.catalog.common",
        "sky.client.sdk",
        "sky.exceptions",
        cloud=CLOUD,
        package="skypilot",
        extra="skypilot",
    )


def check_request(sdk: Any, clouds: tuple[str, ...]) -> Any:
    """Submit ``sky check`` for ``clouds``; its request id. The client SDK's ``check`` lives in
    ``sky.client.sdk``: at the top level ``sky.check`` is the server-side module, not callable."""
    return sdk.client.sdk.check(clouds, False)


def request_state(sdk: Any, request_id: Any) -> str:
    """PENDING, RUNNING, SUCCEEDED, FAILED or CANCELLED, as the API server says now."""
    rows = sdk.api_status([request_id])
    if not rows:
        return "PENDING"  # just submitted: not listed yet
    status = rows[0]["status"] if isinstance(rows[0], dict) else rows[0].status
    return str(getattr(status, "value", status)).upper()


def wait(
    sdk: Any,
    request_id: Any,
    *,
    deadline_s: float | None,
    poll_interval_s: float,
    stop: threading.Event,
) -> Any:
    """The request's result once it ends (``get`` re-raises its error); with a deadline
    (``time.monotonic()``), cancel the request and raise ``RequestTimeout`` when it passes."""
    while deadline_s is not None and request_state(sdk, request_id) not in TERMINAL:
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            sdk.api_cancel(request_id, silent=True)
            raise RequestTimeout(f"request {request_id} did not end in time")
        stop.wait(min(poll_interval_s, left_s))
    return sdk.get(request_id)


def _texts(error: BaseException) -> str:
    """The error's text and that of every location SkyPilot tried before giving up."""
    history = getattr(error, "failover_history", None) or []
    return " | ".join(str(e) for e in [error, *history] if str(e))


def _kind(sdk: Any, error: BaseException, code: str, message: str) -> str | None:
    """The kind where SkyPilot's exception decides it, else ``None`` (the map decides). A quota
    named anywhere in the failover history wins over the class: SkyPilot raises
    ``ResourcesUnavailableError`` for both, and only a quota is worth raising."""
    if ERRORS.quota(code, message, None):
        return "quota"
    unavailable = getattr(sdk.exceptions, "ResourcesUnavailableError", ())
    return "capacity" if isinstance(error, unavailable) else None


def to_error(sdk: Any, error: BaseException, *, call: str, where: str) -> ProvisionerError:
    """The typed contract error for a SkyPilot exception: capacity and quota say "try elsewhere"."""
    code, message = type(error).__name__, _texts(error)[:_MAX_MESSAGE_CHARS]
    kind = _kind(sdk, error, code, message)
    return ERRORS.error(code, message, call=call, where=where, kind=kind)
