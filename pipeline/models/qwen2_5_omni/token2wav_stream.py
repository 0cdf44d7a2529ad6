"""Streaming token2wav for Qwen2.5-Omni: sliding-window DiT (flow matching) + BigVGAN with overlap seams.

Codec tokens arrive one by one from the talker; :class:`Token2WavStream` turns them into 24 kHz float32
audio chunk by chunk, following the plan of :mod:`pipeline.stages.chunk_schedule`:

- DiT: each chunk's frames are synthesized by running the whole ODE (RK4, ``ode_steps`` time points,
  classifier-free guidance batched with the unconditioned branch as the reference sampler does) on the
  chunk plus its past/future context frames. The initial noise of a window is the slice of ONE noise
  tensor per utterance at the window's absolute frames, positions (RoPE) and attention blocks are the
  absolute ones, so a window computes exactly what a one-shot pass computes whenever the context covers
  the DiT's receptive field (it does not with trained settings: context frames feel their own missing
  context through the look-ahead/look-back layers, so streaming is close to, not equal to, one-shot).
- BigVGAN: each chunk re-runs up to ``vocoder_overlap_frames`` already-final mel frames before its own,
  drops the output of the first ``vocoder_trim_frames`` and holds back its own last
  ``overlap - trim`` frames until the next chunk supplies their right context: no seam clicks.

Speaker conditioning (ECAPA on the reference mel, the ``cond`` vector) is computed once per stream.
All model calls run under ``torch.inference_mode()``. The model must be float32 (the reference requires it).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

from pipeline.errors import CheckpointError, InvalidInputError, PipelineError
from pipeline.stages.chunk_schedule import ChunkingConfig, ChunkPlan, plan_next_chunk

__all__ = ["StreamStatus", "Token2WavStream", "Token2WavStreamStateError", "StreamingToken2Wav", "one_shot"]

_CFG_OFF_BELOW = 1e-5
"""Guidance scales below this run the conditioned branch alone (same threshold as the reference sampler)."""

Velocity = Callable[[Tensor, Tensor], Tensor]


class Token2WavStreamStateError(PipelineError):
    """A :class:`Token2WavStream` method was called in a state that does not allow it
    (``step()`` with no chunk ready, ``push()`` after ``finish()``, any use after ``close()``)."""

    code = "token2wav_stream_state"


class StreamStatus(enum.Enum):
    """Lifecycle of a stream, in order: OPEN -> FINISHED -> DONE; CLOSED from any state."""

    OPEN = "open"  # accepting codes
    FINISHED = "finished"  # no more codes; chunks may remain to synthesize
    DONE = "done"  # every sample emitted
    CLOSED = "closed"  # tensors released


# ---------------------------------------------------------------------------------------------------
# DiT pieces shared by the streaming and one-shot paths


@dataclass(frozen=True)
class _Speaker:
    """Per-stream speaker conditioning, batched as [conditioned, unconditioned] when CFG is on.

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


def _integrate(velocity: Velocity, y0: Tensor, times: Tensor) -> Tensor:
    """Fixed-step RK4 (Kutta's 3/8 rule) from ``times[0]`` to ``times[-1]``; the reference's solver."""
    y = y0
    for t0, t1 in zip(times[:-1], times[1:]):
        h = t1 - t0
        k1 = velocity(t0, y)
        k2 = velocity(t0 + h / 3, y + h * k1 / 3)
        k3 = velocity(t0 + 2 * h / 3, y + h * (k2 - k1 / 3))
        k4 = velocity(t1, y + h * (k1 - k2 + k3))
        y = y + (k1 + 3 * (k2 + k3) + k4) * h / 8
    return y


def _guided(prediction: Tensor, guidance_scale: float, use_cfg: bool) -> Tensor:
    if not use_cfg:
        return prediction
    conditioned, unconditioned = prediction.chunk(2, dim=0)
    return conditioned + (conditioned - unconditioned) * guidance_scale


