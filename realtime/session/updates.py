"""``session.update`` in the session, and the voices and output modalities it accepts.

Each refused field of an update gets its own ``error`` and the rest applies (:mod:`realtime.protocol.session_update`;
an unknown voice is one more refused field, and so is audio output from an engine that has none). What changed
reaches the engine as commands (:class:`~realtime.session.commands.SetInstructions`, ``SetContextPolicy``,
``SetTools``) and the turn detector as :class:`~realtime.session.commands.ConfigureTurnDetection`.
"""

from __future__ import annotations

import dataclasses

from realtime.errors import RealtimeError
from realtime.protocol.client import SessionUpdate, client_event_type
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import KEEP, OutputModality, SessionConfig, SessionPatch
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
        unknown voice is one more refused field, audio output from an engine without it another).
        ``session.updated`` follows unless every field was refused."""
        refused = list(event.refused)
        patch = event.patch
        if patch.voice is not KEEP:
            try:
                patch = dataclasses.replace(patch, voice=self._voice(patch.voice, patch.voice_param))
            except RealtimeError as exc:
                refused.append(exc)
                patch = dataclasses.replace(patch, voice=KEEP)
        if patch.modality is not KEEP:
            try:
                self._check_modality(patch.modality, patch.modality_param)
            except RealtimeError as exc:
                refused.append(exc)
                patch = dataclasses.replace(patch, modality=KEEP)
        for exc in refused:
            self._error(exc, event.event_id, client_event_type(event).value)
        if refused and patch == SessionPatch(voice_param=patch.voice_param, modality_param=patch.modality_param):
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

    def _check_modality(self, modality: OutputModality, param: str) -> None:
        """Refuse audio output (``unsupported_value`` at ``param``) when the engine has none."""
        if modality is OutputModality.AUDIO and not self.settings.audio_output:
            raise RealtimeError(
                'this model has no audio output: it answers in text only (output_modalities ["text"])',
                code=ErrorCode.UNSUPPORTED_VALUE,
                param=param,
            )

    def _voice(self, name: str, param: str) -> str:
        """The name the session reports for voice ``name``: a speaker in the engine's spelling, an alias as the
        client wrote it (matched case-insensitively, :class:`realtime.voices.VoiceTable`)."""
        resolved = self._voices.resolve(name)
        if resolved is None:
            known = self._voices.names() if self.settings.audio_output else "no voice (it answers in text only)"
            raise RealtimeError(
                f"unknown voice {name!r}; this model has: {known}", code=ErrorCode.UNKNOWN_VOICE, param=param
            )
        return resolved[0]

    def _speaker(self, voice: str | None) -> str | None:
        """The engine's speaker for a voice name :meth:`_voice` accepted (None: the engine has no voices)."""
        if voice is None:
            return None
        resolved = self._voices.resolve(voice)
        assert resolved is not None, "only accepted voice names are kept"
        return resolved[1]
