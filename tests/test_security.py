"""No API key in any log line: the filter ``omni-realtime serve`` installs on every log handler,
and the server's whole log at debug level during refused and accepted sessions."""

from __future__ import annotations

import asyncio
import logging

import httpx2
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from realtime.server import REDACTED, SecretFilter
from tests.test_hygiene import ServeProcess, connect, user_text

KEY = "sk-test_0123456789abcdef"
BEARER = {"Authorization": f"Bearer {KEY}"}


# --- no secrets in logs -------------------------------------------------------------------------


def test_the_secret_filter_redacts_messages_arguments_and_tracebacks():
    secret_filter = SecretFilter(KEY)
    record = logging.LogRecord("websockets", logging.DEBUG, __file__, 1, "< %s: %s", ("authorization", f"Bearer {KEY}"),
                               None)
    assert secret_filter.filter(record) and record.getMessage() == f"< authorization: Bearer {REDACTED}"
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError as exc:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, (type(exc), exc, exc.__traceback__))
    secret_filter.filter(failed)
    text = logging.Formatter().format(failed)
    assert KEY not in text and f"bad key {REDACTED}" in text


@pytest.mark.timeout(120)
def test_the_key_never_reaches_the_log_even_at_debug_level(tiny_model_dir, tmp_path):
    """``omni-realtime serve --log-level debug`` logs every request header (the ``websockets``
    library does); refused and accepted sessions, with the key as a Bearer header and as the
    browser's subprotocol, leave no trace of it."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    server = ServeProcess(tiny_model_dir, tmp_path, "--api-key-file", str(key_file), log_level="debug")
    try:
        async def clients() -> None:
            for headers, protocols in (({"Authorization": "Bearer wrong"}, None), ({}, None),
                                       ({}, ["realtime", "openai-insecure-api-key.wrong"])):
                with pytest.raises(InvalidStatus):
                    await websockets.connect(server.ws_url, additional_headers=headers, subprotocols=protocols)
            async with httpx2.AsyncClient(base_url=server.base_url) as http:
                assert (await http.post("/v1/realtime/calls", content="v=0")).status_code == 401
            for headers, protocols in ((BEARER, None), ({}, ["realtime", f"openai-insecure-api-key.{KEY}"])):
                async with connect(server.ws_url, additional_headers=headers, subprotocols=protocols) as client:
                    await client.send(user_text("Hello"))
                    await client.send({"type": "response.create", "response": {
                        "max_output_tokens": 4, "output_modalities": ["text"]}})
                    await client.until("response.done", timeout=60)

        asyncio.run(clients())
    finally:
        log = server.stop()
    assert server.process.returncode == 0, log
    assert "openai-insecure-api-key" in log and "authorization" in log.lower(), "the headers were not logged"
    assert KEY not in log
    assert REDACTED in log
    assert "Traceback" not in log

