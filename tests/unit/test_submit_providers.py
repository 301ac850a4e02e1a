"""``submit`` on a provider other than the local cloud: a missing credential is named first (what
the SDK's chain looked for, how to fix it), with exit code 2 and no traceback; with credentials,
the provider is refused in this version with a fix (``--emulate`` runs it on its emulation).
Nothing starts, nothing is written. The emulated world's parts that need no VM: the price book
the emulated API reports, the market the chaos schedule acts through."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
LOCATIONS = (
    "    - local/sim-us/sim-us-a\n    - local/sim-us/sim-us-b\n    - local/sim-eu/sim-eu-a\n"
)


def _aws_recipe(folder: Path) -> Path:
    text = QUICKSTART.read_text().split("local_cloud:")[0]
    text = text.replace("provider: local", "provider: aws").replace(
        LOCATIONS, "    - aws/us-east-1\n"
    )
    path = folder / "aws.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    pytest.importorskip("boto3")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_provider_without_credentials_is_named_with_a_fix(tmp_path, capsys, no_aws_credentials):
    code = main(["submit", str(_aws_recipe(tmp_path)), "--jobs-dir", str(tmp_path / "jobs")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "provider: aws" in err and "no AWS credentials" in err and "To fix" in err
    assert not (tmp_path / "jobs").exists()


def test_a_cloud_that_does_not_answer_gives_one_line_and_launches_nothing(
    tmp_path, capsys, monkeypatch
):
    """With credentials, submit asks AWS for the job's bucket first: an endpoint that refuses
    (here a closed local port) is one line naming the cloud and the call."""
    import socket

    pytest.importorskip("boto3")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret-but-well-formed-0000000")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    code = main(["submit", str(_aws_recipe(tmp_path)), "--jobs-dir", str(tmp_path / "jobs")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "aws: sts.get_caller_identity" in err and "nothing of the job runs" in err
    assert "not-a-real-secret" not in err


def test_a_real_cloud_takes_no_chaos_orders(tmp_path, capsys):
    code = main(
        ["submit", str(_aws_recipe(tmp_path)), "--preempt-at", "5"]
        + ["--jobs-dir", str(tmp_path / "jobs")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--emulate" in err and "Traceback" not in err


def test_emulate_is_for_cloud_providers_and_says_so(tmp_path, capsys):
    code = main(["submit", str(QUICKSTART), "--emulate", "--jobs-dir", str(tmp_path / "jobs")])
    err = capsys.readouterr().err
    assert code == 2 and "--emulate" in err and "provider: aws" in err and "Traceback" not in err
    assert not (tmp_path / "jobs").exists()


def test_the_emulated_api_reports_the_catalogs_spot_prices():
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.cloud import spot_price_book

    catalog = default_catalog()
    book = spot_price_book(catalog, "aws", ("us-east-1", "eu-west-1"))
    assert {region for region, _ in book} == {"us-east-1", "eu-west-1"}
    listed = [
        o
        for o in catalog.offers.offers
        if o.location.cloud == "aws" and o.location.region == "us-east-1"
        and o.instance_type == "g4dn.xlarge"
    ]  # fmt: skip
    assert book[("us-east-1", "g4dn.xlarge")] == min(o.spot_usd_per_hour for o in listed)
    assert spot_price_book(catalog, "aws", ()) == {}


def test_the_chaos_schedule_takes_nodes_through_the_emulated_market():
    from types import SimpleNamespace

    from orchestrator.driver.chaos import ChaosSchedule
    from orchestrator.driver.cloud import EmulatorMarket

    calls = []

    class Emulator:
        def interrupt(self, node_id, *, notice_s):
            calls.append(("interrupt", node_id, notice_s))

        def lose(self, node_id):
            calls.append(("lose", node_id))

        def interrupt_zone(self, zone, *, notice_s):
            calls.append(("zone", zone, notice_s))
            return []

    node = SimpleNamespace(node_id="i-0abc", infra="aws/us-east-1/us-east-1a")
    provisioner = SimpleNamespace(nodes=lambda: [node])
    market = EmulatorMarket(Emulator(), notice_s=7.0)
    chaos = ChaosSchedule(provisioner, market=market, nodes={2}, losses={3}, locations={4})
    for step in (1, 2, 3, 4):
        chaos.after(SimpleNamespace(step=step, nodes=("i-0abc",)))
    assert calls == [
        ("interrupt", "i-0abc", 7.0),
        ("lose", "i-0abc"),
        ("zone", "us-east-1a", 7.0),
    ]


def test_jobs_live_in_one_home_per_user_whatever_the_folder(monkeypatch, tmp_path):
    from orchestrator.driver.job import jobs_home

    monkeypatch.delenv("GEO_ORCHESTRATOR_HOME", raising=False)
    monkeypatch.delenv("ORCHESTRATOR_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.chdir(tmp_path)
    assert jobs_home() == tmp_path / "me" / ".orchestrator" / "jobs"
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "short"))
    assert jobs_home() == tmp_path / "short" / "jobs"
    monkeypatch.setenv("GEO_ORCHESTRATOR_HOME", str(tmp_path / "shared"))
    assert jobs_home() == tmp_path / "shared" / "jobs"  # the package's own name first


def test_the_program_ends_on_ctrl_c_and_sigterm_with_one_line_and_its_cleanups(monkeypatch, capsys):
    import os
    import signal

    import orchestrator.cli as cli

    cleaned = []

    def interrupted():
        try:
            raise KeyboardInterrupt
        finally:
            cleaned.append("ctrl-c")

    monkeypatch.setattr(cli, "main", interrupted)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert cli.run() == 130
        assert capsys.readouterr().err.strip() == "interrupted"

        def terminated():
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
                return 0
            finally:
                cleaned.append("sigterm")

        monkeypatch.setattr(cli, "main", terminated)
        # taken as Ctrl-C is (a followed job stops cleanly first: driver/local.py), its own code
        assert cli.run() == 128 + signal.SIGTERM
        assert capsys.readouterr().err.strip() == "interrupted"
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cleaned == ["ctrl-c", "sigterm"]  # the finally blocks ran both times
