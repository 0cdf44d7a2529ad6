"""Input audio transcription: the loaded model's thinker writes down each committed user message, in a side request.

How a transcript is made (:func:`transcribe`): a *side conversation* is opened on the engine with the model family's
transcription instructions (:class:`pipeline.api.TranscriptionPrompt`), the message's 16 kHz audio is added as a user
message, then the family's request to write down exactly what was said (with the client's ``language`` and
``prompt`` as hints), and a text-only reply is asked for, capped at :func:`max_transcript_tokens` (proportional to the
audio's duration). Its text deltas are the transcription deltas; its usage is the transcription's usage. The side
conversation is closed when the job ends, however it ends. No second checkpoint is loaded; the audio is encoded and
prefilled a second time, in the side conversation.

When a job runs (:class:`Transcriber`, one per session): jobs run one at a time, in commit order, and a job starts
only while the session's ``may_start()`` says so: the runner's rule is that no reply is waiting for its first output
(audio, or text for a text-only reply), and no reply is about to start. So a transcription never competes with a
reply's first audio: it starts right after that audio, or at once when no reply is pending (``create_response:
false``, a manual commit without ``response.create``). A job that has started runs to its end even if a reply starts
meanwhile (it is short: its length is capped by the audio's duration). At most :data:`MAX_WAITING_JOBS` jobs wait;
a job beyond that fails at once (``...input_audio_transcription.failed``, code ``transcription_backlog``).

Cancellation: :meth:`Transcriber.drop` forgets a waiting job (its item was deleted); cancelling the transcriber's
task (the session ends, e.g. the client disconnected) cancels the running side reply and closes its conversation.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.api import INPUT_SAMPLE_RATE, EngineHandle
from pipeline.errors import EngineFailure, PipelineError
from pipeline.response_events import ResponseDone, ResponseStatus, TextDelta, Usage
from realtime.errors import LimitExceeded, RealtimeError
from realtime.protocol.codes import ErrorCode

logger = logging.getLogger(__name__)

MAX_WAITING_JOBS = 4
"""Transcription jobs of one session that may wait for their turn; one more fails at once."""

BASE_TOKENS = 16
"""Text tokens a transcript may have beyond :data:`TOKENS_PER_SECOND` per second of audio."""
TOKENS_PER_SECOND = 10
"""Text tokens a transcript may have per second of audio (fast speech is 3 to 5 words a second)."""

SIDE_AUDIO_ITEM = "transcribe_audio"
SIDE_REQUEST_ITEM = "transcribe_request"
SIDE_REPLY_ITEM = "transcribe_reply"
"""Item ids in a side conversation (one per job)."""

CANCEL_REASON = "transcription_cancelled"
"""Cancel reason given to the engine for a side reply whose session ended."""


class TranscriptionBacklog(LimitExceeded):
    """Too many transcription jobs of one session wait for their turn."""

    code = ErrorCode.TRANSCRIPTION_BACKLOG


class TranscriptionUnavailable(RealtimeError):
    """The message's audio was not kept for a transcription: transcription was turned on while it was spoken."""

    code = ErrorCode.TRANSCRIPTION_UNAVAILABLE


@dataclass(frozen=True, eq=False)
class TranscriptionJob:
    """The committed user message ``item_id`` (content part ``content_index``): float32 16 kHz mono ``pcm``."""

    item_id: str
    content_index: int
    pcm: np.ndarray
    language: str | None = None
    prompt: str | None = None


class TranscriptionReport:
    """Where a job's results go (the runner feeds them to the session): ``delta(job, text)`` as the text comes,
    then exactly one of ``completed(job, transcript, usage)`` or ``failed(job, exc)``; nothing for a job that was
    cancelled or dropped."""

    def __init__(
        self,
        delta: Callable[[TranscriptionJob, str], None],
        completed: Callable[[TranscriptionJob, str, Usage], None],
        failed: Callable[[TranscriptionJob, Exception], None],
    ) -> None:
        self.delta, self.completed, self.failed = delta, completed, failed


def max_transcript_tokens(samples: int, engine_cap: int) -> int:
    """The reply cap of a transcription of ``samples`` samples of 16 kHz audio, within the engine's cap."""
    seconds = samples / INPUT_SAMPLE_RATE
    return min(engine_cap, BASE_TOKENS + math.ceil(TOKENS_PER_SECOND * seconds))


