"""Who may open a session: optional API-key authentication and an optional browser-origin
allow-list, checked on WebSocket upgrades and HTTP requests alike.

A key is accepted in two forms: the ``Authorization: Bearer <key>`` header (SDKs, servers) and,
for browsers that cannot set headers on a WebSocket, the subprotocol
``openai-insecure-api-key.<key>`` (never echoed back). Comparison is constant-time.

Refusal happens before the WebSocket is accepted and before any model work: the endpoint answers
the upgrade with HTTP 401 (bad or missing key: ``authentication_error`` / ``invalid_api_key``) or
403 (origin not allowed: ``origin_not_allowed``) and a JSON ``{"error": {...}}`` body; a server
without the ASGI denial-response extension closes the handshake with 1008 instead. Keys are never
logged or put in error messages; :class:`ApiKeyAuth` hides its key from ``repr``.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from realtime.errors import AuthError, ErrorType, RealtimeError

BEARER_SCHEME = "bearer"
"""The ``Authorization`` scheme carrying the key (matched case-insensitively, RFC 7235)."""

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
"""Subprotocol prefix of the browser form of the key."""


class AccessCode(enum.StrEnum):
    """Wire error codes of refused requests not already named in ``realtime.protocol.codes``."""

    ORIGIN_NOT_ALLOWED = "origin_not_allowed"


class OriginError(RealtimeError):
    type = ErrorType.AUTHENTICATION
    code = AccessCode.ORIGIN_NOT_ALLOWED


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, and the HTTP status to refuse it with."""

    status: int
    error: RealtimeError


def presented_key(headers: Mapping[str, str], subprotocols: Sequence[str] = ()) -> str | None:
    """The key a client presented: the Bearer header wins over the subprotocol form; ``None`` if
    it presented neither. ``headers`` is case-insensitive (Starlette's ``Headers``) or lower-case."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() == BEARER_SCHEME and credentials.strip():
            return credentials.strip()
    for protocol in subprotocols:
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX) and len(protocol) > len(KEY_SUBPROTOCOL_PREFIX):
            return protocol[len(KEY_SUBPROTOCOL_PREFIX) :]
    return None


def is_key_subprotocol(protocol: str) -> bool:
    """True for the subprotocol that carries a key (a server must never echo it)."""
    return protocol.startswith(KEY_SUBPROTOCOL_PREFIX)


class ApiKeyAuth:
    """Checks presented keys against the server's key; with no key configured everyone passes."""

    def __init__(self, api_key: str | None) -> None:
        self._key = api_key.encode("utf-8") if api_key is not None else None

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def __repr__(self) -> str:
        return f"ApiKeyAuth(enabled={self.enabled})"

    def check(self, headers: Mapping[str, str], subprotocols: Sequence[str] = ()) -> AuthError | None:
        """``None`` when the request may proceed, else the error to refuse it with."""
        if self._key is None:
            return None
        key = presented_key(headers, subprotocols)
        if key is None:
            return AuthError(
                "missing API key: send 'Authorization: Bearer <key>' or the subprotocol "
                f"'{KEY_SUBPROTOCOL_PREFIX}<key>'"
            )
        # compare_digest takes time independent of where the bytes differ (not of the length).
        if not hmac.compare_digest(key.encode("utf-8"), self._key):
            return AuthError("invalid API key")
        return None


class AccessPolicy:
    """The server's admission rule for sessions: an allowed ``Origin`` (browsers) and the key."""

    def __init__(self, api_key: str | None, allowed_origins: tuple[str, ...] | None = None) -> None:
        self.auth = ApiKeyAuth(api_key)
        self._origins = allowed_origins

    def check(self, headers: Mapping[str, str], subprotocols: Sequence[str] = ()) -> Refusal | None:
        """``None`` when the request may proceed. The origin is checked first: a page from a
        foreign origin learns nothing about the key."""
        origin = headers.get("origin")
        if origin is not None and self._origins is not None and origin not in self._origins:
            return Refusal(403, OriginError(f"origin {origin!r} is not allowed on this server"))
        error = self.auth.check(headers, subprotocols)
        return Refusal(401, error) if error is not None else None
