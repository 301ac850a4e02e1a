"""boto3 behind one door: the lazy import, every API call, and AWS errors turned into typed errors.

Every call the adapter makes goes through ``call`` (or ``pages`` for paginated calls) so that an
AWS error code becomes the error a caller can act on, as ``ERRORS`` (provisioners/error_map.py)
declares: capacity codes become ``CapacityError`` and limit codes ``QuotaError`` (both mean "try
the next location"), rejected credentials become ``CredentialsMissing`` and missing permissions
name the IAM action. Messages pass through ``scrub``
and the SDK's exception is not chained, so nothing secret rides along in a traceback.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from provisioners.base import CloudCallError, CredentialsMissing, ProvisionerError, scrub
from provisioners.error_map import ErrorMap, Match
from provisioners.sdk_loader import load_sdk

CLOUD = "aws"

# The location has no capacity now; another zone, region or a later try may have some.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "SpotMaxPriceTooLow",
        "Unsupported",  # the instance type is not offered in the requested zone
    }
)
# Limits of the account, not of the location (RequestLimitExceeded is API throttling, not quota).
QUOTA_CODES = frozenset({"MaxSpotInstanceCountExceeded", "InstanceLimitExceeded"})
THROTTLE_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
# The credentials were found but AWS does not accept them.
REJECTED_CREDENTIAL_CODES = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidAccessKeyId",
    }
)
PERMISSION_CODES = frozenset(
    {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "OptInRequired"}
)


def _iam_action(call: str) -> str:
    """``describe_instances`` -> ``ec2:DescribeInstances`` (close enough to name the permission)."""
    service, _, method = call.partition(".")
    return f"{service}:{''.join(word.capitalize() for word in method.split('_'))}"


ERRORS = ErrorMap(
    cloud=CLOUD,
    capacity=Match(codes=CAPACITY_CODES),
    # the "...LimitExceeded" family is quota too; the ErrorMap tries throttles first, so
    # RequestLimitExceeded stays a throttle
    quota=Match(codes=QUOTA_CODES, code_suffixes=("LimitExceeded",)),
    credentials=Match(codes=REJECTED_CREDENTIAL_CODES),
    permission=Match(codes=PERMISSION_CODES),
    throttle=Match(codes=THROTTLE_CODES),
    fixes={
        "capacity": "try another zone or region (or on-demand instead of spot), or try again later",
        "quota": "ask for a higher quota in the Service Quotas console (EC2: 'Running On-Demand' "
        "or 'All ... Spot Instance Requests' vCPUs for this instance family), or use another "
        "region",
        "credentials": "the credentials boto3 found were rejected: renew them (`aws sso login`, "
        "new access keys via `aws configure`) or check that AWS_PROFILE names the right account",
        "permission": lambda call: (
            f"grant the IAM permission {_iam_action(call)} to the identity boto3 uses"
        ),
        "throttle": "AWS throttled the request: try again in a minute, or poll less often",
        "other": "check the request (instance type, zone, AMI) against the message; retry if "
        "transient",
    },
)


def import_boto3() -> Any:
    """The boto3 module, or ``SdkMissing`` naming the extra that installs it."""
    return load_sdk("boto3", cloud=CLOUD, package="boto3", extra="aws")


# What botocore's DEBUG logs carry beyond base.scrub's patterns: the session token header (in the
# request dump and in the canonical request that botocore.auth logs).
_SDK_LOG_SECRETS = re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,;&}]+")
_SDK_LOGGERS = ("botocore", "boto3", "urllib3")


class _ScrubSdkLogs(logging.Filter):
    """Rewrites SDK log records without secrets (request dumps carry the access key id and, with
    temporary credentials, the session token)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        # the header first: base.scrub's generic token pattern would stop at the b'' prefix
        clean = scrub(_SDK_LOG_SECRETS.sub(lambda m: m.group(1) + "***", text))
        if clean != text:
            record.msg, record.args = clean, None
        return True


_SCRUB_SDK_LOGS = _ScrubSdkLogs()


def keyed_session(keys: Mapping[str, str]) -> Any:
    """A boto3 session with these keys (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_DEFAULT_REGION``) and nothing of the machine's own configuration: an emulated API's
    per-job keys."""
    boto3 = import_boto3()
    return boto3.session.Session(
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        region_name=keys["AWS_DEFAULT_REGION"],
    )


def guard_sdk_logs() -> None:
    """Put the scrubbing filter on every SDK logger that exists now. A filter on a parent logger
    does not see its children's records, so each one gets it; called whenever a client is made,
    since botocore creates loggers as it imports modules lazily."""
    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in _SDK_LOGGERS:
            logger = logging.getLogger(name)
            if _SCRUB_SDK_LOGS not in logger.filters:
                logger.addFilter(_SCRUB_SDK_LOGS)


def credentials_missing(call: str) -> CredentialsMissing:
    """What boto3's credential chain looked at, in its order, and how to fill one of its places."""
    profile = os.environ.get("AWS_PROFILE") or "default"
    credentials_file = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"
    config_file = os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config"
    imds = (
        "disabled by AWS_EC2_METADATA_DISABLED"
        if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"
        else "none answered"
    )
    looked = (
        "boto3 found no AWS credentials. It looked for: the environment variables "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary keys); "
        f"profile '{profile}' (AWS_PROFILE) in {credentials_file} and {config_file}, "
        "including SSO, assume-role and credential_process settings; container credentials "
        f"(AWS_CONTAINER_CREDENTIALS_RELATIVE_URI); and an EC2 instance role ({imds})"
    )
    fix = (
        "run `aws configure` to write access keys to ~/.aws/credentials, or `aws sso login "
        "--profile NAME` and export AWS_PROFILE=NAME, or export AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or run on an EC2 instance with an instance role"
    )
    return CredentialsMissing(looked, cloud=CLOUD, call=call, fix=fix)


def error_for(code: str, message: str, *, call: str) -> ProvisionerError:
    """The typed error for AWS error ``code`` raised by ``call`` (``service.method``)."""
    return ERRORS.error(code, message, call=call)


def translate(error: BaseException, *, call: str) -> ProvisionerError:
    """The typed error for an exception raised by botocore during ``call``."""
    from botocore.exceptions import ClientError, NoCredentialsError

    if isinstance(error, NoCredentialsError):
        return credentials_missing(call)
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        return error_for(
            str(details.get("Code", "Unknown")), str(details.get("Message", "")), call=call
        )
    fix = "check network access to the AWS endpoint and the region name, then retry"
    return CloudCallError(scrub(str(error)), cloud=CLOUD, call=call, fix=fix)


def call(client: Any, method: str, **params: Any) -> dict[str, Any]:
    """``client.method(**params)``, with botocore's errors translated to typed errors."""
    from botocore.exceptions import BotoCoreError, ClientError

    name = f"{client.meta.service_model.service_name}.{method}"
    try:
        return getattr(client, method)(**params)
    except (ClientError, BotoCoreError) as error:
        # not chained: the SDK's exception may carry request details we must not print
        raise translate(error, call=name) from None


def pages(client: Any, method: str, key: str, **params: Any) -> Iterator[Any]:
    """Every item under ``key`` across the pages of a NextToken-paginated call."""
    token: str | None = None
    while True:
        page = call(client, method, **params, **({"NextToken": token} if token else {}))
        yield from page.get(key, [])
        token = page.get("NextToken")
        if not token:
            return


# where ERRORS.error puts the code: "<what>[ in <where>]: [<code>] <message>"


def error_code(error: ProvisionerError) -> str:
    """The AWS error code of an error ``error_for`` made ('' if none)."""
    return error.code


def tags_of(instance: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
