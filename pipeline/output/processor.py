"""The output side of the engine: accepted tokens and made audio become a response's events.

:class:`OutputProcessor` detokenizes reply text into :class:`~pipeline.response_events.TextDelta` events, sends audio
chunks
(:class:`~pipeline.response_events.AudioChunk`) through the reply's real-time player model and, under load, its start
buffer,
and writes the one :class:`~pipeline.response_events.ResponseDone` with the usage when a response ends. Ordering:
every event
of a response goes to its sink on the engine thread, in the order made; ``ResponseDone`` is last.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from pipeline.core.response_state import ResponseState, TextEnd
from pipeline.observe.observer import EngineObserver
from pipeline.output.function_calls import Verdict
from pipeline.output.start_buffer import StartBuffer
from pipeline.response_events import (
    OUTPUT_SAMPLE_RATE,
    AudioChunk,
    ResponseDone,
    ResponseStatus,
    StageTimings,
    TextDelta,
    Usage,
)

__all__ = ["OutputProcessor"]

log = logging.getLogger("pipeline.core.engine_core")  # one logger for the engine's per-response lines


class OutputProcessor:
    def __init__(
        self,
        observer: EngineObserver,
        *,
        text_stop: set[int],
        start_buffer_ms: int | None,
        holds_start: Callable[[ResponseState], bool],
    ) -> None:
        self.observer = observer
        self.text_stop = text_stop
        self.start_buffer_ms = start_buffer_ms
        self.holds_start = holds_start
        """Whether a reply whose first chunk is made now holds it (the scheduler's rule)."""

    # -- text ---------------------------------------------------------------------------------------
    def accept_text_token(self, r: ResponseState, token: int) -> None:
        """A sampled reply token: a stop token ends the text; any other is detokenized and, unless it is the last the
        reply may have, fed through the thinker at the next step."""
        self.observer.count("thinker_tokens_total")
        r.thinker.pending_token = None
        verdict = Verdict.TEXT
        if token in self.text_stop:
            verdict = Verdict.STOP
        elif r.calls is not None:
            verdict = r.calls.accept(token, len(r.item.reply_ids))
        if verdict is Verdict.STOP:
            self._end_text(r, TextEnd.STOP)
            return
        r.item.reply_ids.append(token)
        if verdict is Verdict.HIDDEN:
            r.thinker.silent = True  # a call began: the talker gets nothing more
        else:
            delta = r.detok.push(token)
            if delta:
                r.spec.sink(TextDelta(text=delta, token_ids=(token,)))
        if len(r.item.reply_ids) >= r.spec.max_text_tokens:
            self._end_text(r, TextEnd.MAX_TOKENS)
        else:
            r.thinker.pending_token = token

    @staticmethod
    def _end_text(r: ResponseState, end: TextEnd) -> None:
        r.thinker.end = end
        if r.calls is not None:
            r.calls.end_of_text()  # raises for a call left open

    # -- audio --------------------------------------------------------------------------------------
    def emit_audio(self, r: ResponseState, pcm: np.ndarray) -> None:
        """A chunk made: sent now, or held with the reply's first chunks (start buffer, decided when its first chunk
        is made) and sent with them once they hold enough."""
        if not len(pcm):
            return
        now = time.perf_counter()
        audio = r.audio
        if audio.first_made_at is None:
            audio.first_made_at = now
            r.mark("token2wav_first_made_ms")
            if self.start_buffer_ms is not None and self.holds_start(r):
                audio.start_buffer = StartBuffer(self.start_buffer_ms)
                self.observer.milestone(r.id, "held", now)
        if audio.start_buffer is None:
            self._send(r, pcm, now)
            return
        for held in audio.start_buffer.add(pcm, 1000.0 * len(pcm) / OUTPUT_SAMPLE_RATE):
            self._send(r, held, now)
        if audio.start_buffer.spent:
            self._end_hold(r, now)

    def _end_hold(self, r: ResponseState, now: float) -> None:
        made_at = r.audio.first_made_at
        assert made_at is not None, "a start buffer is made with the reply's first chunk"
        r.audio.start_buffer = None
        r.audio.held_ms = (now - made_at) * 1000.0
        self.observer.hold_released(r.audio.held_ms)

    def _send(self, r: ResponseState, pcm: np.ndarray, now: float) -> None:
        """The chunk leaves the engine: the reply's player takes it, the sink gets it."""
        r.mark("token2wav_first_chunk_ms")
        audio = r.audio
        waited_ms = audio.playout.deliver(now, len(pcm) / OUTPUT_SAMPLE_RATE)
        self.observer.chunk_sent(
            now, r.id, audio.playout.chunks - 1, 1000.0 * len(pcm) / OUTPUT_SAMPLE_RATE, waited_ms, len(pcm)
        )
        r.spec.sink(AudioChunk(pcm=pcm, start_sample=audio.samples, codec_tokens_so_far=r.codec_tokens))
        audio.samples += len(pcm)
        r.item.audio_ms = 1000.0 * audio.samples / OUTPUT_SAMPLE_RATE

    # -- the end ------------------------------------------------------------------------------------
    def finish(self, r: ResponseState, status: ResponseStatus, reason: str | None, error: Exception | None) -> None:
        """The response's last events: held audio (sent if it completed, dropped otherwise), the text's tail, and
        ``ResponseDone`` with the usage. The caller has already released its engine resources."""
        if r.audio.start_buffer is not None:  # the reply's audio ended before the start buffer filled
            if status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE):
                now = time.perf_counter()
                for held in r.audio.start_buffer.release():
                    self._send(r, held, now)
                self._end_hold(r, now)
            r.audio.start_buffer = None  # cancelled or failed: what was held was never sent, and is not
        tail = r.detok.flush()
        if tail and status is not ResponseStatus.FAILED:
            r.spec.sink(TextDelta(text=tail, token_ids=()))
        usage = Usage(
            input_text_tokens=r.thinker.input_text_tokens,
            input_audio_tokens=r.thinker.input_audio_tokens,
            input_image_tokens=r.thinker.input_image_tokens,
            cached_tokens=r.thinker.cached_tokens,
            output_text_tokens=len(r.item.reply_ids),
            output_audio_tokens=r.codec_tokens,
        )
        playout = r.audio.playout
        late = f" ({', '.join(map(str, playout.late))})" if playout.late else ""
        held = f"first audio held {r.audio.held_ms:.0f} ms, " if r.audio.held_ms is not None else ""
        log.info(
            "response %s %s after %.0f ms: %d text + %d codec tokens, %d samples, %s%d underruns (%.0f ms)%s of a "
            "real-time player; milestones (ms) %s",
            r.id,
            status.value,
            (time.perf_counter() - r.started_at) * 1000,
            len(r.item.reply_ids),
            r.codec_tokens,
            r.audio.samples,
            held,
            playout.underruns,
            playout.starved_ms,
            late,
            {k: round(v, 1) for k, v in r.milestones.items()},
        )
        r.spec.sink(
            ResponseDone(
                status=status,
                usage=usage,
                text=r.detok.text,
                text_token_ids=tuple(r.item.reply_ids),
                audio_codes=tuple(r.talker.codes),
                audio_samples=r.audio.samples,
                reason=reason,
                error=error,
                timings=StageTimings(**r.milestones, started_at_s=r.started_at_s),
            )
        )
        if r.calls is not None:
            r.calls.settle(r.conv, r.item)
