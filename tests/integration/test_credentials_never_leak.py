"""Planted fake credentials, in every SDK's standard place, never show up in what the CLI prints or
saves, whatever each cloud's call does with them. No network: AWS is pointed at a closed local port,
the GCP key file cannot sign, and Azure stops at its missing subscription before any call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAPLANTEDPLANTED12",
    "AWS_SECRET_ACCESS_KEY": "planted-aws-secret-value-0123456789",
    "AWS_SESSION_TOKEN": "planted-aws-session-token-0123456789",
    "AZURE_CLIENT_SECRET": "planted-azure-client-secret-0123456789",
}
GCP_KEY_ID = "plantedgcpkeyid0123456789"


def _env(tmp_path: Path) -> dict[str, str]:
    key_file = tmp_path / "service-account.json"
    key_file.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "planted-project",
                "private_key_id": GCP_KEY_ID,
                "private_key": "-----BEGIN PRIVATE KEY-----\nplanted\n-----END PRIVATE KEY-----\n",
                "client_email": "robot@planted-project.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "http://127.0.0.1:9/token",
            }
        )
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "CLOUDSDK_")) and "PROXY" not in k.upper()
    }
    return (
        env
        | SECRETS
        | {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # a closed port: the call fails at once
            "AWS_MAX_ATTEMPTS": "1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "GOOGLE_APPLICATION_CREDENTIALS": str(key_file),
            "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9",
            "AZURE_TENANT_ID": "11111111-1111-1111-1111-111111111111",
            "AZURE_CLIENT_ID": "22222222-2222-2222-2222-222222222222",
        }
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "args",
    [
        ["catalog", "offers", "--live", "--save", "{tmp}/market.csv"],
        ["catalog", "offers", "--live", "--json"],
        ["catalog", "offers", "--provider", "aws"],
        ["catalog", "offers", "--provider", "gcp", "--json"],
        ["catalog", "offers", "--provider", "azure"],
    ],
)
def test_planted_credentials_never_appear_in_output_or_snapshots(tmp_path, args):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=120,
    )
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip(), "each cloud's failure is explained"
    texts = [result.stdout, result.stderr] + [p.read_text() for p in tmp_path.glob("*.csv")]
    for secret in [*SECRETS.values(), GCP_KEY_ID, "planted\n"]:
        assert not any(secret in text for text in texts), f"{secret!r} leaked: {result.stderr}"
