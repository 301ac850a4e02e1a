"""One error mapper for every cloud adapter: how a cloud's failure becomes the contract's typed
error, declared as data.

Each cloud names its error codes (and, where its API reports only prose, patterns of the message)
for each kind of failure, and a fix per kind. The kinds are tried in one order for every cloud:
no capacity, a quota, rejected credentials, a permission, throttling, anything else; so the same
failure reads the same way on AWS, GCP and Azure and a caller can branch on the error's type
(``CapacityError`` moves to the next place, ``QuotaError`` too, ``CredentialsMissing`` stops).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from provisioners.base import (
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    ProvisionerError,
    QuotaError,
    scrub,
)

Fix = str | Callable[[str], str]  # a fix, or one made from the call (to name its permission)


@dataclass(frozen=True)
class Match:
    """What marks one kind of failure: any of ``codes``, a ``message`` pattern, an HTTP status."""

    codes: Collection[str] = ()
    message: re.Pattern[str] | None = None
    statuses: Collection[int] = ()
    code_suffixes: tuple[str, ...] = ()  # e.g. AWS's "...LimitExceeded" quota family

    def __call__(self, code: str, message: str, status: int | None) -> bool:
        return (
            code in self.codes
            or (bool(code) and bool(self.code_suffixes) and code.endswith(self.code_suffixes))
            or (self.message is not None and bool(self.message.search(f"{code} {message}")))
            or (status is not None and status in self.statuses)
        )


NEVER = Match()


@dataclass(frozen=True)
class ErrorMap:
    """One cloud's failures by kind, and the fix for each."""

    cloud: str
    capacity: Match
    quota: Match
    credentials: Match
    permission: Match
    fixes: dict[str, Fix]  # by kind: capacity, quota, credentials, permission, throttle, other
    throttle: Match = NEVER
    what: dict[str, str] = field(
        default_factory=lambda: {
            "capacity": "no capacity for this request now",
            "quota": "a quota forbids this request",
            "credentials": "the credentials were not accepted",
            "permission": "the identity in use may not do this",
            "throttle": "the cloud throttled the request",
            "other": "the call failed",
        }
    )

    def kind(self, code: str, message: str, status: int | None = None) -> str:
        """Which kind of failure this is; throttling is checked before quota (AWS names some
        throttles "...LimitExceeded")."""
        for kind in ("capacity", "throttle", "quota", "credentials", "permission"):
            if getattr(self, kind)(code, message, status):
                return kind
        return "other"

    def error(
        self,
        code: str,
        message: str,
        *,
        call: str,
        where: str = "",
        status: int | None = None,
        kind: str | None = None,
    ) -> ProvisionerError:
        """The typed error for ``code`` and ``message`` (either may be empty) from ``call`` at
        ``where``; ``kind`` forces the kind (e.g. the SDK raised its own credentials error)."""
        kind = kind or self.kind(code, message, status)
        said = scrub(f"[{code}] {message}" if code else message)
        text = f"{self.what[kind]}{f' in {where}' if where else ''}: {said}"
        fix = self.fixes.get(kind) or self.fixes["other"]
        cls = {
            "capacity": CapacityError,
            "quota": QuotaError,
            "credentials": CredentialsMissing,
        }.get(kind, CloudCallError)
        fixed = fix(call) if callable(fix) else fix
        return cls(text, cloud=self.cloud, call=call, fix=fixed, code=code)
