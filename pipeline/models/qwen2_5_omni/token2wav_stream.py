"""Streaming token2wav for Qwen2.5-Omni: sliding-window DiT (flow matching) + BigVGAN with overlap seams.

Codec tokens arrive one by one from the talker; :class:`Qwen25OmniToken2WavStream` turns them into 24 kHz float32
audio chunk by chunk, following the plan of :mod:`pipeline.models.qwen2_5_omni.chunk_schedule`:

- DiT: each chunk's frames are synthesized by running the whole ODE (RK4, ``ode_steps`` time points,
  classifier-free guidance batched with the unconditioned branch as the reference sampler does) on the
  chunk plus its past/future context frames. The initial noise of a window is the slice of ONE noise
  tensor per utterance at the window's absolute frames, positions (RoPE) and attention blocks are the
  absolute ones, so a window computes exactly what a one-shot pass computes whenever the context covers
  the DiT's receptive field (it does not with trained settings: context frames feel their own missing
  context through the look-ahead/look-back layers, so streaming is close to, not equal to, one-shot).
- BigVGAN: each chunk re-runs up to ``vocoder_overlap_frames`` already-final mel frames before its own,
  drops the output of the first ``vocoder_trim_frames`` and holds back its own last
  ``overlap - trim`` frames until the next chunk supplies their right context: no seam clicks. A first chunk vocoded
  with provisional look-ahead frames (``first_vocoder_lookahead_frames``) emits samples whose right context the next
  chunk recomputes; the next chunk's first :data:`PROVISIONAL_SEAM_FADE_SAMPLES` cross-fade from the provisional
  continuation, so that seam has no step either.

Speaker conditioning (ECAPA on the reference mel, the ``cond`` vector) is computed once per voice and cached by the
synthesizer (keyed by an explicit voice name or by the identity of the speaker tensors). All model calls run under
``torch.inference_mode()``. The model must be float32 (the reference requires it).

GPU path (model on CUDA, ``cuda_graphs`` on by default there): the DiT windows of one or several streams
(:meth:`StreamingToken2Wav.step_many`) are padded into a few static shapes and the whole ODE solve of a shape is
replayed from a CUDA graph, as is BigVGAN for the regular chunk lengths (:mod:`.token2wav_graphs`); other vocoder
lengths (the last chunk) run eagerly. Padding frames are masked out of the real frames' attention, so the audio
equals the eager path's up to float rounding. On CPU, ``step()`` runs exactly the eager computation.

The DiT's velocity field is :mod:`.dit`'s (transformers' arithmetic, with what does not depend on the ODE state made
once: the modulation of every evaluation time per synthesizer, the attention masks per solve). Compiled
(``compile_dit``, the stage config's ``compile``; on by default with CUDA in the engine), each DiT block runs through
``torch.compile`` (:class:`.dit.CompiledDitBlock`, one compiled graph shared by all blocks and all window shapes),
compiled at :meth:`StreamingToken2Wav.warm_up` before any graph is captured (the graphs then record the compiled
kernels). With ``fused_vocoder`` each of BigVGAN's anti-aliased activations runs as two Triton kernels
(:mod:`.vocoder`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

from pipeline.errors import CheckpointError, ConfigError, InvalidInputError, PipelineError
from pipeline.kernels.devices import device_scope
from pipeline.models.common.codec_stream import CodecStream, next_chunks
from pipeline.models.qwen2_5_omni import vocoder
from pipeline.models.qwen2_5_omni.chunk_schedule import ChunkingConfig, ChunkPlan, plan_next_chunk
from pipeline.models.qwen2_5_omni.dit import (
    CompiledDitBlock,
    DitAttention,
    DitBlock,
    DitWeights,
    TimeModulation,
    WindowInputs,
    dit_velocity,
    dit_weights,
    guided,
    integrate,
)
from pipeline.models.qwen2_5_omni.token2wav_graphs import (
    CapturedCall,
    WindowJob,
    bucket_at_least,
    bucket_holding,
    pack_windows,
    slot_sizes,
)
from pipeline.models.synthesis import StreamStatus

log = logging.getLogger(__name__)

PROVISIONAL_SEAM_FADE_SAMPLES = 240
"""Samples (10 ms at 24 kHz, one mel frame) over which the chunk after a provisional seam fades in from the vocoder's
provisional continuation of the samples already emitted. Why: those samples were computed with look-ahead mel frames
that the next chunk recomputes, so the two versions differ by ~1 % of the peak (tiny random token2wav) and a hard cut
between them would be a step in the waveform; the continuation is seamless with what was emitted, and 10 ms is short
enough to be inaudible as a blend and long enough to spread the step below normal sample-to-sample changes."""

__all__ = [
    "DEFAULT_MAX_BATCH",
    "GraphStats",
    "StreamStatus",
    "StreamingToken2Wav",
    "Qwen25OmniToken2WavStream",
    "Token2WavStreamStateError",
    "one_shot",
]

_CFG_OFF_BELOW = 1e-5
"""Guidance scales below this run the conditioned branch alone (same threshold as the reference sampler)."""

DEFAULT_MAX_BATCH = 8
"""Streams whose DiT windows share one batched solve (and one CUDA graph launch) in ``step_many``."""

MAX_CACHED_VOICES = 32
"""Speaker conditionings kept per synthesizer (least recently used dropped first)."""


class Token2WavStreamStateError(PipelineError):
    """A :class:`Qwen25OmniToken2WavStream` method was called in a state that does not allow it
    (``step()`` with no chunk ready, ``push()`` after ``finish()``, any use after ``close()``), or a chunk's DiT window
    is off the attention blocks (an invariant of the chunk schedule, checked where the window is made)."""

    code = "token2wav_stream_state"


# ---------------------------------------------------------------------------------------------------
# DiT pieces shared by the streaming and one-shot paths


@dataclass(frozen=True)
class _Speaker:
    """Speaker conditioning of one voice (cached by the synthesizer), batched as [conditioned, unconditioned]
    when CFG is on.

    ``ref_embedding``: ECAPA(ref_mel) and ECAPA(zeros), (B, enc_dim); ``cond``: cond and zeros, (B, enc_emb_dim).
    """

    ref_embedding: Tensor
    cond: Tensor

    @property
    def batch(self) -> int:
        return self.cond.shape[0]


def _speaker(dit, cond: Tensor, ref_mel: Tensor, use_cfg: bool) -> _Speaker:
    if use_cfg:
        ref_mel = torch.cat([ref_mel, torch.zeros_like(ref_mel)], dim=0)
        cond = torch.cat([cond, torch.zeros_like(cond)], dim=0)
    return _Speaker(ref_embedding=dit.input_embed.spk_encoder(ref_mel), cond=cond)


def _ode_time_points(cfg: ChunkingConfig, device: torch.device) -> Tensor:
    """Flow-matching time points in [0, 1], bent by the sway schedule (denser near t=0 for sway < 0)."""
    t = torch.linspace(0, 1, cfg.ode_steps, device=device, dtype=torch.float32)
    return t + cfg.sway_coefficient * (torch.cos(torch.pi / 2 * t) - 1 + t)


def _features(dit, speaker: _Speaker, codes: Tensor) -> Tensor:
    """Per-row conditioning of a window, (rows, len(codes) * repeats, enc_dim + emb_dim + enc_emb_dim): speaker
    embedding, code embedding (codes dropped in the unconditioned row) and ``cond``, concatenated per frame."""
    use_cfg = speaker.batch == 2
    embeds = [dit.text_embed(codes)] + ([dit.text_embed(codes, drop_code=True)] if use_cfg else [])
    code_embed = torch.cat(embeds, dim=0)
    batch, length = code_embed.shape[0], code_embed.shape[1]
    return torch.cat(
        [
            speaker.ref_embedding.unsqueeze(1).expand(batch, length, -1),
            code_embed,
            speaker.cond.unsqueeze(1).expand(batch, length, -1),
        ],
        dim=-1,
    )


def _window_inputs(dit, speaker: _Speaker, codes: Tensor, first_frame: int) -> WindowInputs:
    """One stream's window on mel frames ``[first_frame, first_frame + len(codes) * repeats)``, unpadded.

    Everything that does not depend on (t, x) is computed once here: code embeddings, speaker features,
    RoPE tables and the block mask, all at absolute frame positions so that the window sees exactly the
    attention pattern a one-shot pass has on those frames.
    """
    static = _features(dit, speaker, codes)
    batch, length = static.shape[0], static.shape[1]
    positions = torch.arange(first_frame, first_frame + length, device=codes.device)
    rope = dit.rotary_embed(static, positions.unsqueeze(0).expand(batch, -1))
    blocks = positions // dit.block_size
    block_diff = (blocks.unsqueeze(0) - blocks.unsqueeze(1)).expand(batch, -1, -1).contiguous()
    return WindowInputs(static, rope, block_diff)


def _solve_packed(
    weights: DitWeights,
    modulation: TimeModulation,
    times: Tensor,
    guidance_scale: float,
    use_cfg: bool,
    block: DitBlock,
    noise: Tensor,
    features: Tensor,
    cos: Tensor,
    sin: Tensor,
    block_diff: Tensor,
) -> Tensor:
    """The ODE solve of packed windows (see :class:`.token2wav_graphs.PackedWindows`), a pure function of its
    tensors so that it can be captured: (slots, frames, mel_dim) noise -> (slots, frames, mel_dim) mel."""
    window = WindowInputs(features, (cos, sin), block_diff)
    return integrate(dit_velocity(weights, modulation, window, guidance_scale, use_cfg, block), noise, times)


def _vocode(bigvgan, mel: Tensor) -> Tensor:
    """(rows, mel_dim, frames) -> (rows, frames * hop) float32 samples on CPU (BigVGAN's own forward)."""
    return bigvgan(mel).reshape(mel.shape[0], -1).float()


def _check_model(model: Qwen2_5OmniToken2WavModel, cfg: ChunkingConfig) -> ChunkingConfig:
    """Validate the model against ``cfg``'s model facts; return ``cfg`` with the DiT block size filled in."""
    dit, voc = model.code2wav_dit_model.config, model.code2wav_bigvgan_model.config
    if cfg.dit_block_frames is None:
        cfg = replace(cfg, dit_block_frames=dit.block_size)
    hop = math.prod(voc.upsample_rates)
    checks = [
        (next(model.parameters()).dtype == torch.float32, "token2wav must run in float32 (as the reference requires)"),
        (dit.repeats == cfg.frames_per_code, f"DiT repeats={dit.repeats} != frames_per_code={cfg.frames_per_code}"),
        (hop == cfg.samples_per_frame, f"BigVGAN hop {hop} != samples_per_frame={cfg.samples_per_frame}"),
        (dit.mel_dim == voc.mel_dim, f"DiT mel_dim {dit.mel_dim} != BigVGAN mel_dim {voc.mel_dim}"),
        (dit.block_size == cfg.dit_block_frames, f"DiT block_size={dit.block_size} != {cfg.dit_block_frames=}"),
        # An odd kernel - rate would make the vocoder's output length differ from frames * hop.
        (
            all((k - r) % 2 == 0 for r, k in zip(voc.upsample_rates, voc.upsample_kernel_sizes)),
            "BigVGAN upsample kernels and rates must differ by even numbers",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise CheckpointError(message)
    return cfg


def _check_dit_attention(name: DitAttention | str, device: torch.device, dtype: torch.dtype) -> DitAttention:
    try:
        attention = DitAttention(name)
    except ValueError:
        choices = ", ".join(a.value for a in DitAttention)
        raise ConfigError(f"dit_attention must be one of {choices}, got {name!r}", param="dit_attention") from None
    if attention is DitAttention.TRITON:
        from pipeline.models.qwen2_5_omni.dit_attention import dit_attention_available

        if not dit_attention_available(device, dtype):
            raise ConfigError(
                f"dit_attention=triton needs Triton, the DiT on CUDA and a half-precision dit_dtype (got "
                f"{device.type}, {dtype})",
                param="dit_attention",
            )
    return attention


def _check_conditioning(dit, cond: Tensor, ref_mel: Tensor) -> None:
    cfg = dit.config
    if cond.ndim != 2 or cond.shape != (1, cfg.enc_emb_dim):
        raise InvalidInputError(f"cond must have shape (1, {cfg.enc_emb_dim}), got {tuple(cond.shape)}", param="cond")
    if ref_mel.ndim != 3 or ref_mel.shape[0] != 1 or ref_mel.shape[2] != cfg.mel_dim or ref_mel.shape[1] < 1:
        raise InvalidInputError(
            f"ref_mel must have shape (1, T, {cfg.mel_dim}), got {tuple(ref_mel.shape)}", param="ref_mel"
        )


def _codes_tensor(dit, codes: Sequence[int] | Tensor, device: torch.device) -> Tensor:
    """Codes as a (n,) long tensor on ``device``, validated against the DiT's code embedding table on the host
    (a check on a GPU tensor would wait for all queued GPU work)."""
    tensor = torch.as_tensor(codes, dtype=torch.long).reshape(-1).cpu()
    table = dit.text_embed.codec_embed.num_embeddings
    if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= table):
        raise InvalidInputError(f"codec ids must lie in [0, {table}); strip talker special tokens", param="codes")
    return tensor.to(device)


# ---------------------------------------------------------------------------------------------------
# Speaker conditioning, cached per voice


def _version(tensor: Tensor) -> int | None:
    """The in-place write counter of ``tensor`` (None for inference tensors, which have none)."""
    return None if tensor.is_inference() else tensor._version


@dataclass(frozen=True)
class _CachedSpeaker:
    speaker: _Speaker
    cond: Tensor  # the tensors it was computed from (strong references: their ids cannot be reused meanwhile)
    ref_mel: Tensor
    versions: tuple[int | None, int | None]

    def made_from(self, cond: Tensor, ref_mel: Tensor) -> bool:
        """The very same tensors, not written in place since."""
        same = self.cond is cond and self.ref_mel is ref_mel
        return same and self.versions == (_version(cond), _version(ref_mel))

    def same_values(self, cond: Tensor, ref_mel: Tensor) -> bool:
        """Other tensors holding the values this entry was computed from."""
        unchanged = self.versions == (_version(self.cond), _version(self.ref_mel))
        shapes = self.cond.shape == cond.shape and self.ref_mel.shape == ref_mel.shape
        return unchanged and shapes and torch.equal(self.cond, cond) and torch.equal(self.ref_mel, ref_mel)


class _SpeakerCache:
    """Speaker conditioning (ECAPA on the reference mel, with the unconditioned branch) per voice, LRU-bounded.

    Key: the explicit voice name when given (then other tensors with equal values also hit: callers that copy
    the speaker tensors to the device per request still compute ECAPA once), else the identity of the
    ``(cond, ref_mel)`` pair. A hit needs tensors unchanged since (version counters; inference tensors have none,
    so in-place writes to those are not detected). A name given with different values recomputes and replaces.
    """

    def __init__(self, compute: Callable[[Tensor, Tensor], _Speaker], capacity: int = MAX_CACHED_VOICES) -> None:
        self._compute = compute
        self._capacity = capacity
        self._entries: OrderedDict[tuple, _CachedSpeaker] = OrderedDict()
        self.computed = 0

    def get(self, cond: Tensor, ref_mel: Tensor, voice: str | None) -> _Speaker:
        key = ("voice", voice) if voice is not None else ("tensors", id(cond), id(ref_mel))
        entry = self._entries.get(key)
        if entry is not None and self._hit(entry, cond, ref_mel, named=voice is not None):
            self._entries.move_to_end(key)
            return entry.speaker
        speaker = self._compute(cond, ref_mel)
        self.computed += 1
        self._entries[key] = _CachedSpeaker(speaker, cond, ref_mel, (_version(cond), _version(ref_mel)))
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return speaker

    @staticmethod
    def _hit(entry: _CachedSpeaker, cond: Tensor, ref_mel: Tensor, *, named: bool) -> bool:
        return entry.made_from(cond, ref_mel) or (named and entry.same_values(cond, ref_mel))


# ---------------------------------------------------------------------------------------------------
# Batched DiT solves and the vocoder, CUDA graphs on GPU


@dataclass(frozen=True)
class GraphStats:
    """What a synthesizer's GPU path did so far. ``dit_graphs``: captured (window frames, slots) shapes;
    ``vocoder_graphs``: captured (mel frames, rows) vocoder shapes; ``*_replays``: graph launches; ``eager_*``: DiT
    solves (one per batch or per single window) and vocoder calls that ran without a graph; ``dit_compiled``: the
    DiT blocks run compiled (``compile_dit``), in graphs and eagerly alike; ``vocoder_fused``: the vocoder's
    anti-aliased activations run as two Triton kernels each (``fused_vocoder``)."""

    enabled: bool
    dit_graphs: tuple[tuple[int, int], ...]
    vocoder_graphs: tuple[tuple[int, int], ...]
    dit_replays: int
    vocoder_replays: int
    eager_dit_solves: int
    eager_vocoder_calls: int
    dit_compiled: bool = False
    vocoder_fused: bool = False


def _window_frames(cfg: ChunkingConfig) -> tuple[int, ...]:
    """DiT window lengths worth a graph, over ``cfg``'s schedules (with its quick first chunk, if set): each first chunk
    with its look-ahead, and each later chunk size (ramp and steady) with its full past and look-ahead. No window is
    longer than the largest (a chunk after the first has at most ``past_frames`` of past); shorter ones (early chunks,
    the last) are padded up to the nearest."""
    lengths = set()
    for c in cfg.schedules():
        lengths.add(c.first_chunk_frames + c.future_frames)
        lengths |= {c.past_frames + size + c.future_frames for size in (*c.ramp_frames, c.chunk_frames)}
    return tuple(sorted(lengths))


def _vocoder_frames(cfg: ChunkingConfig) -> tuple[int, ...]:
    """Vocoder input lengths worth a graph, over ``cfg``'s schedules: each first chunk (with its vocoded look-ahead),
    the second chunk after the re-run overlap that the first chunk can give, and each later chunk size after the full
    overlap. The vocoder cannot be padded exactly (its right edge would see the padding), so other lengths (a last
    chunk) run eagerly."""
    lengths = set()
    for c in cfg.schedules():
        lengths.add(c.first_chunk_frames + c.vocoder_lookahead(0))
        lengths.add(min(c.vocoder_overlap_frames, c.first_chunk_frames) + c.chunk_size(1) + c.vocoder_lookahead(1))
        lengths |= {
            c.vocoder_overlap_frames + size + c.vocoder_lookahead(i)
            for i, size in enumerate((*c.ramp_frames, c.chunk_frames), start=1)
        }
    return tuple(sorted(lengths))


class _BatchedDit:
    """ODE solves of DiT windows of one or more streams, in padded batches of static shape (frames, slots):
    frames rounded up to a :func:`_window_frames` length, slots to one of ``batch_sizes`` (the last is the most). With
    ``graphs`` each shape replays its CUDA graph (captured on first use or by :meth:`capture`); without, the same
    padded computation runs eagerly. ``block`` runs each transformer block, in graphs and eagerly alike (the
    compiled block when the synthesizer compiles the DiT)."""

    def __init__(
        self,
        dit,
        weights: DitWeights,
        modulation: TimeModulation,
        cfg: ChunkingConfig,
        times: Tensor,
        *,
        graphs: bool,
        batch_sizes: tuple[int, ...],
        block: DitBlock | None = None,
        capture_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self.dit, self.weights, self.modulation, self.cfg, self.times = dit, weights, modulation, cfg, times
        self.block = block or DitBlock()
        self.capture_stream = capture_stream
        self.use_cfg = cfg.guidance_scale >= _CFG_OFF_BELOW
        self.frame_buckets = _window_frames(cfg)
        self.graphs, self.batch_sizes, self.max_batch = graphs, batch_sizes, batch_sizes[-1]
        self.captured: dict[tuple[int, int], CapturedCall[Tensor]] = {}
        self.eager_solves = 0

    def solve(self, jobs: Sequence[WindowJob]) -> list[Tensor]:
        """Solved windows, (1, L, mel_dim) each, in the order of ``jobs``; tensors the caller owns."""
        out: list[Tensor] = []
        for start in range(0, len(jobs), self.max_batch):
            out += self._solve_batch(jobs[start : start + self.max_batch])
        return out

    def capture(self, frames: int, slots: int) -> None:
        """Capture the graph of one shape now, without replaying it (no-op if captured or graphs are off)."""
        if self.graphs and (frames, slots) not in self.captured:
            self._capture(frames, slots, self._blank_inputs(frames, slots))

    def evaluate_blank(self, frames: int, slots: int) -> None:
        """One velocity evaluation of a blank batch of this shape, eagerly (no graph): what compiles the blocks."""
        noise, features, cos, sin, block_diff = self._blank_inputs(frames, slots)
        window = WindowInputs(features, (cos, sin), block_diff)
        dit_velocity(self.weights, self.modulation, window, self.cfg.guidance_scale, self.use_cfg, self.block)(
            0, self.times[0], noise
        )

    def _blank_inputs(self, frames: int, slots: int) -> tuple[Tensor, ...]:
        mel_dim = self.dit.config.mel_dim
        width = self.dit.input_embed.proj.in_features - mel_dim
        groups = 2 if self.use_cfg else 1
        device = self.times.device
        blank = WindowJob(
            torch.zeros(1, frames, mel_dim, device=device),
            torch.zeros(groups, frames, width, device=device),
            first_frame=0,
        )
        packed = pack_windows([blank], frames=frames, slots=slots, block_size=self.dit.block_size)
        return self._inputs(packed)

    def _solve_batch(self, jobs: Sequence[WindowJob]) -> list[Tensor]:
        longest = max(job.frames for job in jobs)
        frames = bucket_at_least(longest, self.frame_buckets) or longest
        slots = bucket_holding(len(jobs), self.batch_sizes)
        packed = pack_windows(jobs, frames=frames, slots=slots, block_size=self.dit.block_size)
        inputs = self._inputs(packed)
        if self.graphs and frames in self.frame_buckets:
            solved = self._replay_or_capture(frames, slots, inputs)
        else:
            solved = self._solve(*inputs)
            self.eager_solves += 1
        # Copies: a graph's output buffer is overwritten by its next replay.
        return [packed.window(solved, slot).clone() for slot in range(len(jobs))]

    def _inputs(self, packed) -> tuple[Tensor, ...]:
        cos, sin = self.dit.rotary_embed(packed.features, packed.positions)
        return packed.noise, packed.features, cos, sin, packed.block_diff

    def _replay_or_capture(self, frames: int, slots: int, inputs: tuple[Tensor, ...]) -> Tensor:
        call = self.captured.get((frames, slots)) or self._capture(frames, slots, inputs)
        return call(*inputs)

    def _capture(self, frames: int, slots: int, inputs: tuple[Tensor, ...]) -> CapturedCall[Tensor]:
        # One warm-up solve (36 evaluations) initialises every library handle the capture needs.
        call = self.captured[(frames, slots)] = CapturedCall(
            self._solve, inputs, warmup_runs=1, capture_stream=self.capture_stream
        )
        return call

    def _solve(self, *inputs: Tensor) -> Tensor:
        return _solve_packed(
            self.weights, self.modulation, self.times, self.cfg.guidance_scale, self.use_cfg, self.block, *inputs
        )


class _Vocoder:
    """BigVGAN over chunks' mel frames, chunks of equal length batched (``batch_sizes[-1]`` rows at a time); with
    ``graphs`` a CUDA graph per (:func:`_vocoder_frames` length, one of ``batch_sizes`` rows), the batch padded with
    blank rows (rows are independent, so padding changes nothing in the real ones). Other lengths (a last chunk) run
    eagerly. Both run :func:`.vocoder.waveform` with ``activation`` for the anti-aliased activations (the modules' own
    forward, or the fused kernel)."""

    def __init__(
        self,
        bigvgan,
        cfg: ChunkingConfig,
        device: torch.device,
        *,
        graphs: bool,
        batch_sizes: tuple[int, ...],
        activation: vocoder.Activation = vocoder.reference_activation,
        capture_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self.bigvgan, self.graphs, self.capture_stream = bigvgan, graphs, capture_stream
        self.activation = activation
        self.batch_sizes, self.max_batch = batch_sizes, batch_sizes[-1]
        self.lengths = _vocoder_frames(cfg)
        self.floor = vocoder.min_amplitude(device)
        self.captured: dict[tuple[int, int], CapturedCall[Tensor]] = {}
        self.eager_calls = 0

    def many(self, mels: Sequence[Tensor]) -> list[Tensor]:
        """(1, mel_dim, frames_i) each -> (frames_i * hop,) float32 samples each, on the CPU, in order. Chunks of one
        length share a call; each call's samples are copied to the host before the next call (a graph's output
        buffer is overwritten by its next replay)."""
        by_length: dict[int, list[int]] = {}
        for i, mel in enumerate(mels):
            by_length.setdefault(mel.shape[2], []).append(i)
        out: dict[int, Tensor] = {}
        for frames, indices in by_length.items():
            for start in range(0, len(indices), self.max_batch):
                part = indices[start : start + self.max_batch]
                wav = self._call(torch.cat([mels[i] for i in part]), frames)
                for row, i in enumerate(part):
                    out[i] = wav[row]
        return [out[i] for i in range(len(mels))]

    def capture(self, frames: int, rows: int) -> None:
        slots = bucket_holding(rows, self.batch_sizes)
        if self.graphs and frames in self.lengths and (frames, slots) not in self.captured:
            mel_dim = self.bigvgan.config.mel_dim
            blank = torch.zeros(slots, mel_dim, frames, device=self.floor.device)
            self.captured[(frames, slots)] = CapturedCall(self._waveform, (blank,), capture_stream=self.capture_stream)

    def _call(self, mel: Tensor, frames: int) -> Tensor:
        """(rows, mel_dim, frames) -> (rows, frames * hop) on the CPU."""
        rows = mel.shape[0]
        if not (self.graphs and frames in self.lengths):
            self.eager_calls += 1
            return self._waveform(mel).cpu()
        slots = bucket_holding(rows, self.batch_sizes)
        if slots > rows:
            mel = torch.cat([mel, mel.new_zeros(slots - rows, *mel.shape[1:])])
        call = self.captured.get((frames, slots))
        if call is None:
            call = self.captured[(frames, slots)] = CapturedCall(
                self._waveform, (mel,), capture_stream=self.capture_stream
            )
        return call(mel)[:rows].cpu()

    def _waveform(self, mel: Tensor) -> Tensor:
        return vocoder.waveform(self.bigvgan, self.floor, mel, self.activation)


@contextlib.contextmanager
def _tf32_matmuls(enabled: bool) -> Iterator[None]:
    """TF32 for float32 CUDA matrix products inside the block when ``enabled``; the previous setting after."""
    if not enabled:
        yield
        return
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


# ---------------------------------------------------------------------------------------------------
# Streaming


class StreamingToken2Wav:
    """Factory of per-utterance streams over one float32 ``Qwen2_5OmniToken2WavModel`` (put in eval mode).

    ``cfg.frames_per_code`` / ``samples_per_frame`` / ``dit_block_frames`` must match the checkpoint
    (``dit_block_frames=None`` takes the checkpoint's); mismatches raise :class:`CheckpointError`.
    Streams share the model and are independent of each other; none is thread-safe.

    ``cuda_graphs`` (default: on when the model is on CUDA) replays the DiT solve and the vocoder from CUDA graphs
    (see the module docstring); a shape is captured the first time it is needed (about two solves' time), or up
    front by :meth:`warm_up`. ``max_batch`` bounds the streams of one batched DiT solve in :meth:`step_many`; a solve
    or vocoder call is padded up to one of :func:`.token2wav_graphs.slot_sizes` (the powers of two up to
    ``max_batch``), each with graphs of its own.

    ``tf32_matmul`` (CUDA only, off by default) runs the float32 matrix products of the DiT on TF32 tensor cores
    (10-bit mantissa inputs, float32 accumulation): about twice as fast on an H100/H200, no longer equal to the
    float32 reference (about 0.2% of the peak with random 7B weights; see BENCHMARKS.md). The global switch is set
    only while this synthesizer computes or captures, and captured graphs keep the kernels chosen at capture.

    ``compile_dit`` (off by default; CPU or CUDA) runs every DiT transformer block through ``torch.compile``
    (inductor fuses the elementwise work around the matrix products: modulated norms, RoPE head, gates), in the
    CUDA graphs (which record the compiled kernels) and in eager solves alike; the audio equals the uncompiled
    path's up to float rounding. Compiling takes seconds to a minute (one graph for every block, see
    :class:`.dit.CompiledDitBlock`) and happens in :meth:`warm_up`; without it, in the first chunk.

    ``fused_vocoder`` (off by default; CUDA only) runs each of BigVGAN's anti-aliased activations as two Triton kernels
    (:func:`.vocoder.triton_activation`) instead of ~10 kernels and a slow depthwise transposed convolution, which
    were most of a vocoder call's GPU time; equal up to float rounding.

    ``dit_dtype`` (float32 by default, as the reference) is the precision of the DiT's transformer: ``bfloat16`` or
    ``float16`` run copies of its blocks in that dtype on the tensor cores, at half the bytes of every activation;
    the ODE state, time embedding and sums stay float32 (:class:`.dit.DitWeights`). Not equal to float32: the mel moves
    by what BENCHMARKS.md measures. The vocoder stays float32.

    ``dit_attention`` (:class:`.dit.DitAttention`; ``sdpa`` by default) is how the DiT blocks attend: ``triton`` runs
    each block's attention as one kernel (:mod:`.dit_attention`; CUDA and a half-precision ``dit_dtype`` only, else a
    ConfigError) instead of SDPA and the four kernels around it; equal up to float rounding.

    ``capture_stream`` (CUDA graphs only; default: a new stream) is where every graph of the synthesizer is warmed up
    and captured.
    """

    def __init__(
        self,
        model: Qwen2_5OmniToken2WavModel,
        cfg: ChunkingConfig | None = None,
        *,
        cuda_graphs: bool | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        tf32_matmul: bool = False,
        compile_dit: bool = False,
        fused_vocoder: bool = False,
        dit_dtype: torch.dtype = torch.float32,
        capture_stream: torch.cuda.Stream | None = None,
        dit_attention: DitAttention | str = DitAttention.SDPA,
    ) -> None:
        self.cfg = _check_model(model, cfg or ChunkingConfig())
        self.model = model.eval()
        self.dit = model.code2wav_dit_model
        self.dit_dtype = dit_dtype
        self._weights = dit_weights(self.dit, dit_dtype)
        self.bigvgan = model.code2wav_bigvgan_model
        self.device = next(model.parameters()).device
        on_cuda = self.device.type == "cuda"
        for name, wanted in (
            ("cuda_graphs", cuda_graphs),
            ("tf32_matmul", tf32_matmul),
            ("fused_vocoder", fused_vocoder),
        ):
            if wanted and not on_cuda:
                raise ConfigError(f"{name} needs the token2wav model on a CUDA device", param=name)
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}", param="max_batch")
        self.cuda_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        self.max_batch = max_batch
        self.batch_sizes = slot_sizes(max_batch)
        self.tf32_matmul = tf32_matmul
        self.compile_dit = compile_dit
        self.fused_vocoder = fused_vocoder
        if fused_vocoder:
            vocoder.check_fusable(model.code2wav_bigvgan_model)
        self.compile_seconds = 0.0
        """Wall time of the compile step of :meth:`warm_up` (0 when nothing is compiled, or before it)."""
        self.dit_attention = _check_dit_attention(dit_attention, self.device, dit_dtype)
        self._block: DitBlock = CompiledDitBlock(self.dit_attention) if compile_dit else DitBlock(self.dit_attention)
        self._times = _ode_time_points(self.cfg, self.device)
        with _tf32_matmuls(tf32_matmul):
            self._modulation = TimeModulation.build(self._weights, self._times)
        self._speakers = _SpeakerCache(
            lambda cond, ref_mel: _speaker(
                self.dit, cond.to(self.device, torch.float32), ref_mel.to(self.device, torch.float32), self.use_cfg
            )
        )
        # One capture stream (one cuBLAS workspace) for every graph of this synthesizer: its solves and vocoder calls
        # run one at a time, but may run beside the decode steps' graphs, which have streams of their own.
        self.capture_stream = (capture_stream or torch.cuda.Stream(self.device)) if self.cuda_graphs else None
        self._dit_batches = _BatchedDit(
            self.dit,
            self._weights,
            self._modulation,
            self.cfg,
            self._times,
            graphs=self.cuda_graphs,
            batch_sizes=self.batch_sizes,
            block=self._block,
            capture_stream=self.capture_stream,
        )
        activation = vocoder.triton_activation if fused_vocoder else vocoder.reference_activation
        self._vocoder = _Vocoder(
            self.bigvgan,
            self.cfg,
            self.device,
            graphs=self.cuda_graphs,
            batch_sizes=self.batch_sizes,
            activation=activation,
            capture_stream=self.capture_stream,
        )
        self._eager_windows = 0

    @property
    def use_cfg(self) -> bool:
        return self.cfg.guidance_scale >= _CFG_OFF_BELOW

    @property
    def speaker_computations(self) -> int:
        """How many times speaker conditioning (ECAPA) ran: once per voice while it stays cached."""
        return self._speakers.computed

    def start(
        self,
        cond: Tensor,
        ref_mel: Tensor,
        *,
        voice: str | None = None,
        noise: Tensor | None = None,
        generator: torch.Generator | None = None,
        max_codes: int,
        quick: bool = False,
    ) -> Qwen25OmniToken2WavStream:
        """Open a stream for one utterance of at most ``max_codes`` codec tokens.

        ``cond`` (1, enc_emb_dim) and ``ref_mel`` (1, T, mel_dim) are the speaker's (``spk_dict.pt``); their
        conditioning is cached per ``voice`` name, or per tensor pair when no name is given (pass the name when
        the tensors are fresh copies each time). ``noise`` (1, >= max_codes * frames_per_code, mel_dim) is the
        utterance's initial ODE state; when omitted it is drawn once, here, from ``generator`` (torch's default
        generator when None). ``quick``: the stream makes the quick first chunk (``ChunkingConfig.quick``; the
        synthesizer's chunking must set ``quick_first_chunk_frames``, else ConfigError).
        """
        if quick and self.cfg.quick_first_chunk_frames is None:
            raise ConfigError(
                "a quick first chunk needs chunking.quick_first_chunk_frames", param="quick_first_chunk_frames"
            )
        frames = max_codes * self.cfg.frames_per_code
        limit = self.dit.config.max_position_embeddings // self.cfg.frames_per_code
        if not 0 <= max_codes <= limit:  # the DiT's trained position range, as the reference enforces
            raise InvalidInputError(f"max_codes={max_codes} outside [0, {limit}]", param="max_codes")
        _check_conditioning(self.dit, cond, ref_mel)
        # looked up as given (any device): the engine passes the checkpoint's own host tensors, which hit the cache by
        # identity; comparing device copies would wait for the device's queued work (~12 ms at a talker start)
        with torch.inference_mode(), device_scope(self.device):
            noise = self._noise(noise, generator, frames)
            speaker = self._speakers.get(cond, ref_mel, voice)
        return Qwen25OmniToken2WavStream(self, speaker, noise, max_codes, self.cfg.quick() if quick else self.cfg)

    def warm_up(self, max_batch: int = 1) -> None:
        """Compile the DiT blocks (``compile_dit``), then capture the graphs of the regular shapes (``cuda_graphs``),
        so that no stream pays either: DiT windows of the first and steady chunks for batches of up to
        ``max_batch`` streams (padded to the synthesizer's ``batch_sizes``) and the vocoder of the first and steady
        chunks. Seconds (a minute or more when compiling); no-op when both are off.

        Raises :class:`ConfigError` (``param="compile_dit"``) when compiling, or capturing the compiled blocks, fails:
        the synthesizer never falls back to the uncompiled DiT on its own; build it with ``compile_dit=False`` for
        that."""
        slots = sorted({bucket_holding(n, self.batch_sizes) for n in range(1, min(max_batch, self.max_batch) + 1)})
        with torch.inference_mode(), _tf32_matmuls(self.tf32_matmul), device_scope(self.device):
            if self.compile_dit:
                self._compile()
            if not self.cuda_graphs:
                return
            with self._compiled_dit_errors("capturing the CUDA graphs of the compiled DiT blocks"):
                for frames in _window_frames(self.cfg):
                    for slot_count in slots:
                        self._dit_batches.capture(frames, slot_count)
            for frames in _vocoder_frames(self.cfg):
                for slot_count in slots:
                    self._vocoder.capture(frames, slot_count)

    def step_many(self, streams: Sequence[Qwen25OmniToken2WavStream]) -> list[np.ndarray]:
        """Synthesize the next chunk of each of ``streams``, their DiT windows batched (``max_batch`` at a time,
        one graph launch per batch on GPU). Returns each stream's samples, in order, as its ``step()`` would (equal
        up to float rounding). Every stream must be ready, opened by this synthesizer and listed once; otherwise
        :class:`Token2WavStreamStateError` (or ValueError) is raised before any stream changes."""
        plans = next_chunks(self, streams)
        return self._synthesize(list(zip(streams, plans)))

    def graph_stats(self) -> GraphStats:
        return GraphStats(
            enabled=self.cuda_graphs,
            dit_graphs=tuple(sorted(self._dit_batches.captured)),
            vocoder_graphs=tuple(sorted(self._vocoder.captured)),
            dit_replays=sum(c.replays for c in self._dit_batches.captured.values()),
            vocoder_replays=sum(c.replays for c in self._vocoder.captured.values()),
            eager_dit_solves=self._dit_batches.eager_solves + self._eager_windows,
            eager_vocoder_calls=self._vocoder.eager_calls,
            dit_compiled=self.compile_dit,
            vocoder_fused=self.fused_vocoder,
        )

    # -- internals

    def _compile(self) -> None:
        """Compile every variant of the DiT block that the solves will call: one velocity evaluation of a blank
        window of one slot and, when batches can hold two, of two slots (without CFG one slot is one row, which
        dynamo compiles apart) at each window length worth a graph. Frames and rows are dynamic, so the first
        evaluation compiles and the others only check that the guards hold (a backend that specializes on some
        property of the length, e.g. an alignment, compiles its variant here rather than during a capture or a
        chunk). Outside any capture, on the current stream; the caller holds inference mode and the TF32 setting
        (both are part of dynamo's guards)."""
        started = time.perf_counter()
        with self._compiled_dit_errors("compiling the DiT blocks"):
            for frames in _window_frames(self.cfg):
                for slot_count in (1, 2) if self.max_batch >= 2 else (1,):
                    self._dit_batches.evaluate_blank(frames, slot_count)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # kernel faults surface here, and the time is the compile's
        self.compile_seconds = time.perf_counter() - started
        log.info("token2wav: DiT blocks compiled in %.1f s", self.compile_seconds)

    @contextlib.contextmanager
    def _compiled_dit_errors(self, doing: str) -> Iterator[None]:
        """Re-raise any failure in the block as a ConfigError naming the option, when the DiT is compiled (dynamo,
        inductor and the C++/Triton compilers raise many unrelated types; the original is chained)."""
        if not self.compile_dit:
            yield
            return
        try:
            yield
        except Exception as exc:
            raise ConfigError(
                f"token2wav: {doing} failed ({type(exc).__name__}: {exc}); run the DiT uncompiled with "
                "compile_dit=False (stage config: stages.token2wav.compile: off)",
                param="compile_dit",
            ) from exc

    def _synthesize(self, chunks: list[tuple[Qwen25OmniToken2WavStream, ChunkPlan]]) -> list[np.ndarray]:
        # on this synthesizer's device whatever the caller's current one (its Triton kernels launch on the current one)
        with torch.inference_mode(), _tf32_matmuls(self.tf32_matmul), device_scope(self.device):
            if len(chunks) == 1 and not self.cuda_graphs:
                ((stream, plan),) = chunks
                windows = [stream._solve_window(plan)]  # the unpadded eager computation
                self._eager_windows += 1
            else:
                windows = self._dit_batches.solve([stream._window_job(plan) for stream, plan in chunks])
            mels = [stream._vocoder_input(plan, window) for (stream, plan), window in zip(chunks, windows)]
            wavs = self._vocoder.many(mels)
        # only now, with every chunk made, does any stream advance: a failure above leaves them all as they were
        return [stream._advance(plan, mel, wav) for (stream, plan), mel, wav in zip(chunks, mels, wavs)]

    def _noise(self, noise: Tensor | None, generator: torch.Generator | None, frames: int) -> Tensor:
        mel_dim = self.dit.config.mel_dim
        if noise is None:
            gen_device = generator.device if generator is not None else torch.device("cpu")
            noise = torch.randn((1, frames, mel_dim), generator=generator, device=gen_device, dtype=torch.float32)
        elif noise.ndim != 3 or noise.shape[0] != 1 or noise.shape[1] < frames or noise.shape[2] != mel_dim:
            raise InvalidInputError(
                f"noise must have shape (1, >={frames}, {mel_dim}), got {tuple(noise.shape)}", param="noise"
            )
        return noise[:, :frames].to(self.device, torch.float32)


class Qwen25OmniToken2WavStream(CodecStream):
    """Streaming synthesis state of one utterance (:class:`~pipeline.models.common.codec_stream.CodecStream`; its
    ``frames_done`` counts mel frames). Create with :meth:`StreamingToken2Wav.start`.

    Calling order: any interleaving of ``push(codes)`` and, whenever ``ready()``, ``step()`` (or the owner's
    ``step_many([...])``); then ``finish()``; then ``step()`` until ``done``; ``close()`` at any time (idempotent)
    frees the tensors. Each ``step()`` synthesizes exactly one chunk and returns its samples (float32, 24 kHz,
    contiguous with the previous chunk's; possibly empty for a first chunk shorter than the vocoder hold). An
    engine that interleaves one step per tick can cancel within one chunk by calling ``close()``.
    """

    STATE_ERROR = Token2WavStreamStateError
    KIND = "token2wav"

    def __init__(
        self, owner: StreamingToken2Wav, speaker: _Speaker, noise: Tensor, max_codes: int, cfg: ChunkingConfig
    ) -> None:
        self._cfg = cfg
        """This stream's schedule: the owner's, or its quick variant."""
        self._speaker: _Speaker | None = speaker
        self._noise: Tensor | None = noise
        # Codes stay on the host: pushing one per talker step must not wait on the GPU.
        self._codes: Tensor | None = torch.zeros(max_codes, dtype=torch.long)
        self._mel_tail: Tensor | None = None  # final mel (1, mel_dim, n) ending at frames_done
        self._seam_tail: np.ndarray | None = None  # the vocoder's provisional samples after a provisional seam
        super().__init__(owner, max_codes)

    def push(self, codes: Sequence[int]) -> None:
        """Append codec tokens (DiT code ids, talker specials stripped). Raises InvalidInputError past max_codes."""
        self._require(StreamStatus.OPEN, "push")
        held = self._held()
        tensor = _codes_tensor(self._owner.dit, codes, held.device)
        end = self.codes_received + tensor.numel()
        if end > self.max_codes:
            raise InvalidInputError(f"stream holds at most {self.max_codes} codes, got {end}", param="codes")
        held[self.codes_received : end] = tensor
        self.codes_received = end

    def next_plan(self) -> ChunkPlan | None:
        """The chunk ``step()`` would synthesize now, or None."""
        return self._next_chunk()

    def step(self) -> np.ndarray:
        """Synthesize the next ready chunk; return its samples. Raises Token2WavStreamStateError if none is ready."""
        plan = self._next_chunk()
        if plan is None:
            raise Token2WavStreamStateError(self._not_ready_message())
        return self._owner._synthesize([(self, plan)])[0]

    # -- internals (the owner drives the synthesis of a chunk: _solve_window or _window_job, then
    # _vocoder_input, the vocoder, and _advance)

    def _codes_needed(self) -> int:
        return self._cfg.codes_needed(self.chunks_emitted, frames_done=self.frames_done)

    def _drained(self) -> bool:
        """Nothing was pushed: ``finish()`` leaves no chunk to make. (Once codes came, one remains: the chunk schedule
        leaves a code for a later chunk until the stream finishes, which flushes the held-back vocoder tail.)"""
        return self.codes_received == 0

    def _next_chunk(self) -> ChunkPlan | None:
        if self.status not in (StreamStatus.OPEN, StreamStatus.FINISHED):
            return None
        return plan_next_chunk(
            self._cfg,
            frames_done=self.frames_done,
            codes_available=self.codes_received,
            finished=self.status is StreamStatus.FINISHED,
            index=self.chunks_emitted,
            emitted_frames=self.samples_emitted // self._cfg.samples_per_frame,
        )

    def _window_codes(self, plan: ChunkPlan) -> Tensor:
        codes = self._held()[plan.dit_codes.start : plan.dit_codes.end].unsqueeze(0)
        return codes.to(self._owner.device, non_blocking=True)

    def _context(self, plan: ChunkPlan):
        """The chunk's DiT window, which starts on an attention block boundary: the chunk schedule's sizes are multiples
        of the block (``ChunkingConfig.dit_block_frames``, the checkpoint's), and the Triton attention reads keys block
        by block on that layout (:func:`.dit_attention.dit_attention`)."""
        context = plan.dit_context
        block = self._cfg.dit_block_frames  # the owner's schedule always has it (the checkpoint's by default)
        if block is None or context.start % block:
            raise Token2WavStreamStateError(
                f"a DiT window starts at frame {context.start}, off the "
                f"{self._cfg.dit_block_frames}-frame attention blocks"
            )
        return context

    def _solve_window(self, plan: ChunkPlan) -> Tensor:
        """Run the DiT ODE over the chunk's context window, unpadded; (1, L, mel_dim)."""
        owner, context = self._owner, self._context(plan)
        speaker, noise = self._conditioning()
        window = _window_inputs(owner.dit, speaker, self._window_codes(plan), context.start)
        velocity = dit_velocity(
            owner._weights, owner._modulation, window, self._cfg.guidance_scale, speaker.batch == 2, owner._block
        )
        return integrate(velocity, noise[:, context.start : context.end], owner._times)

    def _window_job(self, plan: ChunkPlan) -> WindowJob:
        """The chunk's context window for a batched solve."""
        context = self._context(plan)
        speaker, noise = self._conditioning()
        features = _features(self._owner.dit, speaker, self._window_codes(plan))
        return WindowJob(noise[:, context.start : context.end], features, context.start)

    def _vocoder_input(self, plan: ChunkPlan, window: Tensor) -> Tensor:
        """The mel frames (1, mel_dim, n) the vocoder runs for the chunk: the re-run overlap frames of the previous
        chunks, then the chunk's frames of its solved ``window`` (and, for a first chunk with provisional look-ahead,
        the window's frames after them). Changes nothing."""
        offset = plan.dit_context.start
        mel = window[:, plan.frames.start - offset : plan.vocoder_frames.end - offset].transpose(1, 2)
        overlap = plan.frames.start - plan.vocoder_frames.start
        if not overlap:
            return mel
        if self._mel_tail is None:  # a schedule with vocoder overlap keeps a tail after every chunk
            raise Token2WavStreamStateError(f"chunk {plan.index} re-runs {overlap} frames, but none were kept")
        return torch.cat([self._mel_tail[:, :, -overlap:], mel], dim=2)

    def _advance(self, plan: ChunkPlan, vocoder_mel: Tensor, wav: Tensor) -> np.ndarray:
        """Keep the chunk's ``plan.samples`` of the vocoder output ``wav`` (CPU, for ``vocoder_mel``), advance the
        stream past the chunk, return the samples."""
        hold = self._cfg.vocoder_overlap_frames
        final = plan.frames.end - plan.vocoder_frames.start  # provisional look-ahead frames after it are not kept
        self._mel_tail = vocoder_mel[:, :, max(0, final - hold) : final] if hold else None
        offset = plan.vocoder_frames.start * self._cfg.samples_per_frame
        samples = wav[plan.samples.start - offset : plan.samples.end - offset].numpy().astype(np.float32, copy=True)
        self._fade_in(samples)
        if plan.vocoder_frames.end > plan.frames.end:  # vocoded with provisional look-ahead: the next chunk fades in
            end = plan.samples.end - offset
            self._seam_tail = wav[end : end + PROVISIONAL_SEAM_FADE_SAMPLES].numpy().astype(np.float32, copy=True)
        self.frames_done = plan.frames.end
        self.samples_emitted += samples.size
        self.chunks_emitted += 1
        if plan.is_last:
            self._set_done()
        return samples

    def _fade_in(self, samples: np.ndarray) -> None:
        """Cross-fade the start of ``samples`` (in place) from the previous chunk's provisional continuation, if it left
        one: linear weights, the continuation's falling as the chunk's own rise."""
        tail, self._seam_tail = self._seam_tail, None
        n = 0 if tail is None else min(tail.size, samples.size)
        if tail is not None and n:
            rise = np.arange(1, n + 1, dtype=np.float32) / (n + 1)
            samples[:n] = tail[:n] * (1 - rise) + samples[:n] * rise

    def _held(self) -> Tensor:
        """The pushed codes' buffer (host); Token2WavStreamStateError once the stream released its tensors."""
        if self._codes is None:
            raise Token2WavStreamStateError(f"the {self.KIND} stream is closed")
        return self._codes

    def _conditioning(self) -> tuple[_Speaker, Tensor]:
        """The speaker and the stream's noise; Token2WavStreamStateError once the stream released its tensors."""
        if self._speaker is None or self._noise is None:
            raise Token2WavStreamStateError(f"the {self.KIND} stream is closed")
        return self._speaker, self._noise

    def _release(self) -> None:
        self._speaker = self._noise = self._codes = self._mel_tail = self._seam_tail = None

    def _not_ready_message(self) -> str:
        if self.status is not StreamStatus.OPEN:
            return f"no chunk to synthesize: the stream is {self.status.value}"
        need = self._cfg.first_audio_codes if self.frames_done == 0 else None
        hint = f" (the first chunk needs {need})" if need else ""
        return f"no chunk ready: {self.codes_received} codes received{hint}; push more codes or finish()"


# ---------------------------------------------------------------------------------------------------
# Reference


def one_shot(
    model: Qwen2_5OmniToken2WavModel,
    codes: Sequence[int] | Tensor,
    cond: Tensor,
    ref_mel: Tensor,
    noise: Tensor,
    cfg: ChunkingConfig | None = None,
) -> np.ndarray:
    """Non-streaming reference: the DiT's own forward (transformers' ``sample`` path) over the whole
    utterance starting from ``noise[:, :len(codes) * repeats]``, then BigVGAN on all frames at once.
    With noise drawn as ``sample`` draws it this equals ``model(code, cond, ref_mel)``. Returns float32
    samples at 24 kHz, ``len(codes) * frames_per_code * samples_per_frame`` of them.
    """
    cfg = cfg or ChunkingConfig()
    dit, device = model.code2wav_dit_model, next(model.parameters()).device
    _check_conditioning(dit, cond, ref_mel)
    with torch.inference_mode():
        code = _codes_tensor(dit, codes, device).unsqueeze(0)
        frames = code.shape[1] * dit.config.repeats
        if noise.ndim != 3 or noise.shape[0] != 1 or noise.shape[1] < frames or noise.shape[2] != dit.config.mel_dim:
            raise InvalidInputError(
                f"noise must have shape (1, >={frames}, {dit.config.mel_dim}), got {tuple(noise.shape)}", param="noise"
            )
        if frames == 0:
            return np.zeros(0, dtype=np.float32)
        cond, ref_mel = cond.to(device, torch.float32), ref_mel.to(device, torch.float32)
        speaker = cond.unsqueeze(1).repeat(1, frames, 1)
        use_cfg = cfg.guidance_scale >= _CFG_OFF_BELOW

        def velocity(number: int, t: Tensor, x: Tensor) -> Tensor:
            out = dit(
                hidden_states=x,
                condition_vector=ref_mel,
                speaker_embedding=speaker,
                quantized_code=code,
                time_step=t,
                apply_cfg=use_cfg,
            )
            return guided(out, cfg.guidance_scale, use_cfg)

        mel = integrate(velocity, noise[:, :frames].to(device, torch.float32), _ode_time_points(cfg, device))
        return _vocode(model.code2wav_bigvgan_model, mel.transpose(1, 2))[0].numpy().astype(np.float32, copy=True)
