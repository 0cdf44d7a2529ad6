"""Input transcription jobs of one session, run by its transcriber (:mod:`realtime.transcription`) on the committed
messages' audio: the :class:`Transcriptions` part of :class:`~realtime.runner.SessionRunner`."""

from __future__ import annotations

import numpy as np

from pipeline.response_events import Usage
from realtime.session import (
    Transcribe,
)
from realtime.transcription import Transcriber, TranscriptionJob, TranscriptionReport, TranscriptionUnavailable


class Transcriptions:
    """Input transcription of :class:`~realtime.runner.SessionRunner`: its transcriber (made by the first job) and
    the audio its last commit kept (``_committed_audio``)."""

    def _transcribe(self, command: Transcribe) -> None:
        """Queue the transcription of the message just committed (its Transcribe follows its CommitAudio, before
        any other commit). Its audio was kept if transcription was on when the message began; else it fails."""
        committed, self._committed_audio = self._committed_audio, None
        if committed is None or committed[0] != command.item_id:
            raise RuntimeError(f"Transcribe {command.item_id} does not follow the commit of its audio")
        kept = committed[1]
        pcm = np.concatenate(kept) if kept else np.zeros(0, np.float32)
        job = TranscriptionJob(command.item_id, command.content_index, pcm, command.language, command.prompt)
        if kept is None:
            unavailable = "input transcription was turned on while this message was being spoken"
            self._failed(job, TranscriptionUnavailable(unavailable))
            return
        if self._transcriber is None:
            report = TranscriptionReport(self._transcription_delta, self._transcription_completed, self._failed)
            self._transcriber = Transcriber(self._engine, report, self._transcription_may_start)
            self._spawn(self._transcriber.run(), "transcriber")
        self._transcriber.submit(job)

    def _transcription_may_start(self) -> bool:
        """No reply waits for its first output, and none is due to start."""
        return not self._awaiting_output and not self.session.reply_pending

    def _transcription_delta(self, job: TranscriptionJob, text: str) -> None:
        self._dispatch(self.session.transcription_delta(job.item_id, job.content_index, text))

    def _transcription_completed(self, job: TranscriptionJob, transcript: str, usage: Usage) -> None:
        self._dispatch(self.session.transcription_completed(job.item_id, job.content_index, transcript, usage))

    def _failed(self, job: TranscriptionJob, exc: Exception) -> None:
        self._dispatch(self.session.transcription_failed(job.item_id, job.content_index, exc))