async def transcribe(engine: EngineHandle, job: TranscriptionJob, on_delta: Callable[[str], None]) -> tuple[str, Usage]:
    """The transcript of ``job``'s audio and the side reply's usage (see the module docstring); ``on_delta`` gets
    each piece of text as it comes. Raises the engine's error, or :class:`EngineFailure` for a side reply that
    failed or was cancelled by the engine. Cancelling the caller cancels the side reply; the side conversation is
    closed in every case."""
    prompt = engine.transcription_prompt
    conversation = engine.conversation(instructions=prompt.instructions)
    try:
        await conversation.add_audio(SIDE_AUDIO_ITEM, job.pcm)
        request = prompt.render_request(language=job.language, prompt=job.prompt)
        await conversation.add_text(SIDE_REQUEST_ITEM, request, "user")
        handle = conversation.respond(
            item_id=SIDE_REPLY_ITEM,
            modalities=frozenset({"text"}),
            max_output_tokens=max_transcript_tokens(len(job.pcm), engine.max_output_tokens),
        )
        pieces: list[str] = []
        done: ResponseDone | None = None
        try:
            async for event in handle:
                if isinstance(event, TextDelta) and event.text:
                    pieces.append(event.text)
                    on_delta(event.text)
                elif isinstance(event, ResponseDone):
                    done = event
        finally:
            if done is None:  # cancelled, or the stream broke
                handle.cancel(CANCEL_REASON)
        if done is None:
            raise EngineFailure("the transcription's reply stream ended without ResponseDone")
        if done.status not in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE):
            raise done.error or EngineFailure(f"the transcription's reply ended {done.status.value}")
        return "".join(pieces), done.usage
    finally:
        await _close(conversation)


async def _close(conversation) -> None:
    try:
        await conversation.close()
    except Exception:  # the job's own outcome is what matters; the engine logs its state
        logger.exception("closing a transcription's side conversation failed")


class Transcriber:
    """One session's transcription jobs, run one at a time by :meth:`run` (the session's task), each once
    ``may_start()`` is true. Call :meth:`wake` whenever what ``may_start`` reads may have changed."""

    def __init__(
        self,
        engine: EngineHandle,
        report: TranscriptionReport,
        may_start: Callable[[], bool],
        *,
        max_waiting: int = MAX_WAITING_JOBS,
    ) -> None:
        self._engine = engine
        self._report = report
        self._may_start = may_start
        self._max_waiting = max_waiting
        self._waiting: deque[TranscriptionJob] = deque()
        self._changed = asyncio.Event()
        self.running: TranscriptionJob | None = None
        """The job whose side request is under way (for tests and traces)."""
        self.started: list[str] = []
        """Item ids of the jobs started, in order."""

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, job: TranscriptionJob) -> None:
        """Queue ``job``; when :data:`MAX_WAITING_JOBS` already wait it fails at once (``report.failed``)."""
        if len(self._waiting) >= self._max_waiting:
            self._report.failed(
                job,
                TranscriptionBacklog(
                    f"{len(self._waiting)} transcriptions of this session are already waiting; "
                    f"item {job.item_id!r} is not transcribed"
                ),
            )
            return
        self._waiting.append(job)
        self.wake()

    def drop(self, item_id: str) -> None:
        """Forget the waiting job of ``item_id`` (its item was deleted); a running one finishes."""
        self._waiting = deque(job for job in self._waiting if job.item_id != item_id)

    def wake(self) -> None:
        self._changed.set()

    async def run(self) -> None:
        """Run jobs forever (until cancelled)."""
        while True:
            while not (self._waiting and self._may_start()):
                self._changed.clear()
                await self._changed.wait()
            job = self._waiting.popleft()
            self.running = job
            self.started.append(job.item_id)
            try:
                await self._run(job)
            finally:
                self.running = None

    async def _run(self, job: TranscriptionJob) -> None:
        try:
            transcript, usage = await transcribe(self._engine, job, lambda text: self._report.delta(job, text))
        except Exception as exc:  # reported to the client as ...input_audio_transcription.failed
            if not isinstance(exc, (PipelineError, RealtimeError)):
                logger.exception("transcription of item %s failed", job.item_id)
            self._report.failed(job, exc)
        else:
            self._report.completed(job, transcript, usage)
