"""What comes in from the client: its messages turned into the session's actions, and when its audio arrived."""

from __future__ import annotations

import time

from pipeline.api import EngineHandle
from pipeline.errors import PipelineError
from realtime.errors import RealtimeError
from realtime.media.images import decode_item
from realtime.protocol.client import InputAudioAppend, ItemCreate, parse_client_event
from realtime.session import Action, Session


async def receive(session: Session, engine: EngineHandle, message: str | bytes | InputAudioAppend) -> list[Action]:
    """The session's actions for one client message. A message with pictures has them decoded first, in a worker
    thread (the caller waits, so the client's events keep their order); a picture that cannot be taken refuses the
    whole message with an ``error`` event and changes nothing."""
    if isinstance(message, InputAudioAppend):
        return session.handle(message)
    try:
        event = parse_client_event(message)
    except RealtimeError as exc:
        return session.refuse(exc)
    if isinstance(event, ItemCreate) and event.item.images:
        try:
            event = await decode_item(event, engine.vision, session.settings.image_limits)
        except (RealtimeError, PipelineError) as exc:
            return session.refuse(exc, event)
    return session.handle(event)


class ArrivalClock:
    """When the session's input audio reached the server: the reader notes the session's audio clock after each
    client message (:meth:`advanced`); :meth:`heard_at` reckons back from the latest advance (audio arrives in real
    time). Times are ``time.monotonic`` seconds; the audio clock is in ms."""

    def __init__(self) -> None:
        self._heard = (time.monotonic(), 0.0)  # when the audio clock last advanced, and to where (ms)

    def advanced(self, clock_ms: float) -> None:
        """The session's audio clock reads ``clock_ms`` now."""
        if clock_ms != self._heard[1]:
            self._heard = (time.monotonic(), clock_ms)

    def heard_at(self, clock_ms: float) -> float:
        """When audio at ``clock_ms`` of the session's audio clock reached the server."""
        at, latest_ms = self._heard
        return at - (latest_ms - clock_ms) / 1000.0
