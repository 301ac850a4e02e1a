"""``submit`` on a provider other than the local cloud: a missing credential is named first (what
the SDK's chain looked for, how to fix it), with exit code 2 and no traceback; with credentials,
the provider is refused in this version with a fix. Nothing starts, nothing is written."""

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


def test_a_provider_with_credentials_is_refused_in_this_version(tmp_path, capsys, monkeypatch):
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret-but-well-formed-0000000")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code = main(["submit", str(_aws_recipe(tmp_path)), "--jobs-dir", str(tmp_path / "jobs")])
    err = capsys.readouterr().err
    assert code == 2 and "local simulated cloud" in err and "To fix" in err
    assert "not-a-real-secret" not in err