def _window_velocity(dit, speaker: _Speaker, codes: Tensor, first_frame: int, guidance_scale: float) -> Velocity:
    """The guided DiT velocity field on mel frames ``[first_frame, first_frame + len(codes) * repeats)``.

    Everything that does not depend on (t, x) is computed once here: code embeddings, speaker features,
    RoPE tables and the block mask, all at absolute frame positions so that the window sees exactly the
    attention pattern a one-shot pass has on those frames.
    """
    use_cfg = speaker.batch == 2
    embeds = [dit.text_embed(codes)] + ([dit.text_embed(codes, drop_code=True)] if use_cfg else [])
    code_embed = torch.cat(embeds, dim=0)
    batch, length = code_embed.shape[0], code_embed.shape[1]
    static = torch.cat(
        [
            speaker.ref_embedding.unsqueeze(1).expand(batch, length, -1),
            code_embed,
            speaker.cond.unsqueeze(1).expand(batch, length, -1),
        ],
        dim=-1,
    )
    positions = torch.arange(first_frame, first_frame + length, device=codes.device)
    rope = dit.rotary_embed(static, positions.unsqueeze(0).expand(batch, -1))
    blocks = positions // dit.block_size
    block_diff = (blocks.unsqueeze(0) - blocks.unsqueeze(1)).expand(batch, dit.num_attention_heads, -1, -1)

    def velocity(t: Tensor, x: Tensor) -> Tensor:
        time_embedding = dit.time_embed(t.reshape(1).expand(batch))
        hidden = dit.input_embed.proj(torch.cat([x.expand(batch, -1, -1), static], dim=-1))
        for layer in dit.transformer_blocks:
            hidden = layer(hidden, time_embedding, position_embeddings=rope, block_diff=block_diff)
        out = dit.proj_out(dit.norm_out(hidden, time_embedding))
        return _guided(out, guidance_scale, use_cfg)

    return velocity


def _vocode(bigvgan, mel: Tensor) -> Tensor:
    """(1, mel_dim, frames) -> (frames * hop,) float32 samples on CPU."""
    return bigvgan(mel).reshape(-1).float()


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
        (all((k - r) % 2 == 0 for r, k in zip(voc.upsample_rates, voc.upsample_kernel_sizes)),
         "BigVGAN upsample kernels and rates must differ by even numbers"),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            raise CheckpointError(message)
    return cfg


def _check_conditioning(dit, cond: Tensor, ref_mel: Tensor) -> None:
    cfg = dit.config
    if cond.ndim != 2 or cond.shape != (1, cfg.enc_emb_dim):
        raise InvalidInputError(f"cond must have shape (1, {cfg.enc_emb_dim}), got {tuple(cond.shape)}", param="cond")
    if ref_mel.ndim != 3 or ref_mel.shape[0] != 1 or ref_mel.shape[2] != cfg.mel_dim or ref_mel.shape[1] < 1:
        raise InvalidInputError(
            f"ref_mel must have shape (1, T, {cfg.mel_dim}), got {tuple(ref_mel.shape)}", param="ref_mel"
        )


def _codes_tensor(dit, codes: Sequence[int] | Tensor, device: torch.device) -> Tensor:
    """Codes as a (n,) long tensor, validated against the DiT's code embedding table."""
    tensor = torch.as_tensor(codes, dtype=torch.long).reshape(-1).to(device)
    table = dit.text_embed.codec_embed.num_embeddings
    if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= table):
        raise InvalidInputError(f"codec ids must lie in [0, {table}); strip talker special tokens", param="codes")
    return tensor


# ---------------------------------------------------------------------------------------------------
# Streaming


