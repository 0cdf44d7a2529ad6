"""Input transcription of one session: the audio each commit kept, the session's transcriber
(:mod:`~realtime.runner.transcription_jobs`) and its results fed back to the session."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.api import EngineHandle
from pipeline.response_events import Usage
from realtime.runner.contracts import Dispatch, Spawn
from realtime.runner.transcription_jobs import (
    Transcriber,
    TranscriptionJob,
    TranscriptionReport,
    TranscriptionUnavailable,
)
from realtime.session import Session, Transcribe


class TranscriptionDriver:
    """The transcription side of a session: the command executor hands it each commit's kept audio (:meth:`kept`),
    then the commit's :class:`~realtime.session.Transcribe` (:meth:`transcribe`), in command order. Its transcriber
    is made by the first job and runs as a task spawned through ``spawn`` (the runner owns it and cancels it when the
    session ends: the running side reply is cancelled, its conversation closed). A job starts only while
    ``may_start()`` holds; call :meth:`wake` whenever what it reads may have changed. Results go to the session, and
    the actions they cause to ``dispatch``."""

    def __init__(
        self,
        engine: EngineHandle,
        session: Session,
        *,
        may_start: Callable[[], bool],
        spawn: Spawn,
        dispatch: Dispatch,
    ) -> None:
        self._engine = engine
        self._session = session
        self._may_start = may_start
        self._spawn = spawn
        self._dispatch = dispatch
        self._committed: tuple[str, list[np.ndarray] | None] | None = None
        self._transcriber: Transcriber | None = None

    @property
    def transcriber(self) -> Transcriber | None:
        """The session's transcriber; ``None`` until the first job."""
        return self._transcriber

    @property
    def committed_audio(self) -> tuple[str, list[np.ndarray] | None] | None:
        """The last commit's item id and kept 16 kHz audio (``None``: not kept), until its Transcribe takes it."""
        return self._committed

    def kept(self, item_id: str, pcm: list[np.ndarray] | None) -> None:
        """The audio the commit of ``item_id`` kept (``None``: transcription was off when the message began)."""
        self._committed = (item_id, pcm)

    def transcribe(self, command: Transcribe) -> None:
        """Queue the transcription of the message just committed (its Transcribe follows its commit, before any other
        commit). A message whose audio was not kept fails at once (``...input_audio_transcription.failed``)."""
        committed, self._committed = self._committed, None
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
            report = TranscriptionReport(self._delta, self._completed, self._failed)
            self._transcriber = Transcriber(self._engine, report, self._may_start)
            self._spawn(self._transcriber.run(), "transcriber")
        self._transcriber.submit(job)

    def drop(self, item_id: str) -> None:
        """Forget the waiting job of ``item_id`` (its item is being deleted); a running one finishes."""
        if self._transcriber is not None:
            self._transcriber.drop(item_id)

    def wake(self) -> None:
        """What ``may_start`` reads may have changed: a waiting job may start."""
        if self._transcriber is not None:
            self._transcriber.wake()

    def _delta(self, job: TranscriptionJob, text: str) -> None:
        self._dispatch(self._session.transcription_delta(job.item_id, job.content_index, text))

    def _completed(self, job: TranscriptionJob, transcript: str, usage: Usage) -> None:
        self._dispatch(self._session.transcription_completed(job.item_id, job.content_index, transcript, usage))

    def _failed(self, job: TranscriptionJob, exc: Exception) -> None:
        self._dispatch(self._session.transcription_failed(job.item_id, job.content_index, exc))
