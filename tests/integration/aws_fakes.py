"""A fake AWS for the AWS adapter's tests, offline: moto for what it models well, botocore Stubbers
for what it lacks or models unrealistically.

moto (inside ``mock_aws``) serves instance types and their zone offerings, run/describe/terminate
instances, availability zones and SSM. A ``Stubber`` on a second client of the same service answers,
with AWS-shaped replies that botocore validates against the service model: spot price history
(moto's is a constant from 2006), spot placement scores and the Pricing API (moto has neither),
spot instance requests of ``run_instances`` spot instances (moto creates none), and the errors AWS
gives that moto never does (InsufficientInstanceCapacity, VcpuLimitExceeded, ...).

The adapter sees one Session-like object (``FakeAws.session_factory``) whose clients route each
method to moto or to a stub; the adapter's code path is the real one either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
from botocore.stub import Stubber
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import StateReason

ACCESS_KEY_ID = "AKIAFAKEFAKEFAKE1234"
SECRET_ACCESS_KEY = "fakeSecret/DoNotLeak+7f3e9a1b2c4d6e8f0a1b2c3d4e5f6a7b"
REGION = "us-east-1"
PRICE_TIME = datetime(2026, 1, 15, 12, 0, tzinfo=timezone.utc)


@dataclass
class FakeAws:
    """The fake cloud's knobs and state; ``session_factory`` hands it to the adapter."""

    spot_usd_per_hour: dict[tuple[str, str], float] = field(default_factory=dict)  # (zone, type)
    on_demand_usd_per_hour: dict[str, float] = field(default_factory=dict)  # type (in REGION)
    scores: dict[str, int] = field(default_factory=dict)  # type -> score 1..10 in every zone
    run_errors: dict[tuple[str, str], tuple[str, str]] = field(
        default_factory=dict
    )  # (type, zone) -> (code, message)
    refuse: dict[str, tuple[str, str]] = field(default_factory=dict)  # method -> (code, message)
    hold_pending: bool = False  # describe_instances shows every instance as pending
    kill_one_on_start: bool = False  # the next describe_instances finds one instance ended
    calls: list[str] = field(default_factory=list)
    # instance id -> how many times its spot request was shown as marked-for-termination
    interrupting: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.session = boto3.session.Session(region_name=REGION)
        self._stubbers: dict[tuple[str, str], tuple[Any, Stubber]] = {}

    def session_factory(self) -> FakeSession:
        return FakeSession(self)

    def preempt(self, instance_id: str) -> None:
        """AWS decides to take the spot instance back: its request shows the notice on the next
        look, and the instance is terminated (reason Server.SpotInstanceTermination) after it."""
        self.interrupting.setdefault(instance_id, 0)

    # ---- plumbing -------------------------------------------------------------------------------

    def stubbed(self, service: str, region: str, method: str, **params: Any) -> Any:
        """Call ``method`` on a stubbed client after queueing the fake's answer (or its error)."""
        key = (service, region)
        if key not in self._stubbers:
            client = self.session.client(service, region_name=region)
            stubber = Stubber(client)
            stubber.activate()
            self._stubbers[key] = (client, stubber)
        client, stubber = self._stubbers[key]
        error = self.refuse.get(method) or self._run_error(method, params)
        if error is not None:
            stubber.add_client_error(method, service_error_code=error[0], service_message=error[1])
        else:
            stubber.add_response(method, getattr(self, f"_answer_{method}")(region, params))
        return getattr(client, method)(**params)

    def _run_error(self, method: str, params: dict[str, Any]) -> tuple[str, str] | None:
        if method != "run_instances":
            return None
        zone = params.get("Placement", {}).get("AvailabilityZone", "")
        return self.run_errors.get((params["InstanceType"], zone))

    def backend_instance(self, region: str, instance_id: str) -> Any:
        return ec2_backends[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)

    def end_instance(self, region: str, instance_id: str, code: str, message: str) -> None:
        """AWS ends an instance on its own, with this state reason."""
        instance = self.backend_instance(region, instance_id)
        instance.terminate()
        instance.state_reason = StateReason(f"{code}: {message}", code)

    # ---- answers --------------------------------------------------------------------------------

    def _answer_describe_spot_price_history(self, region: str, params: dict[str, Any]) -> dict:
        history = []
        for (zone, kind), usd in self.spot_usd_per_hour.items():
            if kind in params["InstanceTypes"] and zone.startswith(region):
                # an older, higher price too: the adapter must keep the latest per zone and type
                for age_h, price in ((0, usd), (3, usd * 1.5)):
                    history.append(
                        {
                            "AvailabilityZone": zone,
                            "InstanceType": kind,
                            "ProductDescription": "Linux/UNIX",
                            "SpotPrice": f"{price:.6f}",
                            "Timestamp": PRICE_TIME - timedelta(hours=age_h),
                        }
                    )
        return {"SpotPriceHistory": history, "NextToken": ""}

    def _answer_get_spot_placement_scores(self, region: str, params: dict[str, Any]) -> dict:
        zones = self.session.client("ec2", region_name=params["RegionNames"][0])
        ids = [z["ZoneId"] for z in zones.describe_availability_zones()["AvailabilityZones"]]
        score = self.scores.get(params["InstanceTypes"][0])
        entries = [
            {"Region": params["RegionNames"][0], "AvailabilityZoneId": zone_id, "Score": score}
            for zone_id in ids
        ]
        return {"SpotPlacementScores": entries if score else []}

    def _answer_get_products(self, region: str, params: dict[str, Any]) -> dict:
        wanted = {f["Field"]: f["Value"] for f in params["Filters"]}
        usd = self.on_demand_usd_per_hour.get(wanted["instanceType"])
        if usd is None or wanted["regionCode"] != REGION:
            return {"FormatVersion": "aws_v1", "PriceList": []}
        return {
            "FormatVersion": "aws_v1",
            "PriceList": [json.dumps(price_list_product(wanted, usd))],
        }

    def _answer_describe_spot_instance_requests(self, region: str, params: dict[str, Any]) -> dict:
        ids = next(f["Values"] for f in params["Filters"] if f["Name"] == "instance-id")
        requests = []
        for n, instance_id in enumerate(ids):
            instance = self.backend_instance(region, instance_id)
            if instance.lifecycle != "spot":
                continue
            code = "fulfilled"
            if instance_id in self.interrupting:
                code = "marked-for-termination"
                self.interrupting[instance_id] += 1
            requests.append(
                spot_request(f"sir-{n:08x}", instance_id, instance.availability_zone, code)
            )
        return {"SpotInstanceRequests": requests}

    # ---- EC2 methods moto serves with a twist -----------------------------------------------------

    def before_describe_instances(self, region: str) -> None:
        """Carry out interruptions whose notice was shown at an earlier look (the adapter reads spot
        requests before instances, so the second showing is the next look): the instance ends as
        AWS ends it."""
        for instance_id, shown in list(self.interrupting.items()):
            if shown >= 2 and self.backend_instance(region, instance_id).state == "running":
                self.end_instance(
                    region,
                    instance_id,
                    "Server.SpotInstanceTermination",
                    "Spot instance termination",
                )
        if self.kill_one_on_start:
            self.kill_one_on_start = False
            victim = next(
                i
                for i in ec2_backends[DEFAULT_ACCOUNT_ID][region].all_instances()
                if i.state != "terminated"
            )
            self.end_instance(
                region, victim.id, "Server.InsufficientInstanceCapacity", "Insufficient capacity."
            )

    def after_describe_instances(self, answer: dict) -> dict:
        if self.hold_pending:
            for reservation in answer["Reservations"]:
                for instance in reservation["Instances"]:
                    if instance["State"]["Name"] == "running":
                        instance["State"] = {"Code": 0, "Name": "pending"}
        return answer


