"""The uvicorn WebSocket protocol that ``ServerConfig.ws_implementation`` names.

``websockets-sansio`` (the default, the implementation uvicorn recommends) is uvicorn's own class with one
change: a connection refused with an HTTP response (401, 403, 503 through the ASGI denial-response extension)
counts as a finished handshake, as a refusal by ``websocket.close`` already does. Without it uvicorn logs
"ASGI callable returned without completing handshake" at ERROR level after every refusal, although the client
got its answer. ``websockets`` is uvicorn's legacy implementation, passed through by name (uvicorn warns that it
is deprecated).

The ``websockets`` library behind both logs the request headers at DEBUG level (under ``uvicorn.error`` with
``websockets-sansio``); ``realtime.server.app`` redacts the API key in every handler's output whatever the logger.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class RefusalAwareSansIOProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol; the last body message of a denial response completes the
    handshake (the response is on the wire and the transport closing), so the app's return logs nothing."""

    async def send(self, message) -> None:  # noqa: ANN001 - uvicorn's ASGISendEvent
        denial_before = self.initial_response is not None and not self.handshake_complete
        await super().send(message)
        finished = message["type"] == "websocket.http.response.body" and not message.get("more_body", False)
        if denial_before and finished:
            self.handshake_complete = True


def ws_protocol(implementation: str) -> type[asyncio.Protocol] | str:
    """What uvicorn's ``ws`` option takes for ``implementation`` (one of ``realtime.config.WS_IMPLEMENTATIONS``)."""
    if implementation == "websockets-sansio":
        return RefusalAwareSansIOProtocol
    return implementation
