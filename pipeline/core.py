"""The engine core: synchronous, single-threaded, owns every model tensor.

``step()`` advances every active response by one unit of each stage — thinker prefill or one
thinker token, one talker token, one token2wav chunk — so a cancel (processed between steps) stops
every stage of a response within one step. Conversation operations are plain method calls made
between steps by the engine thread (see :mod:`pipeline.engine`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import numpy as np
import torch

from pipeline.config import StageGraphConfig
from pipeline.runners.audio_encodes import AudioEncodes
from pipeline.conversation_state import AudioBlock, ConversationState, ConvItem, ItemKind, OpenAudio
from pipeline.output.detokenizer import IncrementalDetokenizer
from pipeline.errors import (
    EmptyInputError,
    EngineFailure,
    InvalidAudioError,
    InvalidInputError,
    PipelineError,
    ResponseActiveError,
    UnknownItemError,
)
from pipeline.models.qwen2_5_omni.audio_features import IncrementalLogMel
from pipeline.models.qwen2_5_omni.checkpoint import LoadedCheckpoint
from pipeline.models.qwen2_5_omni.prompt import PromptRenderer
from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav, StreamStatus
from pipeline.outputs import (
    OUTPUT_SAMPLE_RATE,
    AudioChunk,
    EngineStats,
    ResponseDone,
    ResponseStatus,
    StageTimings,
    TextDelta,
    Usage,
)
from pipeline.scheduler.prefill_batch import PrefillBatch, PrefillJob
from pipeline.registry import CONNECTORS
from pipeline.request import Phase, ResponseSpec, ResponseState, TextEnd
from pipeline.runners.sampling import SampleRows, SamplerSpec
from pipeline.observe.stall_watch import StallWatch
from pipeline.output.start_buffer import StartBuffer, holds_start
from pipeline.observe.timeline import EngineTimeline
from pipeline.models.qwen2_5_omni.chunk_schedule import ChunkingConfig
from pipeline.runners.talker import TalkerRunner
from pipeline.runners.thinker import ThinkerRunner
from pipeline.scheduler.token2wav_jobs import ChunkCandidate, RecentJobs, Token2WavJob, pick_job
from pipeline.runners.token2wav_worker import Token2WavWorker

log = logging.getLogger(__name__)

SLOW_STEP_MS = 250.0
"""An engine step longer than this is logged: every live response waited that long for its next token."""

Sampled = tuple[list[ResponseState], torch.Tensor]
"""Rows of one batched decode step and their sampled ids (a device tensor of the same length), not read yet."""

MIN_AUDIO_FRAMES = 2
"""Shortest audio message the encoder accepts (mel frames of 10 ms)."""


def _audio_runs(audio: dict[int, tuple[torch.Tensor, int]], start: int, end: int):
    """The audio positions of ``[start, end)`` as runs ``(first position, encoder output, rows range)`` of
    consecutive positions holding consecutive rows of the same block."""
    runs: list[tuple[int, torch.Tensor, range]] = []
    for pos in range(start, end):
        if pos not in audio:
            continue
        tensor, row = audio[pos]
        if runs:
            first, last_tensor, rows = runs[-1]
            if last_tensor is tensor and first + len(rows) == pos and rows.stop == row:
                runs[-1] = (first, tensor, range(rows.start, row + 1))
                continue
        runs.append((pos, tensor, range(row, row + 1)))
    return runs


class EngineCore:
    def __init__(self, ckpt: LoadedCheckpoint, cfg: StageGraphConfig, *, seed: int | None = None) -> None:
        self.ckpt = ckpt
        self.cfg = cfg
        self.special = ckpt.special
        self.renderer = PromptRenderer(ckpt.tokenizer, ckpt.special)
        th, ta, tw = cfg.thinker, cfg.talker, cfg.token2wav
        self.max_context = th.max_context_tokens or ckpt.config.thinker_config.text_config.max_position_embeddings
        self.max_codes = ta.max_tokens or 4096
        self.text_stop = {self.special.im_end, self.special.endoftext}
        self.codec_stop = tuple(self.special.codec_stop_ids())
        # each decode step samples inside its graph; the salts keep the two stages' noise apart
        self.thinker = ThinkerRunner(ckpt.thinker, device=th.device, dtype=th.torch_dtype,
                                     kv_slots=th.kv_slots, max_len=self.max_context, cuda_graphs=th.cuda_graphs,
                                     fused_decode=th.fused_decode,
                                     sampler=SamplerSpec(th.sampling, stop=tuple(sorted(self.text_stop)), salt=0))
        # talker positions: the thinker prompt, speaker bos, then one per codec token
        self.talker = TalkerRunner(ckpt.talker, device=ta.device, dtype=ta.torch_dtype,
                                   kv_slots=ta.kv_slots, max_len=self.max_context + self.max_codes + 2,
                                   cuda_graphs=ta.cuda_graphs, fused_decode=ta.fused_decode,
                                   sampler=SamplerSpec(ta.sampling, suppress=tuple(self._codec_suppress_ids()),
                                                       stop=self.codec_stop, salt=1))  # fmt: skip
        self.overlap = ta.overlap
        """The talker decodes beside the thinker (:meth:`_decode_overlapped`)."""
        self._talker_cuda_stream: torch.cuda.Stream | None = None
        self._talker_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        """(engine stream ready, talker batch done): made with the stream, re-recorded every step."""
        self.t2w_device = tw.torch_device
        threaded = tw.worker_thread
        self.token2wav = StreamingToken2Wav(
            ckpt.token2wav, ChunkingConfig(**tw.chunking), max_batch=tw.max_batch,
            tf32_matmul=tw.tf32_matmul and self.t2w_device.type == "cuda", compile_dit=tw.compile,
            fused_vocoder=tw.compile and self.t2w_device.type == "cuda", dit_dtype=tw.torch_dit_dtype,
            dit_attention=tw.dit_attention,
        )
        # compile token2wav's DiT and capture its CUDA graphs now (seconds to a minute), not during the first replies
        self.token2wav.warm_up(max_batch=tw.max_batch)
        self.t2w_worker = Token2WavWorker(self.token2wav, self.t2w_device) if threaded else None
        self._t2w_jobs: dict[int, ResponseState] = {}
        """Stream id -> its response, for the chunks the worker is synthesizing."""
        self.starving_margin_ms = tw.starving_margin_ms
        """A later chunk with less audio ahead than this outranks first chunks (``pick_job``); with
        ``starving_margin_from_jobs``, the floor of a margin that follows :attr:`recent_jobs`."""
        self.starving_margin_from_jobs = tw.starving_margin_from_jobs
        self.start_buffer_ms = tw.start_buffer_ms
        """Under load, a reply's first audio is held until this much is made (ms; None: never; pipeline/
        start_buffer.py)."""
        self.start_buffer_busy = tw.start_buffer_busy or tw.max_batch
        """The load that holds it: this many other conversations busy."""
        self.recent_jobs = RecentJobs()
        """How long the last token2wav jobs took, hand-over to emission (ms)."""
        self._t2w_job_started: tuple[float, bool, int] | None = None
        """``time.perf_counter()`` when the worker's job was handed over, whether it holds first chunks, its streams."""
        self.to_talker = CONNECTORS[ta.connector].fn
        self.to_token2wav = CONNECTORS[tw.connector].fn
        self.prefill_chunk = th.prefill_chunk_tokens
        self.seed = seed
        self._seed_counter = 0
        self.counters = {"thinker_tokens_total": 0, "talker_tokens_total": 0, "audio_samples_total": 0,
                         "decode_steps_total": 0, "talker_chains_total": 0, "audio_underruns_total": 0,
                         "audio_starved_ms_total": 0, "audio_start_holds_total": 0, "audio_start_held_ms_total": 0}
        """Cumulative work counters reported by :meth:`stats` (tokens/s per stage in benchmarks; the underruns of a
        real-time player of each reply, ``ResponseState.playout``)."""
        self.conversations: dict[str, ConversationState] = {}
        self._prefills = PrefillBatch(th.max_prefills_per_step, None)
        """This step's thinker prefill chunks (pipeline/scheduler/prefill_batch.py)."""
        self._talker_prefills_left = 0
        """What is left this step of the talker's ``max_prefills_per_step``."""
        self._background_turn = 0
        self.responses: dict[str, ResponseState] = {}
        self._finished = 0
        self._stall = StallWatch()
        # a tuple of two fixed tensors: the text-pad vector is recognised by identity (:meth:`_chain_steps`)
        self._text_end_vectors = tuple(self.thinker.embed([self.special.tts_text_end, self.special.tts_text_pad]))
        self.timeline = EngineTimeline(cfg.engine.timeline_path) if cfg.engine.timeline_path else None
        """Every step, token2wav job, chunk and response with its time (``engine.timeline_path``; None: off)."""
        self.commands_waiting: Callable[[], bool] = lambda: False
        """Set by whoever runs the core's commands and steps: whether commands wait for the engine thread (then no
        chain of talker steps is started, :meth:`_chain_steps`)."""
        self.audio_encodes = AudioEncodes(self.thinker, width=self.thinker.text_model.config.hidden_size,
                                          dtype=self.thinker.dtype, device=self.thinker.device)  # fmt: skip
        """User audio blocks and tails queued by commands, encoded together at the start of each step."""
        self.text_sampler, self.code_sampler = self.thinker.sampler, self.talker.sampler
        # capture the decode and prefill graphs now (seconds on a 7B model), not during the first replies
        self.thinker.capture()
        self.talker.capture()

    def _codec_suppress_ids(self) -> list[int]:
        """The talker must never emit codec bos, nor ids the DiT cannot embed (except stop ids)."""
        dit_vocab = self.ckpt.config.token2wav_config.dit_config.num_embeds
        talker_vocab = self.ckpt.config.talker_config.vocab_size
        beyond = [i for i in range(dit_vocab, talker_vocab) if i not in self.codec_stop]
        return [self.special.codec_bos, *beyond]

    # -- conversations ----------------------------------------------------------------------------
    def open_conversation(self, conv_id: str, instructions: str) -> None:
        self.conversations[conv_id] = ConversationState(
            conv_id, self.renderer, instructions=instructions, max_context_tokens=self.max_context
        )

    def close_conversation(self, conv_id: str) -> None:
        conv = self.conversations.pop(conv_id, None)
        if conv is None:
            return
        if conv.active_response in self.responses:
            self._finish(self.responses[conv.active_response], ResponseStatus.CANCELLED, "conversation_closed")
        self.release_slots(conv)

    # -- KV slots ---------------------------------------------------------------------------------
    def release_slots(self, conv: ConversationState) -> None:
        """Forget the conversation's caches and give its KV slots back to the pools."""
        conv.free()
        self.thinker.pool.slots.release(conv.id)
        self.talker.pool.slots.release(conv.id)
        conv.slot = conv.talker_slot = None

    def _idle_owner(self, allocator, exclude: ConversationState) -> ConversationState | None:
        """The least recently used conversation of ``allocator`` that no response is using."""
        for owner in allocator.lru_owners():
            conv = self.conversations.get(owner)
            if conv is None or conv is exclude:
                continue
            if conv.active_response is None:
                return conv
        return None

    def _thinker_slot(self, conv: ConversationState, *, evict: bool) -> int | None:
        """The conversation's thinker slot; a free one, or (``evict``) one taken from the least recently used
        idle conversation, which is prefilled again at its next response. None while every slot is busy."""
        slot = self.thinker.pool.slots.acquire(conv.id)
        if slot is None and evict:
            victim = self._idle_owner(self.thinker.pool.slots, exclude=conv)
            if victim is not None:
                log.info("KV pool full: conversation %s loses its cache to %s", victim.id, conv.id)
                self.release_slots(victim)
                slot = self.thinker.pool.slots.acquire(conv.id)
        if slot is not None and slot != conv.slot:
            conv.free()  # a new slot holds nothing yet
            conv.slot = slot
        return slot

    def _talker_slot(self, conv: ConversationState, *, evict: bool = True) -> int | None:
        """The conversation's talker slot; a free one, or (``evict``) one taken from the least recently used
        conversation without a response, which loses only its talker cache. None while every slot is busy."""
        slot = self.talker.pool.slots.acquire(conv.id)
        if slot is None and evict:
            victim = self._idle_owner(self.talker.pool.slots, exclude=conv)
            if victim is not None:
                victim.crop_talker(0)
                self.talker.pool.slots.release(victim.id)
                victim.talker_slot = None
                slot = self.talker.pool.slots.acquire(conv.id)
        if slot is not None and slot != conv.talker_slot:
            conv.crop_talker(0)
            conv.talker_slot = slot
        return slot

    def conv(self, conv_id: str) -> ConversationState:
        try:
            return self.conversations[conv_id]
        except KeyError:
            raise InvalidInputError(f"conversation {conv_id!r} is closed", param="conversation") from None

    def set_instructions(self, conv_id: str, instructions: str) -> None:
        conv = self.conv(conv_id)
        conv._require_idle("change the instructions")
        conv.instructions = instructions
        conv.dirty = True

    def add_text(self, conv_id: str, item_id: str, role: str, text: str) -> None:
        if not text.strip():
            raise EmptyInputError("text message is empty", param="text")
        self.conv(conv_id).add(ConvItem(id=item_id, role=role, kind=ItemKind.TEXT, text=text))

    def append_audio(self, conv_id: str, item_id: str, pcm: np.ndarray) -> None:
        """Feed user audio (16 kHz float32) of a message still being spoken. Each complete 2 s block is queued for
        the next step's encode (pipeline/runners/audio_encodes.py) and prefilled in the background while the conversation
        is idle."""
        conv = self.conv(conv_id)
        pending = conv.open_audio.get(item_id)
        if pending is None:
            pending = conv.open_audio[item_id] = OpenAudio(item_id, IncrementalLogMel(self.ckpt.feature_extractor))
            if any(item.id == item_id for item in conv.items):  # reported at commit, where the caller waits
                pending.error = InvalidInputError(f"item id {item_id!r} already exists", param="item_id")
        if pending.error is not None:
            return
        try:
            pending.features.append(pcm)
            for k in range(len(pending.blocks), pending.features.ready_blocks()):
                pending.blocks.append(self._encode_block(pending.features, k, pending.features.running_floor))
                conv.dirty = True
        except Exception as exc:  # noqa: BLE001 - kept and raised at commit, where the caller waits
            log.exception("encoding audio of %s failed", item_id)
            pending.error = exc

    def commit_audio(self, conv_id: str, item_id: str) -> None:
        """Close a spoken message: queue the tail's encode (and, with ``audio_floor: exact``, the re-encode of the
        blocks whose features the final loudness changed) for the next step, and add it to the conversation."""
        conv = self.conv(conv_id)
        pending = conv.open_audio.pop(item_id, None)
        if pending is None:
            raise UnknownItemError(f"no audio message {item_id!r} is being recorded", param="item_id")
        conv.dirty = True  # whatever happens below, its prefilled positions must be re-synced
        if pending.error is not None:
            raise pending.error
        feats = pending.features
        feats.finish()
        if feats.total_frames < MIN_AUDIO_FRAMES:
            raise InvalidAudioError("audio message is too short to encode (needs at least 20 ms)", param="audio")
        final = feats.final_floor()
        if self.cfg.thinker.audio_floor == "exact":
            for k, block in enumerate(pending.blocks):
                if feats.block_changes(k, block.floor):
                    pending.blocks[k] = self._encode_block(feats, k, final, version=block.version + 1)
        for k in range(len(pending.blocks), feats.ready_blocks()):  # completed by the end of the signal
            pending.blocks.append(self._encode_block(feats, k, final))
        tail = feats.raw_tail()
        if tail.shape[1]:
            pending.blocks.append(self.audio_encodes.block(feats.features(tail, final), floor=final))
        conv.add(ConvItem(id=item_id, role="user", kind=ItemKind.AUDIO, audio_blocks=pending.blocks))

    def _encode_block(self, feats: IncrementalLogMel, k: int, floor: float, version: int = 0) -> AudioBlock:
        return self.audio_encodes.block(feats.features(feats.raw_block(k), floor), floor=floor, version=version)

    def discard_audio(self, conv_id: str, item_id: str) -> None:
        conv = self.conv(conv_id)
        if conv.open_audio.pop(item_id, None) is not None:
            conv.dirty = True  # its prefilled positions are rolled back in the background

    def add_audio(self, conv_id: str, item_id: str, pcm: np.ndarray) -> None:
        """A whole audio message: the same path as streamed audio, so features are identical."""
        self.append_audio(conv_id, item_id, pcm)
        self.commit_audio(conv_id, item_id)

    def delete_item(self, conv_id: str, item_id: str) -> None:
        self.conv(conv_id).delete(item_id)

    def truncate_item(self, conv_id: str, item_id: str, audio_end_ms: int) -> None:
        self.conv(conv_id).truncate_reply(item_id, audio_end_ms)

    # -- responses --------------------------------------------------------------------------------
    def start_response(self, spec: ResponseSpec) -> None:
        conv = self.conv(spec.conv_id)
        if conv.active_response is not None:
            raise ResponseActiveError("a response is already in progress for this conversation", param="response")
        if not any(item.role == "user" for item in conv.items):
            raise EmptyInputError("the conversation has no user input to respond to", param="input")
        item = ConvItem(id=spec.item_id, role="assistant", kind=ItemKind.REPLY, open=True)
        conv.add(item)
        conv.active_response = spec.id
        self.responses[spec.id] = ResponseState(
            spec=spec, conv=conv, item=item, detok=IncrementalDetokenizer(self.renderer.decode),
            seed=self._response_seed(), started_at=time.perf_counter(), started_at_s=time.monotonic(),
        )
        if self.timeline is not None:
            self.timeline.response(self.responses[spec.id].started_at, spec.id, "started")

    def cancel_response(self, response_id: str, reason: str) -> None:
        state = self.responses.get(response_id)
        if state is not None and state.cancel_reason is None:
            state.cancel_reason = reason

    def step(self) -> bool:
        """Advance every active response by one unit per stage: responses still prefilling get one prefill
        chunk each; all decoding responses get one thinker token in one batched step, then one talker token in
        another, then one token2wav job: a batch of the streams with their next chunk ready, first chunks alone
        (pipeline/scheduler/token2wav_jobs.py), inline or handed to the worker. Returns False when nothing
        could progress (every response is paused by backpressure or waits for a KV slot), so the caller can
        wait instead of spin."""
        started = time.perf_counter()
        # before anything renders a conversation: the commands since the last step queued their audio encodes
        progressed = self.encode_audio() > 0
        progressed |= self._collect_token2wav()
        tokens_before = (self.counters["thinker_tokens_total"], self.counters["talker_tokens_total"])
        chains_before = self.counters["talker_chains_total"]
        decoding = []
        self._prefills = PrefillBatch(self.cfg.thinker.max_prefills_per_step, self.thinker.prefill_rows)
        self._talker_prefills_left = self.cfg.talker.max_prefills_per_step
        for state in list(self.responses.values()):
            try:
                advanced, decodes = self._step_response(state)
            except Exception as exc:  # noqa: BLE001 - isolate one response's failure from the others
                self._fail(state, exc)
                advanced, decodes = True, False
            progressed |= advanced
            if decodes:
                decoding.append(state)
        background = self._plan_background_prefills()
        progressed |= bool(background)
        self._run_prefills(self._prefills.jobs)
        if self._first_chunks_alone(decoding):
            decoding = []  # nothing decodes this step: see _first_chunks_alone
        if decoding:
            self.counters["decode_steps_total"] += 1
        # Both stages' steps are queued before either's tokens are read: the talker's step needs the thinker's
        # vectors (device tensors), not its new tokens.
        thinker_rows = [r for r in decoding if not r.thinker_done]
        if self.overlap:
            thinker_tokens, talker_rows, talker_codes = self._decode_overlapped(decoding, thinker_rows)
        else:
            thinker_tokens = self._thinker_decode(thinker_rows)
            talker_rows = self._talker_rows(self._talker_may_step([r for r in decoding if r.id in self.responses
                                                                    and r.spec.audio]))  # fmt: skip
            talker_codes = self._talker_decode(talker_rows, alone=not thinker_rows)
        self._accept_sampled(thinker_tokens, self._accept_text_token)
        self._accept_sampled(talker_codes, self._accept_code)
        live = [r for r in decoding if r.id in self.responses]
        ready = [r for r in live if r.t2w is not None and not self._t2w_busy(r) and r.t2w.ready()]
        now = time.perf_counter()
        for r in ready:
            r.playout.chunk_ready(now)
            if r.first_audio_at is None:
                r.mark("talker_first_chunk_ms")  # its codes are in; its job may still wait for the worker
        # a response only waiting for the token2wav worker is not progress: the loop then waits for a wake-up
        progressed |= tokens_before != (self.counters["thinker_tokens_total"], self.counters["talker_tokens_total"])
        progressed |= bool(ready) and (self.t2w_worker is None or self.t2w_worker.idle)
        if self.t2w_worker is None:
            chosen, job = self._token2wav_job(ready)
            self._token2wav_step(chosen, first=job is not None and job.urgent)
        elif ready and self.t2w_worker.idle:
            chosen, job = self._token2wav_job(ready)
            for r in chosen:
                r.mark("token2wav_first_job_ms")
                r.playout.job_started(time.perf_counter())
            self._t2w_jobs = {id(r.t2w): r for r in chosen}
            self._t2w_job_started = (time.perf_counter(), job.urgent, len(chosen))
            self.t2w_worker.submit([r.t2w for r in chosen], urgent=job.urgent)
        for state in live:
            if state.id in self.responses and state.all_done() and not self._t2w_busy(state):
                progressed = True
                incomplete = state.text_end is TextEnd.MAX_TOKENS
                status = ResponseStatus.INCOMPLETE if incomplete else ResponseStatus.COMPLETED
                self._finish(state, status, "max_output_tokens" if incomplete else None)
        elapsed = (time.perf_counter() - started) * 1000
        if elapsed > SLOW_STEP_MS:
            log.warning("slow engine step: %.0f ms (%d responses decoding, %d token2wav chunks, %d background prefills, "
                        "%d responses)", elapsed, len(decoding), len(ready), background, len(self.responses))
        self._watch_for_stall()
        if self.timeline is not None and progressed:
            self.timeline.step(started, time.perf_counter(), prefills=len(self._prefills.jobs),
                               thinker_rows=len(thinker_rows), talker_rows=len(talker_rows),
                               codes=self.counters["talker_tokens_total"] - tokens_before[1],
                               chains=self.counters["talker_chains_total"] - chains_before)  # fmt: skip
        return progressed

    def encode_audio(self) -> int:
        """Run the audio encodes the commands queued (pipeline/runners/audio_encodes.py), every conversation's in one call;
        :meth:`step` starts with it. Returns how many blocks were encoded."""
        return self.audio_encodes.flush()

    def _watch_for_stall(self) -> None:
        marks = (self.counters["thinker_tokens_total"], self.counters["talker_tokens_total"],
                 self.counters["audio_samples_total"], self._finished)  # fmt: skip
        stalled = self._stall.check(marks, live=bool(self.responses), now=time.monotonic())
        if stalled is not None:
            log.warning("engine stalled: no token, audio or finished response for %.0f s with %d responses live\n%s",
                        stalled, len(self.responses), "\n".join(self.describe()))

    def describe(self) -> list[str]:
        """One line per live response (where it is in each stage) and per shared resource (KV slots, token2wav
        worker): what a stalled or slow engine waits on. Engine thread only."""
        lines = []
        for r in self.responses.values():
            t2w, busy = r.t2w, self._t2w_busy(r)
            # a stream in the worker is being changed there: its readiness is not read from this thread
            steppable = t2w is not None and t2w.status in (StreamStatus.OPEN, StreamStatus.FINISHED)
            ready = steppable and not busy and t2w.ready()
            t2w_state = "none" if t2w is None else (
                f"{t2w.status.value} codes={t2w.codes_received} chunks={t2w.chunks_emitted} ready={ready} busy={busy}")
            lines.append(
                f"  {r.id} conv={r.conv.id} phase={r.phase.name} accepts={r.spec.can_accept()} "
                f"text={len(r.item.reply_ids)} end={r.text_end.name} talker_started={r.talker_started} "
                f"talker_done={r.talker_done} queue={len(r.talker_queue)} codes={r.codec_tokens} "
                f"thinker_slot={r.conv.slot} talker_slot={r.conv.talker_slot} samples={r.samples} t2w: {t2w_state}")
        for name, pool in (("thinker", self.thinker.pool), ("talker", self.talker.pool)):
            lines.append(f"  {name} KV slots: {pool.slots.used} of {pool.slots.capacity} used")
        if self.t2w_worker is not None:
            lines.append(f"  token2wav worker: {len(self.t2w_worker.in_flight)} streams in flight, "
                         f"{len(self._t2w_jobs)} jobs known")
        return lines

    def stats(self, pending_commands: int = 0) -> EngineStats:
        convs = self.conversations.values()
        return EngineStats(
            conversations=len(self.conversations), responses=len(self.responses),
            open_audio_messages=sum(len(c.open_audio) for c in convs),
            cached_tokens=sum(len(c.cached_keys) for c in convs),
            talker_cached_tokens=sum(len(c.talker_keys) for c in convs if c.talker_slot is not None),
            pending_commands=pending_commands, **self.counters, **self._device_memory(),
        )

    def _device_memory(self) -> dict[str, int]:
        device = self.thinker.device
        if device.type != "cuda":
            return {}
        return {"device_memory_bytes": torch.cuda.memory_allocated(device),
                "device_memory_peak_bytes": torch.cuda.max_memory_allocated(device)}  # fmt: skip

    def has_work(self) -> bool:
        """Whether a step can do something now: a response running, an audio encode queued, a background prefill that
        can get a thinker slot, or a token2wav job in flight. A conversation whose background prefill waits for a slot
        that other conversations hold is not work (a background prefill never evicts: only a command frees a slot), so
        ``OmniEngine.wait_idle`` returns instead of waiting for it forever."""
        return (bool(self.responses) or self.audio_encodes.pending > 0
                or any(self._needs_prefill(c) and self._thinker_slot_free_for(c) for c in self.conversations.values())
                or (self.t2w_worker is not None and not self.t2w_worker.idle))  # fmt: skip

    def _thinker_slot_free_for(self, conv: ConversationState) -> bool:
        """Whether ``conv`` holds a thinker slot or one is free (no side effect, unlike :meth:`_thinker_slot`)."""
        slots = self.thinker.pool.slots
        return slots.slot_of(conv.id) is not None or slots.used < slots.capacity

    def close(self) -> None:
        """Stop the token2wav worker (after its running job) and write the timeline, if one is kept. Conversations are
        closed by the caller."""
        if self.t2w_worker is not None:
            for result in self.t2w_worker.poll(wait=True):
                self._token2wav_done(result)
            self.t2w_worker.close()
        if self.timeline is not None:
            self.timeline.write()

    def _needs_prefill(self, conv: ConversationState) -> bool:
        return conv.active_response is None and conv.dirty

    def _plan_background_prefills(self) -> int:
        """Conversations whose background prefill progressed this step (planned chunks, in turn, under the step's
        prefill budget)."""
        planned = 0
        convs = list(self.conversations.values())
        self._background_turn = (self._background_turn + 1) % max(len(convs), 1)  # round robin under the budget
        for conv in convs[self._background_turn :] + convs[: self._background_turn]:
            if not self._prefills.has_room():
                break
            planned += self._background_prefill(conv)
        return planned

    def _background_prefill(self, conv: ConversationState) -> bool:
        """While a conversation is idle, plan the prefill of what the user has said so far (one chunk per step), if
        a KV slot is free (a background prefill never takes another conversation's slot)."""
        if not self._needs_prefill(conv) or self._thinker_slot(conv, evict=False) is None:
            return False
        try:
            if (error := conv.audio_error()) is not None:
                raise error
            rendering = conv.render(with_open_audio=True)
            if conv.common_prefix(rendering.keys) == len(rendering.keys):
                conv.crop(len(rendering.keys))  # items were removed: drop what follows
                conv.dirty = False
                return True
            return self._prefills.admit(self._plan_chunk(conv, rendering, need_logits=False))
        except Exception:  # noqa: BLE001 - a background failure must not stop the engine thread
            log.exception("background prefill of %s failed; its cache is dropped", conv.id)
            conv.free()
            conv.dirty = False
            return True

    def _step_response(self, r: ResponseState) -> tuple[bool, bool]:
        """Returns (progressed, joins this step's decode batches); whether a decoding response progresses is
        known after the batches ran (see :meth:`step`)."""
        if r.cancel_reason is not None:
            self._finish(r, ResponseStatus.CANCELLED, r.cancel_reason)
            return True, False
        if not r.spec.can_accept():
            return False, False
        if r.phase is Phase.PREFILL:
            if not self._prefills.has_room():
                return False, False  # next step: the prefill budget keeps decode steps short
            return self._prefill(r), False
        return False, True

    # -- thinker ----------------------------------------------------------------------------------
    def _prefill(self, r: ResponseState) -> bool:
        """Plan the next chunk of the conversation's prefill up to the reply's header (one per step; it runs with the
        step's other chunks, :meth:`_run_prefills`); the last chunk's logits give the first reply token. False while
        the response waits for a KV slot or the step's prefill budget."""
        conv = r.conv
        if (error := conv.audio_error()) is not None:
            raise error  # the response fails with it (step isolates it)
        if r.prompt_len == 0:  # first prefill step of this response
            conv.make_room(r.spec.max_text_tokens, drop_oldest=self.cfg.thinker.context_policy == "drop_oldest")
        if self._thinker_slot(conv, evict=True) is None:
            return False
        rendering = conv.render()
        if r.prompt_len == 0:
            r.cached_tokens = min(conv.common_prefix(rendering.keys), len(rendering.keys) - 1)
            r.prompt_len = len(rendering.keys)
            r.input_audio_tokens = len(rendering.audio)
            r.input_text_tokens = r.prompt_len - len(rendering.audio)
            self.text_sampler.reset(conv.slot, rendering.token_ids)
        job = self._plan_chunk(conv, rendering, need_logits=True)
        job.owner = r
        return self._prefills.admit(job)

    def _run_prefills(self, jobs: list[PrefillJob]) -> None:
        """Run the step's prefill chunks together, then extend each conversation's cache and start the responses
        whose prompt is complete (their first tokens sampled in one batch). If the batch fails, each chunk is retried
        alone, so that only a faulty one fails."""
        if not jobs:
            return
        spans = [(job.embeds, job.conv.slot, job.start, job.logits) for job in jobs]
        try:
            outputs = list(zip(jobs, self.thinker.prefill_many(spans)))
        except Exception:  # noqa: BLE001 - find the faulty chunk by retrying one by one
            log.exception("batched prefill of %d chunks failed; retrying each alone", len(jobs))
            outputs = []
            for job, span in zip(jobs, spans):
                try:
                    outputs.append((job, self.thinker.prefill_many([span])[0]))
                except Exception as exc:  # noqa: BLE001 - isolate this conversation's failure
                    self._prefill_failed(job, exc)
        started, listening = [], []
        for job, out in outputs:
            try:
                job.conv.extend(job.keys, self.to_talker(out.hidden, job.talker_embeds))
            except Exception as exc:  # noqa: BLE001 - isolate this conversation's failure
                self._prefill_failed(job, exc)
                continue
            if job.owner is None:
                job.conv.dirty = not job.last
                listening.append(job.conv)
            elif job.last and job.owner.id in self.responses:
                job.owner.phase = Phase.DECODE
                job.owner.mark("prefill_done_ms")
                started.append((job.owner, out.last_logits))
        if started:
            rows = [r for r, _ in started]
            logits = torch.stack([logits for _, logits in started])
            tokens = self.text_sampler.sample(logits, [r.conv.slot for r in rows],
                                              force_continue=[self._force_text(r) for r in rows],
                                              seeds=[r.seed for r in rows],
                                              counters=[len(r.item.reply_ids) for r in rows])  # fmt: skip
            self._accept_each(rows, tokens, self._accept_text_token)
        for conv in listening:
            self._background_talker_prefill(conv)

    def _background_talker_prefill(self, conv: ConversationState) -> None:
        """While a conversation is idle, bring its talker cache up to its thinker cache (the talker's prompt is the
        thinker's vectors of the same positions), so that a reply's talker prefill at the end of the turn covers only
        what the turn's last chunk added, the speaker's bos and the first reply vector: ~150 positions of a 5 s
        question otherwise, on every reply's first-audio path. Only into a slot the conversation holds or a free one
        (listening never evicts). A failure is logged and leaves the talker cache as it was: the reply's own prefill
        then covers the rest."""
        if conv.active_response is not None or not conv.cached_keys:
            return
        slot = self._talker_slot(conv, evict=False)
        if slot is None:
            return
        keys = conv.cached_keys
        start = conv.common_prefix_of(conv.talker_keys, keys)
        if start == len(keys):
            return
        conv.crop_talker(start)
        try:
            self.talker.prefill_prompt(conv.talker_prompt()[start:], slot=slot, start=start)
        except Exception:  # noqa: BLE001 - a background failure must not stop the engine thread
            log.exception("background talker prefill of %s failed; its talker cache is dropped", conv.id)
            return
        conv.talker_keys = list(keys)

    def _prefill_failed(self, job: PrefillJob, exc: Exception) -> None:
        if job.owner is None:
            log.error("background prefill of %s failed; its cache is dropped", job.conv.id, exc_info=exc)
            job.conv.free()
            job.conv.dirty = False
        elif job.owner.id in self.responses:
            self._fail(job.owner, exc)

    def _plan_chunk(self, conv: ConversationState, rendering, *, need_logits: bool) -> PrefillJob:
        """The next chunk (at most ``prefill_chunk_tokens``) of ``rendering`` missing from the cache, cropping the
        cache to what the rendering shares with it. With ``need_logits`` the last position is recomputed if it is
        already cached (its logits are wanted)."""
        keys = rendering.keys
        start = conv.common_prefix(keys)
        if need_logits:
            start = min(start, len(keys) - 1)
        conv.crop(start)
        end = min(len(keys), start + self.prefill_chunk)
        embeds = self.thinker.embed(rendering.token_ids[start:end])
        talker_embeds = embeds.clone()
        for at, audio, rows in _audio_runs(rendering.audio, start, end):  # one copy per audio block, not per position
            embeds[at - start : at - start + len(rows)] = audio[rows.start : rows.stop]
            talker_embeds[at - start : at - start + len(rows)] = 0  # the reference zeroes multimodal positions
        return PrefillJob(conv, keys[start:end], embeds, talker_embeds, start, last=end == len(keys),
                          logits=need_logits and end == len(keys))  # fmt: skip

    def _thinker_decode(self, rows: list[ResponseState]) -> list[Sampled]:
        """Feed every row's pending token through the thinker in one batch, which samples the next ones on the
        device. Returns the batches run and their sampled tokens (device tensors), for :meth:`_accept_sampled`:
        the rows' caches and talker queues are updated here, their new tokens are not read yet."""
        sampled = []

        def run(batch: list[ResponseState], done: set[str]) -> None:
            rows = SampleRows.of([r.conv.slot for r in batch], force_continue=[self._force_text(r) for r in batch],
                                 seeds=[r.seed for r in batch], counters=[len(r.item.reply_ids) for r in batch])
            step = self.thinker.decode([r.pending_token for r in batch], [r.conv.slot for r in batch],
                                       [len(r.conv.cached_keys) for r in batch], rows)  # fmt: skip
            vectors = self.to_talker(step.hidden, step.embeds)
            sampled.append((batch, step.tokens.clone()))  # the graph's buffer is overwritten by the next replay
            for i, r in enumerate(batch):
                r.conv.extend([r.pending_token], vectors[i : i + 1])
                if r.spec.audio:
                    r.talker_queue.append(vectors[i])
                done.add(r.id)

        self._run_batch("thinker", rows, run)
        return sampled

    def _accept_sampled(self, sampled: list[Sampled], accept: Callable[[ResponseState, int], None]) -> None:
        """Read each batch's sampled ids (one host transfer per batch) and ``accept(row, id)`` them, in row order; a
        chain's (steps, B) ids step by step."""
        for batch, tokens in sampled:
            values = tokens.tolist()
            for step in values if tokens.dim() == 2 else [values]:
                self._accept_each(batch, step, accept)

    def _accept_each(self, rows: list[ResponseState], tokens: list[int],
                     accept: Callable[[ResponseState, int], None]) -> None:  # fmt: skip
        for r, token in zip(rows, tokens):
            if r.id not in self.responses:
                continue
            try:
                accept(r, token)
            except Exception as exc:  # noqa: BLE001 - isolate one response's failure from the others
                self._fail(r, exc)

    def _run_batch(self, stage: str, rows: list[ResponseState], run) -> None:
        """Run one batched stage step, ``run(batch, done)`` adding each row to ``done`` once its state is
        updated. If it raises, the rows not done are retried one by one so that only a faulty row fails."""
        if not rows:
            return
        done: set[str] = set()
        try:
            run(rows, done)
            return
        except Exception as exc:  # noqa: BLE001 - find the faulty row by retrying one by one
            left = [r for r in rows if r.id not in done and r.id in self.responses]
            if len(left) == 1:
                self._fail(left[0], exc)
                return
            log.exception("batched %s step of %d rows failed; retrying each row alone", stage, len(left))
        for r in left:
            try:
                run([r], done)
            except Exception as exc:  # noqa: BLE001 - isolate this response's failure
                self._fail(r, exc)

    def _force_text(self, r: ResponseState) -> bool:
        return len(r.item.reply_ids) < (self.cfg.thinker.min_tokens or 0)

    def _accept_text_token(self, r: ResponseState, token: int) -> None:
        self.counters["thinker_tokens_total"] += 1
        r.pending_token = None
        if token in self.text_stop:
            r.text_end = TextEnd.STOP
            return
        r.item.reply_ids.append(token)
        delta = r.detok.push(token)
        if delta:
            r.spec.sink(TextDelta(text=delta, token_ids=(token,)))
        if len(r.item.reply_ids) >= r.spec.max_text_tokens:
            r.text_end = TextEnd.MAX_TOKENS
        else:
            r.pending_token = token

    # -- talker ---------------------------------------------------------------------------------
    def _talker_rows(self, rows: list[ResponseState]) -> list[tuple[ResponseState, torch.Tensor]]:
        """Each row's talker work this step: a response whose talker has not started is prefilled here (one
        at a time: prompt lengths differ); the others yield (row, next thinker vector) for the batched decode,
        or nothing while they wait for the thinker."""
        batch = []
        for r in rows:
            try:
                vector = self._talker_step(r)
            except Exception as exc:  # noqa: BLE001 - isolate one response's failure from the others
                self._fail(r, exc)
                continue
            if vector is not None:
                batch.append((r, vector))
        return batch

    def _decode_overlapped(self, decoding: list[ResponseState], thinker_rows: list[ResponseState]):
        """This step's thinker and talker decodes with the talker beside the thinker (``talker.overlap``): the talker
        rows take the vectors queued by earlier steps (so the talker runs one thinker step behind the text), their
        batch is queued on the talker's stream, then the thinker's batch on the engine's, then the talker starts
        (prefills, which may use this step's vectors) on the engine's stream as without overlap. The engine's stream
        waits for the talker's before returning, so everything queued later sees the codes. Returns (thinker tokens,
        talker rows, talker codes) as :meth:`_thinker_decode`, :meth:`_talker_rows` and :meth:`_talker_decode` do."""
        speaking = self._talker_may_step([r for r in decoding if r.spec.audio])
        # talker_rows keeps the popped vectors (engine-stream memory) alive until the engine's stream waits for the
        # talker's below, so nothing queued on the engine's stream meanwhile can reuse it while the talker reads it
        talker_rows = self._talker_rows([r for r in speaking if r.talker_started])
        side = self._talker_stream if talker_rows else None
        if side is None:
            talker_codes = self._talker_decode(talker_rows, alone=not thinker_rows)
        else:
            main = torch.cuda.current_stream(self.talker.device)
            ready, done = self._talker_events
            ready.record(main)
            side.wait_event(ready)  # the vectors and caches of earlier steps
            with torch.cuda.stream(side):
                talker_codes = self._talker_decode(talker_rows, alone=not thinker_rows)
                done.record(side)
        thinker_tokens = self._thinker_decode(thinker_rows)
        self._talker_rows([r for r in speaking if not r.talker_started and r.id in self.responses])
        if side is not None:
            main.wait_event(done)
        return thinker_tokens, talker_rows, talker_codes

    @property
    def _talker_stream(self) -> torch.cuda.Stream | None:
        """The talker's CUDA stream with overlap (None on the CPU), made on first use on the engine thread with the
        priority of that thread's stream (the engine's decode stream outranks token2wav's steady jobs)."""
        if self._talker_cuda_stream is None and self.talker.device.type == "cuda":
            priority = torch.cuda.current_stream(self.talker.device).priority
            self._talker_cuda_stream = torch.cuda.Stream(self.talker.device, priority=priority)
            # made once: events made and dropped every step stalled steps behind token2wav jobs (BENCHMARKS §14.4)
            self._talker_events = (torch.cuda.Event(), torch.cuda.Event())
        return self._talker_cuda_stream

    def _first_chunks_alone(self, decoding: list[ResponseState]) -> bool:
        """Whether every decoding response is a spoken reply whose first chunk the token2wav worker is making now. Then
        the step decodes nothing, thinker included: nothing else needs the GPU, and the decode steps would only slow
        that chunk, which someone is waiting to hear (a reply still writing its text, 40 tokens, had its first chunk
        take ~104 ms beside the thinker's steps on the H100, ~39 ms without: BENCHMARKS.md §17.1). Their next tokens
        are for the second chunk, 240 ms of audio later. :meth:`_talker_may_step` does the same for the talker alone,
        beside replies that only write text."""
        return bool(decoding) and all(r.t2w is not None and id(r.t2w) in self._t2w_jobs and r.first_audio_at is None
                                      for r in decoding)  # fmt: skip

    def _talker_may_step(self, rows: list[ResponseState]) -> list[ResponseState]:
        """``rows``, or none when every one still talking is a reply whose first chunk the token2wav worker is making
        now. Why: then nothing else needs the GPU, and their talker steps would only slow that chunk, which someone is
        waiting to hear (at one user on the H100 a first chunk took ~70 ms beside the talker's remaining steps, ~45
        ms without them; BENCHMARKS.md §13.5); their next codes are needed for the second chunk, 240-480 ms of audio
        later. With any other row decoding, the GPU is shared anyway and everyone steps."""
        talking = [r for r in rows if not r.talker_done]
        if talking and all(id(r.t2w) in self._t2w_jobs and r.first_audio_at is None for r in talking):
            return []
        return rows

    def _talker_step(self, r: ResponseState) -> torch.Tensor | None:
        """Start the talker (prefill and first code) or return the vector of its next decode step."""
        if r.talker_done:
            return None
        if not r.talker_started:
            if not r.talker_queue:
                if r.thinker_done:  # the reply had no token the talker could start from
                    self._end_talker(r)
                return None
            if self._talker_prefills_left <= 0:
                return None
            self._talker_prefills_left -= 1
            logits = self._talker_prefill(r)
            if logits is not None:
                (code,) = self.code_sampler.sample(logits.unsqueeze(0), [r.conv.talker_slot],
                                                   force_continue=[self._force_codes(r)], seeds=[r.seed],
                                                   counters=[r.codec_tokens])  # fmt: skip
                self._accept_code(r, code)
            return None
        return self._next_talker_vector(r)

    def _talker_decode(self, rows: list[tuple[ResponseState, torch.Tensor]], *, alone: bool = False) -> list[Sampled]:
        """One codec token for every row, sampled on the device in one batched talker step, or a chain of steps
        (:meth:`_chain_steps`; ``alone``: no thinker row runs in this step). Returns the batches and their codes
        (device tensors: (B,), or (steps, B) for a chain) for :meth:`_accept_sampled`."""
        sampled = []
        steps = self._chain_steps(rows) if alone else 1

        def run(batch: list[ResponseState], done: set[str]) -> None:
            slots = [r.conv.talker_slot for r in batch]
            rows = SampleRows.of(slots, force_continue=[self._force_codes(r) for r in batch],
                                 seeds=[r.seed for r in batch], counters=[r.codec_tokens for r in batch])
            inputs = ([r.last_code for r in batch], torch.stack([vectors[r.id] for r in batch]), slots,
                      [r.talker_len for r in batch], rows)  # fmt: skip
            if steps > 1:
                sampled.append((batch, self.talker.decode_chain(*inputs, steps=steps)))
                self.counters["talker_chains_total"] += 1
            else:
                sampled.append((batch, self.talker.decode(*inputs)[1].clone()))
            for r in batch:
                r.talker_len += steps
                done.add(r.id)

        vectors = {r.id: v for r, v in rows}
        self._run_batch("talker", [r for r, _ in rows], run)
        return sampled

    def _chain_steps(self, rows: list[tuple[ResponseState, torch.Tensor]]) -> int:
        """How many talker steps to queue at once for ``rows`` (1: a step as usual); ``talker.chain_steps`` says why.
        Only while nothing else waits for the engine: every live response is in this batch, no prefill, no token2wav
        job in flight (its chunk would wait for the chain), no command waiting. Each row must be past its text (the
        text-pad vector, the same at every step), and the chain ends where a row's next chunk becomes ready (it goes to
        token2wav in this step, as without a chain), where its stop suppression ends (``min_tokens``: the flag is one
        per chain) and at its most codes."""
        limit = self.cfg.talker.chain_steps
        if (limit <= 1 or not self.talker.can_chain or len(rows) != len(self.responses) or self._prefills.jobs
                or self._t2w_jobs or self.commands_waiting()):
            return 1
        pad, floor = self._text_end_vectors[1], self.cfg.talker.min_tokens or 0
        steps = limit
        for r, vector in rows:
            if vector is not pad or r.t2w is None:
                return 1
            left = r.t2w.codes_until_ready()
            if left is not None:
                steps = min(steps, left)
            steps = min(steps, self.max_codes - r.codec_tokens)
            if r.codec_tokens < floor:
                steps = min(steps, floor - r.codec_tokens)
        return max(1, steps)

    def _force_codes(self, r: ResponseState) -> bool:
        return r.codec_tokens < (self.cfg.talker.min_tokens or 0)

    def _talker_prefill(self, r: ResponseState) -> torch.Tensor | None:
        """Talker prefill: the prompt positions not already in the conversation's talker slot
        (kept across turns: the prompt of turn N+1 extends the prompt of turn N), then the speaker's
        bos and the first reply vector. None while every talker slot is busy."""
        conv = r.conv
        if self._talker_slot(conv) is None:
            return None
        speaker = self.ckpt.speakers[r.spec.voice]
        prompt_keys = conv.cached_keys[: r.prompt_len]
        reuse = conv.common_prefix_of(conv.talker_keys, prompt_keys)
        conv.crop_talker(reuse)
        prompt = conv.talker_prompt()[reuse : r.prompt_len]
        bos = self.thinker.embed([speaker.bos_token])
        first = r.talker_queue.popleft().view(1, -1)
        vectors = torch.cat([prompt, bos, first]).to(self.talker.device)
        conv.talker_keys = list(prompt_keys)
        r.talker_started = True
        r.talker_len = r.prompt_len + 2
        seen = {self.special.codec_pad, self.special.codec_bos}
        if r.prompt_len:
            seen.add(self.special.codec_mask)
        self.code_sampler.reset(conv.talker_slot, seen)
        r.t2w = self.token2wav.start(
            speaker.cond, speaker.ref_mel, voice=r.spec.voice,
            generator=self._generator(self.t2w_device), max_codes=self.max_codes, quick=self._quick_first_chunk(conv),
        )
        return self.talker.prefill(
            vectors, codec_pad=self.special.codec_pad, codec_bos=self.special.codec_bos, slot=conv.talker_slot,
            start=reuse,
        )

    def _quick_first_chunk(self, conv: ConversationState) -> bool:
        """Whether a reply's audio starts with the quick first chunk (``ChunkingConfig.quick_first_chunk_frames``):
        only while at most ``quick_first_chunk_max_open`` other replies' audio is still being synthesized, and not
        under the load that holds first audio for a start buffer (a quick chunk would only be held: a job for
        nothing)."""
        chunking = self.token2wav.cfg
        if chunking.quick_first_chunk_frames is None or self._holds_start(conv):
            return False
        open_streams = sum(1 for r in self.responses.values() if r.t2w is not None and not r.t2w.done)
        return open_streams <= chunking.quick_first_chunk_max_open

    def _next_talker_vector(self, r: ResponseState) -> torch.Tensor | None:
        """Next thinker vector for the talker: reply tokens, then text-eos once, then text-pad."""
        if r.talker_queue:
            return r.talker_queue.popleft()
        if not r.thinker_done:
            return None  # wait for the thinker: the talker never runs ahead of the text
        index = 1 if r.text_eos_sent else 0
        r.text_eos_sent = True
        return self._text_end_vectors[index]

    def _accept_code(self, r: ResponseState, code: int) -> None:
        if r.talker_done:
            return  # a chained step after the reply's last code (:meth:`_chain_steps`): its code means nothing
        self.counters["talker_tokens_total"] += 1
        dit_code = self.to_token2wav(code, self.codec_stop)
        if dit_code is None:
            self._end_talker(r)
            return
        r.codes.append(code)
        if self.timeline is not None and not r.codes[1:]:
            self.timeline.response(time.perf_counter(), r.id, "first_code")
        r.mark("talker_first_code_ms")
        r.codec_tokens += 1
        r.last_code = code
        r.t2w.push([dit_code])
        if r.codec_tokens >= self.max_codes:
            self._end_talker(r)

    def _end_talker(self, r: ResponseState) -> None:
        r.talker_done = True
        if self.timeline is not None:
            self.timeline.response(time.perf_counter(), r.id, "codes_done")
        self._release_talker(r)
        if r.t2w is not None:
            r.t2w.finish()

    def _release_talker(self, r: ResponseState) -> None:
        """Drop this reply's positions from the conversation's talker cache; keep the prompt (the reply's
        positions lie past ``talker_keys`` in the slot and are overwritten by the next prefill)."""
        r.talker_len = 0

    # -- token2wav --------------------------------------------------------------------------------
    def _t2w_busy(self, r: ResponseState) -> bool:
        return self.t2w_worker is not None and r.t2w is not None and self.t2w_worker.busy_with(r.t2w)

    def _token2wav_job(self, ready: list[ResponseState]) -> tuple[list[ResponseState], Token2WavJob | None]:
        """The responses whose next chunk to make now, and the job (pipeline/scheduler/token2wav_jobs.py: first
        chunks alone, then the streams with the least audio ahead, one batch at most; None when ``ready`` is empty)."""
        now = time.perf_counter()
        # a reply whose first audio is held counts 0 ms ahead: someone waits for it to start
        candidates = [
            ChunkCandidate(i, first=r.first_audio_at is None,
                           audio_ahead_ms=r.playout.ahead_ms(now) if r.playout.started else 0.0)
            for i, r in enumerate(ready)
        ]  # fmt: skip
        job = pick_job(candidates, self.token2wav.max_batch, starving_margin_ms=self.starving_margin())
        return ([ready[i] for i in job.keys], job) if job else ([], None)

    def starving_margin(self) -> float:
        """The starving margin (ms) of the next job: the configured one, or with ``starving_margin_from_jobs`` at least
        the longest recent first-chunk job plus the longest recent later-chunk job."""
        if not self.starving_margin_from_jobs:
            return float(self.starving_margin_ms)
        return self.recent_jobs.starving_margin_ms(self.starving_margin_ms)

    def _collect_token2wav(self) -> bool:
        """Emit the chunks the worker finished since the last step (engine thread: events stay in order)."""
        if self.t2w_worker is None:
            return False
        results = self.t2w_worker.poll()
        for result in results:
            self._token2wav_done(result)
        return bool(results)

    def _token2wav_done(self, result) -> None:
        jobs, self._t2w_jobs = self._t2w_jobs, {}
        if self._t2w_job_started is not None:
            started, first, streams = self._t2w_job_started
            self.recent_jobs.record(first, (time.perf_counter() - started) * 1000)
            if self.timeline is not None:
                self.timeline.job(started, time.perf_counter(), streams=streams, first=first)
            self._t2w_job_started = None
        for i, stream in enumerate(result.streams):
            r = jobs.get(id(stream))
            if r is None or r.id not in self.responses or r.t2w is not stream:
                stream.close()  # its response ended while the chunk was being made
                continue
            if result.error is None:
                self._emit_audio(r, result.chunks[i])
                continue
            try:  # the batch failed: retry alone, so that only a faulty stream fails
                self._emit_audio(r, r.t2w.step())
            except Exception as exc:  # noqa: BLE001 - isolate this response's failure
                self._fail(r, exc)

    def _token2wav_step(self, ready: list[ResponseState], first: bool = False) -> None:
        """One chunk for every response in ``ready`` (streams with their next chunk ready; first chunks if
        ``first``), their DiT windows batched in one pass (one graph launch per batch on GPU). If the batch fails,
        each response is retried alone so that only the faulty one fails."""
        if not ready:
            return
        started = time.perf_counter()
        for r in ready:
            r.mark("token2wav_first_job_ms")
            r.playout.job_started(started)
        try:
            chunks = self.token2wav.step_many([r.t2w for r in ready])
        except Exception:  # noqa: BLE001 - find the faulty stream by retrying one by one
            log.exception("batched token2wav step failed; retrying each stream alone")
            for r in ready:
                try:
                    self._emit_audio(r, r.t2w.step())
                except Exception as exc:  # noqa: BLE001 - isolate this response's failure
                    self._fail(r, exc)
            return
        self.recent_jobs.record(first, (time.perf_counter() - started) * 1000)
        if self.timeline is not None:
            self.timeline.job(started, time.perf_counter(), streams=len(ready), first=first)
        for r, pcm in zip(ready, chunks):
            self._emit_audio(r, pcm)

    def _emit_audio(self, r: ResponseState, pcm: np.ndarray) -> None:
        """A chunk made: sent now, or held with the reply's first chunks (:attr:`start_buffer_ms`, decided when its
        first chunk is made) and sent with them once they hold enough."""
        if not len(pcm):
            return
        now = time.perf_counter()
        if r.first_audio_at is None:
            r.first_audio_at = now
            r.mark("token2wav_first_made_ms")
            if self._holds_start(r.conv):
                r.start_buffer = StartBuffer(self.start_buffer_ms)
                if self.timeline is not None:
                    self.timeline.response(now, r.id, "held")
        if r.start_buffer is None:
            self._send_audio(r, pcm, now)
            return
        for held in r.start_buffer.add(pcm, 1000.0 * len(pcm) / OUTPUT_SAMPLE_RATE):
            self._send_audio(r, held, now)
        if r.start_buffer.spent:
            self._end_hold(r, now)

    def _holds_start(self, conv: ConversationState) -> bool:
        """Whether a reply of ``conv`` whose first chunk is made now holds it (pipeline/output/start_buffer.py)."""
        if not self.start_buffer_ms:
            return False
        busy = sum(1 for c in self.conversations.values()
                   if c is not conv and (c.open_audio or c.active_response is not None))  # fmt: skip
        return holds_start(self.start_buffer_ms, busy, self.start_buffer_busy)

    def _end_hold(self, r: ResponseState, now: float) -> None:
        """The start buffer is released (its chunks sent): count how long it held the first audio."""
        r.start_buffer = None
        r.start_held_ms = (now - r.first_audio_at) * 1000.0
        self.counters["audio_start_holds_total"] += 1
        self.counters["audio_start_held_ms_total"] += round(r.start_held_ms)

    def _send_audio(self, r: ResponseState, pcm: np.ndarray, now: float) -> None:
        """The chunk leaves the engine: the reply's player (pipeline/output/playout.py) takes it, the sink gets it."""
        r.mark("token2wav_first_chunk_ms")
        waited_ms = r.playout.deliver(now, len(pcm) / OUTPUT_SAMPLE_RATE)
        if self.timeline is not None:
            self.timeline.chunk(now, r.id, r.playout.chunks - 1, 1000.0 * len(pcm) / OUTPUT_SAMPLE_RATE, waited_ms)
        if waited_ms > 0:
            self.counters["audio_underruns_total"] += 1
            self.counters["audio_starved_ms_total"] += round(waited_ms)
        r.spec.sink(AudioChunk(pcm=pcm, start_sample=r.samples, codec_tokens_so_far=r.codec_tokens))
        r.samples += len(pcm)
        self.counters["audio_samples_total"] += len(pcm)
        r.item.audio_ms = 1000.0 * r.samples / OUTPUT_SAMPLE_RATE

    # -- endings ----------------------------------------------------------------------------------
    def _finish(self, r: ResponseState, status: ResponseStatus, reason: str | None, error: Exception | None = None):
        if r.start_buffer is not None:  # the reply's audio ended before the start buffer filled
            if status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE):
                now = time.perf_counter()
                for held in r.start_buffer.release():
                    self._send_audio(r, held, now)
                self._end_hold(r, now)
            r.start_buffer = None  # cancelled or failed: what was held was never sent, and is not
        self.responses.pop(r.id, None)
        if self.timeline is not None:
            self.timeline.response(time.perf_counter(), r.id, status.value)
        self._finished += 1
        r.phase = Phase.FINISHED
        r.item.open = False
        if r.conv.active_response == r.id:
            r.conv.active_response = None
            r.conv.dirty = True  # the reply's footer and anything said meanwhile get prefilled
        self._release_talker(r)
        if r.t2w is not None:
            if not self._t2w_busy(r):  # else closed when the worker hands it back
                r.t2w.close()
            r.t2w = None
        tail = r.detok.flush()
        if tail and status is not ResponseStatus.FAILED:
            r.spec.sink(TextDelta(text=tail, token_ids=()))
        usage = Usage(
            input_text_tokens=r.input_text_tokens, input_audio_tokens=r.input_audio_tokens,
            cached_tokens=r.cached_tokens, output_text_tokens=len(r.item.reply_ids),
            output_audio_tokens=r.codec_tokens,
        )
        late = f" ({', '.join(map(str, r.playout.late))})" if r.playout.late else ""
        held = f"first audio held {r.start_held_ms:.0f} ms, " if r.start_held_ms is not None else ""
        log.info("response %s %s after %.0f ms: %d text + %d codec tokens, %d samples, %s%d underruns (%.0f ms)%s of a "
                 "real-time player; milestones (ms) %s", r.id, status.value, (time.perf_counter() - r.started_at) * 1000,
                 len(r.item.reply_ids), r.codec_tokens, r.samples, held, r.playout.underruns, r.playout.starved_ms,
                 late, {k: round(v, 1) for k, v in r.milestones.items()})
        r.spec.sink(ResponseDone(
            status=status, usage=usage, text=r.detok.text, text_token_ids=tuple(r.item.reply_ids),
            audio_codes=tuple(r.codes), audio_samples=r.samples, reason=reason, error=error,
            timings=StageTimings(**r.milestones, started_at_s=r.started_at_s),
        ))

    def _fail(self, r: ResponseState, exc: Exception) -> None:
        if not isinstance(exc, PipelineError):
            log.exception("response %s failed inside the engine", r.id)
            # the traceback is in the server log; clients get no internals
            exc = EngineFailure("the engine failed while generating this response")
        if r.phase is Phase.PREFILL and isinstance(exc, PipelineError) and not isinstance(exc, EngineFailure):
            r.conv.items.remove(r.item)  # refused before anything was generated: leave no trace
        else:
            self.release_slots(r.conv)  # a stage may have died mid-update: never keep a possibly corrupt cache
        self._finish(r, ResponseStatus.FAILED, "error", exc)

    def _response_seed(self) -> int:
        """The noise seed of a new response's sampling (pipeline/runners/sampling.py): drawn from the OS, or with an engine
        seed, the seed and the response's number (so a seeded engine repeats its replies)."""
        if self.seed is None:
            return secrets.randbits(32)
        self._seed_counter += 1
        return (self.seed * 1_000_003 + self._seed_counter) & 0xFFFFFFFF

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        self._seed_counter += 1
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed + self._seed_counter)
        return gen