class FakeSession:
    """What the adapter uses of boto3.session.Session: client(), region_name, get_credentials()."""

    def __init__(self, fake: FakeAws) -> None:
        self._fake = fake
        self.region_name = REGION

    def client(self, service: str, region_name: str | None = None, **options: Any) -> FakeClient:
        # options (config=, endpoint_url=) are boto3's own; the fake's moto client has its own
        return FakeClient(self._fake, service, region_name or REGION)

    def get_credentials(self) -> Any:
        return self._fake.session.get_credentials()


STUBBED = {
    "ec2": {
        "describe_spot_price_history",
        "get_spot_placement_scores",
        "describe_spot_instance_requests",
    },
    "pricing": {"get_products"},
}


class FakeClient:
    """A moto client of ``service`` whose STUBBED methods (and refused or failing calls) are
    answered by the fake instead."""

    def __init__(self, fake: FakeAws, service: str, region: str) -> None:
        self._fake, self._service, self._region = fake, service, region
        self._moto = fake.session.client(service, region_name=region)
        self.meta = self._moto.meta

    def __getattr__(self, method: str) -> Any:
        fake, region = self._fake, self._region

        def invoke(**params: Any) -> Any:
            fake.calls.append(f"{self._service}.{method}")
            stub = method in STUBBED.get(self._service, ()) or method in fake.refuse
            if stub or fake._run_error(method, params) is not None:
                return fake.stubbed(self._service, region, method, **params)
            if method == "describe_instances":
                fake.before_describe_instances(region)
                return fake.after_describe_instances(self._moto.describe_instances(**params))
            return getattr(self._moto, method)(**params)

        return invoke


def price_list_product(filters: dict[str, str], usd: float) -> dict:
    """One Pricing API product, shaped as AWS returns it (trimmed to the fields that matter)."""
    sku = "SKU" + filters["instanceType"].replace(".", "").upper()
    return {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {**filters, "servicecode": "AmazonEC2", "usagetype": "BoxUsage"},
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "offerTermCode": "JRTCKXETXF",
                    "sku": sku,
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "pricePerUnit": {"USD": f"{usd:.10f}"},
                            "description": f"${usd} per On Demand Linux instance hour",
                        }
                    },
                }
            }
        },
    }


def spot_request(request_id: str, instance_id: str, zone: str, code: str) -> dict:
    return {
        "SpotInstanceRequestId": request_id,
        "InstanceId": instance_id,
        "State": "active",
        "Type": "one-time",
        "ProductDescription": "Linux/UNIX",
        "LaunchedAvailabilityZone": zone,
        "InstanceInterruptionBehavior": "terminate",
        "Status": {"Code": code, "Message": code, "UpdateTime": datetime.now(timezone.utc)},
    }
