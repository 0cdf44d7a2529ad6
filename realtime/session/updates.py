"""``session.update`` in the session, and the voices it accepts.

Each refused field of an update gets its own ``error`` and the rest applies (:mod:`realtime.protocol.session_update`;
an unknown voice is one more refused field). What changed reaches the engine as commands
(:class:`~realtime.session.commands.SetInstructions`, ``SetContextPolicy``, ``SetTools``) and the turn detector as
:class:`~realtime.session.commands.ConfigureTurnDetection`.
"""

from __future__ import annotations

import dataclasses

from realtime.errors import RealtimeError
from realtime.protocol.client import SessionUpdate, client_event_type
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import KEEP, SessionConfig, SessionPatch
from realtime.session.commands import SetContextPolicy, SetInstructions
from realtime.tool_calls import SetTools
from realtime.voices import VoiceTable


class SessionUpdates:
    """``session.update`` (mixed into :class:`realtime.session.Session`). Owns the session's configuration
    (``config``) and the voices it accepts (``_voices``); uses the session's ``_emit``, ``_send``, ``_error``,
    ``_events``, ``settings``, ``session_id`` and turn detection (``_turn_detection_changed``)."""

    config: SessionConfig
    _voices: VoiceTable

    def _session_update(self, event: SessionUpdate) -> None:
        """Each refused field gets its own error and the rest applies (:mod:`realtime.protocol.session_update`; an
        unknown voice is one more refused field). ``session.updated`` follows unless every field was refused."""
        refused = list(event.refused)
        patch = event.patch
        if patch.voice is not KEEP:
            try:
                patch = dataclasses.replace(patch, voice=self._voice(patch.voice, patch.voice_param))
            except RealtimeError as exc:
                refused.append(exc)
                patch = dataclasses.replace(patch, voice=KEEP)
        for exc in refused:
            self._error(exc, event.event_id, client_event_type(event).value)
        if refused and patch == SessionPatch(voice_param=patch.voice_param):
            return
        old, new = self.config, self.config.apply(patch)
        self.config = new
        if new.instructions != old.instructions:
            self._emit(SetInstructions(new.instructions))
        if new.truncation != old.truncation:
            self._emit(SetContextPolicy(new.truncation.context_policy()))
        if new.tools != old.tools:
            self._emit(SetTools(new.tools))
        if new.turn_detection != old.turn_detection:
            self._turn_detection_changed(new.turn_detection)
        self._send(self._events.session_updated(new, session_id=self.session_id, model=self.settings.model))

    def _voice(self, name: str, param: str) -> str:
        """The name the session reports for voice ``name``: a speaker in the engine's spelling, an alias as the
        client wrote it (matched case-insensitively, :class:`realtime.voices.VoiceTable`)."""
        resolved = self._voices.resolve(name)
        if resolved is None:
            raise RealtimeError(
                f"unknown voice {name!r}; this model has: {self._voices.names()}",
                code=ErrorCode.UNKNOWN_VOICE,
                param=param,
            )
        return resolved[0]

    def _speaker(self, voice: str) -> str:
        """The engine's speaker for a voice name :meth:`_voice` accepted."""
        resolved = self._voices.resolve(voice)
        assert resolved is not None, "only accepted voice names are kept"
        return resolved[1]
