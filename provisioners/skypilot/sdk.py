"""SkyPilot's SDK, imported only when the adapter is used, and the few calls we make around it.

SkyPilot (>= 0.8) answers ``launch``, ``status``, ``down`` and ``check`` with a request id served by
its API server; ``wait`` polls ``api_status`` until the request ends or a deadline passes, then
``get``s the result, which re-raises the request's own exception (``ResourcesUnavailableError``...).
``to_error`` turns those exceptions into the contract's typed errors, scrubbed of secrets.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from provisioners.base import (
    CapacityError,
    CloudCallError,
    ProvisionerError,
    QuotaError,
    SdkMissing,
)

CLOUD = "skypilot"
PIP_EXTRA = "pip install 'geo-orchestrator[skypilot]'"
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# Words SkyPilot's failover messages use when an account limit, not the cloud's stock, said no
# (AWS VcpuLimitExceeded / MaxSpotInstanceCountExceeded, GCP QUOTA_EXCEEDED, Azure QuotaExceeded).
_QUOTA = re.compile(r"(?i)quota|limitexceeded|countexceeded|vcpu ?limit")
_MAX_MESSAGE_CHARS = 600  # SkyPilot's failover histories are long; the head says what happened


class RequestTimeout(Exception):
    """A SkyPilot request did not end before its deadline (it was cancelled)."""


def load_sdk() -> Any:
    """The ``sky`` module with the submodules the adapter uses; ``SdkMissing`` if not installed."""
    try:
        import sky
        import sky.catalog.common  # noqa: F401  (the catalog CSV loader behind offers)
        import sky.client.sdk  # noqa: F401  (its check: `sky.check` is a module since 0.10)
        import sky.exceptions  # noqa: F401  (the error types we map)
    except ImportError as error:
        raise SdkMissing(
            f"the SkyPilot SDK ('sky') cannot be imported: {error}",
            cloud=CLOUD,
            call="import sky",
            fix=PIP_EXTRA,
        ) from None
    return sky


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


def to_error(sdk: Any, error: BaseException, *, call: str, where: str) -> ProvisionerError:
    """The typed contract error for a SkyPilot exception: capacity and quota say "try elsewhere"."""
    text = _texts(error)[:_MAX_MESSAGE_CHARS] or type(error).__name__
    message = f"{where}: {text}"
    if _QUOTA.search(text):
        return QuotaError(
            message,
            cloud=CLOUD,
            call=call,
            fix="raise the quota in the cloud's console (SkyPilot's message names it), "
            "or launch in another region or cloud",
        )
    unavailable = getattr(sdk.exceptions, "ResourcesUnavailableError", ())
    if isinstance(error, unavailable):
        return CapacityError(
            message,
            cloud=CLOUD,
            call=call,
            fix="try another zone, region or cloud, a smaller gang, or on-demand nodes",
        )
    return CloudCallError(
        f"{message} ({type(error).__name__})",
        cloud=CLOUD,
        call=call,
        fix="run `sky check` and `sky api status` to see whether SkyPilot and its API server are "
        "healthy, then retry",
    )
