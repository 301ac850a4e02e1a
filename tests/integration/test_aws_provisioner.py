"""The AWS adapter against a fake AWS (moto + botocore Stubbers, see aws_fakes.py), offline.

Covers the shared contract (run_contract), the offer fields and their sources, the launch request
AWS receives, AWS error codes turned into typed errors, all-or-nothing launches, preemption and
failure events, credentials (missing, scrubbed) and the on-node IMDSv2 interruption watcher.
"""

from __future__ import annotations

import base64
import http.server
import json
import logging
import sys
import threading
from collections.abc import Iterator

import pytest
from moto import mock_aws

from provisioners.aws import AwsProvisioner
from provisioners.aws.metadata import interruption_notice, notice
from provisioners.base import (
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    LaunchRequest,
    NodeLost,
    NodeState,
    PreemptionNotice,
    QuotaError,
    SdkMissing,
)
from provisioners.registry import create
from tests.integration.aws_fakes import (
    ACCESS_KEY_ID,
    PRICE_TIME,
    REGION,
    SECRET_ACCESS_KEY,
    FakeAws,
)
from tests.integration.contract import Harness, run_contract

pytestmark = pytest.mark.integration

TYPES = ("g5.xlarge", "g4dn.xlarge", "p4d.24xlarge", "p4de.24xlarge")
# moto serves this SSM parameter (the real default names a Deep Learning AMI moto lacks)
AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/amzn2-ami-hvm-x86_64-gp2"
NO_CAPACITY_MESSAGE = (
    "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested "
    "(us-east-1c). Our system will be working on provisioning additional capacity."
)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    """Fake credentials in the environment only; no profile files, no instance metadata."""
    _isolate_credential_chain(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    # mock_credentials=False: boto3 really signs with the planted keys, so the leak checks mean something
    with mock_aws(config={"core": {"mock_credentials": False}}):
        yield


def _isolate_credential_chain(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, file in (
        ("AWS_CONFIG_FILE", "config"),
        ("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
    ):
        (tmp_path / file).write_text("")
        monkeypatch.setenv(name, str(tmp_path / file))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def fake(aws_env) -> FakeAws:
    zones = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")
    spot = {(z, "g5.xlarge"): 0.4512 for z in zones}
    spot |= {(z, "g4dn.xlarge"): 0.1578 for z in zones}
    spot |= {("us-east-1a", "p4d.24xlarge"): 9.8315, ("us-east-1b", "p4d.24xlarge"): 10.1}
    return FakeAws(
        spot_usd_per_hour=spot,
        on_demand_usd_per_hour={"g5.xlarge": 1.006, "g4dn.xlarge": 0.526, "p4de.24xlarge": 40.9657},
        scores={"g5.xlarge": 7, "p4d.24xlarge": 2},
        run_errors={
            ("g5.xlarge", "us-east-1c"): ("InsufficientInstanceCapacity", NO_CAPACITY_MESSAGE)
        },
    )


def make(fake: FakeAws, **options) -> AwsProvisioner:
    settings = dict(
        regions=[REGION], instance_types=TYPES, session_factory=fake.session_factory,
        poll_interval_s=0.01, ami_ssm_parameter=AMI_PARAMETER,
    )  # fmt: skip
    return AwsProvisioner(**(settings | options))


def request(zone: str = "us-east-1b", **changes) -> LaunchRequest:
    fields = dict(
        gang="g1", infra=f"aws/{REGION}/{zone}", instance_type="g5.xlarge", gpu="A10G", count=2,
        timeout_s=5.0,
    )  # fmt: skip
    return LaunchRequest(**(fields | changes))


def moto_instances(fake: FakeAws) -> list[dict]:
    answer = fake.session.client("ec2", region_name=REGION).describe_instances()
    return [i for r in answer["Reservations"] for i in r["Instances"]]


# ---- the shared contract ---------------------------------------------------------------------------


def test_aws_meets_the_contract(fake: FakeAws, caplog: pytest.LogCaptureFixture) -> None:
    harness = Harness(
        provisioner=make(fake),
        launchable=request("us-east-1b"),
        no_capacity=request("us-east-1c", gang="full"),
        preempt=fake.preempt,
        secrets=(ACCESS_KEY_ID, SECRET_ACCESS_KEY),
        event_timeout_s=10.0,
    )
    run_contract(harness, caplog)
    assert "ec2.describe_spot_instance_requests" in fake.calls  # the notice's real source


# ---- offers ----------------------------------------------------------------------------------------


def test_offers_carry_each_field_from_its_source(fake: FakeAws) -> None:
    offers = {(o.zone, o.instance_type): o for o in make(fake).offers()}
    g5 = offers[("us-east-1b", "g5.xlarge")]
    assert (g5.gpu, g5.gpus_per_node, g5.vcpus, g5.memory_gib) == ("A10G", 1, 4.0, 16.0)
    assert g5.spot_usd_per_hour == pytest.approx(0.4512)  # the latest price, not the older one
    assert g5.observed_at_s == PRICE_TIME.timestamp()
    assert g5.on_demand_usd_per_hour == pytest.approx(1.006)
    assert g5.availability_score == pytest.approx(0.7)
    assert g5.available_count is None and g5.preemption_rate_per_hour is None
    assert g5.infra == "aws/us-east-1/us-east-1b"
    p4d = offers[("us-east-1a", "p4d.24xlarge")]
    assert (p4d.gpu, p4d.gpus_per_node, p4d.on_demand_usd_per_hour) == ("A100", 8, None)
    assert p4d.availability_score == pytest.approx(0.2)
    p4de = [o for o in offers.values() if o.instance_type == "p4de.24xlarge"]
    assert p4de and all(o.gpu == "A100-80GB" and o.spot_usd_per_hour is None for o in p4de)
    assert all(o.on_demand_usd_per_hour == pytest.approx(40.9657) for o in p4de)


def test_offers_filter_by_gpu_and_region(fake: FakeAws) -> None:
    provisioner = make(fake)
    only = provisioner.offers(gpus=["A100-80GB"])
    assert only and {o.instance_type for o in only} == {"p4de.24xlarge"}
    assert provisioner.offers(regions=["eu-west-1"]) == []


def test_offers_find_every_gpu_type_when_none_configured(fake: FakeAws) -> None:
    fake.spot_usd_per_hour |= {
        ("us-east-1a", "p5.48xlarge"): 31.4,
        ("us-east-1a", "g6.xlarge"): 0.3,
    }
    provisioner = make(fake, instance_types=None, placement_scores=False, on_demand_prices=False)
    offers = provisioner.offers()
    assert {"H100", "L4", "A10G", "T4"} <= {o.gpu for o in offers}
    assert all(o.gpus_per_node >= 1 for o in offers)
    assert (
        "ec2.get_spot_placement_scores" not in fake.calls
        and "pricing.get_products" not in fake.calls
    )


@pytest.mark.parametrize(
    "method, code",
    [
        ("get_spot_placement_scores", "UnauthorizedOperation"),
        ("get_products", "AccessDeniedException"),
    ],
)
def test_refused_optional_sources_leave_fields_unknown_and_log_once(
    fake: FakeAws, caplog: pytest.LogCaptureFixture, method: str, code: str
) -> None:
    fake.refuse[method] = (code, f"User is not authorized to perform: {method}")
    with caplog.at_level(logging.WARNING):
        offers = make(fake).offers()
    assert offers and all(o.spot_usd_per_hour or o.on_demand_usd_per_hour for o in offers)
    if method == "get_products":
        assert all(o.on_demand_usd_per_hour is None for o in offers)
    else:
        assert all(o.availability_score is None for o in offers)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


# ---- launch ----------------------------------------------------------------------------------------


def test_launch_asks_for_a_tagged_spot_gang_in_the_zone(fake: FakeAws) -> None:
    provisioner = make(fake)
    nodes = provisioner.launch(request(labels=(("team", "ml"),)))
    ssm = fake.session.client("ssm", region_name=REGION)
    ami = ssm.get_parameter(Name=AMI_PARAMETER)["Parameter"]["Value"]
    instances = moto_instances(fake)
    assert len(instances) == 2
    for instance in instances:
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags["geo-orchestrator:gang"] == "g1" and tags["team"] == "ml"
        assert instance["InstanceLifecycle"] == "spot" and instance["ImageId"] == ami
        assert instance["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert all(
        n.gpus == 1 and n.address and n.spot and n.labels == (("team", "ml"),) for n in nodes
    )


def test_each_node_boots_its_own_script_as_user_data(fake: FakeAws) -> None:
    scripts = ("#!/bin/bash\necho node zero\n", "#!/bin/bash\necho node one\n")
    nodes = make(fake).launch(request(boot_scripts=scripts))
    ec2 = fake.session.client("ec2", region_name=REGION)
    booted = []
    for node in nodes:  # node i ran script i
        answer = ec2.describe_instance_attribute(InstanceId=node.node_id, Attribute="userData")
        booted.append(base64.b64decode(answer["UserData"]["Value"]).decode())
    assert tuple(booted) == scripts
    assert "echo node" not in repr(request(boot_scripts=scripts))  # a script holds a secret


def test_nodes_go_behind_the_jobs_security_group_which_admits_only_the_overlay(
    fake: FakeAws,
) -> None:
    from provisioners.base import Firewall

    provisioner = make(fake)
    admit = Firewall(job="j1", port=51820, sources=("192.0.2.1", "198.51.100.7"))
    nodes = provisioner.launch(request(firewall=admit))
    ec2 = fake.session.client("ec2", region_name=REGION)

    def group() -> dict:
        (found,) = ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": ["geo-j1"]}]
        )["SecurityGroups"]
        return found

    def admitted() -> set:
        return {
            (p["IpProtocol"], p["FromPort"], p["ToPort"], r["CidrIp"])
            for p in group()["IpPermissions"]
            for r in p["IpRanges"]
        }

    assert {t["Key"]: t["Value"] for t in group()["Tags"]} == {"geo-job": "j1"}
    for instance in moto_instances(fake):
        assert [g["GroupId"] for g in instance["SecurityGroups"]] == [group()["GroupId"]]
    assert admitted() == {
        ("udp", 51820, 51820, "192.0.2.1/32"),
        ("udp", 51820, 51820, "198.51.100.7/32"),
    }
    # a node joined, another left: the group admits exactly the job's addresses now
    provisioner.open_overlay(Firewall(job="j1", port=51820, sources=("192.0.2.1", "203.0.113.9")))
    assert admitted() == {
        ("udp", 51820, 51820, "192.0.2.1/32"),
        ("udp", 51820, 51820, "203.0.113.9/32"),
    }
    assert len(nodes) == 2


def test_relabel_moves_a_live_nodes_lease_tag(fake: FakeAws) -> None:
    provisioner = make(fake)
    nodes = provisioner.launch(request(labels=(("geo-expires", "100"),)))
    provisioner.relabel([n.node_id for n in nodes], {"geo-expires": "200"})
    for instance in moto_instances(fake):
        assert {t["Key"]: t["Value"] for t in instance["Tags"]}["geo-expires"] == "200"


def test_a_boot_script_too_long_for_user_data_launches_nothing(fake: FakeAws) -> None:
    huge = "#!/bin/bash\n" + "#" * (16 * 1024)
    with pytest.raises(CloudCallError) as caught:
        make(fake).launch(request(boot_scripts=("#!/bin/bash\n", huge)))
    assert "16384" in str(caught.value) and "fewer nodes" in str(caught.value)
    assert moto_instances(fake) == []


def test_on_demand_launch_without_zone_lands_in_some_zone(fake: FakeAws) -> None:
    nodes = make(fake).launch(request(zone="", infra=f"aws/{REGION}", spot=False, count=1))
    assert nodes[0].infra.startswith(f"aws/{REGION}/{REGION}") and not nodes[0].spot
    assert "InstanceLifecycle" not in moto_instances(fake)[0]


@pytest.mark.parametrize(
    "code, expected",
    [
        ("InsufficientInstanceCapacity", CapacityError),
        ("SpotMaxPriceTooLow", CapacityError),
        ("InsufficientCapacity", CapacityError),
        ("VcpuLimitExceeded", QuotaError),
        ("MaxSpotInstanceCountExceeded", QuotaError),
        ("InstanceLimitExceeded", QuotaError),
        ("RequestLimitExceeded", CloudCallError),  # throttling, not quota
        ("UnauthorizedOperation", CloudCallError),
        ("AuthFailure", CredentialsMissing),
        ("InvalidAMIID.Malformed", CloudCallError),
    ],
)
def test_aws_errors_become_typed_errors(fake: FakeAws, code: str, expected: type) -> None:
    fake.run_errors[("g5.xlarge", "us-east-1b")] = (code, f"{code} happened")
    with pytest.raises(expected) as caught:
        make(fake).launch(request())
    error = caught.value
    assert type(error) is expected and error.cloud == "aws" and error.call == "ec2.run_instances"
    assert code in str(error) and "To fix:" in str(error)
    if code == "UnauthorizedOperation":
        assert "ec2:RunInstances" in error.fix
    assert moto_instances(fake) == []


def test_launch_timeout_terminates_the_whole_gang(fake: FakeAws) -> None:
    fake.hold_pending = True
    provisioner = make(fake)
    with pytest.raises(CapacityError, match="did not all reach 'running' within 0.05 s"):
        provisioner.launch(request(timeout_s=0.05))
    fake.hold_pending = False
    assert {i["State"]["Name"] for i in moto_instances(fake)} == {"terminated"}
    assert not [n for n in provisioner.nodes() if n.state != NodeState.TERMINATED]


def test_a_gang_member_that_dies_while_starting_fails_the_gang(fake: FakeAws) -> None:
    fake.kill_one_on_start = True
    with pytest.raises(CapacityError, match="ended before running: .*Insufficient capacity"):
        make(fake).launch(request(count=3))
    assert [i["State"]["Name"] for i in moto_instances(fake)] == ["terminated"] * 3


def test_missing_ami_parameter_says_how_to_choose_an_image(fake: FakeAws) -> None:
    provisioner = make(fake, ami_ssm_parameter="/geo/no-such-ami")
    with pytest.raises(CloudCallError, match="ParameterNotFound") as caught:
        provisioner.launch(request())
    assert "image_id=" in caught.value.fix


# ---- events and terminate --------------------------------------------------------------------------


def test_unexpected_end_of_an_on_demand_node_is_a_failure(fake: FakeAws) -> None:
    provisioner = make(fake)
    node = provisioner.launch(request(spot=False, count=1))[0]
    provisioner.poll_events()  # the NodeReady of the launch
    fake.end_instance(REGION, node.node_id, "Server.InternalError", "Internal error on launch")
    events = provisioner.poll_events(timeout_s=1.0)
    assert [type(e) for e in events] == [NodeLost] and events[0].reason == "failed"
    assert provisioner.nodes()[0].state == NodeState.LOST


def test_preemption_notice_precedes_the_loss(fake: FakeAws) -> None:
    provisioner = make(fake)
    node = provisioner.launch(request(count=1))[0]
    provisioner.poll_events()
    fake.preempt(node.node_id)
    first = provisioner.poll_events(timeout_s=1.0)
    assert [type(e) for e in first] == [PreemptionNotice]
    assert first[0].deadline_s == pytest.approx(first[0].at_s + 120, abs=2)
    assert provisioner.nodes()[0].state == NodeState.LOST  # the next look finds it gone
    lost = provisioner.poll_events()
    assert [(type(e), e.reason) for e in lost] == [(NodeLost, "preempted")]


def test_terminate_is_idempotent_and_ignores_unknown_ids(fake: FakeAws) -> None:
    provisioner = make(fake)
    ids = [n.node_id for n in provisioner.launch(request())]
    provisioner.poll_events()
    provisioner.terminate([*ids, "i-0123456789abcdef0"])
    provisioner.terminate(ids)
    events = provisioner.poll_events()
    assert sorted(e.node_id for e in events if isinstance(e, NodeLost)) == sorted(ids)
    assert {e.reason for e in events} == {"terminated"}
    assert {i["State"]["Name"] for i in moto_instances(fake)} == {"terminated"}


# ---- credentials and secrets -----------------------------------------------------------------------


def test_missing_credentials_name_every_place_boto3_looks(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    _isolate_credential_chain(monkeypatch, tmp_path)
    with pytest.raises(CredentialsMissing) as caught:
        AwsProvisioner(regions=[REGION]).check_credentials()
    text = str(caught.value)
    for place in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "SSO",
                  str(tmp_path / "credentials"), str(tmp_path / "config"), "instance role",
                  "AWS_EC2_METADATA_DISABLED", "aws configure", "aws sso login"):  # fmt: skip
        assert place in text, place


def test_credentials_found_in_the_environment_pass(fake: FakeAws) -> None:
    make(fake).check_credentials()
    AwsProvisioner(regions=[REGION]).check_credentials()  # the default boto3 Session too


def test_secrets_in_aws_messages_are_scrubbed(
    fake: FakeAws, caplog: pytest.LogCaptureFixture
) -> None:
    leak = f"signed with {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY}"
    fake.run_errors[("g5.xlarge", "us-east-1b")] = ("AuthFailure", leak)
    fake.refuse["get_spot_placement_scores"] = ("UnauthorizedOperation", leak)
    provisioner = make(fake)
    with caplog.at_level(logging.DEBUG), pytest.raises(CredentialsMissing) as caught:
        provisioner.offers()
        provisioner.launch(request())
    texts = [str(caught.value), repr(caught.value)] + [r.getMessage() for r in caplog.records]
    assert "AuthFailure" in texts[0]
    assert not [t for t in texts if ACCESS_KEY_ID in t or SECRET_ACCESS_KEY in t]


def test_without_boto3_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(SdkMissing, match=r"geo-orchestrator\[aws\]"):
        AwsProvisioner().check_credentials()


def test_the_registry_builds_the_adapter(fake: FakeAws) -> None:
    provisioner = create("aws", regions=[REGION], session_factory=fake.session_factory)
    assert isinstance(provisioner, AwsProvisioner) and provisioner.cloud == "aws"


# ---- on-node interruption notice (IMDSv2) ----------------------------------------------------------


class _Imds(http.server.BaseHTTPRequestHandler):
    """A tiny instance metadata service: tokens required, one spot action (or none)."""

    action: dict | None = None
    token = "imds-session-token"
    refuse: bool = False  # every GET answers 401, as to a token IMDS did not issue

    def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._reply(200 if self.path == "/latest/api/token" and ttl else 400, self.token)

    def do_GET(self) -> None:  # noqa: N802
        if self.refuse or self.headers.get("X-aws-ec2-metadata-token") != self.token:
            return self._reply(401, "")
        answers = {
            "/latest/meta-data/instance-id": "i-0abc",
            "/latest/meta-data/placement/availability-zone": "us-east-1b",
            "/latest/meta-data/placement/region": "us-east-1",
        }
        if self.action is not None:
            answers["/latest/meta-data/spot/instance-action"] = json.dumps(self.action)
        body = answers.get(self.path)
        self._reply(404 if body is None else 200, body or "")

    def _reply(self, status: int, body: str) -> None:
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def imds() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    _Imds.action, _Imds.refuse = None, False


def test_imds_without_notice_answers_none(imds: str) -> None:
    assert interruption_notice(endpoint=imds, timeout_s=2.0) is None


def test_imds_notice_becomes_a_preemption_notice(imds: str) -> None:
    _Imds.action = {"action": "terminate", "time": "2026-01-15T12:02:00Z"}
    notice = interruption_notice(endpoint=imds, timeout_s=2.0)
    assert notice is not None and notice.node_id == "i-0abc"
    assert notice.infra == "aws/us-east-1/us-east-1b"
    assert notice.deadline_s == PRICE_TIME.timestamp() + 120


def test_no_imds_is_a_clear_error(imds: str) -> None:
    with pytest.raises(CloudCallError, match="run this on an EC2 instance"):
        interruption_notice(endpoint="http://127.0.0.1:9", timeout_s=0.5)


def test_the_watchers_notice_reads_the_same_exchange(imds: str) -> None:
    assert notice(endpoint=imds, timeout_s=2.0) is None  # 404: no notice yet
    _Imds.action = {"action": "terminate", "time": "2026-01-15T12:02:00Z"}
    found = notice(endpoint=imds, timeout_s=2.0)
    assert found is not None and found.text == "EC2 spot terminate"
    assert found.deadline_s == PRICE_TIME.timestamp() + 120
    _Imds.refuse = True  # any answer but 200 is no notice, as the watcher reads it
    assert notice(endpoint=imds, timeout_s=2.0) is None
    with pytest.raises(OSError):  # nothing answers: the watcher logs it and asks again
        notice(endpoint="http://127.0.0.1:9", timeout_s=0.5)


def test_sdk_debug_logs_lose_keys_and_session_tokens(
    fake: FakeAws, caplog: pytest.LogCaptureFixture
) -> None:
    make(fake).offers(gpus=["T4"])  # creating clients puts the filter on botocore's loggers
    dump = (
        "headers={'X-Amz-Security-Token': b'IQoJb3JpZ2luX2VjEFAKESESSIONTOKEN', "
        f"'Authorization': b'AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/20260115/us-east-1/ec2'}}"
    )
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("botocore.endpoint").debug("Sending http request: %s", dump)
    message = caplog.records[-1].getMessage()
    assert "FAKESESSIONTOKEN" not in message and ACCESS_KEY_ID not in message
    assert "X-Amz-Security-Token" in message and "***" in message


# ---- hosting a job's controller ---------------------------------------------------------------------


def test_a_private_job_bucket_and_the_two_identities_are_made_once(fake: FakeAws) -> None:
    provisioner = make(fake)
    url = provisioner.job_bucket(REGION)
    assert url == f"s3://geo-orchestrator-123456789012-{REGION}" == provisioner.job_bucket(REGION)
    s3 = fake.session.client("s3", region_name=REGION)
    blocked = s3.get_public_access_block(Bucket=url[5:])["PublicAccessBlockConfiguration"]
    assert all(blocked.values())
    assert provisioner.job_buckets() == {REGION: url}

    identities = provisioner.identities(url)
    identities_again = provisioner.identities(url)  # the policies rewritten, nothing doubled
    assert identities == identities_again
    iam = fake.session.client("iam", region_name=REGION)
    profile = iam.get_instance_profile(InstanceProfileName=identities.node)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [identities.node]
    policy = iam.get_role_policy(RoleName=identities.node, PolicyName=identities.node)
    resources = {str(s["Resource"]) for s in policy["PolicyDocument"]["Statement"]}
    assert f"arn:aws:s3:::{url[5:]}/jobs/*" in resources  # the bucket's jobs only

    key = "jobs/j/wheel/w.whl"
    s3.put_object(Bucket=url[5:], Key=key, Body=b"wheel")
    plain = make(fake, session_factory=lambda: fake.session)  # boto3's own client: it signs
    presigned = plain.presign(f"{url}/{key}", expires_s=60)
    assert "X-Amz-Signature" in presigned and "X-Amz-Expires=60" in presigned


def test_a_controller_instance_acts_as_its_profile_and_terminates_on_shutdown(fake: FakeAws):
    provisioner = make(fake)
    identities = provisioner.identities(provisioner.job_bucket(REGION))
    provisioner.launch(
        request(
            count=1, spot=False, gpu="", instance_type="g4dn.xlarge", identity=identities.controller
        )
    )
    (instance,) = moto_instances(fake)
    assert instance["IamInstanceProfile"]["Arn"].endswith(f"/{identities.controller}")
    attribute = fake.session.client("ec2", region_name=REGION).describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
    )
    assert attribute["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"


def test_a_vm_found_by_label_is_relabelled_by_an_adapter_that_did_not_launch_it(fake: FakeAws):
    make(fake).launch(request(count=1, labels=(("geo-job", "j"), ("geo-expires", "1"))))
    other = make(fake)
    (vm,) = other.labelled("geo-job")
    other.relabel_labelled([vm], {"geo-expires": "99"})
    (instance,) = moto_instances(fake)
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["geo-expires"] == "99" and tags["geo-job"] == "j"
