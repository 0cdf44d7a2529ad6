"""Streaming code2wav for Qwen3-Omni: codec frames in, 24 kHz audio out, chunk by chunk, equal to the one-shot decode.

The talker emits one frame of ``num_quantizers`` (16) codes per 80 ms of audio (12.5 frames/s). transformers'
``Qwen3OmniMoeCode2Wav`` decodes a whole utterance ``codes (1, 16, T)``: the mean of the frame's code embeddings, a
causal sliding-window transformer, then a ConvNet (``upsample`` + ``decoder``, ``total_upsample`` samples a frame) that
returns ``T * samples_per_frame - deficit`` samples (:mod:`.code2wav_geometry`). A stream here produces exactly those
samples (float rounding aside), in order, as frames arrive:

- Transformer: run once per frame, incrementally, with a sliding-window key/value cache per stream at absolute RoPE
  positions (:mod:`.code2wav_transformer`): exact whatever the chunking, and no frame is ever re-run through it.
  Re-running a window instead would need ``num_hidden_layers * (sliding_window - 1)`` frames of context to be exact
  (568 frames, 45 s, in the released checkpoint; transformers' ``chunked_decode`` uses 25 and is not exact, and it also
  drops the last ``deficit`` samples of every chunk).
- ConvNet: each chunk re-runs it over the chunk's hidden frames preceded by ``left_context_frames`` hidden frames before
  the frame of its first sample. By default that is :attr:`.ConvGeometry.left_context_frames` (10 frames in the
  released checkpoint): the deepest any output sample reads back through the causal kernels, so every sample the chunk
  keeps is computed from the same hidden frames as in the one-shot pass, and the window's zero padding is never read.
  The ConvNet's transposed convolutions look one step ahead, but their trim drops exactly the samples that would need a
  later frame: a chunk ending at frame ``b`` emits up to ``samples(b)``, all final, and the next chunk continues there.
  Nothing is held back, no seam is blended, and a finished stream needs no flush chunk.

The chunk schedule (:class:`Code2WavChunking`) only trades latency against work: a later chunk of ``n`` frames re-runs
the ConvNet over about ``n + left_context_frames`` frames (``+ 1`` with the released checkpoint, whose first sample of a
chunk lies in the frame before its first new frame), so small chunks cost more ConvNet work per second of audio, and
every chunk is one more batched job.

Calling order and states are those of :class:`pipeline.models.synthesis.Token2WavStream`. All model
calls run under ``torch.inference_mode()`` on the module's device and in its dtype; eager (no CUDA graphs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import Tensor
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from pipeline.errors import ConfigError, InvalidInputError, PipelineError
from pipeline.models.common.codec_stream import CodecStream, next_chunks
from pipeline.models.family import StreamStatus
from pipeline.models.qwen3_omni.code2wav_chunking import Code2WavChunking
from pipeline.models.qwen3_omni.code2wav_geometry import ConvGeometry
from pipeline.models.qwen3_omni.code2wav_transformer import KVWindow, transformer_step

__all__ = [
    "DEFAULT_MAX_BATCH",
    "Code2WavChunking",
    "Code2WavStream",
    "Code2WavStreamStateError",
    "StreamingCode2Wav",
    "one_shot",
]

DEFAULT_MAX_BATCH = 8
"""Streams whose chunks share one batched pass in ``step_many``."""


class Code2WavStreamStateError(PipelineError):
    """A :class:`Code2WavStream` method was called in a state that does not allow it (``step()`` with no chunk ready,
    ``push()`` after ``finish()``, any use after ``close()``)."""

    code = "token2wav_stream_state"


def _frames_tensor(frames: Sequence[Sequence[int]] | Tensor, model: Qwen3OmniMoeCode2Wav) -> Tensor:
    """``frames`` as a host (n, num_quantizers) long tensor, validated: integer codes in ``[0, codebook_size)``.
    A device tensor is copied to the host (which waits for its device's queued work)."""
    quantizers, codebook = model.config.num_quantizers, model.config.codebook_size
    try:
        tensor = torch.as_tensor(frames).cpu()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidInputError(
            f"codec frames must be a (n, {quantizers}) array of codes: {exc}", param="codes"
        ) from None
    if tensor.numel() == 0:
        return torch.zeros(0, quantizers, dtype=torch.long)
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise InvalidInputError(f"codec codes must be integers, got {tensor.dtype}", param="codes")
    if tensor.ndim != 2 or tensor.shape[1] != quantizers:
        raise InvalidInputError(
            f"codec frames must have shape (n, {quantizers}), got {tuple(tensor.shape)}", param="codes"
        )
    tensor = tensor.to(torch.long)
    if int(tensor.min()) < 0 or int(tensor.max()) >= codebook:
        raise InvalidInputError(f"codec codes must lie in [0, {codebook}); strip talker special ids", param="codes")
    return tensor


def _convnet(model: Qwen3OmniMoeCode2Wav, hidden: Tensor) -> Tensor:
    """The module's ConvNet and final clamp, as its forward runs them: (B, hidden, frames) -> (B, samples)."""
    for blocks in model.upsample:
        for block in cast(torch.nn.ModuleList, blocks):  # transformers builds each upsampling stage as a ModuleList
            hidden = block(hidden)
    for block in model.decoder:
        hidden = block(hidden)
    return hidden.clamp(min=-1, max=1)[:, 0]


@dataclass(frozen=True)
class _Chunk:
    """What one chunk of a stream computed, before the stream moves past it."""

    end: int  # the frame the chunk ends at
    window: KVWindow
    hidden: Tensor  # (hidden, frames) of the frames the next chunk's ConvNet window may need
    hidden_start: int
    samples: np.ndarray


class StreamingCode2Wav:
    """Factory of per-utterance streams over one ``Qwen3OmniMoeCode2Wav`` (put in eval mode; its device and dtype).

    Streams share the module and are independent of each other; neither they nor this object are thread-safe (one
    thread drives them at a time). ``max_batch`` bounds the streams of one batched pass in :meth:`step_many`.
    Raises CheckpointError for a module whose ConvNet :class:`.ConvGeometry` cannot describe, ConfigError for a bad
    ``max_batch``.
    """

    def __init__(
        self, model: Qwen3OmniMoeCode2Wav, cfg: Code2WavChunking | None = None, *, max_batch: int = DEFAULT_MAX_BATCH
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}", param="max_batch")
        self.model = model.eval()
        self.cfg = cfg or Code2WavChunking()
        self.geometry = ConvGeometry.of(model)
        self.left_context_frames = (
            self.geometry.left_context_frames if self.cfg.left_context_frames is None else self.cfg.left_context_frames
        )
        """Hidden frames re-run before the frame of a chunk's first sample (the schedule's, or the exact need)."""
        self.max_batch = max_batch
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype

    @property
    def samples_per_frame(self) -> int:
        return self.geometry.samples_per_frame

    def start(self, max_codes: int, *, quick: bool = False) -> Code2WavStream:
        """Open a stream for one utterance of at most ``max_codes`` frames (within the module's
        ``max_position_embeddings``, else InvalidInputError). ``quick``: it starts with the quick first chunk (the
        schedule must set ``quick_first_chunk_frames``, else ConfigError)."""
        limit = self.model.config.max_position_embeddings
        if isinstance(max_codes, bool) or not isinstance(max_codes, int) or not 0 <= max_codes <= limit:
            raise InvalidInputError(
                f"max_codes must be an integer in [0, {limit}], got {max_codes!r}", param="max_codes"
            )
        cfg = self.cfg.quick() if quick else self.cfg
        with torch.inference_mode():
            return Code2WavStream(self, KVWindow.empty(self.model), max_codes, cfg)

    def warm_up(self, max_batch: int = 1) -> None:
        """Run throwaway streams (a first chunk, then steady chunks with their whole left context) through one batched
        pass of up to ``max_batch`` streams, so that the first reply does not pay the kernels' first calls (library
        handles, algorithm choice, allocator growth). Keeps no state."""
        streams = min(max(1, max_batch), self.max_batch)
        steady = math.ceil((self.left_context_frames + 1) / self.cfg.chunk_frames) + 1
        frames = min(
            self.cfg.first_chunk_frames + steady * self.cfg.chunk_frames, self.model.config.max_position_embeddings
        )
        opened = [self.start(frames) for _ in range(streams)]
        try:
            silence = torch.zeros(frames, self.model.config.num_quantizers, dtype=torch.long)
            for stream in opened:
                stream.push(silence)
                stream.finish()
            while not all(s.done for s in opened):
                self.step_many([s for s in opened if not s.done])
        finally:
            for stream in opened:
                stream.close()

    def step_many(self, streams: Sequence[Code2WavStream]) -> list[np.ndarray]:
        """Synthesize the next chunk of each of ``streams``, ``max_batch`` of them per batched pass. Returns each
        stream's samples, in order, as its ``step()`` would (equal up to float rounding). Every stream must be ready,
        opened by this synthesizer and listed once; otherwise Code2WavStreamStateError (or ValueError) is raised before
        any stream changes; if a pass fails, no stream changes."""
        ends = next_chunks(self, streams)
        chunks: list[_Chunk] = []
        with torch.inference_mode():
            for first in range(0, len(streams), self.max_batch):
                batch = slice(first, first + self.max_batch)
                chunks += self._synthesize(streams[batch], ends[batch])
        # only now, with every chunk made, does any stream advance
        return [stream._advance(chunk) for stream, chunk in zip(streams, chunks)]

    # -- internals

    def _synthesize(self, streams: Sequence[Code2WavStream], ends: list[int]) -> list[_Chunk]:
        """One batched pass: the transformer over each stream's new frames, then the ConvNet over each stream's window
        (right-padded: the samples kept never read the padding, see :mod:`.code2wav_geometry`)."""
        model, spf = self.model, self.samples_per_frame
        new = [end - s.frames_done for s, end in zip(streams, ends)]
        states = [s._state() for s in streams]
        codes = torch.zeros(len(streams), max(new), model.config.num_quantizers, dtype=torch.long)
        for row, ((_, pending, _), n) in enumerate(zip(states, new)):
            codes[row, :n] = pending[:n]
        codes = codes.transpose(1, 2).to(self.device)  # (B, quantizers, n), as the module's forward takes codes
        embeds = model.code_embedding(codes + model.code_offset).mean(1)
        hidden, windows = transformer_step(model, embeds, new, [window for window, _, _ in states])
        starts = [max(0, s.samples_emitted // spf - self.left_context_frames) for s in streams]
        histories = [
            torch.cat([kept[:, start - s._hidden_start :], hidden[row, :n].T], dim=1)
            for row, (s, (_, _, kept), n, start) in enumerate(zip(streams, states, new, starts))
        ]
        width = max(h.shape[1] for h in histories)
        padded = torch.zeros(len(streams), model.config.hidden_size, width, device=self.device, dtype=self.dtype)
        for row, (history, start, end) in enumerate(zip(histories, starts, ends)):
            padded[row, :, : end - start] = history
        wav = _convnet(model, padded).float().cpu()
        chunks = []
        for row, (stream, start, end) in enumerate(zip(streams, starts, ends)):
            offset = start * spf
            samples = wav[row, stream.samples_emitted - offset : self.geometry.samples(end) - offset]
            keep = max(0, self.geometry.samples(end) // spf - self.left_context_frames)
            chunks.append(
                _Chunk(
                    end=end,
                    window=windows[row],
                    hidden=histories[row][:, keep - start :].clone(),
                    hidden_start=keep,
                    samples=samples.numpy().astype(np.float32, copy=True),
                )
            )
        return chunks


class Code2WavStream(CodecStream):
    """Streaming decode of one utterance (:class:`~pipeline.models.common.codec_stream.CodecStream`). Create with
    :meth:`StreamingCode2Wav.start`.

    Calling order: any interleaving of ``push(frames)`` and, whenever ``ready()``, ``step()`` (or the owner's
    ``step_many([...])``); then ``finish()``; then ``step()`` until ``done``; ``close()`` at any time (idempotent)
    frees the tensors. Each ``step()`` decodes exactly one chunk and returns its samples (float32, 24 kHz, contiguous
    with the previous chunk's; never empty). Over the stream the chunks concatenate to :func:`one_shot` of all frames
    pushed (equal up to float rounding).
    """

    STATE_ERROR = Code2WavStreamStateError
    KIND = "code2wav"

    def __init__(self, owner: StreamingCode2Wav, window: KVWindow, max_codes: int, cfg: Code2WavChunking) -> None:
        self._cfg = cfg
        """This stream's schedule: the owner's, or its quick variant."""
        self._window: KVWindow | None = window
        # Frames stay on the host until their chunk runs: pushing one per talker step never waits on the device.
        self._pending: Tensor | None = torch.zeros(0, owner.model.config.num_quantizers, dtype=torch.long)
        self._hidden: Tensor | None = torch.zeros(
            owner.model.config.hidden_size, 0, device=owner.device, dtype=owner.dtype
        )
        self._hidden_start = 0  # the frame of self._hidden's first column
        super().__init__(owner, max_codes)

    def push(self, frames: Sequence[Sequence[int]] | Tensor) -> None:
        """Append codec frames: a sequence of frames of ``num_quantizers`` codes each (codebook 0, then the code
        predictor's), or an (n, num_quantizers) integer tensor. InvalidInputError for a wrong shape, a code outside
        ``[0, codebook_size)`` or more than ``max_codes`` frames in all; Code2WavStreamStateError unless open."""
        self._require(StreamStatus.OPEN, "push")
        tensor = _frames_tensor(frames, self._owner.model)
        total = self.codes_received + tensor.shape[0]
        if total > self.max_codes:
            raise InvalidInputError(f"stream holds at most {self.max_codes} frames, got {total}", param="codes")
        _, pending, _ = self._state()
        self._pending = torch.cat([pending, tensor])
        self.codes_received = total

    def step(self) -> np.ndarray:
        """Decode the next ready chunk; return its samples. Raises Code2WavStreamStateError if none is ready."""
        return self._owner.step_many([self])[0]

    # -- internals (the owner decodes a chunk, then calls _advance)

    def _next_end(self) -> int:
        return self.frames_done + self._cfg.chunk_size(self.chunks_emitted)

    def _codes_needed(self) -> int:
        return self._next_end()

    def _drained(self) -> bool:
        """Every frame pushed is decoded already: ``finish()`` leaves no chunk to make."""
        return self.codes_received == self.frames_done

    def _next_chunk(self) -> int | None:
        """The frame the next chunk would end at, or None when no chunk is ready."""
        if self.status is StreamStatus.OPEN:
            end = self._next_end()
            return end if self.codes_received >= end else None
        if self.status is StreamStatus.FINISHED and self.codes_received > self.frames_done:
            return min(self._next_end(), self.codes_received)
        return None

    def _state(self) -> tuple[KVWindow, Tensor, Tensor]:
        """The KV window, the pending frames (host) and the hidden states kept for the next ConvNet window;
        Code2WavStreamStateError once the stream released its tensors."""
        if self._window is None or self._pending is None or self._hidden is None:
            raise Code2WavStreamStateError(f"the {self.KIND} stream is closed")
        return self._window, self._pending, self._hidden

    def _advance(self, chunk: _Chunk) -> np.ndarray:
        _, pending, _ = self._state()
        self._pending = pending[chunk.end - self.frames_done :]
        self._window, self._hidden, self._hidden_start = chunk.window, chunk.hidden, chunk.hidden_start
        self.frames_done = chunk.end
        self.samples_emitted += chunk.samples.size
        self.chunks_emitted += 1
        if self.status is StreamStatus.FINISHED and self._drained():
            self._set_done()
        return chunk.samples

    def _release(self) -> None:
        self._window = self._pending = self._hidden = None

    def _not_ready_message(self) -> str:
        if self.status is not StreamStatus.OPEN:
            return f"no chunk to decode: the stream is {self.status.value}"
        return (
            f"no chunk ready: {self.codes_received} frames received, the next chunk ends at frame {self._next_end()}; "
            "push more frames or finish()"
        )


def one_shot(model: Qwen3OmniMoeCode2Wav, frames: Sequence[Sequence[int]] | Tensor) -> np.ndarray:
    """Non-streaming reference: the whole utterance's frames ((T, num_quantizers), validated as ``push`` does) through
    the module's own ``forward``, under inference mode. Returns its float32 samples at 24 kHz
    (``T * total_upsample - deficit`` of them; none for no frame)."""
    codes = _frames_tensor(frames, model)
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    device = next(model.parameters()).device
    with torch.inference_mode():
        wav = model(codes.T.unsqueeze(0).to(device))
    return wav[0, 0].float().cpu().numpy().astype(np.float32, copy=True)