class StreamingToken2Wav:
    """Factory of per-utterance streams over one float32 ``Qwen2_5OmniToken2WavModel`` (put in eval mode).

    ``cfg.frames_per_code`` / ``samples_per_frame`` / ``dit_block_frames`` must match the checkpoint
    (``dit_block_frames=None`` takes the checkpoint's); mismatches raise :class:`CheckpointError`.
    Streams share the model and are independent of each other; none is thread-safe.
    """

    def __init__(self, model: Qwen2_5OmniToken2WavModel, cfg: ChunkingConfig | None = None) -> None:
        self.cfg = _check_model(model, cfg or ChunkingConfig())
        self.model = model.eval()
        self.dit = model.code2wav_dit_model
        self.bigvgan = model.code2wav_bigvgan_model
        self.device = next(model.parameters()).device

    @property
    def use_cfg(self) -> bool:
        return self.cfg.guidance_scale >= _CFG_OFF_BELOW

    def start(
        self,
        cond: Tensor,
        ref_mel: Tensor,
        *,
        noise: Tensor | None = None,
        generator: torch.Generator | None = None,
        max_codes: int,
    ) -> Token2WavStream:
        """Open a stream for one utterance of at most ``max_codes`` codec tokens.

        ``cond`` (1, enc_emb_dim) and ``ref_mel`` (1, T, mel_dim) are the speaker's (``spk_dict.pt``).
        ``noise`` (1, >= max_codes * frames_per_code, mel_dim) is the utterance's initial ODE state; when
        omitted it is drawn once, here, from ``generator`` (torch's default generator when None).
        """
        frames = max_codes * self.cfg.frames_per_code
        limit = self.dit.config.max_position_embeddings // self.cfg.frames_per_code
        if not 0 <= max_codes <= limit:  # the DiT's trained position range, as the reference enforces
            raise InvalidInputError(f"max_codes={max_codes} outside [0, {limit}]", param="max_codes")
        _check_conditioning(self.dit, cond, ref_mel)
        cond, ref_mel = cond.to(self.device, torch.float32), ref_mel.to(self.device, torch.float32)
        with torch.inference_mode():
            noise = self._noise(noise, generator, frames)
            speaker = _speaker(self.dit, cond, ref_mel, self.use_cfg)
        return Token2WavStream(self, speaker, noise, max_codes)

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


