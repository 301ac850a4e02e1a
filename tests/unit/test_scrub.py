"""``provisioners.base.scrub``: secrets out of any text an adapter shows; harmless words kept."""

from __future__ import annotations

import pytest

from provisioners.base import CapacityError, scrub


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("client_secret=abc123XYZ more", "abc123XYZ"),
        ("headers {'X-Amz-Security-Token': b'IQoJb3JpZ2luX2VjE'}", "IQoJb3JpZ2luX2VjE"),
        ('{"token": "ya29.a0AfH6SMB"}', "ya29.a0AfH6SMB"),
        ("Authorization: Bearer eyJ0eXAiOiJKV1Qi", "eyJ0eXAiOiJKV1Qi"),
        ("key AKIAABCDEFGHIJKLMNOP used", "ABCDEFGHIJKLMNOP"),
        ("password: hunter2!", "hunter2!"),
    ],
)
def test_secrets_are_replaced(text, secret):
    assert secret not in scrub(text) and "***" in scrub(text)


def test_values_of_secret_environment_variables_are_replaced(monkeypatch):
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "planted-azure-secret-42")
    error = CapacityError(
        "SDK said: planted-azure-secret-42 rejected", cloud="azure", call="x", fix="retry"
    )
    assert "planted-azure-secret-42" not in str(error)


def test_harmless_words_stay():
    text = "InvalidAuthenticationToken: The access token expired; run az login"
    assert scrub(text) == text
