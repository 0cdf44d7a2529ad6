"""``session.update``: the session's configuration, and the voices and output modalities it accepts.

Each refused field of an update gets its own ``error`` and the rest applies (:mod:`realtime.protocol.session_update`;
an unknown voice is one more refused field, and so is audio output from an engine that has none). What changed
reaches the engine as commands (:class:`~realtime.session.commands.SetInstructions`, ``SetContextPolicy``,
``SetTools``) and turn detection through the ``turn_detection_changed`` callback it was made with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from realtime.errors import RealtimeError
from realtime.protocol.client import SessionUpdate, client_event_type
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import KEEP, OutputModality, SessionConfig, SessionPatch
from realtime.protocol.server import ServerEvents
from realtime.protocol.turn_detection import ServerVadParams
from realtime.session.commands import SetContextPolicy, SetInstructions, SetTools
from realtime.session.emitter import Emitter
from realtime.session.settings import SessionSettings
from realtime.voices import VoiceTable, usable_aliases


class SessionUpdates:
    """Owns the session's configuration (:attr:`config`) and the voices it accepts. ``turn_detection_changed`` is
    called with the new ``turn_detection`` (after :attr:`config` holds it) when an update changes it, before
    ``session.updated`` is sent."""

    def __init__(
        self,
        settings: SessionSettings,
        events: ServerEvents,
        out: Emitter,
        session_id: str,
        turn_detection_changed: Callable[[ServerVadParams | None], None],
    ) -> None:
        self._settings = settings
        self._events = events
        self._out = out
        self._session_id = session_id
        self._turn_detection_changed = turn_detection_changed
        self._voices = VoiceTable(settings.voices, usable_aliases(settings.voice_aliases, settings.voices)[0])
        self._config = SessionConfig(
            instructions=settings.default_instructions,
            voice=settings.default_voice,
            modality=OutputModality.AUDIO if settings.audio_output else OutputModality.TEXT,
        )

    @property
    def config(self) -> SessionConfig:
        return self._config

    def update(self, event: SessionUpdate) -> None:
        """Each refused field gets its own error and the rest applies. ``session.updated`` follows unless every
        field was refused."""
        refused = list(event.refused)
        patch = event.patch
        if patch.voice is not KEEP:
            try:
                patch = dataclasses.replace(patch, voice=self.voice(patch.voice, patch.voice_param))
            except RealtimeError as exc:
                refused.append(exc)
                patch = dataclasses.replace(patch, voice=KEEP)
        if patch.modality is not KEEP:
            try:
                self.check_modality(patch.modality, patch.modality_param)
            except RealtimeError as exc:
                refused.append(exc)
                patch = dataclasses.replace(patch, modality=KEEP)
        for problem in refused:
            self._out.error(problem, event.event_id, client_event_type(event).value)
        if refused and patch == SessionPatch(voice_param=patch.voice_param, modality_param=patch.modality_param):
            return
        old, new = self._config, self._config.apply(patch)
        self._config = new
        if new.instructions != old.instructions:
            self._out.emit(SetInstructions(new.instructions))
        if new.truncation != old.truncation:
            self._out.emit(SetContextPolicy(new.truncation.context_policy()))
        if new.tools != old.tools:
            self._out.emit(SetTools(new.tools))
        if new.turn_detection != old.turn_detection:
            self._turn_detection_changed(new.turn_detection)
        self._out.send(self._events.session_updated(new, session_id=self._session_id, model=self._settings.model))

    def check_modality(self, modality: OutputModality, param: str) -> None:
        """Refuse audio output (``unsupported_value`` at ``param``) when the engine has none."""
        if modality is OutputModality.AUDIO and not self._settings.audio_output:
            raise RealtimeError(
                'this model has no audio output: it answers in text only (output_modalities ["text"])',
                code=ErrorCode.UNSUPPORTED_VALUE,
                param=param,
            )

    def voice(self, name: str, param: str) -> str:
        """The name the session reports for voice ``name``: a speaker in the engine's spelling, an alias as the
        client wrote it (matched case-insensitively, :class:`realtime.voices.VoiceTable`); ``unknown_voice`` at
        ``param`` if there is no such voice."""
        resolved = self._voices.resolve(name)
        if resolved is None:
            known = self._voices.names() if self._settings.audio_output else "no voice (it answers in text only)"
            raise RealtimeError(
                f"unknown voice {name!r}; this model has: {known}", code=ErrorCode.UNKNOWN_VOICE, param=param
            )
        return resolved[0]

    def speaker(self, voice: str | None) -> str | None:
        """The engine's speaker for a voice name :meth:`voice` accepted (None: the engine has no voices)."""
        if voice is None:
            return None
        resolved = self._voices.resolve(voice)
        assert resolved is not None, "only accepted voice names are kept"
        return resolved[1]