class Token2WavStream:
    """Streaming synthesis state of one utterance. Create with :meth:`StreamingToken2Wav.start`.

    Calling order: any interleaving of ``push(codes)`` and, whenever ``ready()``, ``step()``; then
    ``finish()``; then ``step()`` until ``done``; ``close()`` at any time (idempotent) frees the tensors.
    Each ``step()`` synthesizes exactly one chunk and returns its samples (float32, 24 kHz, contiguous with
    the previous chunk's; possibly empty for a first chunk shorter than the vocoder hold). An engine that
    interleaves one step per tick can cancel within one chunk by calling ``close()``.
    """

    def __init__(self, owner: StreamingToken2Wav, speaker: _Speaker, noise: Tensor, max_codes: int) -> None:
        self._owner = owner
        self._cfg = owner.cfg
        self._speaker: _Speaker | None = speaker
        self._noise: Tensor | None = noise
        self._codes: Tensor | None = torch.zeros(max_codes, dtype=torch.long, device=owner.device)
        self._mel_tail: Tensor | None = None  # final mel (1, mel_dim, n) ending at frames_done
        self.max_codes = max_codes
        self.status = StreamStatus.OPEN
        self.codes_received = 0
        self.frames_done = 0
        self.samples_emitted = 0
        self.chunks_emitted = 0

    @property
    def done(self) -> bool:
        """True once every sample of a finished stream was returned by ``step()``."""
        return self.status is StreamStatus.DONE

    def push(self, codes: Sequence[int]) -> None:
        """Append codec tokens (DiT code ids, talker specials stripped). Raises InvalidInputError past max_codes."""
        self._require(StreamStatus.OPEN, "push")
        tensor = _codes_tensor(self._owner.dit, codes, self._owner.device)
        end = self.codes_received + tensor.numel()
        if end > self.max_codes:
            raise InvalidInputError(f"stream holds at most {self.max_codes} codes, got {end}", param="codes")
        self._codes[self.codes_received : end] = tensor
        self.codes_received = end

    def finish(self) -> None:
        """No more codes: the remaining frames become the last chunk(s). Idempotent."""
        if self.status is StreamStatus.OPEN:
            self.status = StreamStatus.FINISHED
            if self.codes_received == 0:
                self._set_done()

    def ready(self) -> bool:
        """Whether ``step()`` would synthesize a chunk now."""
        return self._plan() is not None

    def next_plan(self) -> ChunkPlan | None:
        """The chunk ``step()`` would synthesize now, or None."""
        return self._plan()

    def step(self) -> np.ndarray:
        """Synthesize the next ready chunk; return its samples. Raises Token2WavStreamStateError if none is ready."""
        plan = self._plan()
        if plan is None:
            raise Token2WavStreamStateError(self._not_ready_message())
        with torch.inference_mode():
            mel = self._final_mel(plan)
            samples = self._vocode(plan, mel)
        self.frames_done = plan.frames.end
        self.samples_emitted += samples.size
        self.chunks_emitted += 1
        if plan.is_last:
            self._set_done()
        return samples

    def close(self) -> None:
        """Release every tensor; the stream is unusable afterwards. Safe to call more than once."""
        self._release()
        self.status = StreamStatus.CLOSED

    # -- internals

    def _plan(self) -> ChunkPlan | None:
        if self.status not in (StreamStatus.OPEN, StreamStatus.FINISHED):
            return None
        return plan_next_chunk(
            self._cfg,
            frames_done=self.frames_done,
            codes_available=self.codes_received,
            finished=self.status is StreamStatus.FINISHED,
            index=self.chunks_emitted,
        )

    def _final_mel(self, plan: ChunkPlan) -> Tensor:
        """Run the DiT ODE over the chunk's context window; return the chunk's frames, (1, mel_dim, n)."""
        owner, context = self._owner, plan.dit_context
        codes = self._codes[plan.dit_codes.start : plan.dit_codes.end].unsqueeze(0)
        velocity = _window_velocity(owner.dit, self._speaker, codes, context.start, self._cfg.guidance_scale)
        times = _ode_time_points(self._cfg, owner.device)
        window = _integrate(velocity, self._noise[:, context.start : context.end], times)
        return window[:, plan.frames.start - context.start : plan.frames.end - context.start].transpose(1, 2)

    def _vocode(self, plan: ChunkPlan, mel: Tensor) -> np.ndarray:
        """Vocode ``mel`` after the re-run overlap frames; keep ``plan.samples``; update the mel tail."""
        overlap = plan.frames.start - plan.vocoder_frames.start
        if overlap:
            mel = torch.cat([self._mel_tail[:, :, -overlap:], mel], dim=2)
        self._mel_tail = mel[:, :, -self._cfg.vocoder_overlap_frames :] if self._cfg.vocoder_overlap_frames else None
        wav = _vocode(self._owner.bigvgan, mel)
        offset = plan.vocoder_frames.start * self._cfg.samples_per_frame
        return wav[plan.samples.start - offset : plan.samples.end - offset].numpy().astype(np.float32, copy=True)

    def _set_done(self) -> None:
        self.status = StreamStatus.DONE
        self._release()

    def _release(self) -> None:
        self._speaker = self._noise = self._codes = self._mel_tail = None

    def _require(self, status: StreamStatus, action: str) -> None:
        if self.status is not status:
            raise Token2WavStreamStateError(f"cannot {action}() a token2wav stream that is {self.status.value}")

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

        def velocity(t: Tensor, x: Tensor) -> Tensor:
            out = dit(
                hidden_states=x,
                condition_vector=ref_mel,
                speaker_embedding=speaker,
                quantized_code=code,
                time_step=t,
                apply_cfg=use_cfg,
            )
            return _guided(out, cfg.guidance_scale, use_cfg)

        mel = _integrate(velocity, noise[:, :frames].to(device, torch.float32), _ode_time_points(cfg, device))
        return _vocode(model.code2wav_bigvgan_model, mel.transpose(1, 2)).numpy().astype(np.float32, copy=True)
