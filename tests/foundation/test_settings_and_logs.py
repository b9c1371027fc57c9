"""Settings validation, log redaction, and where log lines go."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
from pydantic import ValidationError

from app.observability.logging import JsonFormatter, configure_logging, redact, request_id_var
from app.settings import EngineKind, Settings, decode_webhook_secret


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LETHE_HOST", "LETHE_PORT", "LETHE_ENGINE", "LETHE_DATABASE_URL", "LETHE_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings(_env_file=None)
    assert (settings.host, settings.port, settings.engine) == ("127.0.0.1", 8000, EngineKind.HF)
    assert settings.database_url is None
    assert str(settings.data_dir) == ".lethe"
    assert settings.resolved_model_cache_dir == settings.data_dir / "models"


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LETHE_PORT", "9123")
    monkeypatch.setenv("LETHE_ENGINE", "vllm-remote")
    settings = Settings(_env_file=None)
    assert settings.port == 9123 and settings.engine is EngineKind.VLLM_REMOTE


@pytest.mark.parametrize("bad", ["secret", "whsec_***notbase64***", "whsec_AAAA"])
def test_webhook_secret_must_be_standard_webhooks_form(bad: str) -> None:
    with pytest.raises(ValidationError):
        Settings(_env_file=None, bootstrap_webhook_secret=bad)  # type: ignore[call-arg, arg-type]


def test_webhook_secret_decodes() -> None:
    assert len(decode_webhook_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")) == 24


def test_secrets_are_masked_in_settings_repr() -> None:
    settings = Settings(_env_file=None, bootstrap_api_key="k-very-secret", database_url="postgresql://u:pw@h/db")  # type: ignore[call-arg, arg-type]
    assert "k-very-secret" not in repr(settings) and "pw@" not in repr(settings)


def test_redact_masks_credentials() -> None:
    line = "auth Bearer lethe_abcdefghijklmnopqrstuvwxyz sig whsec_MfKQ9r8GKYqr= url postgresql://u:hunter2@db/x"
    out = redact(line)
    assert "abcdefghijklmnop" not in out and "MfKQ9r8" not in out and "hunter2" not in out


def test_json_log_lines_carry_the_request_id() -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.route = "/v1/x"
    token = request_id_var.set("req_123")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id_var.reset(token)
    assert line["msg"] == "hello world" and line["request_id"] == "req_123" and line["route"] == "/v1/x"


def test_log_lines_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logging configured while stderr was a stream that was closed since (a CLI runner's) still writes, to the
    stderr of now: a server thread that outlives the runner never hits a closed file."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # restored afterwards, with the level
    monkeypatch.setattr(root, "level", root.level)
    runner, now = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", runner)
    configure_logging("INFO", json_lines=False)
    runner.close()
    monkeypatch.setattr(sys, "stderr", now)
    monkeypatch.setattr(logging, "raiseExceptions", True)
    logging.getLogger("lethe.test").info("still heard")
    written = now.getvalue()
    assert "Logging error" not in written and written.strip().endswith("still heard"), written
