"""The runners of one engine: every model tensor and device call, behind the operations a step plan asks for.

:class:`ModelRunner` owns the thinker and talker runners (pooled KV caches, CUDA graphs, in-graph sampling), the
user-audio encodes, the model family's connectors and the token2wav synthesizer with its worker thread. It runs what
the scheduler decided — a batch of prefill chunks, one batched thinker decode, talker prefills and one batched talker
decode (or a chain of them), one token2wav job — and returns sampled ids without reading them, so that both decoder
stages are queued before the host waits. A batch that raises is retried row by row so that only a faulty response
fails (``fail``). Engine thread only (the token2wav worker has its own thread; see
:mod:`pipeline.runners.token2wav_worker`).

A runner of a checkpoint that does not speak has no talker, token2wav, worker or ``thinker -> talker`` connector
(``speaks`` False): the conversations then keep no talker vectors, and no talker or token2wav work is ever asked of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.conversation_state import ConversationState
from pipeline.core.response_state import ResponseState
from pipeline.runners.sampling import SampleRows
from pipeline.runners.thinker import PrefillSpan, ThinkerOutput
from pipeline.runners.token2wav_worker import Token2WavWorker
from pipeline.scheduler.prefill_batch import PrefillJob

__all__ = ["AudioJob", "ModelRunner", "Sampled"]

log = logging.getLogger("pipeline.core.engine_core")

Sampled = tuple[list[ResponseState], torch.Tensor]
"""Rows of one batched decode step and their sampled ids (a device tensor of the same length, or (steps, rows) for a
talker chain), not read yet."""


@dataclass
class AudioJob:
    """One token2wav job as the runner takes it: the responses whose next chunk it makes, most urgent first;
    ``urgent``: first chunks (it runs on the CUDA stream that outranks decode)."""

    rows: list[ResponseState]
    urgent: bool


class ModelRunner:
    def __init__(
        self,
        *,
        thinker,
        talker,
        token2wav,
        worker: Token2WavWorker | None,
        audio_encodes,
        to_talker,
        overlap: bool,
        fail: Callable[[ResponseState, Exception], None],
    ) -> None:
        self.thinker = thinker
        self.talker = talker
        """The talker runner; None when the checkpoint does not speak."""
        self.token2wav = token2wav
        """The family's streaming synthesizer; None when the checkpoint does not speak."""
        self.worker = worker
        self.audio_encodes = audio_encodes
        """User audio blocks and tails queued by requests, encoded together at the start of each step."""
        self.to_talker = to_talker
        """The ``thinker -> talker`` connector: what a conversation keeps per position for the talker; None when the
        checkpoint does not speak (nothing is kept)."""
        self.overlap = overlap
        """The talker decodes beside the thinker (on CUDA, on a stream of its own)."""
        self.fail = fail
        self.jobs: dict[int, ResponseState] = {}
        """Stream id -> its response, for the chunks the worker is making now."""
        self._job_started: tuple[float, bool, int] | None = None
        """``perf_counter()`` when the worker's job was handed over, whether it holds first chunks, its streams."""
        self._talker_cuda_stream: torch.cuda.Stream | None = None
        self._talker_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    @property
    def speaks(self) -> bool:
        """Whether the engine has a talker and token2wav (the checkpoint makes audio)."""
        return self.talker is not None

    # -- thinker ----------------------------------------------------------------------------------
    def reset_samplers(self, resets: list[tuple[int, list[int]]]) -> None:
        for slot, token_ids in resets:
            self.thinker.sampler.reset(slot, token_ids)

    def run_prefills(
        self, jobs: list[PrefillJob], conversations: Mapping[str, ConversationState]
    ) -> tuple[list[tuple[PrefillJob, ThinkerOutput]], list[tuple[PrefillJob, Exception]]]:
        """Run the step's prefill chunks together and extend each conversation's cache (``conversations``: by id).
        Returns (each chunk that ran with its output, each chunk that failed with its error): if the batch fails, each
        chunk is retried alone, so that only a faulty one fails."""
        if not jobs:
            return [], []
        inputs = [self._embeds(job) for job in jobs]
        spans = [
            PrefillSpan(embeds, job.slot, job.start, job.logits, job.rope, self._deepstack(job, embeds.device))
            for job, (embeds, *_) in zip(jobs, inputs)
        ]
        failed: list[tuple[PrefillJob, Exception]] = []
        try:
            outputs = list(zip(jobs, inputs, self.thinker.prefill_many(spans)))
        except Exception:  # noqa: BLE001 - find the faulty chunk by retrying one by one
            log.exception("batched prefill of %d chunks failed; retrying each alone", len(jobs))
            outputs = []
            for job, pair, span in zip(jobs, inputs, spans):
                try:
                    outputs.append((job, pair, self.thinker.prefill_many([span])[0]))
                except Exception as exc:  # noqa: BLE001 - isolate this conversation's failure
                    failed.append((job, exc))
        ran = []
        for job, (_, token_embeds, multimodal), out in outputs:
            try:
                vectors = self._talker_vectors(out.talker_hidden, token_embeds, multimodal)
                conv = conversations[job.conv_id]
                conv.extend(job.keys, vectors, rope=job.rope, spans=job.spans)
                if job.rope_shift is not None:
                    conv.rope_shift = job.rope_shift
            except Exception as exc:  # noqa: BLE001 - isolate this conversation's failure
                failed.append((job, exc))
                continue
            ran.append((job, out))
        return ran, failed

    def _embeds(self, job: PrefillJob) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(thinker inputs, token embeddings, multimodal) of a chunk: the inputs are the token embeddings with the audio
        and vision encoders' outputs at their placeholder positions, which ``multimodal`` (T,) bool marks (the
        connector decides what the talker takes there)."""
        token_embeds = self.thinker.embed(job.token_ids)
        embeds = token_embeds.clone()
        multimodal = torch.zeros(len(job.token_ids), dtype=torch.bool, device=embeds.device)
        for at, audio, rows in job.audio:  # one copy per audio run, not per position
            embeds[at : at + len(rows)] = audio[rows.start : rows.stop]
            multimodal[at : at + len(rows)] = True
        return embeds, token_embeds, multimodal

    @staticmethod
    def _deepstack(job: PrefillJob, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The chunk's deepstack features as the decoder takes them: per layer, (rows of the chunk (n,), features
        (n, H)), every run of the chunk in order; None when no position of the chunk has any."""
        if not job.deepstack:
            return None
        rows = torch.cat([torch.arange(at, at + len(r), device=device) for at, _, r in job.deepstack])
        layers = len(job.deepstack[0][1])  # every picture's block has the tower's count (ImageEncodes)
        return [
            (rows, torch.cat([features[k][r.start : r.stop] for _, features, r in job.deepstack]))
            for k in range(layers)
        ]

    def _talker_vectors(
        self, hidden: torch.Tensor, embeds: torch.Tensor, multimodal: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The connector's vectors of these positions; None without a talker."""
        return None if self.to_talker is None else self.to_talker(hidden, embeds, multimodal)

    def sample_first(self, rows: list[ResponseState], logits: list[torch.Tensor], *, force: list[bool]) -> list[int]:
        """The first reply token of each response whose prompt was completed this step, sampled in one batch."""
        return self.thinker.sampler.sample(
            torch.stack(logits),
            [r.conv.slot for r in rows],
            force_continue=force,
            seeds=[r.seed for r in rows],
            counters=[len(r.item.reply_ids) for r in rows],
        )

    def thinker_decode(self, rows: list[ResponseState], *, force: Callable[[ResponseState], bool]) -> list[Sampled]:
        """Feed every row's pending token through the thinker in one batch, which samples the next ones on the device;
        each row's cache and talker queue are updated here, its new token is not read yet."""
        sampled = []

        def run(batch: list[ResponseState], done: set[str]) -> None:
            sample_rows = SampleRows.of(
                [r.conv.held_slot() for r in batch],
                force_continue=[force(r) for r in batch],
                seeds=[r.seed for r in batch],
                counters=[len(r.item.reply_ids) for r in batch],
            )
            shifts = [r.conv.rope_shift for r in batch]
            step = self.thinker.decode(
                [r.thinker.pending_token for r in batch],
                [r.conv.held_slot() for r in batch],
                [len(r.conv.cached_keys) for r in batch],
                sample_rows,
                rope_shifts=shifts if any(shifts) else None,
            )
            vectors = self._talker_vectors(step.hidden, step.embeds, None)
            sampled.append((batch, step.tokens.clone()))  # the graph's buffer is overwritten by the next replay
            for i, r in enumerate(batch):
                row = None if vectors is None else vectors[i : i + 1]
                r.conv.extend([r.thinker.pending_token], row, shift=shifts[i])
                if vectors is not None and r.spec.audio and not r.thinker.silent:  # audio: the engine speaks
                    r.talker.queue.append(vectors[i])
                done.add(r.id)

        self._run_batch("thinker", rows, run)
        return sampled

    # -- talker -----------------------------------------------------------------------------------
    def talker_prefill(self, r: ResponseState, *, reuse: int, speaker_bos: int, codec: dict[str, int]) -> torch.Tensor:
        """The talker prompt positions past ``reuse`` (kept across turns), then the speaker's bos and the first reply
        vector, into the conversation's talker slot; returns the last position's logits."""
        conv, end = r.conv, r.thinker.prompt_len
        prompt = conv.talker_prompt()[reuse:end]
        bos = self.thinker.embed([speaker_bos])
        first = r.talker.queue.popleft().view(1, -1)
        vectors = torch.cat([prompt, bos, first]).to(self.talker.device)
        rope = conv.cached_rope.get(reuse, end)
        if rope is not None or r.talker.rope_shift:  # the prompt's own positions, then text at the reply's shift
            head = rope if rope is not None else np.tile(np.arange(reuse, end), (3, 1))
            rope = np.concatenate([head, np.tile(np.arange(end, end + 2) + r.talker.rope_shift, (3, 1))], axis=1)
        return self.talker.prefill(
            vectors, codec_pad=codec["pad"], codec_bos=codec["bos"], slot=conv.talker_slot, start=reuse, rope=rope
        )

    def talker_prompt_prefill(self, conv: ConversationState, start: int, *, slot: int) -> None:
        """Bring the conversation's talker cache (in talker ``slot``) up to its thinker cache from position ``start``
        (listening), at the thinker's rope positions."""
        vectors = conv.talker_prompt()[start:]
        rope = conv.cached_rope.get(start, start + vectors.shape[0])
        self.talker.prefill_prompt(vectors, slot=slot, start=start, rope=rope)

    def talker_decode(
        self,
        rows: list[tuple[ResponseState, torch.Tensor]],
        *,
        steps: int,
        force: Callable[[ResponseState], bool],
        chains: Callable[[], None],
    ) -> list[Sampled]:
        """One codec token for every row, sampled on the device in one batched talker step, or a chain of ``steps``
        steps fed on the device with the codes they sample. Returns the batches and their codes, not read yet."""
        sampled = []
        vectors = {r.id: v for r, v in rows}

        def run(batch: list[ResponseState], done: set[str]) -> None:
            slots = [r.conv.held_talker_slot() for r in batch]
            sample_rows = SampleRows.of(
                slots,
                force_continue=[force(r) for r in batch],
                seeds=[r.seed for r in batch],
                counters=[r.codec_tokens for r in batch],
            )
            inputs = (
                [r.talker.last_code for r in batch],
                torch.stack([vectors[r.id] for r in batch]),
                slots,
                [r.talker.length for r in batch],
                sample_rows,
            )
            shifts = [r.talker.rope_shift for r in batch]
            rope_shifts = shifts if any(shifts) else None
            if steps > 1:
                sampled.append((batch, self.talker.decode_chain(*inputs, steps=steps, rope_shifts=rope_shifts)))
                chains()
            else:
                sampled.append((batch, self.talker.decode(*inputs, rope_shifts=rope_shifts)[1].clone()))
            for r in batch:
                r.talker.length += steps
                done.add(r.id)

        self._run_batch("talker", [r for r, _ in rows], run)
        return sampled

    def beside_thinker(self, talker_work: Callable[[], list[Sampled]]) -> tuple[list[Sampled], Callable[[], None]]:
        """Queue ``talker_work`` on the talker's own CUDA stream after what the engine's stream queued so far; returns
        its result and ``join``, which makes the engine's stream wait for it (call it after queuing the thinker). On the
        CPU the work just runs."""
        side = self._talker_stream
        if side is None:
            return talker_work(), lambda: None
        main = torch.cuda.current_stream(self.talker.device)
        assert self._talker_events is not None, "made with the talker's stream"
        ready, done = self._talker_events
        ready.record(main)
        side.wait_event(ready)  # the vectors and caches of earlier steps
        with torch.cuda.stream(side):
            result = talker_work()
            done.record(side)
        return result, lambda: main.wait_event(done)

    @property
    def _talker_stream(self) -> torch.cuda.Stream | None:
        """The talker's CUDA stream (None on the CPU), made on first use on the engine thread with that thread's
        stream priority (the engine's decode stream outranks token2wav's steady jobs). Its two events are made once:
        events made and dropped every step stalled steps behind token2wav jobs."""
        if self._talker_cuda_stream is None and self.talker.device.type == "cuda":
            priority = torch.cuda.current_stream(self.talker.device).priority
            self._talker_cuda_stream = torch.cuda.Stream(self.talker.device, priority=priority)
            self._talker_events = (torch.cuda.Event(), torch.cuda.Event())
        return self._talker_cuda_stream

    # -- token2wav ----------------------------------------------------------------------------------
    def in_worker(self, r: ResponseState) -> bool:
        """Whether the worker is making a chunk of ``r``'s stream now (then the stream is not touched here)."""
        return self.worker is not None and r.audio.stream is not None and self.worker.busy_with(r.audio.stream)

    def worker_idle(self) -> bool:
        return self.worker is None or self.worker.idle

    def submit_audio(self, job: AudioJob) -> None:
        """Hand ``job`` to the worker (which must be idle)."""
        for r in job.rows:
            r.mark("token2wav_first_job_ms")
            r.audio.playout.job_started(time.perf_counter())
        self.jobs = {id(r.audio.stream): r for r in job.rows}
        if self.worker is None:
            raise RuntimeError("no token2wav worker: the engine synthesizes on its own thread")
        self._job_started = (time.perf_counter(), job.urgent, len(job.rows))
        self.worker.submit([r.audio.stream for r in job.rows], urgent=job.urgent)

    def synthesize(
        self,
        job: AudioJob,
        emit: Callable[[ResponseState, np.ndarray], None],
        record: Callable[[float, bool, int], None],
    ) -> None:
        """Make ``job``'s chunks here (no worker), their DiT windows batched in one pass; ``emit(response, pcm)`` each,
        ``record(started, urgent, streams)`` the job. If the batch fails, each stream is retried alone."""
        started = time.perf_counter()
        for r in job.rows:
            r.mark("token2wav_first_job_ms")
            r.audio.playout.job_started(started)
        try:
            chunks = self.token2wav.step_many([r.audio.stream for r in job.rows])
        except Exception:  # noqa: BLE001 - find the faulty stream by retrying one by one
            log.exception("batched token2wav step failed; retrying each stream alone")
            for r in job.rows:
                self._retry_alone(r, emit)
            return
        record(started, job.urgent, len(job.rows))
        for r, pcm in zip(job.rows, chunks):
            emit(r, pcm)

    def collect_audio(
        self,
        emit: Callable[[ResponseState, np.ndarray], None],
        record: Callable[[float, bool, int], None],
        live: Callable[[ResponseState], bool],
        *,
        wait: bool = False,
    ) -> bool:
        """Emit the chunks the worker finished since the last call (engine thread: a response's events stay in order);
        a chunk of a response that ended meanwhile is dropped and its stream closed. Returns whether any came back."""
        if self.worker is None:
            return False
        results = self.worker.poll(wait=wait)
        for result in results:
            jobs, self.jobs = self.jobs, {}
            if self._job_started is not None:
                record(*self._job_started)
                self._job_started = None
            for i, stream in enumerate(result.streams):
                r = jobs.get(id(stream))
                if r is None or not live(r) or r.audio.stream is not stream:
                    stream.close()  # its response ended while the chunk was being made
                elif result.chunks is not None:  # None exactly when the job failed (``result.error``)
                    emit(r, result.chunks[i])
                else:  # the batch failed: retry alone, so that only a faulty stream fails
                    self._retry_alone(r, emit)
        return bool(results)

    def _retry_alone(self, r: ResponseState, emit: Callable[[ResponseState, np.ndarray], None]) -> None:
        try:
            emit(r, r.audio.live_stream().step())
        except Exception as exc:  # noqa: BLE001 - isolate this response's failure
            self.fail(r, exc)

    def close(self, emit, record, live) -> None:
        """Stop the token2wav worker after its running job (whose chunks are emitted)."""
        if self.worker is not None:
            self.collect_audio(emit, record, live, wait=True)
            self.worker.close()

    # -- failure isolation ------------------------------------------------------------------------
    def _run_batch(self, stage: str, rows: list[ResponseState], run) -> None:
        """Run one batched stage step, ``run(batch, done)`` adding each row to ``done`` once its state is updated. If
        it raises, the rows not done are retried one by one so that only a faulty row fails."""
        if not rows:
            return
        done: set[str] = set()
        try:
            run(rows, done)
            return
        except Exception as exc:  # noqa: BLE001 - find the faulty row by retrying one by one
            left = [r for r in rows if r.id not in done and not r.status.is_finished()]
            if len(left) == 1:
                self.fail(left[0], exc)
                return
            log.exception("batched %s step of %d rows failed; retrying each row alone", stage, len(left))
        for r in left:
            try:
                run([r], done)
            except Exception as exc:  # noqa: BLE001 - isolate this response's failure
                self.fail(r, exc)
