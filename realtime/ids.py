"""Identifiers of protocol objects: ``event_…``, ``item_…``, ``resp_…``, ``sess_…``, ``conv_…``.

The session layer asks an :class:`IdGenerator` for every id it mints, so production uses random
ids (:class:`RandomIds`, shaped like the OpenAI API's: a prefix and 21 base-62 characters) and tests
use predictable ones (:class:`SequentialIds`).
"""

from __future__ import annotations

import enum
import secrets
import string
from collections import Counter
from typing import Protocol

MAX_CLIENT_ID_LENGTH = 32
"""Longest id a client may choose for an item it creates (the OpenAI API's limit)."""

_ALPHABET = string.ascii_letters + string.digits
_TOKEN_LENGTH = 21


class IdKind(enum.Enum):
    """What an id names; the value is its prefix."""

    EVENT = "event"
    ITEM = "item"
    RESPONSE = "resp"
    SESSION = "sess"
    CONVERSATION = "conv"
    CALL = "call"


class IdGenerator(Protocol):
    def new(self, kind: IdKind) -> str:
        """A fresh id for ``kind``, never returned before by this generator."""
        ...


class RandomIds:
    """Unpredictable ids (``secrets``): ``item_`` + 21 base-62 characters = 26 characters."""

    def new(self, kind: IdKind) -> str:
        token = "".join(secrets.choice(_ALPHABET) for _ in range(_TOKEN_LENGTH))
        return f"{kind.value}_{token}"


class SequentialIds:
    """Deterministic ids for tests: ``item_1``, ``item_2``, ``event_1``… (one counter per kind)."""

    def __init__(self) -> None:
        self._counts: Counter[IdKind] = Counter()

    def new(self, kind: IdKind) -> str:
        self._counts[kind] += 1
        return f"{kind.value}_{self._counts[kind]}"
